#version 450
// x[t, i] += sum_j w[t, j] * y[t, j, i]: the routed experts' outputs, weighted and summed in
// slot order as ggml sums them, then added into the residual stream.
#include "common.glsl"
layout(local_size_x = 64) in;
layout(std430, binding = 0) readonly buffer Y { float y[]; };
layout(std430, binding = 1) readonly buffer Wt { float w[]; };
layout(std430, binding = 2) buffer X { float x[]; };
layout(push_constant) uniform Push {
    uint n_embd;
    uint n_used;
    uint n;            // n_tokens * n_embd
} p;

void main() {
    const uint i = gl_GlobalInvocationID.x + gl_GlobalInvocationID.y * gl_NumWorkGroups.x * gl_WorkGroupSize.x;
    if (i >= p.n) return;
    const uint t = i / p.n_embd, c = i - t * p.n_embd;
    const uint s0 = t * p.n_used;
    float acc = y[s0 * p.n_embd + c] * w[s0];
    for (uint j = 1; j < p.n_used; j++) acc += y[(s0 + j) * p.n_embd + c] * w[s0 + j];
    x[i] = acc + x[i];
}
