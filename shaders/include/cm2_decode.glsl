// mul_mat_cm2's and mul_mat_moe_cm2's view of W (binding 0) for VK_NV_cooperative_matrix2's
// tensor loads: its blocks of QK weights as a struct array, and the decode function the
// load calls per weight (its block, the weight's place in the block), giving it as f16.
// Q4_K's sub-block scales and mins are not worked out per weight: load_scales() puts a
// super-block's into shared memory for every row of the tile, and decode reads them there.
// Needs BM (rows of a tile) declared before.
#if defined(TYPE_F16)
const uint QK = 1;
layout(std430, binding = 0) readonly buffer W { float16_t w[]; };
#elif defined(TYPE_Q8_0)
const uint QK = 32;
struct Block { float16_t d; uint16_t qs[16]; };                       // 34 bytes
layout(std430, binding = 0) readonly buffer W { Block w[]; };
layout(buffer_reference, std430, buffer_reference_align = 2) buffer Dec { Block b; };
float16_t decode(const in Dec bl, const in uint blockCoords[2], const in uint coordInBlock[2]) {
    const uint i = coordInBlock[1];
    const int q = int(uint(bl.b.qs[i >> 1]) << (24 - 8 * (i & 1))) >> 24;
    return float16_t(float(bl.b.d) * float(q));
}
#elif defined(TYPE_Q4_0)
const uint QK = 32;
struct Block { float16_t d; uint16_t qs[8]; };                        // 18 bytes
layout(std430, binding = 0) readonly buffer W { Block w[]; };
layout(buffer_reference, std430, buffer_reference_align = 2) buffer Dec { Block b; };
float16_t decode(const in Dec bl, const in uint blockCoords[2], const in uint coordInBlock[2]) {
    // byte j holds weight j (low nibble) and j + 16 (high)
    const uint i = coordInBlock[1], j = i & 15u;
    const uint q = (uint(bl.b.qs[j >> 1]) >> (8 * (j & 1) + (i >> 4) * 4)) & 15u;
    return float16_t(float(bl.b.d) * (float(q) - 8.0));
}
#elif defined(TYPE_Q4_K)
const uint QK = 256;
struct Block { f16vec2 dm; uint scales[3]; uint qs[32]; };           // 144 bytes
layout(std430, binding = 0) readonly buffer W { Block w[]; };
layout(std430, binding = 0) readonly buffer W4 { uvec4 w4[]; };
layout(buffer_reference, std430, buffer_reference_align = 16) buffer Dec { Block b; };
shared vec2 dmin[8 * BM];          // (scale, min) of sub-block s of row r at [s * BM + r % BM]
float16_t decode(const in Dec bl, const in uint blockCoords[2], const in uint coordInBlock[2]) {
    // weights 64j .. 64j + 31 are the low nibbles of qs bytes 32j .., the next 32 the high
    const uint i = coordInBlock[1];
    const uint byte = (i >> 6) * 32 + (i & 31u);
    const uint q = (bl.b.qs[byte >> 2] >> (8 * (byte & 3) + 4 * ((i >> 5) & 1))) & 15u;
    const vec2 sm = dmin[(i >> 5) * BM + blockCoords[0] % BM];
    return float16_t(sm.x * float(q) - sm.y);
}
#include "kscale.glsl"
#elif defined(TYPE_Q6_K)
const uint QK = 256;
struct Block { uint16_t ql[64]; uint16_t qh[32]; uint16_t scales[8]; float16_t d; };  // 210
layout(std430, binding = 0) readonly buffer W { Block w[]; };
layout(buffer_reference, std430, buffer_reference_align = 2) buffer Dec { Block b; };
float16_t decode(const in Dec bl, const in uint blockCoords[2], const in uint coordInBlock[2]) {
    // weight i: its low 4 bits in ql[64(i / 128) + i % 64] (high nibble where (i / 64) is
    // odd), 2 more in qh[32(i / 128) + i % 32] at bit 2((i / 32) % 4), scale scales[i / 16]
    const uint i = coordInBlock[1];
    const uint lb = (i >> 7) * 64 + (i & 63u), hb = (i >> 7) * 32 + (i & 31u);
    const uint lo = (uint(bl.b.ql[lb >> 1]) >> (8 * (lb & 1) + 4 * ((i >> 6) & 1))) & 15u;
    const uint hi = (uint(bl.b.qh[hb >> 1]) >> (8 * (hb & 1) + 2 * ((i >> 5) & 3))) & 3u;
    const uint sb = i >> 4;
    const int sc = int(uint(bl.b.scales[sb >> 1]) << (24 - 8 * (sb & 1))) >> 24;
    return float16_t(float(bl.b.d) * float(sc) * (float(lo | (hi << 4)) - 32.0));
}
#endif

#if defined(TYPE_Q4_K)
// super-block kb's (scale, min) per sub-block for rows base .. base + BM - 1 (rows past
// limit read the last one), where decode finds them: at row % BM, so a tile may start on
// any row
void load_scales(uint base, uint limit, uint n_in, uint kb) {
    barrier();                       // the last super-block's loads are done
    const uint nb = n_in / QK;
    for (uint e = gl_LocalInvocationID.x; e < 2 * BM; e += gl_WorkGroupSize.x) {
        const uint r = e >> 1, row = min(base + r, limit - 1);
        const uvec4 hd = w4[(row * nb + kb) * 9];
        const vec2 dm = unpackHalf2x16(hd.x);
        [[unroll]] for (uint s = 4 * (e & 1); s < 4 * (e & 1) + 4; s++) {
            const uvec2 sm = kscale_min(hd, s);
            dmin[s * BM + (base + r) % BM] = vec2(dm.x * float(sm.x), dm.y * float(sm.y));
        }
    }
    barrier();
}
#endif
