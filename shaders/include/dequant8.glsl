// dequant8 for the weight types that define it once for every product (DEQUANT8_TYPE in
// types.glsl): block ib (32 weights; a sub-block of a 256-weight super-block, counted from
// the first super-block), lo = weights 4q..4q+3 and hi = 16+4q..16+4q+3, q in 0..3.
// Needs the weight buffer declared as w16 (uint16_t) and w32 (uint); quant.glsl declares it
// for the tiled products, the kernel itself for the chunked ones. Layouts as gguf-py's
// dequantizers (gguf/quants.py) read them.

uvec4 d8_bytes(uint v) { return uvec4(v, v >> 8, v >> 16, v >> 24) & 0xFFu; }
uvec4 d8_nib_lo(uint v) { return uvec4(v, v >> 8, v >> 16, v >> 24) & 0xFu; }
uvec4 d8_nib_hi(uint v) { return uvec4(v >> 4, v >> 12, v >> 20, v >> 28) & 0xFu; }
uvec4 d8_bits(uint v, uint first) {       // bits first .. first + 3 of v
    return (uvec4(v) >> uvec4(first, first + 1, first + 2, first + 3)) & 1u;
}
uint d8_word16(uint byte_off) {           // 4 bytes at an even byte offset
    return uint(w16[byte_off >> 1]) | (uint(w16[(byte_off >> 1) + 1]) << 16);
}
// 4 bytes at any byte offset, read in u16s: a buffer range that ends half-way into a word
// (MXFP4's 17-byte blocks) keeps its last bytes readable
uint d8_word(uint byte_off) {
    const uint i = byte_off >> 1;
    if ((byte_off & 1u) == 0) return uint(w16[i]) | (uint(w16[i + 1]) << 16);
    return (uint(w16[i]) >> 8) | (uint(w16[i + 1]) << 8) | ((uint(w16[i + 2]) & 0xFFu) << 24);
}
uint d8_byte16(uint byte_off) {           // 1 byte
    return (uint(w16[byte_off >> 1]) >> (8 * (byte_off & 1u))) & 0xFFu;
}

#if defined(TYPE_IQ2_XXS) || defined(TYPE_IQ2_XS) || defined(TYPE_IQ2_S) \
    || defined(TYPE_IQ3_XXS) || defined(TYPE_IQ3_S)
#include "iq_grids.glsl"
// ggml's ksigns_iq2xs: 7 stored sign bits, the 8th their parity
uint d8_ksigns(uint i) { return i | ((bitCount(i) & 1u) << 7); }
// +1 or -1 for sign bits first .. first + 3
vec4 d8_signs(uint bits, uint first) { return 1.0 - 2.0 * vec4(d8_bits(bits, first)); }
// values 4h .. 4h + 3 of IQ2 grid row r (iq_grids.glsl: 2-bit codes of 8, 25, 43)
vec4 d8_iq2_row(uint word, uint r, uint h) {
    const uint c = word >> (16 * (r & 1u) + 8 * h);
    const vec4 code = vec4((uvec4(c, c >> 2, c >> 4, c >> 6)) & 3u);
    return 8.0 + 17.0 * code + floor(code * 0.5);
}
#endif

#if defined(TYPE_IQ4_NL) || defined(TYPE_IQ4_XS)
const float KVALUES[16] = float[16](-127.0, -104.0, -83.0, -65.0, -49.0, -35.0, -22.0, -10.0,
                                    1.0, 13.0, 25.0, 38.0, 53.0, 69.0, 89.0, 113.0);
#elif defined(TYPE_MXFP4)
// e2m1 values, doubled (the block's e8m0 scale is taken at half)
const float KVALUES[16] = float[16](0.0, 1.0, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0,
                                    0.0, -1.0, -2.0, -3.0, -4.0, -6.0, -8.0, -12.0);
#endif
#if defined(TYPE_IQ4_NL) || defined(TYPE_IQ4_XS) || defined(TYPE_MXFP4)
vec4 d8_kv(uvec4 i) { return vec4(KVALUES[i.x], KVALUES[i.y], KVALUES[i.z], KVALUES[i.w]); }
#endif

