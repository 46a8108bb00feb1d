#version 450
// out[r, :] = x[r, :] / sqrt(mean(x[r, :]^2) + eps) * w    (one workgroup per row)
// ADD = 1: out[r, :] += that (a post-norm's output onto the residual, gemma and olmo2)
// The lanes of a workgroup sum strided squares; the subgroups' sums meet in shared memory.
#include "common.glsl"
#extension GL_KHR_shader_subgroup_arithmetic : require
layout(local_size_x_id = 0) in;
layout(constant_id = 1) const uint ADD = 0;
layout(std430, binding = 0) readonly buffer X { float x[]; };
layout(std430, binding = 1) readonly buffer Wt { float w[]; };
layout(std430, binding = 2) buffer Out { float o[]; };
layout(push_constant) uniform Push {
    uint n_cols;
    uint n_rows;
    float eps;
    uint x_offset;   // rows to skip in x and out (the last-token-only head)
} p;

shared float sums[32];

void main() {
    const uint r = gl_WorkGroupID.x;
    if (r >= p.n_rows) return;
    const uint base = (r + p.x_offset) * p.n_cols;
    float ss = 0.0;
    for (uint i = gl_LocalInvocationID.x; i < p.n_cols; i += gl_WorkGroupSize.x) {
        const float v = x[base + i];
        ss += v * v;
    }
    ss = subgroupAdd(ss);
    if (gl_NumSubgroups > 1) {
        if (gl_SubgroupInvocationID == 0) sums[gl_SubgroupID] = ss;
        barrier();
        ss = 0.0;
        for (uint g = 0; g < gl_NumSubgroups; g++) ss += sums[g];
    }
    const float scale = 1.0 / sqrt(ss / float(p.n_cols) + p.eps);
    for (uint i = gl_LocalInvocationID.x; i < p.n_cols; i += gl_WorkGroupSize.x) {
        const float y = x[base + i] * scale * w[i];
        o[base + i] = ADD != 0 ? o[base + i] + y : y;
    }
}
