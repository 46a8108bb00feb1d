#version 450
// out[0] = argmax(x) (lowest index on ties, as llama.cpp's greedy sampler); one subgroup.
#include "common.glsl"
#extension GL_KHR_shader_subgroup_arithmetic : require
layout(local_size_x_id = 0) in;
layout(std430, binding = 0) readonly buffer X { float x[]; };
layout(std430, binding = 1) writeonly buffer O { uint o[]; };
layout(push_constant) uniform Push { uint n; uint x_offset; } p;

void main() {
    float best = -1.0 / 0.0;
    uint best_i = 0xFFFFFFFFu;
    for (uint i = gl_SubgroupInvocationID; i < p.n; i += gl_SubgroupSize) {
        const float v = x[p.x_offset + i];
        if (v > best) { best = v; best_i = i; }
    }
    const float m = subgroupMax(best);
    const uint idx = subgroupMin(best == m ? best_i : 0xFFFFFFFFu);
    if (gl_SubgroupInvocationID == 0) o[0] = idx;
}
