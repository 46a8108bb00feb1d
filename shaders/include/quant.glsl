// Weight formats. Each defines the weight buffer `W` at binding WEIGHT_BINDING and
//   void dequant8(uint ib, uint q, out vec4 lo, out vec4 hi)
// giving, for block ib (32 weights), the weights at positions 4q..4q+3 (lo) and
// 16+4q..16+4q+3 (hi), q in 0..3. That pairing matches how Q4_0/Q4_1 pack nibbles (byte j
// holds weights j and j+16), so one unit reads one 32-bit word of quants there.
#ifndef WEIGHT_BINDING
#define WEIGHT_BINDING 0
#endif

#if defined(TYPE_F32)
layout(std430, binding = WEIGHT_BINDING) readonly buffer W { vec4 w4[]; };
void dequant8(uint ib, uint q, out vec4 lo, out vec4 hi) {
    lo = w4[ib * 8 + q];
    hi = w4[ib * 8 + 4 + q];
}

#elif defined(TYPE_F16)
layout(std430, binding = WEIGHT_BINDING) readonly buffer W { uvec2 w2[]; };   // 4 halves each
vec4 half4(uvec2 v) { return vec4(unpackHalf2x16(v.x), unpackHalf2x16(v.y)); }
void dequant8(uint ib, uint q, out vec4 lo, out vec4 hi) {
    lo = half4(w2[ib * 8 + q]);
    hi = half4(w2[ib * 8 + 4 + q]);
}

#elif defined(TYPE_Q8_0)
// block: f16 d, int8 qs[32]  (34 bytes = 17 u16)
layout(std430, binding = WEIGHT_BINDING) readonly buffer W { uint16_t w16[]; };
vec4 q8x4(uint base) {   // 4 int8 starting at u16 index base (2 u16)
    uint a = uint(w16[base]), b = uint(w16[base + 1]);
    uint v = a | (b << 16);
    return vec4(ivec4(int(v << 24) >> 24, int(v << 16) >> 24, int(v << 8) >> 24, int(v) >> 24));
}
void dequant8(uint ib, uint q, out vec4 lo, out vec4 hi) {
    uint b = ib * 17;
    float d = unpackHalf2x16(uint(w16[b])).x;
    lo = d * q8x4(b + 1 + 2 * q);
    hi = d * q8x4(b + 9 + 2 * q);
}

#elif defined(TYPE_Q4_0)
// block: f16 d, uint8 qs[16]; w = (nibble - 8) * d   (18 bytes = 9 u16)
layout(std430, binding = WEIGHT_BINDING) readonly buffer W { uint16_t w16[]; };
void dequant8(uint ib, uint q, out vec4 lo, out vec4 hi) {
    uint b = ib * 9;
    float d = unpackHalf2x16(uint(w16[b])).x;
    uint v = uint(w16[b + 1 + 2 * q]) | (uint(w16[b + 2 + 2 * q]) << 16);
    lo = d * (vec4(uvec4(v, v >> 8, v >> 16, v >> 24) & 0xFu) - 8.0);
    hi = d * (vec4(uvec4(v >> 4, v >> 12, v >> 20, v >> 28) & 0xFu) - 8.0);
}

#elif defined(TYPE_Q4_1)
// block: f16 d, f16 m, uint8 qs[16]; w = nibble * d + m   (20 bytes = 5 u32)
layout(std430, binding = WEIGHT_BINDING) readonly buffer W { uint w32[]; };
void dequant8(uint ib, uint q, out vec4 lo, out vec4 hi) {
    uint b = ib * 5;
    vec2 dm = unpackHalf2x16(w32[b]);
    uint v = w32[b + 1 + q];
    lo = vec4(uvec4(v, v >> 8, v >> 16, v >> 24) & 0xFu) * dm.x + dm.y;
    hi = vec4(uvec4(v >> 4, v >> 12, v >> 20, v >> 28) & 0xFu) * dm.x + dm.y;
}

#else
#error "define one TYPE_*"
#endif
