#version 450
// y[t, r] (+)= sum_k W[r, k] * x[t, k]   for a tile of ROWS weight rows x NT tokens.
// Each subgroup of the workgroup owns its own tile: lanes split the K dimension in units of
// 8 weights and the tile stays in registers, so there is no shared memory and no barrier.
// Each weight unit is dequantized once per NT tokens. NT = 1 is the decode matrix-vector
// product.
// ACT rounds x on the fly as ggml's CPU backend rounds activations for this weight type
// (include/act.glsl): 1 = Q8_0, 2 = Q8_1 blocks of 32.
#include "common.glsl"
#extension GL_KHR_shader_subgroup_arithmetic : require

layout(local_size_x_id = 0) in;
layout(constant_id = 1) const uint ROWS = 2;
layout(constant_id = 2) const uint NT = 1;
layout(constant_id = 3) const uint ACC = 0;      // 1: add into y (fused residual add)
layout(constant_id = 4) const uint ACT = 0;      // activation rounding, see above

#define WEIGHT_BINDING 0
#include "quant.glsl"
#include "act.glsl"
layout(std430, binding = 1) readonly buffer X { vec4 x4[]; };
layout(std430, binding = 2) buffer Y { float y[]; };
#include "tile.glsl"

layout(push_constant) uniform Push {
    uint n_in;       // K, a multiple of 32
    uint n_out;      // rows of W
    uint n_tokens;
    uint x_offset;   // in vec4 units: first token row to read
    uint y_offset;   // in floats
    uint row_offset; // first weight row (in rows) of this dispatch
    uint y_stride;   // floats between token rows of y (n_out unless W comes in parts)
} p;

void main() {
    const uint lane = gl_SubgroupInvocationID;
    const uint row0 = (gl_WorkGroupID.x * gl_NumSubgroups + gl_SubgroupID) * ROWS;
    const uint t0 = gl_WorkGroupID.y * NT;
    if (row0 >= p.n_out) return;
    const uint nb = p.n_in / 32;
    const uint xs = p.n_in / 4;     // x row stride in vec4

    [[unroll]] for (uint i = 0; i < ROWS * NT; i++) acc[i] = 0.0;

    [[unroll]] for (uint r = 0; r < ROWS; r++) wrow[r] = min(row0 + r, p.n_out - 1) + p.row_offset;
    [[unroll]] for (uint t = 0; t < NT; t++) {
        xrow[t] = p.x_offset + min(t0 + t, p.n_tokens - 1) * xs;
    }
    tile_dot(nb);
    [[unroll]] for (uint r = 0; r < ROWS; r++) {
        [[unroll]] for (uint t = 0; t < NT; t++) {
            const float s = subgroupAdd(acc[r * NT + t]);
            const uint row = row0 + r, tok = t0 + t;
            if (lane == 0 && row < p.n_out && tok < p.n_tokens) {
                const uint o = p.y_offset + tok * p.y_stride + row;
                y[o] = ACC != 0 ? y[o] + s : s;
            }
        }
    }
}
