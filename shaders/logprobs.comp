#version 450
// Log-softmax of one row of logits, for logprobs: out[0] = lse = log(sum(exp(x))), then the
// k largest logits as log-probabilities (x - lse), largest first, then their indices (lowest
// index first on ties, as argmax.comp). One workgroup: each lane keeps its k best of a
// strided slice, sorted; subgroups and shared memory join the maximum and the sum of
// exponentials; then k rounds take the best head among the lanes. Floats go out as bits.
#include "common.glsl"
#extension GL_KHR_shader_subgroup_arithmetic : require
#define TOP_MAX 20          // OpenAI's most top_logprobs (engine/residency/model.py's TOP_LOGPROBS)
#define MAX_SUBGROUPS 128   // a workgroup of up to 1024 lanes in subgroups of 8 or more
layout(local_size_x_id = 0) in;
layout(std430, binding = 0) readonly buffer X { float x[]; };
layout(std430, binding = 1) writeonly buffer O { uint o[]; };
layout(push_constant) uniform Push { uint n; uint x_offset; uint k; uint o_offset; } p;

shared float part_v[MAX_SUBGROUPS];
shared uint part_i[MAX_SUBGROUPS];

// The workgroup's best (value, index): the largest value, the lowest index among equals.
void best_of_all(inout float v, inout uint idx) {
    float m = subgroupMax(v);
    uint i = subgroupMin(v == m ? idx : 0xFFFFFFFFu);
    barrier();                                  // the last round's readers are done
    if (gl_SubgroupInvocationID == 0) {
        part_v[gl_SubgroupID] = m;
        part_i[gl_SubgroupID] = i;
    }
    barrier();
    m = part_v[0];
    i = part_i[0];
    for (uint g = 1; g < gl_NumSubgroups; g++) {
        if (part_v[g] > m || (part_v[g] == m && part_i[g] < i)) {
            m = part_v[g];
            i = part_i[g];
        }
    }
    v = m;
    idx = i;
}

float sum_of_all(float v) {
    float s = subgroupAdd(v);
    barrier();
    if (gl_SubgroupInvocationID == 0) part_v[gl_SubgroupID] = s;
    barrier();
    s = 0.0;
    for (uint g = 0; g < gl_NumSubgroups; g++) s += part_v[g];
    return s;
}

void main() {
    const uint k = min(p.k, TOP_MAX);
    float tv[TOP_MAX];
    uint ti[TOP_MAX];
    for (uint j = 0; j < TOP_MAX; j++) {
        tv[j] = -1.0 / 0.0;
        ti[j] = 0xFFFFFFFFu;
    }
    // this lane's k best, in order; a later equal value stays behind (its index is higher)
    for (uint i = gl_LocalInvocationID.x; i < p.n; i += gl_WorkGroupSize.x) {
        const float v = x[p.x_offset + i];
        if (k == 0 || !(v > tv[k - 1])) continue;
        uint j = k - 1;
        while (j > 0 && v > tv[j - 1]) {
            tv[j] = tv[j - 1];
            ti[j] = ti[j - 1];
            j--;
        }
        tv[j] = v;
        ti[j] = i;
    }
    // the maximum: the best of the lanes' own maxima (k >= 1), else a pass of its own
    float m = -1.0 / 0.0;
    if (k > 0) {
        m = tv[0];
    } else {
        for (uint i = gl_LocalInvocationID.x; i < p.n; i += gl_WorkGroupSize.x)
            m = max(m, x[p.x_offset + i]);
    }
    uint unused = 0;
    best_of_all(m, unused);
    float s = 0.0;
    for (uint i = gl_LocalInvocationID.x; i < p.n; i += gl_WorkGroupSize.x)
        s += exp(x[p.x_offset + i] - m);
    const float lse = m + log(sum_of_all(s));
    if (gl_LocalInvocationID.x == 0) o[p.o_offset] = floatBitsToUint(lse);
    // k rounds: the best head among the lanes goes out, its lane moves on to its next
    uint head = 0;
    for (uint r = 0; r < k; r++) {
        float v = head < k ? tv[head] : -1.0 / 0.0;
        uint idx = head < k ? ti[head] : 0xFFFFFFFFu;
        const uint mine = idx;
        best_of_all(v, idx);
        if (idx == mine && idx != 0xFFFFFFFFu) head++;
        if (gl_LocalInvocationID.x == 0) {
            o[p.o_offset + 1 + r] = floatBitsToUint(v - lse);
            o[p.o_offset + 1 + k + r] = idx;
        }
    }
}
