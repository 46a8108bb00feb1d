#version 450
// Log-softmax of one row of logits, for logprobs: out[0] = lse = log(sum(exp(x))), then the
// k largest logits as log-probabilities (x - lse), largest first, then their indices (lowest
// index first on ties, as argmax.comp). One workgroup, one pass over x: each lane keeps its
// running max and sum of exponentials and its TOP_MAX best of a strided slice, sorted (the
// insertion is unrolled: a driver that bounds loop iterations counts one loop a value);
// subgroups and shared memory join the lanes' sums; then k rounds take the best head among
// the lanes. Floats go out as bits.
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
    [[unroll]] for (uint j = 0; j < TOP_MAX; j++) {
        tv[j] = -1.0 / 0.0;
        ti[j] = 0xFFFFFFFFu;
    }
    float m = -1.0 / 0.0, s = 0.0;      // this lane's max and sum of exp(x - m)
    for (uint i = gl_LocalInvocationID.x; i < p.n; i += gl_WorkGroupSize.x) {
        const float v = x[p.x_offset + i];
        if (v > m) {
            s = s * exp(m - v) + 1.0;
            m = v;
        } else if (v > -1.0 / 0.0) {
            s += exp(v - m);
        }
        // into this lane's sorted list; an equal value stays behind (its index is higher)
        if (v > tv[TOP_MAX - 1]) {
            float cv = v;
            uint ci = i;
            [[unroll]] for (uint j = 0; j < TOP_MAX; j++) {
                if (cv > tv[j]) {
                    const float tf = tv[j];
                    const uint tu = ti[j];
                    tv[j] = cv;
                    ti[j] = ci;
                    cv = tf;
                    ci = tu;
                }
            }
        }
    }
    float mx = m;
    uint unused = 0;
    best_of_all(mx, unused);
    const float lse = mx + log(sum_of_all(s > 0.0 ? s * exp(m - mx) : 0.0));
    if (gl_LocalInvocationID.x == 0) o[p.o_offset] = floatBitsToUint(lse);
    // k rounds: the best head among the lanes goes out, its lane moves on to its next
    uint head = 0;
    for (uint r = 0; r < k; r++) {
        float v = head < TOP_MAX ? tv[head] : -1.0 / 0.0;
        uint idx = head < TOP_MAX ? ti[head] : 0xFFFFFFFFu;
        const uint mine = idx;
        best_of_all(v, idx);
        if (idx == mine && idx != 0xFFFFFFFFu) head++;
        if (gl_LocalInvocationID.x == 0) {
            o[p.o_offset + 1 + r] = floatBitsToUint(v - lse);
            o[p.o_offset + 1 + k + r] = idx;
        }
    }
}
