#version 450
// out[t, c] = sum_k x[c, t + k] * w[c, k]    (ggml_ssm_conv: a causal depthwise convolution)
// x [n_channels, width - 1 + n_tokens]: per channel the conv state, then the new inputs;
// w [n_channels, width]. Summed in k order in f32, as ggml's CPU loop does.
#include "common.glsl"
layout(local_size_x = 64) in;
layout(std430, binding = 0) readonly buffer X { float x[]; };
layout(std430, binding = 1) readonly buffer Wt { float w[]; };
layout(std430, binding = 2) writeonly buffer O { float o[]; };
layout(push_constant) uniform Push {
    uint n_channels;
    uint n_tokens;
    uint width;      // kernel length (l_cache)
} p;

void main() {
    const uint c = gl_GlobalInvocationID.x, t = gl_WorkGroupID.y;
    if (c >= p.n_channels || t >= p.n_tokens) return;
    const uint row = c * (p.width - 1 + p.n_tokens) + t;
    float sum = 0.0;
    for (uint k = 0; k < p.width; k++) {
        sum += x[row + k] * w[c * p.width + k];
    }
    o[t * p.n_channels + c] = sum;
}
