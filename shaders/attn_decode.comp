#version 450
// Decode attention (one query token) in one pass: the visible KV range split across n_split
// workgroups per head as attn_split.comp splits it (include/split.glsl), each folding its
// positions into an online softmax and writing its max, its sum and its unnormalised output.
// The head's workgroup that finishes last (a counter per head, back to 0 after each token)
// then rescales the splits to their common max and divides by the total: no second dispatch.
// (attn_split's two passes normalise before P.V, which ggml's f16 probabilities need; this
// one does not.)
// LP adjacent lanes share a position, each taking every LP-th vec4 of the head. A workgroup
// takes QH query heads of one KV head (grouped-query attention): each K and V row is read
// once for all of them.
// Options: scores soft-capped (softcap > 0), a sink logit per head (SINKS), as split.glsl says.
// AHEAD = 1 loads a group's next K and V rows before it folds in the current ones, so their
// reads overlap the dot products and the softmax instead of following them.
#include "common.glsl"
#extension GL_KHR_shader_subgroup_shuffle : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require

layout(local_size_x_id = 0) in;
layout(constant_id = 1) const uint HD = 64;         // head dim, a multiple of 4 * LP
layout(constant_id = 2) const uint LP = 4;          // lanes per position (<= SG)
layout(constant_id = 3) const uint SINKS = 0;
layout(constant_id = 4) const uint QH = 1;          // query heads a workgroup takes, dividing
                                                    // the heads that share a KV head
layout(constant_id = 5) const uint AHEAD = 0;

layout(std430, binding = 0) readonly buffer Q { vec4 q4[]; };       // [n_head, HD]
layout(std430, binding = 1) readonly buffer K { f16vec4 k4[]; };    // [n_ctx, n_head_kv, HD]
layout(std430, binding = 2) readonly buffer V { f16vec4 v4[]; };    // [n_ctx, n_head_kv, HD]
layout(std430, binding = 3) coherent buffer T { vec2 stats[]; };    // [n_head, n_split] max, sum
layout(std430, binding = 4) coherent buffer P { vec4 part[]; };     // [n_head, n_split, HD]
#include "step.glsl"
layout(std430, binding = 6) readonly buffer Sk { float sinks[]; };  // [n_head] (SINKS)
layout(std430, binding = 7) writeonly buffer O { vec4 o4[]; };      // [n_head, HD]
layout(std430, binding = 8) coherent buffer C { uint done[]; };     // [n_head / QH] splits done
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
shared vec2 red2[QH * G];
shared vec4 red4[G * D4];
shared bool last;
vec4 qh[QH * DL];                  // this lane's part of each head's q (as split.glsl's qv)