#if defined(TYPE_Q5_1)
// block: f16 d, f16 m, uint32 qh, uint8 qs[16]; w = (nibble | bit j of qh << 4) * d + m
// (24 bytes = 6 words; byte j of qs holds weights j and j + 16)
#define HAS_BLOCK_MIN
void dequant8(uint ib, uint q, out vec4 lo, out vec4 hi) {
    const uint o = ib * 6;
    const vec2 dm = unpackHalf2x16(w32[o]);
    const uint qh = w32[o + 1], v = w32[o + 2 + q];
    lo = vec4(d8_nib_lo(v) | (d8_bits(qh, 4 * q) << 4)) * dm.x + dm.y;
    hi = vec4(d8_nib_hi(v) | (d8_bits(qh, 16 + 4 * q) << 4)) * dm.x + dm.y;
}
float block_min(uint ib) { return unpackHalf2x16(w32[ib * 6]).y; }

#elif defined(TYPE_BF16)
// the top halves of f32s, two per word
vec4 d8_bf16x4(uint a, uint b) {
    return uintBitsToFloat(uvec4(a << 16, a & 0xFFFF0000u, b << 16, b & 0xFFFF0000u));
}
void dequant8(uint ib, uint q, out vec4 lo, out vec4 hi) {
    const uint o = ib * 16 + 2 * q;
    lo = d8_bf16x4(w32[o], w32[o + 1]);
    hi = d8_bf16x4(w32[o + 8], w32[o + 9]);
}

#elif defined(TYPE_Q2_K)
// super-block (84 bytes = 21 words): scales[16] (low nibble scale, high nibble min, per 16
// weights), qs[64], f16 d, f16 dmin. Weight 128n + 32k + l holds 2 bits at qs[32n + l] >> 2k;
// w = d * scale - dmin * min. Sub-block s = 4n + k: scales 2s (l < 16) and 2s + 1.
void dequant8(uint ib, uint q, out vec4 lo, out vec4 hi) {
    const uint sb = (ib >> 3) * 21, s = ib & 7, n = s >> 2, k = s & 3;
    const vec2 dm = unpackHalf2x16(w32[sb + 20]);
    const uint sc = w32[sb + (s >> 1)] >> (16 * (s & 1));      // scales[2s], scales[2s + 1]
    const uint a = w32[sb + 4 + 8 * n + q] >> (2 * k), b = w32[sb + 8 + 8 * n + q] >> (2 * k);
    lo = dm.x * float(sc & 0xFu) * vec4(d8_bytes(a) & 3u) - dm.y * float((sc >> 4) & 0xFu);
    hi = dm.x * float((sc >> 8) & 0xFu) * vec4(d8_bytes(b) & 3u) - dm.y * float((sc >> 12) & 0xFu);
}

#elif defined(TYPE_Q3_K)
// super-block (110 bytes = 55 u16): hmask[32], qs[64], scales[12], f16 d. Weight
// 128n + 32k + l of sub-block s = 4n + k: 2 low bits at qs[32n + l] >> 2k, and 4 subtracted
// unless bit s of hmask[l] is set; 6-bit signed scales (minus 32) per 16 weights, low nibbles
// in bytes 0..7 (j % 8, shifted 4 (j / 8)), high pairs in bytes 8..11 (j % 4, shifted
// 2 (j / 4)). w = d * scale * q.
float d8_scale3(uint b0, uint j) {
    const uint lo4 = d8_word16(b0 + 96 + (j & 4u)) >> (8 * (j & 3u) + 4 * (j >> 3));
    const uint hi2 = d8_word16(b0 + 104) >> (8 * (j & 3u) + 2 * (j >> 2));
    return float(int((lo4 & 0xFu) | ((hi2 & 3u) << 4)) - 32);
}
void dequant8(uint ib, uint q, out vec4 lo, out vec4 hi) {
    const uint b0 = (ib >> 3) * 110, s = ib & 7, n = s >> 2, k = s & 3;
    const float d = unpackHalf2x16(uint(w16[(b0 + 108) >> 1])).x;
    const uint a = d8_word16(b0 + 32 + 32 * n + 4 * q) >> (2 * k);
    const uint b = d8_word16(b0 + 48 + 32 * n + 4 * q) >> (2 * k);
    const uint ha = d8_word16(b0 + 4 * q) >> s, hb = d8_word16(b0 + 16 + 4 * q) >> s;
    // hmask bit clear: 4 less
    const vec4 qa = vec4(d8_bytes(a) & 3u) - 4.0 * vec4(1u - (d8_bytes(ha) & 1u));
    const vec4 qb = vec4(d8_bytes(b) & 3u) - 4.0 * vec4(1u - (d8_bytes(hb) & 1u));
    lo = d * d8_scale3(b0, 2 * s) * qa;
    hi = d * d8_scale3(b0, 2 * s + 1) * qb;
}

