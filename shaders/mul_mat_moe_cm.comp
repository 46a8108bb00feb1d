#version 450
// y[s, r] = sum_k W[e, r, k] * x[t (or s), k]   for every slot s = t * n_used + j routed to
// expert e, on the matrix units (VK_KHR_cooperative_matrix): mul_mat_moe's grouping (moe_group's
// perm and groups) with mul_mat_cm's tiles. Workgroups are (row tiles of BM, G slot-tile
// lanes, experts of this part of W); workgroup y takes its expert's tiles of BN slots y,
// y + G, ...: an expert with more slots than G tiles hold loops, one with none exits at once.
// A tile's x rows are gathered through perm into shared memory as f16 beside the expert's
// dequantized rows, as mul_mat_cm stages them; sums in f32, y in slot order
// [n_tokens, n_used, n_out] for moe_combine.
// X_SLOT 0: a slot reads its token's row of x (gate, up); 1: its own row s (down).
// W bound in parts holds whole experts; groups is indexed by expert_base + the part's expert.
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"
#extension GL_KHR_cooperative_matrix : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_KHR_shader_subgroup_basic : require

layout(local_size_x = 128) in;
layout(constant_id = 0) const uint BM = 64;      // weight rows per workgroup: 64 or 128
layout(constant_id = 1) const uint BN = 32;      // slots per tile: 32 or 64
layout(constant_id = 2) const uint X_SLOT = 0;

layout(std430, binding = 0) readonly buffer W4 { uvec4 w4[]; };
layout(std430, binding = 0) readonly buffer W16 { uint16_t w16[]; };
layout(std430, binding = 0) readonly buffer W32 { uint w32[]; };
#include "chunk.glsl"
layout(std430, binding = 1) readonly buffer X { vec4 x4[]; };
layout(std430, binding = 2) readonly buffer Groups { uint groups[]; };
layout(std430, binding = 3) readonly buffer Perm { uint perm[]; };
layout(std430, binding = 4) writeonly buffer Y { float y[]; };

layout(push_constant) uniform Push {
    uint n_in;         // K, a multiple of BK
    uint n_out;        // rows of one expert
    uint n_used;       // experts per token
    uint expert_base;  // first expert held by this part of W
} p;

shared uint slot_of[BN];                          // the tile's slots (perm), 0 past count
shared uint xrow_of[BN];                          // ... and their x rows, in vec4

uint x_row(uint t) { return xrow_of[t]; }

void put(uint t, uint row, float v) { y[slot_of[t] * p.n_out + row] = v; }

#include "cm_tile.glsl"

void main() {
    const uint row0 = gl_WorkGroupID.x * BM;
    const uint e = gl_WorkGroupID.z;                       // in this part
    const uint offset = groups[2 * (p.expert_base + e)];
    const uint count = groups[2 * (p.expert_base + e) + 1];
    const uint xs = p.n_in / 4;

    for (uint i0 = gl_WorkGroupID.y * BN; i0 < count; i0 += gl_NumWorkGroups.y * BN) {
        const uint live = min(BN, count - i0);
        barrier();                                         // the last tile's slots are read
        for (uint t = gl_LocalInvocationID.x; t < BN; t += 128) {
            const uint s = t < live ? perm[offset + i0 + t] : 0;
            slot_of[t] = s;
            xrow_of[t] = (X_SLOT != 0 ? s : s / p.n_used) * xs;
        }
        barrier();
        tile_product(e * p.n_out, row0, live);
        tile_store(row0, live);
    }
}
