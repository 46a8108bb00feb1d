#version 450
// o[i] = f16(x[x_offset + i]), four values a lane: the activations of a prefill product
// turned to f16 once, for the products that load x as f16 tiles (mul_mat_cm2's X16), as
// many of them as read the same x.
#extension GL_EXT_shader_16bit_storage : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
layout(local_size_x = 64) in;
layout(std430, binding = 0) readonly buffer X { vec4 x[]; };
layout(std430, binding = 1) writeonly buffer O { f16vec4 o[]; };
layout(push_constant) uniform Push {
    uint n;            // values, a multiple of 4
    uint x_offset;     // in vec4
} p;

void main() {
    const uint i = gl_GlobalInvocationID.x + gl_GlobalInvocationID.y * gl_NumWorkGroups.x * 64;
    if (i >= p.n / 4) return;
    o[i] = f16vec4(x[p.x_offset + i]);
}
