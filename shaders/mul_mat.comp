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
    const uint n_units = nb * 4;
    const uint xs = p.n_in / 4;     // x row stride in vec4

    float acc[ROWS * NT];
    [[unroll]] for (uint i = 0; i < ROWS * NT; i++) acc[i] = 0.0;

    for (uint u = lane; u < n_units; u += gl_SubgroupSize) {
        const uint ib = u >> 2, q = u & 3;
        vec4 xa[NT], xb[NT];
        [[unroll]] for (uint t = 0; t < NT; t++) {
            const uint tt = min(t0 + t, p.n_tokens - 1);
            const uint xo = p.x_offset + tt * xs + ib * 8 + q;
            xa[t] = x4[xo];
            xb[t] = x4[xo + 4];
        }
        float corr[NT];
        if (ACT != 0) {
            [[unroll]] for (uint t = 0; t < NT; t++) corr[t] = round_act(ACT, xa[t], xb[t]);
        }
        [[unroll]] for (uint r = 0; r < ROWS; r++) {
            const uint row = min(row0 + r, p.n_out - 1) + p.row_offset;
            vec4 lo, hi;
            dequant8(row * nb + ib, q, lo, hi);
            [[unroll]] for (uint t = 0; t < NT; t++) {
                acc[r * NT + t] += dot(lo, xa[t]) + dot(hi, xb[t]);
            }
#if defined(TYPE_Q4_1)
            if (ACT == 2 && q == 0) {
                const float m = block_min(row * nb + ib);
                [[unroll]] for (uint t = 0; t < NT; t++) acc[r * NT + t] += m * corr[t];
            }
#endif
        }
    }
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