void main() {
    const uint s = gl_WorkGroupID.x, h0 = gl_WorkGroupID.y * QH;
    const uint t = gl_LocalInvocationIndex, lane = t % LP, g = t / LP;
    const uint pos = step.pos0;
    const uint kvh = h0 / (p.n_head / p.n_head_kv);
    const uvec2 ab = split_range(s, pos, p.window, p.n_split, p.min_chunk);
    const uint a = ab.x, b = ab.y;

    [[unroll]] for (uint r = 0; r < QH; r++) {
        [[unroll]] for (uint i = 0; i < DL; i++)
            qh[r * DL + i] = q4[(h0 + r) * D4 + lane + LP * i] * p.scale;
    }
    float m[QH], l[QH];
    vec4 acc[QH * DL];
    [[unroll]] for (uint r = 0; r < QH; r++) {
        m[r] = -1.0 / 0.0;
        l[r] = 0.0;
        if (SINKS != 0 && s == 0 && g == 0) { m[r] = sinks[h0 + r]; l[r] = 1.0; }
        [[unroll]] for (uint i = 0; i < DL; i++) acc[r * DL + i] = vec4(0.0);
    }
    f16vec4 kn[DL], vn[DL];                // AHEAD: the next position's rows, in flight
    if (AHEAD != 0 && a + g < b) {
        const uint kb = ((a + g) * p.n_head_kv + kvh) * D4 + lane;
        [[unroll]] for (uint i = 0; i < DL; i++) {
            kn[i] = k4[kb + LP * i];
            vn[i] = v4[kb + LP * i];
        }
    }
    for (uint kp = a + g; kp < b; kp += G) {
        const uint kb = (kp * p.n_head_kv + kvh) * D4 + lane;
        vec4 kv[DL], vr[DL];
        if (AHEAD != 0) {
            [[unroll]] for (uint i = 0; i < DL; i++) { kv[i] = vec4(kn[i]); vr[i] = vec4(vn[i]); }
            if (kp + G < b) {
                const uint nb = kb + G * p.n_head_kv * D4;
                [[unroll]] for (uint i = 0; i < DL; i++) {
                    kn[i] = k4[nb + LP * i];
                    vn[i] = v4[nb + LP * i];
                }
            }
        } else {
            [[unroll]] for (uint i = 0; i < DL; i++) kv[i] = vec4(k4[kb + LP * i]);
        }
        float e[QH];
        [[unroll]] for (uint r = 0; r < QH; r++) {
            float d = 0.0;
            [[unroll]] for (uint i = 0; i < DL; i++) d += dot(qh[r * DL + i], kv[i]);
            LANES_ADD(d, LP);
            d = soft_cap(d, p.softcap);
            const float mn = max(m[r], d);
            const float c = exp(m[r] - mn);
            e[r] = exp(d - mn);
            l[r] = l[r] * c + e[r];
            [[unroll]] for (uint i = 0; i < DL; i++) acc[r * DL + i] *= c;
            m[r] = mn;
        }
        [[unroll]] for (uint i = 0; i < DL; i++) {
            const vec4 v = AHEAD != 0 ? vr[i] : vec4(v4[kb + LP * i]);
            [[unroll]] for (uint r = 0; r < QH; r++) acc[r * DL + i] += e[r] * v;
        }
    }
    // each head's groups' partial softmaxes, rescaled to the split's max, one head at a time
    // through the shared sums
    if (lane == 0) {
        [[unroll]] for (uint r = 0; r < QH; r++) red2[r * G + g] = vec2(m[r], l[r]);
    }
    barrier();
    [[unroll]] for (uint r = 0; r < QH; r++) {
        float M = -1.0 / 0.0;
        for (uint i = 0; i < G; i++) M = max(M, red2[r * G + i].x);
        const float f = l[r] > 0.0 ? exp(m[r] - M) : 0.0;
        [[unroll]] for (uint i = 0; i < DL; i++) red4[g * D4 + lane + LP * i] = acc[r * DL + i] * f;
        barrier();
        const uint st = (h0 + r) * p.n_split + s;
        if (t == 0) {
            float L = 0.0;
            for (uint i = 0; i < G; i++) {
                const vec2 x = red2[r * G + i];
                if (x.y > 0.0) L += x.y * exp(x.x - M);
            }
            stats[st] = vec2(M, L);
        }
        for (uint d = t; d < D4; d += WG) {
            vec4 sum = vec4(0.0);
            for (uint i = 0; i < G; i++) sum += red4[i * D4 + d];
            part[st * D4 + d] = sum;
        }
        barrier();
    }
    // the group's last split to finish joins them all
    memoryBarrierBuffer();
    barrier();
    if (t == 0) last = atomicAdd(done[gl_WorkGroupID.y], 1u) == p.n_split - 1;
    barrier();
    if (!last) return;
    memoryBarrierBuffer();
    for (uint r = 0; r < QH; r++) {
        const uint s0 = (h0 + r) * p.n_split;
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
            o4[(h0 + r) * D4 + d] = sum / L2;
        }
    }
    if (t == 0) done[gl_WorkGroupID.y] = 0u;
}
