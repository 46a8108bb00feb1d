#version 450
// out[0] = argmax(x) (lowest index on ties, as llama.cpp's greedy sampler); one workgroup:
// each lane keeps its best over a strided slice, subgroups reduce, shared memory joins them.
// A NaN or +inf anywhere (or nothing above -inf) gives 0xFFFFFFFF: the host then stops the
// request instead of taking an index the comparisons happened to leave. The test is on the
// bits (an exponent of all ones, other than -inf), which no fast-math setting folds away.
#include "common.glsl"
#extension GL_KHR_shader_subgroup_arithmetic : require
#extension GL_KHR_shader_subgroup_vote : require
layout(local_size_x_id = 0) in;
layout(std430, binding = 0) readonly buffer X { float x[]; };
layout(std430, binding = 1) writeonly buffer O { uint o[]; };
layout(push_constant) uniform Push { uint n; uint x_offset; } p;

shared float best_v[32];
shared uint best_at[32];
shared bool any_bad[32];

void main() {
    float best = -1.0 / 0.0;
    uint best_i = 0xFFFFFFFFu;
    bool bad = false;
    for (uint i = gl_LocalInvocationID.x; i < p.n; i += gl_WorkGroupSize.x) {
        const float v = x[p.x_offset + i];
        const uint bits = floatBitsToUint(v);
        bad = bad || ((bits & 0x7F800000u) == 0x7F800000u && bits != 0xFF800000u);
        if (v > best) { best = v; best_i = i; }
    }
    float m = subgroupMax(best);
    uint idx = subgroupMin(best == m ? best_i : 0xFFFFFFFFu);
    bad = subgroupAny(bad);
    if (gl_NumSubgroups > 1) {
        if (gl_SubgroupInvocationID == 0) {
            best_v[gl_SubgroupID] = m;
            best_at[gl_SubgroupID] = idx;
            any_bad[gl_SubgroupID] = bad;
        }
        barrier();
        m = best_v[0];
        idx = best_at[0];
        bad = any_bad[0];
        for (uint g = 1; g < gl_NumSubgroups; g++) {
            bad = bad || any_bad[g];
            if (best_v[g] > m || (best_v[g] == m && best_at[g] < idx)) {
                m = best_v[g];
                idx = best_at[g];
            }
        }
    }
    if (gl_LocalInvocationID.x == 0) o[0] = bad ? 0xFFFFFFFFu : idx;
}
