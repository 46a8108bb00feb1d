// f16_rne: x rounded to f16 through an explicit f32 -> f16 conversion (lavapipe rounds it to
// nearest even, as ggml's CPU code does; other drivers may round their own way, and the tests
// say by how much).
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require

float f16_rne(float v) { return float(float16_t(v)); }
vec4 f16_rne(vec4 v) { return vec4(f16vec4(v)); }

// bf16_rne: x rounded to bf16 (the top half of its f32) to nearest even, as ggml's
// GGML_FP32_TO_BF16 rounds (NaN kept a quiet NaN)
float bf16_rne(float v) {
    const uint u = floatBitsToUint(v);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) return uintBitsToFloat((u & 0xFFFF0000u) | 0x00400000u);
    return uintBitsToFloat((u + 0x7FFFu + ((u >> 16) & 1u)) & 0xFFFF0000u);
}
vec4 bf16_rne(vec4 v) { return vec4(bf16_rne(v.x), bf16_rne(v.y), bf16_rne(v.z), bf16_rne(v.w)); }
