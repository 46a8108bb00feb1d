#version 450
// Average pooling of a square grid of tokens: x holds side x side tokens of n_cols values,
// row-major (token y * side + x); out holds (side / K)^2 tokens, token oy * (side / K) + ox the
// mean of the K x K block at (K oy, K ox). ggml_pool_2d(AVG, K, K, stride K, no padding) over
// the grid as a [side, side, n_cols] image (Gemma 3's projector, 64 x 64 patches to 256 tokens).
#include "common.glsl"
layout(local_size_x = 64) in;
layout(constant_id = 0) const uint K = 4;
layout(std430, binding = 0) readonly buffer X { float x[]; };
layout(std430, binding = 1) writeonly buffer Out { float o[]; };
layout(push_constant) uniform Push {
    uint n_cols;
    uint side;         // tokens per row of the input grid
} p;

void main() {
    const uint i = gl_GlobalInvocationID.x + gl_GlobalInvocationID.y * gl_NumWorkGroups.x * 64;
    const uint out_side = p.side / K;
    if (i >= out_side * out_side * p.n_cols) return;
    const uint c = i % p.n_cols, t = i / p.n_cols;
    const uint oy = t / out_side, ox = t % out_side;
    float s = 0.0;
    for (uint dy = 0; dy < K; dy++)
        for (uint dx = 0; dx < K; dx++)
            s += x[((K * oy + dy) * p.side + K * ox + dx) * p.n_cols + c];
    o[i] = s / float(K * K);
}
