#version 450
// x *= scale, in place (ggml_scale: granite's logits, divided by its logit scale).
#include "common.glsl"
layout(local_size_x = 64) in;
layout(std430, binding = 0) buffer X { float x[]; };
layout(push_constant) uniform Push { uint n; float scale; } p;

void main() {
    const uint i = gl_GlobalInvocationID.x + gl_GlobalInvocationID.y * gl_NumWorkGroups.x * gl_WorkGroupSize.x;
    if (i >= p.n) return;
    x[i] = x[i] * p.scale;
}
