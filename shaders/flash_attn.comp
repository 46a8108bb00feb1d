#version 450
// Tiled (flash) attention for prefill over the f16 KV cache, grouped-query heads.
// One workgroup per (tile of BR query rows, query head). The KV range is walked in blocks of
// BC positions: the K and V block and, where needed, the mask tile are staged in shared memory
// and every row is folded in with an online softmax (running max, sum and output).
// A row is served by LP adjacent lanes, each owning every LP-th vec4 of the head dim: a
// score is their partial dot products summed with shuffles, so each lane holds the whole
// row of BC scores and the softmax needs no shared memory.
// The mask is attn_mask.comp's: f16 0/-inf per (row, column) and one class per tile. With
// SKIP, fully masked tiles are not visited and fully visible ones read no mask; without it
// every tile loads its mask, which gives the same bits (a masked tile changes nothing: its
// scores are -inf, so the running max stays, the rescale is exp(0) = 1 and the terms are 0).
// Options (include/attn.glsl): scores soft-capped (softcap > 0), a sink logit per head (SINKS).
#include "common.glsl"
#include "round.glsl"
#extension GL_KHR_shader_subgroup_shuffle : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require

layout(local_size_x_id = 0) in;                     // BR * LP
layout(constant_id = 1) const uint HD = 64;         // head dim, a multiple of 4 * LP
layout(constant_id = 2) const uint BR = 16;         // query rows per tile
layout(constant_id = 3) const uint BC = 32;         // KV positions per block
layout(constant_id = 4) const uint LP = 4;          // lanes per row, a power of two <= SG
// GGML = 1 follows ggml's CPU arithmetic: q rounded to f16, and two passes over the KV, the
// first for each row's max and sum, the second rounding the probabilities to f16 before P.V.
layout(constant_id = 5) const uint GGML = 0;
layout(constant_id = 6) const uint SKIP = 1;        // use the tile classes
layout(constant_id = 7) const uint SINKS = 0;

layout(std430, binding = 0) readonly buffer Q { vec4 q4[]; };       // [n_tokens, n_head, HD]
layout(std430, binding = 1) readonly buffer K { f16vec4 k4[]; };    // [n_ctx, n_head_kv, HD]
layout(std430, binding = 2) readonly buffer V { f16vec4 v4[]; };    // [n_ctx, n_head_kv, HD]
layout(std430, binding = 3) writeonly buffer O { vec4 o4[]; };      // [n_tokens, n_head, HD]
layout(std430, binding = 4) readonly buffer M { float16_t mask[]; }; // [rows, stride]
layout(std430, binding = 5) readonly buffer C { uint cls[]; };      // [rows/BR, stride/BC]
#include "step.glsl"
layout(std430, binding = 7) readonly buffer Sk { float sinks[]; };  // [n_head] (SINKS)
layout(push_constant) uniform Push {
    uint n_head;
    uint n_head_kv;
    uint n_tokens;
    uint stride;       // mask columns
    float scale;
    float softcap;     // 0: none
} p;
#include "attn.glsl"

const uint D4 = HD / 4;
const uint DL = D4 / LP;                            // vec4 per lane
const uint MIXED = 0, MASKED = 1, VISIBLE = 2;
const float NEG = -3.4028234e38 / 2.0;              // a running max that never makes NaN
const uint WG = gl_WorkGroupSize.x;
const uint KV_STEPS = (BC * D4 + WG - 1) / WG, MASK_STEPS = (BR * BC + WG - 1) / WG;

shared f16vec4 ksh[BC * D4];
shared f16vec4 vsh[BC * D4];
shared float16_t msh[BR * BC];

