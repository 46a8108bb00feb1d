#version 450
// y[t, j, r] = sum_k W[e, r, k] * x[t (, j), k]   with e = ids[t, j], the j-th expert routed
// for token t (ggml's mul_mat_id). The expert index is read here, on the device, so a recorded
// graph routes every token without the host seeing the choice.
// One workgroup per (tile of rows, slot j, token t); each subgroup owns ROWS rows of expert e
// and its lanes split K in units of 8 weights, as in mul_mat with one token. X_SLOT 0: every
// slot reads the token's row of x (gate, up); 1: slot j reads row t * n_used + j (down).
// W bound in parts holds whole experts; a dispatch whose part lacks e writes nothing.
#include "common.glsl"
#extension GL_KHR_shader_subgroup_arithmetic : require

layout(local_size_x_id = 0) in;
layout(constant_id = 1) const uint ROWS = 2;
layout(constant_id = 2) const uint ACT = 0;      // activation rounding, see mul_mat.comp
layout(constant_id = 3) const uint X_SLOT = 0;

#define WEIGHT_BINDING 0
#include "quant.glsl"
#include "act.glsl"
layout(std430, binding = 1) readonly buffer X { vec4 x4[]; };
layout(std430, binding = 2) readonly buffer Ids { uint ids[]; };
layout(std430, binding = 3) writeonly buffer Y { float y[]; };

layout(push_constant) uniform Push {
    uint n_in;         // K, a multiple of 32
    uint n_out;        // rows of one expert
    uint n_used;       // experts per token
    uint expert_base;  // first expert held by this part of W
    uint n_experts;    // experts in this part
} p;

void main() {
    const uint lane = gl_SubgroupInvocationID;
    const uint slot = gl_WorkGroupID.z * p.n_used + gl_WorkGroupID.y;
    const uint e = ids[slot] - p.expert_base;    // below the part it wraps past n_experts
    const uint row0 = (gl_WorkGroupID.x * gl_NumSubgroups + gl_SubgroupID) * ROWS;
    if (e >= p.n_experts || row0 >= p.n_out) return;
    const uint nb = p.n_in / 32;
    const uint n_units = nb * 4;
    const uint x0 = (X_SLOT != 0 ? slot : gl_WorkGroupID.z) * (p.n_in / 4);
    const uint w0 = e * p.n_out;

    float acc[ROWS];
    [[unroll]] for (uint r = 0; r < ROWS; r++) acc[r] = 0.0;

    for (uint u = lane; u < n_units; u += gl_SubgroupSize) {
        const uint ib = u >> 2, q = u & 3;
        vec4 xa = x4[x0 + ib * 8 + q];
        vec4 xb = x4[x0 + ib * 8 + 4 + q];
        float corr = 0.0;
        if (ACT != 0) corr = round_act(ACT, xa, xb);
        [[unroll]] for (uint r = 0; r < ROWS; r++) {
            const uint row = w0 + min(row0 + r, p.n_out - 1);
            vec4 lo, hi;
            dequant8(row * nb + ib, q, lo, hi);
            acc[r] += dot(lo, xa) + dot(hi, xb);
#if defined(HAS_BLOCK_MIN)
            if (ACT == 2 && q == 0) acc[r] += block_min(row * nb + ib) * corr;
#endif
        }
    }
    [[unroll]] for (uint r = 0; r < ROWS; r++) {
        const float s = subgroupAdd(acc[r]);
        if (lane == 0 && row0 + r < p.n_out) y[slot * p.n_out + row0 + r] = s;
    }
}
