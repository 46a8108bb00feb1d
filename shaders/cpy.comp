#version 450
// dst[dst_offset + r * dst_stride + i] = src[src_offset + r * src_stride + i]
// (ggml_cpy between row views: the last inputs of each channel become its conv state)
#include "common.glsl"
layout(local_size_x = 64) in;
layout(std430, binding = 0) readonly buffer S { float s[]; };
layout(std430, binding = 1) writeonly buffer D { float d[]; };
layout(push_constant) uniform Push {
    uint n_cols;
    uint n_rows;
    uint src_offset;   // floats
    uint src_stride;
    uint dst_offset;
    uint dst_stride;
} p;

void main() {
    const uint i = gl_GlobalInvocationID.x + gl_GlobalInvocationID.y * gl_NumWorkGroups.x * 64;
    if (i >= p.n_cols * p.n_rows) return;
    const uint r = i / p.n_cols, c = i % p.n_cols;
    d[p.dst_offset + r * p.dst_stride + c] = s[p.src_offset + r * p.src_stride + c];
}
