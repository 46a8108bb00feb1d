#version 450
// Causal attention with grouped-query heads over an f16 KV cache.
// One subgroup per (query head, query token): each lane walks every SG-th key with an online
// softmax (running max, sum and output), then the lanes are merged with subgroup operations,
// so no shared memory and no barrier. Token t sits at position step.pos0 + t and sees keys
// 0..pos (all of the pass where step.bidir is set), or only the last WINDOW of them when
// window > 0 (sliding-window layers); with
// SEQS = 1 none before step.seq_first[t], the first slot of its own sequence (packed passes).
// Options (include/attn.glsl): scores soft-capped (softcap > 0), a sink logit per head (SINKS).
#include "common.glsl"
#include "round.glsl"
#extension GL_KHR_shader_subgroup_arithmetic : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require

layout(local_size_x_id = 0) in;
layout(constant_id = 1) const uint HD = 64;         // head dim, a multiple of 4
// GGML = 1 follows ggml's CPU arithmetic instead of the online softmax: q rounded to f16,
// the full-row softmax in f32 (max, then sum), probabilities rounded to f16 before P.V.
layout(constant_id = 2) const uint GGML = 0;
layout(constant_id = 3) const uint SINKS = 0;
layout(constant_id = 4) const uint SEQS = 0;

layout(std430, binding = 0) readonly buffer Q { vec4 q4[]; };       // [n_tokens, n_head, HD]
layout(std430, binding = 1) readonly buffer K { f16vec4 k4[]; };    // [n_ctx, n_head_kv, HD]
layout(std430, binding = 2) readonly buffer V { f16vec4 v4[]; };    // [n_ctx, n_head_kv, HD]
layout(std430, binding = 3) writeonly buffer O { vec4 o4[]; };      // [n_tokens, n_head, HD]
#include "step.glsl"
layout(std430, binding = 5) readonly buffer Sk { float sinks[]; };  // [n_head] (SINKS)
layout(push_constant) uniform Push {
    uint n_head;
    uint n_head_kv;
    uint n_tokens;
    uint window;       // 0: full causal attention
    float scale;
    float softcap;     // 0: none
} p;
#include "attn.glsl"

const uint D4 = HD / 4;

void main() {
    const uint h = gl_WorkGroupID.x, t = gl_WorkGroupID.y;
    if (t >= p.n_tokens) return;
    const uint lane = gl_SubgroupInvocationID;
    const uint pos = step.pos0 + t;
    const uint last = step.bidir != 0 ? step.n_past - 1 : pos;     // its last key
    const uint kvh = h / (p.n_head / p.n_head_kv);
    const uint wfirst = (p.window > 0 && pos >= p.window) ? pos - p.window + 1 : 0;
    const uint first = SEQS != 0 ? max(wfirst, step.seq_first[t]) : wfirst;

    vec4 qv[D4];
    const uint qb = (t * p.n_head + h) * D4;
    const uint ob = (t * p.n_head + h) * D4;
    if (GGML != 0) {
        [[unroll]] for (uint d = 0; d < D4; d++) qv[d] = f16_rne(q4[qb + d]);
        float mx = -1.0 / 0.0;
        for (uint kp = first + lane; kp <= last; kp += gl_SubgroupSize) {
            const uint kb = (kp * p.n_head_kv + kvh) * D4;
            float s = 0.0;
            [[unroll]] for (uint d = 0; d < D4; d++) s += dot(qv[d], vec4(k4[kb + d]));
            mx = max(mx, soft_cap(s * p.scale, p.softcap));
        }
        mx = subgroupMax(mx);
        if (SINKS != 0) mx = max(mx, sinks[h]);
        float sum = 0.0;
        for (uint kp = first + lane; kp <= last; kp += gl_SubgroupSize) {
            const uint kb = (kp * p.n_head_kv + kvh) * D4;
            float s = 0.0;
            [[unroll]] for (uint d = 0; d < D4; d++) s += dot(qv[d], vec4(k4[kb + d]));
            sum += exp(soft_cap(s * p.scale, p.softcap) - mx);
        }
        const float inv = div_rn(1.0, subgroupAdd(sum) + (SINKS != 0 ? exp(sinks[h] - mx) : 0.0));
        vec4 acc[D4];
        [[unroll]] for (uint d = 0; d < D4; d++) acc[d] = vec4(0.0);
        for (uint kp = first + lane; kp <= last; kp += gl_SubgroupSize) {
            const uint kb = (kp * p.n_head_kv + kvh) * D4;
            float s = 0.0;
            [[unroll]] for (uint d = 0; d < D4; d++) s += dot(qv[d], vec4(k4[kb + d]));
            const float pr = f16_rne(exp(soft_cap(s * p.scale, p.softcap) - mx) * inv);
            [[unroll]] for (uint d = 0; d < D4; d++) acc[d] += pr * vec4(v4[kb + d]);
        }
        [[unroll]] for (uint d = 0; d < D4; d++) {
            const vec4 tot = subgroupAdd(acc[d]);
            if (lane == 0) o4[ob + d] = tot;
        }
        return;
    }
    [[unroll]] for (uint d = 0; d < D4; d++) qv[d] = q4[qb + d] * p.scale;

    float m = -1.0 / 0.0, l = 0.0;
    if (SINKS != 0 && lane == 0) { m = sinks[h]; l = 1.0; }
    vec4 acc[D4];
    [[unroll]] for (uint d = 0; d < D4; d++) acc[d] = vec4(0.0);

    for (uint kp = first + lane; kp <= last; kp += gl_SubgroupSize) {
        const uint kb = (kp * p.n_head_kv + kvh) * D4;
        float s = 0.0;
        [[unroll]] for (uint d = 0; d < D4; d++) s += dot(qv[d], vec4(k4[kb + d]));
        s = soft_cap(s, p.softcap);
        const float mn = max(m, s);
        const float c = exp(m - mn), e = exp(s - mn);
        l = l * c + e;
        [[unroll]] for (uint d = 0; d < D4; d++) acc[d] = acc[d] * c + e * vec4(v4[kb + d]);
        m = mn;
    }
    const float M = subgroupMax(m);
    const float f = (l > 0.0) ? exp(m - M) : 0.0;
    const float L = subgroupAdd(l * f);
    [[unroll]] for (uint d = 0; d < D4; d++) {
        const vec4 sum = subgroupAdd(acc[d] * f);
        if (lane == 0) o4[ob + d] = sum / L;
    }
}
