#version 450
// out[r, i] = a[a_offset + r * a_stride + i] * f(b[b_offset + r * b_stride + i])
// (ggml_mul of two row views, e.g. the B and x chunks of one in_proj output)
#include "common.glsl"
layout(local_size_x = 64) in;
// SIGMOID = 1: f(b) = sigmoid(b) (a gate: qwen3next/qwen35's attention output gate and
// shared-expert gate); 0: f(b) = b
layout(constant_id = 0) const uint SIGMOID = 0;
// BCAST = 1: b holds one value per row, b[b_offset + r * b_stride], for every i
layout(constant_id = 1) const uint BCAST = 0;
layout(std430, binding = 0) readonly buffer A { float a[]; };
layout(std430, binding = 1) readonly buffer B { float b[]; };
layout(std430, binding = 2) writeonly buffer O { float o[]; };
layout(push_constant) uniform Push {
    uint n_cols;
    uint n_rows;
    uint a_offset;   // floats
    uint a_stride;
    uint b_offset;
    uint b_stride;
} p;

void main() {
    const uint i = gl_GlobalInvocationID.x, r = gl_WorkGroupID.y;
    if (i >= p.n_cols || r >= p.n_rows) return;
    float g = b[p.b_offset + r * p.b_stride + (BCAST != 0 ? 0 : i)];
    if (SIGMOID != 0) g = 1.0 / (1.0 + exp(-g));
    o[r * p.n_cols + i] = a[p.a_offset + r * p.a_stride + i] * g;
}
