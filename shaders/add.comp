#version 450
// out = a + b, b repeated every b_len elements (b_len = n: element-wise; a row length: a
// bias added to every row)
#include "common.glsl"
layout(local_size_x = 64) in;
layout(std430, binding = 0) readonly buffer A { float a[]; };
layout(std430, binding = 1) readonly buffer B { float b[]; };
layout(std430, binding = 2) writeonly buffer O { float o[]; };
layout(push_constant) uniform Push { uint n; uint b_len; } p;

void main() {
    const uint i = gl_GlobalInvocationID.x + gl_GlobalInvocationID.y * gl_NumWorkGroups.x * gl_WorkGroupSize.x;
    if (i >= p.n) return;
    o[i] = a[i] + b[i % p.b_len];
}
