#version 450
// Decode attention (one query token) with the visible KV range split across n_split
// workgroups per head, in two passes; attn_combine.comp adds the splits' outputs.
// The splits and the walk over their keys are include/split.glsl's (as attn_decode.comp's);
// the token sits at position step.pos0.
// PASS 0: scores q.k * scale into `scores`, and the split's max and sum of exp(score - max)
//   into `stats`. LP adjacent lanes share a position, each taking every LP-th vec4 of the dot.
// PASS 1: the softmax over all splits (the max of their maxes, their sums rescaled to it),
//   p = exp(score - max) / sum, and the split's sum of p * v into `part`.
// Options: scores soft-capped (softcap > 0), a sink logit per head (SINKS), as split.glsl says.
#include "common.glsl"
#include "round.glsl"
#extension GL_KHR_shader_subgroup_shuffle : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require

layout(local_size_x_id = 0) in;
layout(constant_id = 1) const uint HD = 64;         // head dim, a multiple of 4 * LP
layout(constant_id = 2) const uint LP = 4;          // PASS 0: lanes per position (<= SG)
layout(constant_id = 3) const uint PASS = 0;
layout(constant_id = 4) const uint SINKS = 0;

layout(std430, binding = 0) readonly buffer Q { vec4 q4[]; };       // [n_head, HD]
layout(std430, binding = 1) readonly buffer K { f16vec4 k4[]; };    // [n_ctx, n_head_kv, HD]
layout(std430, binding = 2) readonly buffer V { f16vec4 v4[]; };    // [n_ctx, n_head_kv, HD]
layout(std430, binding = 3) buffer S { float scores[]; };           // [n_head, n_ctx]
layout(std430, binding = 4) buffer T { vec2 stats[]; };             // [n_head, n_split] max, sum
layout(std430, binding = 5) writeonly buffer P { vec4 part[]; };    // [n_head, n_split, HD]
#include "step.glsl"
layout(std430, binding = 7) readonly buffer Sk { float sinks[]; };  // [n_head] (SINKS)
layout(push_constant) uniform Push {
    uint n_head;
    uint n_head_kv;
    uint n_ctx;
    uint window;       // 0: full causal attention
    uint n_split;
    uint min_chunk;
    float scale;
    float softcap;     // 0: none
} p;
#include "split.glsl"

const uint WG = gl_WorkGroupSize.x;
shared vec2 red2[WG];
shared vec4 red4[WG];

void main() {
    const uint s = gl_WorkGroupID.x, h = gl_WorkGroupID.y;
    const uint t = gl_LocalInvocationIndex;
    const uint pos = step.pos0;
    const uint kvh = h / (p.n_head / p.n_head_kv);
    const uvec2 ab = split_range(s, pos, p.window, p.n_split, p.min_chunk);
    const uint a = ab.x, b = ab.y;
    const uint st = h * p.n_split;

    if (PASS == 0) {
        const uint G = WG / LP;
        const uint lane = t % LP, g = t / LP;
        [[unroll]] for (uint i = 0; i < DL; i++) qv[i] = q4[h * D4 + lane + LP * i];
        float m = -1.0 / 0.0, l = 0.0;
        if (SINKS != 0 && s == 0 && g == 0) { m = sinks[h]; l = 1.0; }
        for (uint kp = a + g; kp < b; kp += G) {
            const float sc = soft_cap(qk_dot((kp * p.n_head_kv + kvh) * D4 + lane) * p.scale,
                                      p.softcap);
            if (lane == 0) scores[h * p.n_ctx + kp] = sc;
            const float mn = max(m, sc);
            l = l * exp(m - mn) + exp(sc - mn);
            m = mn;
        }
        red2[t] = vec2(m, l);
        barrier();
        if (t == 0) {
            float M = -1.0 / 0.0;
            for (uint i = 0; i < G; i++) M = max(M, red2[i * LP].x);
            float L = 0.0;
            for (uint i = 0; i < G; i++) {
                const vec2 x = red2[i * LP];
                if (x.y > 0.0) L += x.y * exp(x.x - M);
            }
            stats[st + s] = vec2(M, L);
        }
        return;
    }

    // PASS 1: NS position slots of TS threads; a thread owns every TS-th vec4 of the head.
    const uint NS = WG >= D4 ? WG / D4 : 1, TS = WG >= D4 ? D4 : WG;
    const uint DV = (D4 + TS - 1) / TS;
    const uint g = t / TS, u = t % TS;
    float M = -1.0 / 0.0;
    for (uint i = 0; i < p.n_split; i++) M = max(M, stats[st + i].x);
    float L = 0.0;
    for (uint i = 0; i < p.n_split; i++) {
        const vec2 x = stats[st + i];
        if (x.y > 0.0) L += x.y * exp(x.x - M);
    }
    const float inv = div_rn(1.0, L);
    vec4 acc[DV];
    [[unroll]] for (uint i = 0; i < DV; i++) acc[i] = vec4(0.0);
    if (g < NS) {
        for (uint kp = a + g; kp < b; kp += NS) {
            const float pr = exp(scores[h * p.n_ctx + kp] - M) * inv;
            const uint vb = (kp * p.n_head_kv + kvh) * D4 + u;
            [[unroll]] for (uint i = 0; i < DV; i++) {
                if (u + TS * i < D4) acc[i] += pr * vec4(v4[vb + TS * i]);
            }
        }
    }
    [[unroll]] for (uint i = 0; i < DV; i++) {
        barrier();
        red4[t] = acc[i];
        barrier();
        if (g == 0 && u + TS * i < D4) {
            vec4 sum = red4[u];
            for (uint k = 1; k < NS; k++) sum += red4[k * TS + u];
            part[(st + s) * D4 + u + TS * i] = sum;
        }
    }
}
