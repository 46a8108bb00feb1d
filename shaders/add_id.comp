#version 450
// out[r, :] = a[r, :] + b[ids[r], :] for rows r of n_cols (ggml_add_id): a row of b chosen by
// an id per row, as gpt-oss adds each routed expert's bias to its products (rows are
// (token, slot) pairs, ids the experts moe_router chose).
#include "common.glsl"
layout(local_size_x = 64) in;
layout(std430, binding = 0) readonly buffer A { float a[]; };      // [n_rows, n_cols]
layout(std430, binding = 1) readonly buffer B { float b[]; };      // [n_ids, n_cols]
layout(std430, binding = 2) readonly buffer I { uint ids[]; };     // [n_rows]
layout(std430, binding = 3) writeonly buffer O { float o[]; };     // [n_rows, n_cols]
layout(push_constant) uniform Push { uint n_cols; uint n; } p;     // n = n_rows * n_cols

void main() {
    const uint i = gl_GlobalInvocationID.x + gl_GlobalInvocationID.y * gl_NumWorkGroups.x * gl_WorkGroupSize.x;
    if (i >= p.n) return;
    const uint r = i / p.n_cols, c = i - r * p.n_cols;
    o[i] = a[i] + b[ids[r] * p.n_cols + c];
}
