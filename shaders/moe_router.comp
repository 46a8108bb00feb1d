#version 450
// Expert routing, one token per workgroup of one subgroup: the n_used largest router scores
// (largest first, lowest index on ties) into ids[t, :] and their weights into w[t, :].
// SOFTMAX_K = 0 (qwen3moe, mixtral): the scores are the softmax over all logits, the weights
//   those probabilities, divided by their sum when NORM.
// SOFTMAX_K = 1 (gpt-oss): the scores are the logits themselves, the weights the softmax
//   over the n_used chosen ones alone.
// Lane l owns experts l, l + SG, ...: no other lane reads them, so no barrier is needed.
#include "common.glsl"
#extension GL_KHR_shader_subgroup_arithmetic : require

layout(local_size_x_id = 0) in;
layout(constant_id = 1) const uint NORM = 1;
layout(constant_id = 2) const uint SOFTMAX_K = 0;
layout(std430, binding = 0) readonly buffer L { float logits[]; };
layout(std430, binding = 1) writeonly buffer I { uint ids[]; };
layout(std430, binding = 2) writeonly buffer Wt { float w[]; };
layout(push_constant) uniform Push {
    uint n_expert;     // at most MAX_EXPERT
    uint n_used;       // at most MAX_USED
} p;

const uint MAX_EXPERT = 512, MAX_USED = 32;
const float TAKEN = -1.0 / 0.0;          // below every score (logits are finite)
shared float prob[MAX_EXPERT];

void main() {
    const uint t = gl_WorkGroupID.x, lane = gl_SubgroupInvocationID;
    const uint base = t * p.n_expert;
    if (SOFTMAX_K != 0) {
        for (uint e = lane; e < p.n_expert; e += gl_SubgroupSize) prob[e] = logits[base + e];
    } else {
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
    }

    float top[MAX_USED];
    float sum = 0.0;
    for (uint j = 0; j < p.n_used; j++) {
        float best = TAKEN;
        uint best_e = 0xFFFFFFFFu;
        for (uint e = lane; e < p.n_expert; e += gl_SubgroupSize) {
            if (prob[e] > best) { best = prob[e]; best_e = e; }
        }
        const float v = subgroupMax(best);
        const uint pick = subgroupMin(best == v ? best_e : 0xFFFFFFFFu);
        if (pick % gl_SubgroupSize == lane) prob[pick] = TAKEN;
        if (lane == 0) ids[t * p.n_used + j] = pick;
        top[j] = v;
        sum += v;
    }
    if (lane != 0) return;
    if (SOFTMAX_K != 0) {
        // ggml_soft_max over the chosen logits: exp(x - max), times 1 / their sum
        const float m = top[0];
        float s = 0.0;
        for (uint j = 0; j < p.n_used; j++) {
            top[j] = exp(top[j] - m);
            s += top[j];
        }
        const float inv = 1.0 / s;
        for (uint j = 0; j < p.n_used; j++) w[t * p.n_used + j] = top[j] * inv;
        return;
    }
    // ggml clamps the sum at the smallest normal half before dividing
    const float div = NORM != 0 ? max(sum, 6.103515625e-5) : 1.0;
    for (uint j = 0; j < p.n_used; j++) w[t * p.n_used + j] = top[j] / div;
}
