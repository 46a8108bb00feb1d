// Weight formats. Each defines the weight buffer `W` at binding WEIGHT_BINDING (the types
// added later, DEQUANT8_TYPE: W16 and W32, with dequant8 in dequant8.glsl) and
//   void dequant8(uint ib, uint q, out vec4 lo, out vec4 hi)
// giving, for block ib (32 weights), the weights at positions 4q..4q+3 (lo) and
// 16+4q..16+4q+3 (hi), q in 0..3. That pairing matches how Q4_0/Q4_1 pack nibbles (byte j
// holds weights j and j+16), so one unit reads one 32-bit word of quants there.
#ifndef WEIGHT_BINDING
#define WEIGHT_BINDING 0
#endif
#include "types.glsl"

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
// block: f16 d, int8 qs[32]  (34 bytes). Read as 32-bit words: a block starts on a word
// boundary or half-way into one, so each 4-byte group is one word or two halves.
layout(std430, binding = WEIGHT_BINDING) readonly buffer W { uint w32[]; };
uint word_at(uint byte_off) {   // 4 bytes at an even byte offset
    const uint i = byte_off >> 2;
    return (byte_off & 2u) == 0u ? w32[i] : (w32[i] >> 16) | (w32[i + 1] << 16);
}
vec4 i8x4(uint v) {
    return vec4(ivec4(int(v << 24) >> 24, int(v << 16) >> 24, int(v << 8) >> 24, int(v) >> 24));
}
void dequant8(uint ib, uint q, out vec4 lo, out vec4 hi) {
    const uint b = ib * 34;
    const float d = unpackHalf2x16(w32[b >> 2] >> (8 * (b & 2u))).x;
    lo = d * i8x4(word_at(b + 2 + 4 * q));
    hi = d * i8x4(word_at(b + 18 + 4 * q));
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
#define HAS_BLOCK_MIN      // block_min: the block's m, for Q8_1's sum correction (act.glsl)
float block_min(uint ib) { return unpackHalf2x16(w32[ib * 5]).y; }

#elif defined(TYPE_Q5_0)
// block: f16 d, uint8 qh[4], uint8 qs[16]; w = ((nibble | highbit << 4) - 16) * d
// (22 bytes = 11 u16; qh holds bit j for weight j)
layout(std430, binding = WEIGHT_BINDING) readonly buffer W { uint16_t w16[]; };
void dequant8(uint ib, uint q, out vec4 lo, out vec4 hi) {
    uint b = ib * 11;
    float d = unpackHalf2x16(uint(w16[b])).x;
    uint qh = uint(w16[b + 1]) | (uint(w16[b + 2]) << 16);
    uint v = uint(w16[b + 3 + 2 * q]) | (uint(w16[b + 4 + 2 * q]) << 16);
    uvec4 hl = (uvec4(qh >> (4 * q), qh >> (4 * q + 1), qh >> (4 * q + 2), qh >> (4 * q + 3)) & 1u) << 4;
    uvec4 hh = (uvec4(qh >> (4 * q + 16), qh >> (4 * q + 17), qh >> (4 * q + 18), qh >> (4 * q + 19)) & 1u) << 4;
    lo = d * (vec4((uvec4(v, v >> 8, v >> 16, v >> 24) & 0xFu) | hl) - 16.0);
    hi = d * (vec4((uvec4(v >> 4, v >> 12, v >> 20, v >> 28) & 0xFu) | hh) - 16.0);
}

#elif defined(TYPE_Q4_K) || defined(TYPE_Q5_K)
// Super-blocks of 256 weights: f16 d, f16 dmin, 12 bytes of 6-bit scales/mins for eight
// sub-blocks of 32, [Q5_K: qh[32]], qs[128]. Sub-block s uses bytes 32*(s/2).. of qs, low
// nibbles for even s, high for odd; Q5_K's fifth bit of weight l is bit s of qh[l].
// ib counts 32-weight sub-blocks, so rows must hold a multiple of 256 weights.
#if defined(TYPE_Q4_K)
const uint SB_WORDS = 36, QS_WORD = 4;    // 144 bytes
#else
const uint SB_WORDS = 44, QS_WORD = 12;   // 176 bytes; qh at word 4
#endif
layout(std430, binding = WEIGHT_BINDING) readonly buffer W { uint w32[]; };
uint kbyte(uint word0, uint i) { return (w32[word0 + (i >> 2)] >> (8 * (i & 3))) & 0xFFu; }
void dequant8(uint ib, uint q, out vec4 lo, out vec4 hi) {
    const uint sb = (ib >> 3) * SB_WORDS, s = ib & 7;
    const vec2 dm = unpackHalf2x16(w32[sb]);
    const uint sc0 = sb + 1;                       // scales: bytes 4..15 of the block
    uint sc, mn;
    if (s < 4) {
        sc = kbyte(sc0, s) & 63u;
        mn = kbyte(sc0, s + 4) & 63u;
    } else {
        sc = (kbyte(sc0, s + 4) & 0xFu) | ((kbyte(sc0, s - 4) >> 6) << 4);
        mn = (kbyte(sc0, s + 4) >> 4) | ((kbyte(sc0, s) >> 6) << 4);
    }
    const float d = dm.x * float(sc), m = dm.y * float(mn);
    const uint qw = sb + QS_WORD + 8 * (s >> 1) + q;
    const uint sh = 4 * (s & 1);
    const uint a = w32[qw] >> sh, b = w32[qw + 4] >> sh;
    vec4 qa = vec4(uvec4(a, a >> 8, a >> 16, a >> 24) & 0xFu);
    vec4 qb = vec4(uvec4(b, b >> 8, b >> 16, b >> 24) & 0xFu);
#if defined(TYPE_Q5_K)
    const uint ha = w32[sb + 4 + q] >> s, hb = w32[sb + 8 + q] >> s;
    qa += 16.0 * vec4(uvec4(ha, ha >> 8, ha >> 16, ha >> 24) & 1u);
    qb += 16.0 * vec4(uvec4(hb, hb >> 8, hb >> 16, hb >> 24) & 1u);
#endif
    lo = d * qa - m;
    hi = d * qb - m;
}

#elif defined(TYPE_Q6_K)
// Super-blocks of 256: ql[128], qh[64], int8 scales[16], f16 d (210 bytes = 105 u16).
// Sub-block s (32 weights) of half n = s/4, quarter k = s%4: weight l has low bits in
// ql[64n + 32(k&1) + l] (high nibble when k >= 2), two high bits at qh[32n + l] >> 2k,
// and the scale scales[8n + 2k + l/16]; w = d * scale * (q - 32).
layout(std430, binding = WEIGHT_BINDING) readonly buffer W { uint16_t w16[]; };
uint word16x2(uint byte_off) {   // 4 bytes at an even byte offset
    return uint(w16[byte_off >> 1]) | (uint(w16[(byte_off >> 1) + 1]) << 16);
}
float scale6(uint b0, uint i) {
    uint v = uint(w16[(b0 + 192 + i) >> 1]) >> (8 * (i & 1));
    return float(int(v << 24) >> 24);
}
void dequant8(uint ib, uint q, out vec4 lo, out vec4 hi) {
    const uint b0 = (ib >> 3) * 210, s = ib & 7;
    const uint n = s >> 2, k = s & 3;
    const float d = unpackHalf2x16(uint(w16[(b0 + 208) >> 1])).x;
    const uint lsh = 4 * (k >> 1), hsh = 2 * k;
    const uint la = word16x2(b0 + 64 * n + 32 * (k & 1) + 4 * q) >> lsh;
    const uint lb = word16x2(b0 + 64 * n + 32 * (k & 1) + 16 + 4 * q) >> lsh;
    const uint ha = word16x2(b0 + 128 + 32 * n + 4 * q) >> hsh;
    const uint hb = word16x2(b0 + 128 + 32 * n + 16 + 4 * q) >> hsh;
    const ivec4 qa = ivec4((uvec4(la, la >> 8, la >> 16, la >> 24) & 0xFu)
                         | ((uvec4(ha, ha >> 8, ha >> 16, ha >> 24) & 3u) << 4)) - 32;
    const ivec4 qb = ivec4((uvec4(lb, lb >> 8, lb >> 16, lb >> 24) & 0xFu)
                         | ((uvec4(hb, hb >> 8, hb >> 16, hb >> 24) & 3u) << 4)) - 32;
    lo = d * scale6(b0, 8 * n + 2 * k) * vec4(qa);
    hi = d * scale6(b0, 8 * n + 2 * k + 1) * vec4(qb);
}

#elif defined(DEQUANT8_TYPE)
layout(std430, binding = WEIGHT_BINDING) readonly buffer W16 { uint16_t w16[]; };
layout(std430, binding = WEIGHT_BINDING) readonly buffer W32 { uint w32[]; };
#include "dequant8.glsl"

#else
#error "define one TYPE_*"
#endif
