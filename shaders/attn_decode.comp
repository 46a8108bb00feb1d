#version 450
// Decode attention (one query token) in one pass: the visible KV range split across n_split
// workgroups per head as attn_split.comp splits it (include/split.glsl), each folding its
// positions into an online softmax and writing its max, its sum and its unnormalised output.
// The head's workgroup that finishes last (a counter per head, back to 0 after each token)
// then rescales the splits to their common max and divides by the total: no second dispatch.
// (attn_split's two passes normalise before P.V, which ggml's f16 probabilities need; this
// one does not.)
// LP adjacent lanes share a position, each taking every LP-th vec4 of the head.
// Options: scores soft-capped (softcap > 0), a sink logit per head (SINKS), as split.glsl says.
#include "common.glsl"
#extension GL_KHR_shader_subgroup_shuffle : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require

layout(local_size_x_id = 0) in;
layout(constant_id = 1) const uint HD = 64;         // head dim, a multiple of 4 * LP
layout(constant_id = 2) const uint LP = 4;          // lanes per position (<= SG)
layout(constant_id = 3) const uint SINKS = 0;

layout(std430, binding = 0) readonly buffer Q { vec4 q4[]; };       // [n_head, HD]
layout(std430, binding = 1) readonly buffer K { f16vec4 k4[]; };    // [n_ctx, n_head_kv, HD]
layout(std430, binding = 2) readonly buffer V { f16vec4 v4[]; };    // [n_ctx, n_head_kv, HD]
layout(std430, binding = 3) coherent buffer T { vec2 stats[]; };    // [n_head, n_split] max, sum
layout(std430, binding = 4) coherent buffer P { vec4 part[]; };     // [n_head, n_split, HD]
#include "step.glsl"
layout(std430, binding = 6) readonly buffer Sk { float sinks[]; };  // [n_head] (SINKS)
layout(std430, binding = 7) writeonly buffer O { vec4 o4[]; };      // [n_head, HD]
layout(std430, binding = 8) coherent buffer C { uint done[]; };     // [n_head] splits done
layout(push_constant) uniform Push {
    uint n_head;
    uint n_head_kv;
    uint window;       // 0: full causal attention
    uint n_split;
    uint min_chunk;
    float scale;
    float softcap;     // 0: none
} p;
#include "split.glsl"

const uint WG = gl_WorkGroupSize.x, G = WG / LP;    // position groups
shared vec2 red2[G];
shared vec4 red4[G * D4];
shared bool last;

void main() {
    const uint s = gl_WorkGroupID.x, h = gl_WorkGroupID.y;
    const uint t = gl_LocalInvocationIndex, lane = t % LP, g = t / LP;
    const uint pos = step.pos0;
    const uint kvh = h / (p.n_head / p.n_head_kv);
    const uvec2 ab = split_range(s, pos, p.window, p.n_split, p.min_chunk);
    const uint a = ab.x, b = ab.y;

    [[unroll]] for (uint i = 0; i < DL; i++) qv[i] = q4[h * D4 + lane + LP * i] * p.scale;
    float m = -1.0 / 0.0, l = 0.0;
    if (SINKS != 0 && s == 0 && g == 0) { m = sinks[h]; l = 1.0; }
    vec4 acc[DL];
    [[unroll]] for (uint i = 0; i < DL; i++) acc[i] = vec4(0.0);
    for (uint kp = a + g; kp < b; kp += G) {
        const uint kb = (kp * p.n_head_kv + kvh) * D4 + lane;
        const float d = soft_cap(qk_dot(kb), p.softcap);
        const float mn = max(m, d);
        const float c = exp(m - mn), e = exp(d - mn);
        l = l * c + e;
        [[unroll]] for (uint i = 0; i < DL; i++) acc[i] = acc[i] * c + e * vec4(v4[kb + LP * i]);
        m = mn;
    }
    // the groups' partial softmaxes, rescaled to the split's max
    if (lane == 0) red2[g] = vec2(m, l);
    barrier();
    float M = -1.0 / 0.0;
    for (uint i = 0; i < G; i++) M = max(M, red2[i].x);
    const float f = l > 0.0 ? exp(m - M) : 0.0;
    [[unroll]] for (uint i = 0; i < DL; i++) red4[g * D4 + lane + LP * i] = acc[i] * f;
    barrier();
    const uint st = h * p.n_split + s;
    if (t == 0) {
        float L = 0.0;
        for (uint i = 0; i < G; i++) {
            const vec2 x = red2[i];
            if (x.y > 0.0) L += x.y * exp(x.x - M);
        }
        stats[st] = vec2(M, L);
    }
    for (uint d = t; d < D4; d += WG) {
        vec4 sum = vec4(0.0);
        for (uint i = 0; i < G; i++) sum += red4[i * D4 + d];
        part[st * D4 + d] = sum;
    }
    // the head's last split to finish joins them all
    memoryBarrierBuffer();
    barrier();
    if (t == 0) last = atomicAdd(done[h], 1u) == p.n_split - 1;
    barrier();
    if (!last) return;
    memoryBarrierBuffer();
    const uint s0 = h * p.n_split;
    float M2 = -1.0 / 0.0;
    for (uint i = 0; i < p.n_split; i++) M2 = max(M2, stats[s0 + i].x);
    float L2 = 0.0;
    for (uint i = 0; i < p.n_split; i++) {
        const vec2 x = stats[s0 + i];
        if (x.y > 0.0) L2 += x.y * exp(x.x - M2);
    }
    for (uint d = t; d < D4; d += WG) {
        vec4 sum = vec4(0.0);
        for (uint i = 0; i < p.n_split; i++) {
            const vec2 x = stats[s0 + i];
            if (x.y > 0.0) sum += exp(x.x - M2) * part[(s0 + i) * D4 + d];
        }
        o4[h * D4 + d] = sum / L2;
    }
    if (t == 0) done[h] = 0u;
}
