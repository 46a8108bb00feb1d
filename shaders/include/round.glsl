// f16_rne: x rounded to f16 through an explicit f32 -> f16 conversion (lavapipe rounds it to
// nearest even, as ggml's CPU code does; other drivers may round their own way, and the tests
// say by how much).
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require

float f16_rne(float v) { return float(float16_t(v)); }
vec4 f16_rne(vec4 v) { return vec4(f16vec4(v)); }
