// f16_rne: x rounded to f16 as ggml's CPU code rounds it, through an explicit f32 -> f16
// conversion, which common.glsl's RoundingModeRTE makes round to nearest even
// (packHalf2x16's rounding is the driver's own).
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require

float f16_rne(float v) { return float(float16_t(v)); }
vec4 f16_rne(vec4 v) { return vec4(f16vec4(v)); }
