// mul_mat_cm2's and mul_mat_moe_cm2's view of W (binding 0) for VK_NV_cooperative_matrix2's
// tensor loads: its blocks of QK weights as a struct array, and the decode function the
// load calls per weight (its block, the weight's place in the block), giving it as f16.
// The K-quants' sub-block scales are not worked out per weight: fetch_scales() reads a
// super-block's for every row of the tile into registers, store_scales() puts them into
// shared memory (Q4_K's (scale, min) pairs, Q6_K's d * scale), and decode reads them there.
// Q4_K always so; Q6_K where AHEAD is 1 (else decode reads its scale from the block). With
// AHEAD the products fetch the next super-block's while this one's run. Q8_0 and Q4_0 with
// GROUP the same way: eight blocks as one group of QG weights (decode8), their d in shared
// memory.
// Small whole numbers become floats by their bits, not by a conversion instruction (a
// quarter of the rate, or less, of the adds on NVIDIA's shader cores): 0x6400 | n is the
// f16 1024 + n, 0x4B000000 | n the f32 2^23 + n, and subtracting the offset is exact.
// F16DEC 1: the K-quants' scale products rounded to f16 and the weight worked out in f16
// (no conversion of the result; llama.cpp's Q6_K decoder rounds so), else in f32.
// Needs BM (rows of a tile), AHEAD and F16DEC declared before. QG: the weights a step of
// fetch_scales covers (a super-block, or a group).
float16_t small_f16(const in uint n) {             // n < 1024, as f16, offset 1024 kept
    return uint16BitsToFloat16(uint16_t(0x6400u | n));
}
float small_f32(const in uint n) {                 // n < 2^23, as f32, offset 2^23 kept
    return uintBitsToFloat(0x4B000000u | n);
}
#if defined(TYPE_F16)
const uint QK = 1;
layout(std430, binding = 0) readonly buffer W { float16_t w[]; };
#elif defined(TYPE_Q8_0) || defined(TYPE_Q4_0)
// blocks of 32 weights and their f16 scale d; with GROUP, eight blocks at a time as one
// 256-weight group (rows of 256k weights: a group is 272 or 144 bytes, a multiple of 16),
// whose eight d go through shared memory as the K-quants' scales do (fetch_scales)
const uint QK = 32;
#if defined(TYPE_Q8_0)
struct Block { float16_t d; uint16_t qs[16]; };                       // 34 bytes
// the byte with its sign bit flipped is q + 128
#define QUANT(blk, i) (((uint((blk).qs[(i) >> 1]) >> (8 * ((i) & 1u))) & 255u) ^ 128u)
const float16_t QOFF = float16_t(1024.0 + 128.0);
const uint BLOCK_HALVES = 17;
#else
struct Block { float16_t d; uint16_t qs[8]; };                        // 18 bytes
// byte j holds weight j (low nibble) and j + 16 (high)
#define QUANT(blk, i) \
    ((uint((blk).qs[((i) & 15u) >> 1]) >> (8 * ((i) & 1u) + ((i) >> 4) * 4)) & 15u)
