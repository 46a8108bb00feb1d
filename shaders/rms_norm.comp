#version 450
// out[r, :] = x[r, :] / sqrt(mean(x[r, :]^2) + eps) * w    (one workgroup per row)
// ADD = 1: out[r, :] += that (a post-norm's output onto the residual, gemma and olmo2)
// OUT16 = 1: out's rows as f16 too, from o16[0] on (x_offset 0): the products after it that
// load x as f16 tiles (mul_mat_cm2's X16) need no to_f16 pass of their own
// The lanes of a workgroup sum strided squares; the subgroups' sums meet in shared memory.
#include "common.glsl"
#extension GL_KHR_shader_subgroup_arithmetic : require
#extension GL_EXT_shader_16bit_storage : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
layout(local_size_x_id = 0) in;
layout(constant_id = 1) const uint ADD = 0;
layout(constant_id = 2) const uint OUT16 = 0;
layout(std430, binding = 0) readonly buffer X { float x[]; };
layout(std430, binding = 1) readonly buffer Wt { float w[]; };
layout(std430, binding = 2) buffer Out { float o[]; };
layout(std430, binding = 3) writeonly buffer Out16 { float16_t o16[]; };
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
        const float v = ADD != 0 ? o[base + i] + y : y;
        o[base + i] = v;
        if (OUT16 != 0)
            o16[r * p.n_cols + i] = float16_t(v);
    }
}
