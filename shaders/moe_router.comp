#version 450
// Expert routing, one token per workgroup of one subgroup: softmax over the router logits,
// the n_used most probable experts (largest first, lowest index on ties) into ids[t, :], and
// their probabilities into w[t, :], divided by their sum when NORM (qwen3moe, mixtral).
// Lane l owns experts l, l + SG, ...: no other lane reads them, so no barrier is needed.
#include "common.glsl"
#extension GL_KHR_shader_subgroup_arithmetic : require

layout(local_size_x_id = 0) in;
layout(constant_id = 1) const uint NORM = 1;
layout(std430, binding = 0) readonly buffer L { float logits[]; };
layout(std430, binding = 1) writeonly buffer I { uint ids[]; };
layout(std430, binding = 2) writeonly buffer Wt { float w[]; };
layout(push_constant) uniform Push {
    uint n_expert;     // at most MAX_EXPERT
    uint n_used;       // at most MAX_USED
} p;

const uint MAX_EXPERT = 512, MAX_USED = 32;
shared float prob[MAX_EXPERT];

void main() {
    const uint t = gl_WorkGroupID.x, lane = gl_SubgroupInvocationID;
    const uint base = t * p.n_expert;
    float m = -1.0 / 0.0;
    for (uint e = lane; e < p.n_expert; e += gl_SubgroupSize) m = max(m, logits[base + e]);
    m = subgroupMax(m);
    float s = 0.0;
    for (uint e = lane; e < p.n_expert; e += gl_SubgroupSize) {
        prob[e] = exp(logits[base + e] - m);
        s += prob[e];
    }
    const float inv = 1.0 / subgroupAdd(s);
    for (uint e = lane; e < p.n_expert; e += gl_SubgroupSize) prob[e] *= inv;

    float top[MAX_USED];
    float sum = 0.0;
    for (uint j = 0; j < p.n_used; j++) {
        float best = -1.0;                   // below every probability
        uint best_e = 0xFFFFFFFFu;
        for (uint e = lane; e < p.n_expert; e += gl_SubgroupSize) {
            if (prob[e] > best) { best = prob[e]; best_e = e; }
        }
        const float v = subgroupMax(best);
        const uint pick = subgroupMin(best == v ? best_e : 0xFFFFFFFFu);
        if (pick % gl_SubgroupSize == lane) prob[pick] = -2.0;   // taken
        if (lane == 0) ids[t * p.n_used + j] = pick;
        top[j] = v;
        sum += v;
    }
    // ggml clamps the sum at the smallest normal half before dividing
    const float div = NORM != 0 ? max(sum, 6.103515625e-5) : 1.0;
    if (lane == 0) {
        for (uint j = 0; j < p.n_used; j++) w[t * p.n_used + j] = top[j] / div;
    }
}