const float16_t QOFF = float16_t(1024.0 + 8.0);
const uint BLOCK_HALVES = 9;
#endif
const uint QG = 8 * QK;           // a group's weights
const bool QK_SHARED = true;       // GROUP: the d through shared memory even without AHEAD
struct Group { Block b[8]; };
layout(std430, binding = 0) readonly buffer W { Block w[]; };
layout(std430, binding = 0) readonly buffer W8 { Group w8[]; };
layout(std430, binding = 0) readonly buffer W16 { uint16_t w16[]; };
layout(buffer_reference, std430, buffer_reference_align = 2) buffer Dec { Block b; };
layout(buffer_reference, std430, buffer_reference_align = 16) buffer Dec8 { Group g; };
shared float16_t dq[8 * BM];       // GROUP: d of block s of row r's group at [s * BM + r % BM]
float16_t decode(const in Dec bl, const in uint blockCoords[2], const in uint coordInBlock[2]) {
    const uint i = coordInBlock[1];
    return (small_f16(QUANT(bl.b, i)) - QOFF) * bl.b.d;
}
float16_t decode8(const in Dec8 bl, const in uint blockCoords[2], const in uint coordInBlock[2]) {
    const uint i = coordInBlock[1], s = i >> 5;
    return (small_f16(QUANT(bl.g.b[s], i & 31u)) - QOFF) * dq[s * BM + blockCoords[0] % BM];
}
#elif defined(TYPE_Q4_K)
const uint QK = 256, QG = QK;
const bool QK_SHARED = true;       // scales through shared memory even without AHEAD
struct Block { f16vec2 dm; uint scales[3]; uint qs[32]; };           // 144 bytes
layout(std430, binding = 0) readonly buffer W { Block w[]; };
layout(std430, binding = 0) readonly buffer W4 { uvec4 w4[]; };
layout(buffer_reference, std430, buffer_reference_align = 16) buffer Dec { Block b; };
shared vec2 dmin[8 * BM];          // (scale, min) of sub-block s of row r at [s * BM + r % BM]
shared f16vec2 dmin16[8 * BM];     // ... as f16 (F16DEC)
float16_t decode(const in Dec bl, const in uint blockCoords[2], const in uint coordInBlock[2]) {
    // weights 64j .. 64j + 31 are the low nibbles of qs bytes 32j .., the next 32 the high
    const uint i = coordInBlock[1];
    const uint byte = (i >> 6) * 32 + (i & 31u);
    const uint q = (bl.b.qs[byte >> 2] >> (8 * (byte & 3) + 4 * ((i >> 5) & 1))) & 15u;
    if (F16DEC != 0) {
        const f16vec2 sm = dmin16[(i >> 5) * BM + blockCoords[0] % BM];
        return fma(sm.x, small_f16(q) - float16_t(1024.0), -sm.y);      // one rounding
    }
    const vec2 sm = dmin[(i >> 5) * BM + blockCoords[0] % BM];
    return float16_t(sm.x * (small_f32(q) - 8388608.0) - sm.y);
}
#include "kscale.glsl"
#elif defined(TYPE_Q6_K)
const uint QK = 256, QG = QK;
const bool QK_SHARED = false;
struct Block { uint16_t ql[64]; uint16_t qh[32]; uint16_t scales[8]; float16_t d; };  // 210
layout(std430, binding = 0) readonly buffer W { Block w[]; };
layout(std430, binding = 0) readonly buffer W16 { uint16_t w16[]; };
shared float dsc[16 * BM];         // d * scale of sub-block s of row r at [s * BM + r % BM]
shared float16_t dsc16[16 * BM];   // ... as f16 (F16DEC)
layout(buffer_reference, std430, buffer_reference_align = 2) buffer Dec { Block b; };
float16_t decode(const in Dec bl, const in uint blockCoords[2], const in uint coordInBlock[2]) {
    // weight i: its low 4 bits in ql[64(i / 128) + i % 64] (high nibble where (i / 64) is
    // odd), 2 more in qh[32(i / 128) + i % 32] at bit 2((i / 32) % 4), scale scales[i / 16]
    const uint i = coordInBlock[1];
    const uint lb = (i >> 7) * 64 + (i & 63u), hb = (i >> 7) * 32 + (i & 31u);
    const uint lo = (uint(bl.b.ql[lb >> 1]) >> (8 * (lb & 1) + 4 * ((i >> 6) & 1))) & 15u;
    const uint hi = (uint(bl.b.qh[hb >> 1]) >> (8 * (hb & 1) + 2 * ((i >> 5) & 3))) & 3u;
    const uint sb = i >> 4;
    if (AHEAD != 0 && F16DEC != 0)
        return dsc16[sb * BM + blockCoords[0] % BM] * (small_f16(lo | (hi << 4)) -
                                                       float16_t(1024.0 + 32.0));
    if (AHEAD != 0)
        return float16_t(dsc[sb * BM + blockCoords[0] % BM] *
                         (small_f32(lo | (hi << 4)) - (8388608.0 + 32.0)));
    // the scale byte with its sign bit flipped is scale + 128
    const uint u = ((uint(bl.b.scales[sb >> 1]) >> (8 * (sb & 1))) & 255u) ^ 128u;
    if (F16DEC != 0)
        return bl.b.d * (small_f16(u) - float16_t(1024.0 + 128.0)) *
               (small_f16(lo | (hi << 4)) - float16_t(1024.0 + 32.0));
    return float16_t(float(bl.b.d) * (small_f32(u) - (8388608.0 + 128.0)) *
                     (small_f32(lo | (hi << 4)) - (8388608.0 + 32.0)));
}
#endif

