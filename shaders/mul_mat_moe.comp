#version 450
// y[s, r] = sum_k W[e, r, k] * x[t (or s), k]   for every slot s = t * n_used + j routed to
// expert e: the batched expert product of prefill, each expert's weights read once per NT of
// its tokens (mul_mat_id, decode's, reads them once per token). moe_group lists each expert's
// slots (perm) and their (offset, count) in groups.
// Workgroups are (row tiles, tiles of NT slots): workgroup y takes the y-th tile that moe_tiles
// listed for this part of W's experts (moe_tile.glsl), those past them exit at once. Each
// subgroup owns ROWS rows x NT slots of the tile's expert, the x rows gathered through perm,
// and splits K as mul_mat's tiles do (the same sums in the same order, so the same results).
// y stays in slot order, [n_tokens, n_used, n_out], for moe_combine.
// X_SLOT 0: a slot reads its token's row of x (gate, up); 1: its own row s (down).
// W bound in parts holds whole experts, expert_base and n_experts of them.
#include "common.glsl"
#extension GL_KHR_shader_subgroup_arithmetic : require

layout(local_size_x_id = 0) in;
layout(constant_id = 1) const uint ROWS = 2;
layout(constant_id = 2) const uint NT = 8;
layout(constant_id = 3) const uint ACT = 0;      // activation rounding, see mul_mat.comp
layout(constant_id = 4) const uint X_SLOT = 0;

#define WEIGHT_BINDING 0
#include "quant.glsl"
#include "act.glsl"
layout(std430, binding = 1) readonly buffer X { vec4 x4[]; };
layout(std430, binding = 2) readonly buffer Groups { uint groups[]; };
layout(std430, binding = 3) readonly buffer Perm { uint perm[]; };
layout(std430, binding = 4) writeonly buffer Y { float y[]; };
#include "tile.glsl"

layout(push_constant) uniform Push {
    uint n_in;         // K, a multiple of 32
    uint n_out;        // rows of one expert
    uint n_used;       // experts per token
    uint expert_base;  // first expert held by this part of W
    uint n_experts;    // experts in this part
    uint n_expert;     // experts in all
} p;
#include "moe_tile.glsl"

void main() {
    const uint lane = gl_SubgroupInvocationID;
    const uint row0 = (gl_WorkGroupID.x * gl_NumSubgroups + gl_SubgroupID) * ROWS;
    uint e, offset, count, i0;
    if (!moe_tile(e, offset, count, i0, NT) || row0 >= p.n_out) return;
    const uint nb = p.n_in / 32;
    const uint xs = p.n_in / 4;     // x row stride in vec4
    const uint w0 = e * p.n_out;

    uint slot[NT];
    [[unroll]] for (uint t = 0; t < NT; t++) {
        slot[t] = perm[offset + min(i0 + t, count - 1)];
        xrow[t] = (X_SLOT != 0 ? slot[t] : slot[t] / p.n_used) * xs;
    }
    [[unroll]] for (uint i = 0; i < ROWS * NT; i++) acc[i] = 0.0;

    [[unroll]] for (uint r = 0; r < ROWS; r++) wrow[r] = w0 + min(row0 + r, p.n_out - 1);
    tile_dot(nb);
    [[unroll]] for (uint r = 0; r < ROWS; r++) {
        [[unroll]] for (uint t = 0; t < NT; t++) {
            const float s = subgroupAdd(acc[r * NT + t]);
            if (lane == 0 && row0 + r < p.n_out && i0 + t < count) {
                y[slot[t] * p.n_out + row0 + r] = s;
            }
        }
    }
}