void main() {
    const uint tile = gl_WorkGroupID.x, h = gl_WorkGroupID.y;
    const uint t = gl_LocalInvocationIndex;
    const uint r = t / LP, lane = t % LP;
    const uint row = tile * BR + r;
    const uint kvh = h / (p.n_head / p.n_head_kv);
    const uint n_kv = step.n_past;
    const uint n_blocks = (n_kv + BC - 1) / BC;

    vec4 qv[DL];
    const uint qb = (row * p.n_head + h) * D4 + lane;
    [[unroll]] for (uint i = 0; i < DL; i++) {
        const vec4 x = row < p.n_tokens ? q4[qb + LP * i] : vec4(0.0);
        qv[i] = GGML != 0 ? f16_rne(x) : x;
    }
    float m = SINKS != 0 ? sinks[h] : NEG, l = SINKS != 0 ? 1.0 : 0.0;
    vec4 acc[DL];
    [[unroll]] for (uint i = 0; i < DL; i++) acc[i] = vec4(0.0);

    // GGML: a first pass for each row's max and sum, so that the second can round the
    // normalised probabilities to f16 before P.V, as ggml's CPU attention does
    for (uint pass = GGML != 0 ? 0 : 1; pass < 2; pass++) {
        const float inv = div_rn(1.0, l);
        for (uint j = 0; j < n_blocks; j++) {
            const uint c_ = SKIP != 0 ? cls[tile * (p.stride / BC) + j] : MIXED;
            if (c_ == MASKED) continue;
            barrier();                               // the last block's reads are done
            // the block's loads in a fixed number of steps (unrolled: a driver that bounds
            // loop iterations counts only the walk over blocks)
            [[unroll]] for (uint u = 0; u < KV_STEPS; u++) {
                const uint idx = t + u * WG;
                if (idx < BC * D4) {
                    const uint kp = j * BC + idx / D4;
                    const uint src = (kp * p.n_head_kv + kvh) * D4 + idx % D4;
                    ksh[idx] = kp < n_kv ? k4[src] : f16vec4(0.0);
                    if (pass == 1) vsh[idx] = kp < n_kv ? v4[src] : f16vec4(0.0);
                }
            }
            if (c_ != VISIBLE) {
                [[unroll]] for (uint u = 0; u < MASK_STEPS; u++) {
                    const uint idx = t + u * WG;
                    if (idx < BR * BC)
                        msh[idx] = mask[(tile * BR + idx / BC) * p.stride + j * BC + idx % BC];
                }
            }
            barrier();

            float s[BC];
            float mx = NEG;
            [[unroll]] for (uint c = 0; c < BC; c++) {
                float d = 0.0;
                [[unroll]] for (uint i = 0; i < DL; i++)
                    d += dot(qv[i], vec4(ksh[c * D4 + lane + LP * i]));
                LANES_ADD(d, LP);
                s[c] = soft_cap(d * p.scale, p.softcap);
                if (c_ != VISIBLE) s[c] += float(msh[r * BC + c]);
                mx = max(mx, s[c]);
            }
            if (GGML != 0 && pass == 1) {            // m and l are the row's final ones
                [[unroll]] for (uint c = 0; c < BC; c++) {
                    const float pr = f16_rne(exp(s[c] - m) * inv);
                    [[unroll]] for (uint i = 0; i < DL; i++)
                        acc[i] += pr * vec4(vsh[c * D4 + lane + LP * i]);
                }
                continue;
            }
            const float mn = max(m, mx);
            const float f = exp(m - mn);
            l *= f;
            if (pass == 1) {
                [[unroll]] for (uint i = 0; i < DL; i++) acc[i] *= f;
            }
            [[unroll]] for (uint c = 0; c < BC; c++) {
                const float e = exp(s[c] - mn);
                l += e;
                if (pass == 1) {
                    [[unroll]] for (uint i = 0; i < DL; i++)
                        acc[i] += e * vec4(vsh[c * D4 + lane + LP * i]);
                }
            }
            m = mn;
        }
    }
    if (row < p.n_tokens) {
        [[unroll]] for (uint i = 0; i < DL; i++)
            o4[qb + LP * i] = GGML != 0 ? acc[i] : acc[i] / l;
    }
}
