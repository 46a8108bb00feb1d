#version 450
// out[r, :] = x[r, :] / sqrt(mean(x[r, :]^2) + eps) * w * silu(z[r, :])   (one workgroup per
// row): the gated RMS norm of a delta-net layer's output, per head (rows: token, v head).
#include "common.glsl"
#extension GL_KHR_shader_subgroup_arithmetic : require
layout(local_size_x_id = 0) in;
layout(std430, binding = 0) readonly buffer X { float x[]; };
layout(std430, binding = 1) readonly buffer Wt { float w[]; };
layout(std430, binding = 2) readonly buffer Z { float z[]; };
layout(std430, binding = 3) writeonly buffer Out { float o[]; };
layout(push_constant) uniform Push {
    uint n_cols;
    uint n_rows;
    float eps;
} p;

shared float sums[32];

void main() {
    const uint r = gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x;
    if (r >= p.n_rows) return;
    const uint base = r * p.n_cols;
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
        const float zi = z[base + i];
        o[base + i] = x[base + i] * scale * w[i] * (zi / (1.0 + exp(-zi)));
    }
}
