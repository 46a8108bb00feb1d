#version 450
// The attention mask of one prefill pass as flash_attn.comp reads it: f16 0 (visible) or -inf
// (masked) for every query row and key column, and one class per tile of BR rows x BC columns:
// 0 mixed, 1 fully masked, 2 fully visible. Token t sits at position step.pos0 + t and sees
// keys 0..pos, or only the last WINDOW of them when window > 0, and with SEQS = 1 none before
// step.seq_first[t], the first slot of its own sequence (packed passes). Rows past n_tokens
// (the last tile's padding) read as visible and take no part in the classes; columns past
// step.n_past are masked. One workgroup per tile; tiles right of n_past are only classified.
#include "common.glsl"

layout(local_size_x_id = 0) in;
layout(constant_id = 1) const uint BR = 16;         // query rows per tile
layout(constant_id = 2) const uint BC = 32;         // key columns per tile
layout(constant_id = 3) const uint SEQS = 0;

layout(std430, binding = 0) writeonly buffer M { float16_t mask[]; };   // [rows, stride]
layout(std430, binding = 1) writeonly buffer C { uint cls[]; };        // [rows/BR, stride/BC]
#include "step.glsl"
layout(push_constant) uniform Push {
    uint n_tokens;
    uint stride;       // mask columns: n_ctx rounded up to BC
    uint window;       // 0: full causal attention
} p;

const uint MIXED = 0, MASKED = 1, VISIBLE = 2;
shared uint seen;      // bit 0: a visible entry, bit 1: a masked one

void main() {
    const uint j = gl_WorkGroupID.x, tile = gl_WorkGroupID.y;
    const uint t = gl_LocalInvocationIndex;
    const uint n_kv = step.n_past;
    const uint at = tile * (p.stride / BC) + j;
    if (j * BC >= n_kv) {                    // never visited by the attention loop
        if (t == 0) cls[at] = MASKED;
        return;
    }
    if (t == 0) seen = 0;
    barrier();
    uint bits = 0;
    for (uint idx = t; idx < BR * BC; idx += gl_WorkGroupSize.x) {
        const uint row = tile * BR + idx / BC, kp = j * BC + idx % BC;
        const uint pos = step.pos0 + row;
        const uint wfirst = (p.window > 0 && pos >= p.window) ? pos - p.window + 1 : 0;
        const bool real = row < p.n_tokens;
        const uint first = SEQS != 0 && real ? max(wfirst, step.seq_first[row]) : wfirst;
        const bool vis = !real || (kp >= first && (kp <= pos || step.bidir != 0) && kp < n_kv);
        mask[row * p.stride + kp] = vis ? float16_t(0.0) : float16_t(uintBitsToFloat(0xFF800000u));
        if (real) bits |= vis ? 1u : 2u;
    }
    atomicOr(seen, bits);
    barrier();
    if (t == 0) cls[at] = seen == 1u ? VISIBLE : seen == 2u ? MASKED : MIXED;
}