#elif defined(TYPE_IQ4_NL)
// block: f16 d, uint8 qs[16]; w = d * KVALUES[nibble]   (18 bytes = 9 u16, as Q4_0)
void dequant8(uint ib, uint q, out vec4 lo, out vec4 hi) {
    const uint b = ib * 9;
    const float d = unpackHalf2x16(uint(w16[b])).x;
    const uint v = uint(w16[b + 1 + 2 * q]) | (uint(w16[b + 2 + 2 * q]) << 16);
    lo = d * d8_kv(d8_nib_lo(v));
    hi = d * d8_kv(d8_nib_hi(v));
}

#elif defined(TYPE_IQ4_XS)
// super-block (136 bytes = 34 words): f16 d, u16 scales_h, scales_l[4], qs[128]. Sub-block s:
// scale (nibble s of scales_l | bits 2s, 2s + 1 of scales_h << 4) - 32; its 16 bytes of qs
// as IQ4_NL's block. w = d * scale * KVALUES[nibble].
void dequant8(uint ib, uint q, out vec4 lo, out vec4 hi) {
    const uint sb = (ib >> 3) * 34, s = ib & 7;
    const uint hd = w32[sb];
    const uint ls = ((w32[sb + 1] >> (4 * s)) & 0xFu) | (((hd >> (16 + 2 * s)) & 3u) << 4);
    const float dl = unpackHalf2x16(hd).x * float(int(ls) - 32);
    const uint v = w32[sb + 2 + 4 * s + q];
    lo = dl * d8_kv(d8_nib_lo(v));
    hi = dl * d8_kv(d8_nib_hi(v));
}

#elif defined(TYPE_MXFP4)
// block: uint8 e (e8m0 scale), uint8 qs[16]; w = KVALUES[nibble] * 2^(e - 128) (17 bytes:
// blocks start at any byte)
// 2^(e - 128): an e8m0 scale at half (its e2m1 values are taken doubled), subnormal below 2
float e8m0_half(uint e) { return uintBitsToFloat(e < 2 ? 0x00200000u << e : (e - 1) << 23); }
void dequant8(uint ib, uint q, out vec4 lo, out vec4 hi) {
    const uint o = ib * 17;
    const uint e = d8_byte16(o);
    const float d = e8m0_half(e);
    const uint v = d8_word(o + 1 + 4 * q);
    lo = d * d8_kv(d8_nib_lo(v));
    hi = d * d8_kv(d8_nib_hi(v));
}

#elif defined(TYPE_IQ2_XXS)
// super-block (66 bytes = 33 u16): f16 d, then per sub-block of 32 two u32: four grid
// indices (bytes), and four 7-bit sign groups with a 4-bit scale on top. Group g (8 weights):
// IQ2XXS_GRID row of index byte g, signs ksigns[bits 7g..] ; w = d (0.5 + scale) / 4 * value.
void dequant8(uint ib, uint q, out vec4 lo, out vec4 hi) {
    const uint b0 = (ib >> 3) * 66, s = ib & 7, h = q & 1, g = q >> 1;
    const uint aux0 = d8_word16(b0 + 2 + 8 * s), aux1 = d8_word16(b0 + 6 + 8 * s);
    const float db = unpackHalf2x16(uint(w16[b0 >> 1])).x * (0.5 + float(aux1 >> 28)) * 0.25;
    [[unroll]] for (uint i = 0; i < 2; i++) {          // groups g (lo) and g + 2 (hi)
        const uint gi = g + 2 * i;
        const uint row = (aux0 >> (8 * gi)) & 0xFFu;
        const vec4 v = d8_iq2_row(IQ2XXS_GRID[row >> 1], row, h)
                     * d8_signs(d8_ksigns((aux1 >> (7 * gi)) & 127u), 4 * h);
        if (i == 0) lo = db * v; else hi = db * v;
    }
}

