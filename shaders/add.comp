#version 450
// out = a + scale * b, b repeated every b_len elements (b_len = n: element-wise; a row length:
// a bias added to every row). The product is rounded before the sum, as ggml's scale then
// add (granite's residual scale); with scale 1 it is a + b.
#include "common.glsl"
layout(local_size_x = 64) in;
layout(std430, binding = 0) readonly buffer A { float a[]; };
layout(std430, binding = 1) readonly buffer B { float b[]; };
layout(std430, binding = 2) writeonly buffer O { float o[]; };
layout(push_constant) uniform Push { uint n; uint b_len; float scale; } p;

void main() {
    const uint i = gl_GlobalInvocationID.x + gl_GlobalInvocationID.y * gl_NumWorkGroups.x * gl_WorkGroupSize.x;
    if (i >= p.n) return;
    precise const float scaled = p.scale * b[i % p.b_len];
    precise const float sum = a[i] + scaled;
    o[i] = sum;
}
