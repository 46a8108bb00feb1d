#version 450
// out[r, :] = (x[r, :] - mean) / sqrt(var + eps) * w + b    (one workgroup per row)
// ggml_norm then the weight and bias, as a vision encoder's LayerNorm: the biased variance
// of the row, from its mean first (two passes over the row, no cancellation).
#include "common.glsl"
#extension GL_KHR_shader_subgroup_arithmetic : require
layout(local_size_x_id = 0) in;
layout(std430, binding = 0) readonly buffer X { float x[]; };
layout(std430, binding = 1) readonly buffer Wt { float w[]; };
layout(std430, binding = 2) readonly buffer B { float bias[]; };
layout(std430, binding = 3) writeonly buffer Out { float o[]; };
layout(push_constant) uniform Push {
    uint n_cols;
    uint n_rows;
    float eps;
} p;

shared float sums[32];

float row_sum(float v) {
    v = subgroupAdd(v);
    if (gl_NumSubgroups > 1) {
        barrier();                                   // the last sum's reads are done
        if (gl_SubgroupInvocationID == 0) sums[gl_SubgroupID] = v;
        barrier();
        v = 0.0;
        for (uint g = 0; g < gl_NumSubgroups; g++) v += sums[g];
    }
    return v;
}

void main() {
    const uint r = gl_WorkGroupID.x;
    if (r >= p.n_rows) return;
    const uint base = r * p.n_cols;
    float s = 0.0;
    for (uint i = gl_LocalInvocationID.x; i < p.n_cols; i += gl_WorkGroupSize.x) s += x[base + i];
    const float mean = row_sum(s) / float(p.n_cols);
    float ss = 0.0;
    for (uint i = gl_LocalInvocationID.x; i < p.n_cols; i += gl_WorkGroupSize.x) {
        const float d = x[base + i] - mean;
        ss += d * d;
    }
    const float scale = 1.0 / sqrt(row_sum(ss) / float(p.n_cols) + p.eps);
    for (uint i = gl_LocalInvocationID.x; i < p.n_cols; i += gl_WorkGroupSize.x) {
        o[base + i] = (x[base + i] - mean) * scale * w[i] + bias[i];
    }
}