#elif defined(TYPE_IQ2_XS) || defined(TYPE_IQ2_S)
#if defined(TYPE_IQ2_XS)
// super-block (74 bytes = 37 u16): f16 d, u16 qs[32] (9-bit grid index, 7 sign bits),
// scales[8]. Sub-block s has groups 4s .. 4s + 3 and the scale nibbles of scales[s] (low for
// its first 16 weights).
const uint SB_BYTES = 74, SCALES = 66;
#else
// super-block (82 bytes = 41 u16): f16 d, qs[32], signs[32], qh[8], scales[8]. Group i's
// grid index is qs[i] with bits 2(i % 4).. of qh[i / 4] on top, its signs byte signs[i].
const uint SB_BYTES = 82, SCALES = 74;
#endif
void dequant8(uint ib, uint q, out vec4 lo, out vec4 hi) {
    const uint b0 = (ib >> 3) * SB_BYTES, s = ib & 7, h = q & 1, g = q >> 1;
    const float d = unpackHalf2x16(uint(w16[b0 >> 1])).x;
    const uint sc = d8_byte16(b0 + SCALES + s);
    [[unroll]] for (uint i = 0; i < 2; i++) {          // groups g (lo) and g + 2 (hi)
        const uint gi = 4 * s + g + 2 * i;
#if defined(TYPE_IQ2_XS)
        const uint qv = uint(w16[(b0 >> 1) + 1 + gi]);
        const uint row = qv & 511u, signs = d8_ksigns(qv >> 9);
        const vec4 v = d8_iq2_row(IQ2XS_GRID[row >> 1], row, h) * d8_signs(signs, 4 * h);
#else
        const uint qh = d8_byte16(b0 + 66 + s);
        const uint row = d8_byte16(b0 + 2 + gi) | (((qh >> (2 * (g + 2 * i))) & 3u) << 8);
        const vec4 v = d8_iq2_row(IQ2S_GRID[row >> 1], row, h)
                     * d8_signs(d8_byte16(b0 + 34 + gi), 4 * h);
#endif
        const float db = d * (0.5 + float((sc >> (4 * i)) & 0xFu)) * 0.25;
        if (i == 0) lo = db * v; else hi = db * v;
    }
}

#elif defined(TYPE_IQ3_XXS)
// super-block (98 bytes = 49 u16): f16 d, qs[64] (grid indices, 4 weights each), then per
// sub-block a u32 of four 7-bit sign groups (8 weights each) and a 4-bit scale on top;
// w = d (0.5 + scale) / 2 * value.
void dequant8(uint ib, uint q, out vec4 lo, out vec4 hi) {
    const uint b0 = (ib >> 3) * 98, s = ib & 7, h = q & 1, g = q >> 1;
    const uint aux = d8_word16(b0 + 66 + 4 * s);
    const float db = unpackHalf2x16(uint(w16[b0 >> 1])).x * (0.5 + float(aux >> 28)) * 0.5;
    [[unroll]] for (uint i = 0; i < 2; i++) {          // weights 4q.. (lo), 16 + 4q.. (hi)
        const uint row = d8_byte16(b0 + 2 + 8 * s + q + 4 * i);
        const vec4 v = vec4(d8_bytes(IQ3XXS_GRID[row]))
                     * d8_signs(d8_ksigns((aux >> (7 * (g + 2 * i))) & 127u), 4 * h);
        if (i == 0) lo = db * v; else hi = db * v;
    }
}

#elif defined(TYPE_IQ3_S)
// super-block (110 bytes = 55 u16): f16 d, qs[64], qh[8], signs[32], scales[4]. Grid index k
// of sub-block s (4 weights) is qs[8s + k] with bit k of qh[s] on top; signs byte 4s + g per
// 8 weights; scale nibble s of scales; w = d (1 + 2 scale) * value.
void dequant8(uint ib, uint q, out vec4 lo, out vec4 hi) {
    const uint b0 = (ib >> 3) * 110, s = ib & 7, h = q & 1, g = q >> 1;
    const uint qh = d8_byte16(b0 + 66 + s);
    const uint sc = (d8_byte16(b0 + 106 + (s >> 1)) >> (4 * (s & 1))) & 0xFu;
    const float db = unpackHalf2x16(uint(w16[b0 >> 1])).x * float(1 + 2 * sc);
    [[unroll]] for (uint i = 0; i < 2; i++) {          // weights 4q.. (lo), 16 + 4q.. (hi)
        const uint k = q + 4 * i;
        const uint row = d8_byte16(b0 + 2 + 8 * s + k) | (((qh >> k) & 1u) << 8);
        const vec4 v = vec4(d8_bytes(IQ3S_GRID[row]))
                     * d8_signs(d8_byte16(b0 + 74 + 4 * s + g + 2 * i), 4 * h);
        if (i == 0) lo = db * v; else hi = db * v;
    }
}
#endif