#if defined(TYPE_Q4_K) || defined(TYPE_Q6_K) || defined(TYPE_Q8_0) || defined(TYPE_Q4_0)
// a super-block's scales (GROUP: a group's eight d) for rows base .. base + BM - 1 (rows
// past limit read the last one): two lanes a row, each with half the row's sub-blocks (four
// of the group's d); a lane holds at most four (row, half) pairs (BM <= 2 x lanes)
#if defined(TYPE_Q4_K)
uvec4 scale_words[4];              // d, dmin and the 12 scale bytes
#elif defined(TYPE_Q6_K)
uvec2 scale_words[4];              // half the 16 scale bytes
float scale_d[4];
#else
uvec2 scale_words[4];              // four d
#endif
void fetch_scales(uint base, uint limit, uint n_in, uint kb) {
    const uint nb = n_in / QG;
    [[unroll]] for (uint j = 0; j < 4; j++) {
        const uint e = gl_LocalInvocationID.x + j * gl_WorkGroupSize.x;
        if (e < 2 * BM) {
            const uint blk = min(base + (e >> 1), limit - 1) * nb + kb;
#if defined(TYPE_Q4_K)
            scale_words[j] = w4[blk * 9];
#elif defined(TYPE_Q6_K)
            const uint h = blk * 105 + 96 + 4 * (e & 1);     // 105 halves a block
            scale_words[j] = uvec2(uint(w16[h]) | uint(w16[h + 1]) << 16,
                                   uint(w16[h + 2]) | uint(w16[h + 3]) << 16);
            scale_d[j] = float(uint16BitsToFloat16(w16[blk * 105 + 104]));
#else
            const uint h = (blk * 8 + 4 * (e & 1)) * BLOCK_HALVES;
            scale_words[j] = uvec2(uint(w16[h]) | uint(w16[h + BLOCK_HALVES]) << 16,
                                   uint(w16[h + 2 * BLOCK_HALVES]) |
                                   uint(w16[h + 3 * BLOCK_HALVES]) << 16);
#endif
        }
    }
}
// ... and into shared memory, where decode finds them (at row % BM, so a tile may start on
// any row), once the last super-block's loads are done
void store_scales(uint base) {
    barrier();
    [[unroll]] for (uint j = 0; j < 4; j++) {
        const uint e = gl_LocalInvocationID.x + j * gl_WorkGroupSize.x;
        if (e < 2 * BM) {
            const uint r = (base + (e >> 1)) % BM;
#if defined(TYPE_Q4_K)
            const vec2 dm = unpackHalf2x16(scale_words[j].x);
            [[unroll]] for (uint s = 0; s < 4; s++) {
                const uvec2 sm = kscale_min(scale_words[j], s + 4 * (e & 1));
                const vec2 v = vec2(dm.x * float(sm.x), dm.y * float(sm.y));
                if (F16DEC != 0)
                    dmin16[(s + 4 * (e & 1)) * BM + r] = f16vec2(v);
                else
                    dmin[(s + 4 * (e & 1)) * BM + r] = v;
            }
#elif defined(TYPE_Q6_K)
            [[unroll]] for (uint s = 0; s < 8; s++) {
                const int sc = int(scale_words[j][s >> 2] << (24 - 8 * (s & 3))) >> 24;
                if (F16DEC != 0)
                    dsc16[(s + 8 * (e & 1)) * BM + r] = float16_t(scale_d[j] * float(sc));
                else
                    dsc[(s + 8 * (e & 1)) * BM + r] = scale_d[j] * float(sc);
            }
#else
            [[unroll]] for (uint s = 0; s < 4; s++) {
                dq[(s + 4 * (e & 1)) * BM + r] =
                    uint16BitsToFloat16(uint16_t(scale_words[j][s >> 1] >> (16 * (s & 1))));
            }
#endif
        }
    }
    barrier();
}
#endif
