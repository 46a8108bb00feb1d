#version 450
// out = silu(gate) * up      (GELU = 1 uses gelu-tanh instead of silu, for gemma)
// GATED = 0: out = act(gate), up unread (a vision encoder's plain GELU)
// CLAMPED = 1: gpt-oss's SwiGLU (ggml's swiglu_oai, alpha 1.702 and limit 7 as its graph sets
// them): g = min(gate, 7), out = g * sigmoid(1.702 g) * (clamp(up, -7, 7) + 1)
// OUT16 = 1: out as f16 too (o16), for a product after it that loads x as f16 tiles; 2: as
// f16 only (o unwritten), where nothing else reads out
// V4 = 1: four values a lane through 16-byte loads (n a multiple of 4)
#include "common.glsl"
#extension GL_EXT_shader_16bit_storage : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
layout(local_size_x = 64) in;
layout(constant_id = 0) const uint GELU = 0;
layout(constant_id = 1) const uint CLAMPED = 0;
layout(constant_id = 2) const uint GATED = 1;
layout(constant_id = 3) const uint OUT16 = 0;
layout(constant_id = 4) const uint V4 = 0;
layout(std430, binding = 0) readonly buffer G { float g[]; };
layout(std430, binding = 0) readonly buffer G4 { vec4 g4[]; };
layout(std430, binding = 1) readonly buffer U { float u[]; };
layout(std430, binding = 1) readonly buffer U4 { vec4 u4[]; };
layout(std430, binding = 2) writeonly buffer O { float o[]; };
layout(std430, binding = 2) writeonly buffer O4 { vec4 o4[]; };
layout(std430, binding = 3) writeonly buffer O16 { float16_t o16[]; };
layout(std430, binding = 3) writeonly buffer O16x4 { f16vec4 o16x4[]; };
layout(push_constant) uniform Push { uint n; } p;

const float OAI_ALPHA = 1.702, OAI_LIMIT = 7.0;

vec4 act(const vec4 x, const vec4 up) {
    if (CLAMPED != 0) {
        const vec4 xc = min(x, OAI_LIMIT);
        return xc / (1.0 + exp(OAI_ALPHA * -xc)) * (clamp(up, -OAI_LIMIT, OAI_LIMIT) + 1.0);
    }
    vec4 a;
    if (GELU != 0) {
        const float c = 0.7978845608028654;   // sqrt(2 / pi)
        a = 0.5 * x * (1.0 + tanh(c * x * (1.0 + 0.044715 * x * x)));
    } else {
        a = x / (1.0 + exp(-x));
    }
    return GATED != 0 ? a * up : a;
}

void main() {
    const uint i = gl_GlobalInvocationID.x + gl_GlobalInvocationID.y * gl_NumWorkGroups.x * gl_WorkGroupSize.x;
    if (V4 != 0) {          // p.n counts vec4s here
        if (i >= p.n) return;
        const vec4 v = act(g4[i], GATED != 0 || CLAMPED != 0 ? u4[i] : vec4(0.0));
        if (OUT16 != 2) o4[i] = v;
        if (OUT16 != 0) o16x4[i] = f16vec4(v);
        return;
    }
    if (i >= p.n) return;
    const float v = act(vec4(g[i]), vec4(GATED != 0 || CLAMPED != 0 ? u[i] : 0.0)).x;
    if (OUT16 != 2) o[i] = v;
    if (OUT16 != 0) o16[i] = float16_t(v);
}
