#version 450
// x = cap * tanh(x / cap), in place: gemma2's final logit soft-capping (ggml scales by 1 / cap,
// takes tanh, scales by cap). tanh's argument is clamped as include/attn.glsl's soft_cap's.
#include "common.glsl"
layout(local_size_x = 64) in;
layout(std430, binding = 0) buffer X { float x[]; };
layout(push_constant) uniform Push { uint n; float cap; } p;

void main() {
    const uint i = gl_GlobalInvocationID.x + gl_GlobalInvocationID.y * gl_NumWorkGroups.x * gl_WorkGroupSize.x;
    if (i >= p.n) return;
    x[i] = tanh(clamp(x[i] * (1.0 / p.cap), -15.0, 15.0)) * p.cap;
}
