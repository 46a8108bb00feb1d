#version 450
// y[t, r] (+)= sum_k W[r, k] * x[t, k] on the matrix units (VK_KHR_cooperative_matrix):
// the prefill product where the device has them. A workgroup computes a tile of BM weight
// rows x BN tokens (include/cm_tile.glsl) and writes it with bounds checks and the optional
// residual add.
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"
#extension GL_KHR_cooperative_matrix : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_KHR_shader_subgroup_basic : require

layout(local_size_x = 128) in;
layout(constant_id = 0) const uint ACC = 0;      // 1: add into y (fused residual add)
layout(constant_id = 1) const uint BM = 128;     // weight rows per workgroup: 64 or 128
layout(constant_id = 2) const uint BN = 64;      // tokens per workgroup: 32 or 64

layout(std430, binding = 0) readonly buffer W4 { uvec4 w4[]; };
layout(std430, binding = 0) readonly buffer W16 { uint16_t w16[]; };
layout(std430, binding = 0) readonly buffer W32 { uint w32[]; };
#include "chunk.glsl"
layout(std430, binding = 1) readonly buffer X { vec4 x4[]; };
layout(std430, binding = 2) buffer Y { float y[]; };

layout(push_constant) uniform Push {
    uint n_in;       // K, a multiple of BK
    uint n_out;      // rows of W in this binding
    uint n_tokens;
    uint x_offset;   // in vec4 units: first token row to read
    uint y_offset;   // in floats
    uint y_stride;   // floats between token rows of y
} p;

uint x_row(uint t) { return p.x_offset + (gl_WorkGroupID.y * BN + t) * (p.n_in / 4); }

void put(uint t, uint row, float v) {
    const uint o = p.y_offset + (gl_WorkGroupID.y * BN + t) * p.y_stride + row;
    y[o] = ACC != 0 ? y[o] + v : v;
}

#include "cm_tile.glsl"

void main() {
    const uint row0 = gl_WorkGroupID.x * BM, t0 = gl_WorkGroupID.y * BN;
    const uint live = min(BN, p.n_tokens - t0);
    tile_product(0, row0, live);
    tile_store(row0, live);
}
