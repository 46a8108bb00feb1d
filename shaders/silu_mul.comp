#version 450
// out = silu(gate) * up      (GELU = 1 uses gelu-tanh instead of silu, for gemma)
// GATED = 0: out = act(gate), up unread (a vision encoder's plain GELU)
// CLAMPED = 1: gpt-oss's SwiGLU (ggml's swiglu_oai, alpha 1.702 and limit 7 as its graph sets
// them): g = min(gate, 7), out = g * sigmoid(1.702 g) * (clamp(up, -7, 7) + 1)
// OUT16 = 1: out as f16 too (o16), for a product after it that loads x as f16 tiles
#include "common.glsl"
#extension GL_EXT_shader_16bit_storage : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
layout(local_size_x = 64) in;
layout(constant_id = 0) const uint GELU = 0;
layout(constant_id = 1) const uint CLAMPED = 0;
layout(constant_id = 2) const uint GATED = 1;
layout(constant_id = 3) const uint OUT16 = 0;
layout(std430, binding = 0) readonly buffer G { float g[]; };
layout(std430, binding = 1) readonly buffer U { float u[]; };
layout(std430, binding = 2) writeonly buffer O { float o[]; };
layout(std430, binding = 3) writeonly buffer O16 { float16_t o16[]; };
layout(push_constant) uniform Push { uint n; } p;

const float OAI_ALPHA = 1.702, OAI_LIMIT = 7.0;

void main() {
    const uint i = gl_GlobalInvocationID.x + gl_GlobalInvocationID.y * gl_NumWorkGroups.x * gl_WorkGroupSize.x;
    if (i >= p.n) return;
    const float x = g[i];
    if (CLAMPED != 0) {
        const float xc = min(x, OAI_LIMIT);
        const float uc = clamp(u[i], -OAI_LIMIT, OAI_LIMIT);
        const float v = xc / (1.0 + exp(OAI_ALPHA * -xc)) * (uc + 1.0);
        o[i] = v;
        if (OUT16 != 0) o16[i] = float16_t(v);
        return;
    }
    float a;
    if (GELU != 0) {
        const float c = 0.7978845608028654;   // sqrt(2 / pi)
        a = 0.5 * x * (1.0 + tanh(c * x * (1.0 + 0.044715 * x * x)));
    } else {
        a = x / (1.0 + exp(-x));
    }
    const float v = GATED != 0 ? a * u[i] : a;
    o[i] = v;
    if (OUT16 != 0) o16[i] = float16_t(v);
}
