#version 450
// o[r, k] = f16(W[row0 + r, k]): rows of a quantized weight dequantized to f16, for the
// prefill products on the matrix units to read as plain f16 tiles (Builder's predecode):
// each weight is decoded once a pass, not once for every tile of tokens that reads it, and
// rounded to f16 once from its exact value. Eight weights a lane, as get_rows reads them.
#include "common.glsl"
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
layout(local_size_x = 64) in;
#define WEIGHT_BINDING 0
#include "quant.glsl"
layout(std430, binding = 1) writeonly buffer O { f16vec4 o4[]; };
layout(push_constant) uniform Push {
    uint n_in;     // weights a row, a multiple of 32 (of 256 for super-blocks)
    uint n_rows;   // rows to decode
    uint row0;     // the first, among this binding's rows
} p;

void main() {
    const uint u = gl_GlobalInvocationID.x + gl_GlobalInvocationID.y * gl_NumWorkGroups.x * 64;
    const uint nb = p.n_in / 32;
    if (u >= p.n_rows * nb * 4) return;
    const uint ib = u >> 2, q = u & 3;
    vec4 lo, hi;
    dequant8(p.row0 * nb + ib, q, lo, hi);
    o4[ib * 8 + q] = f16vec4(lo);
    o4[ib * 8 + 4 + q] = f16vec4(hi);
}
