// Weight chunks: CHUNK consecutive weights of a row (a block of 32, or a quarter of a
// 256-weight super-block for the K-quants), dequantized from a few wide loads for the tiled
// products; mul_mat_vec.comp takes the chunk size and the bit helpers.
//   void dequant_chunk(uint b, out vec4 w[NV])   b = row * (n_in / CHUNK) + chunk
// Needs the weight buffer declared three ways at binding 0: w4 (uvec4), w16 (uint16_t),
// w32 (uint).
#include "types.glsl"
#if defined(SUPER_BLOCK)
const uint CHUNK = 64;
#else
const uint CHUNK = 32;
#endif
const uint NV = CHUNK / 4;

vec4 cnib_lo(uint v) { return vec4(uvec4(v, v >> 8, v >> 16, v >> 24) & 0xFu); }
vec4 cnib_hi(uint v) { return vec4(uvec4(v >> 4, v >> 12, v >> 20, v >> 28) & 0xFu); }
vec4 csbyte4(uint v) {
    return vec4(ivec4(int(v << 24) >> 24, int(v << 16) >> 24, int(v << 8) >> 24, int(v) >> 24));
}
uint cpair(uint i) { return uint(w16[i]) | (uint(w16[i + 1]) << 16); }   // at u16 index i
float cf16(uint i) { return unpackHalf2x16(uint(w16[i])).x; }

#include "kscale.glsl"

#if defined(DEQUANT8_TYPE)
#include "dequant8.glsl"
#endif

void dequant_chunk(uint b, out vec4 w[NV]) {
#if defined(DEQUANT8_TYPE)
    // chunk b is blocks (CHUNK / 32) b .. of 32 weights, dequant8's lo and hi of each
    [[unroll]] for (uint s = 0; s < CHUNK / 32; s++) {
        [[unroll]] for (uint q = 0; q < 4; q++) {
            dequant8(b * (CHUNK / 32) + s, q, w[8 * s + q], w[8 * s + 4 + q]);
        }
    }
#elif defined(TYPE_F32)
    [[unroll]] for (uint v = 0; v < NV; v++) w[v] = uintBitsToFloat(w4[b * NV + v]);
#elif defined(TYPE_F16)
    [[unroll]] for (uint v = 0; v < NV; v += 2) {
        const uvec4 h = w4[b * 4 + v / 2];
        w[v] = vec4(unpackHalf2x16(h.x), unpackHalf2x16(h.y));
        w[v + 1] = vec4(unpackHalf2x16(h.z), unpackHalf2x16(h.w));
    }
#elif defined(TYPE_Q8_0)
    const uint o = b * 17;                          // 34 bytes: f16 d, int8 qs[32]
    const float d = cf16(o);
    [[unroll]] for (uint v = 0; v < NV; v++) w[v] = d * csbyte4(cpair(o + 1 + 2 * v));
#elif defined(TYPE_Q4_0) || defined(TYPE_Q5_0)
#if defined(TYPE_Q4_0)
    const uint o = b * 9, q0 = o + 1;               // 18 bytes: f16 d, qs[16]
    const float off = 8.0;
#else
    const uint o = b * 11, q0 = o + 3;              // 22 bytes: f16 d, qh[4], qs[16]
    const uint qh = cpair(o + 1);
    const float off = 16.0;
#endif
    const float d = cf16(o);
    [[unroll]] for (uint v = 0; v < 4; v++) {      // byte j: weight j (low), j + 16 (high)
        const uint q = cpair(q0 + 2 * v);
        vec4 lo = cnib_lo(q), hi = cnib_hi(q);
#if defined(TYPE_Q5_0)
        lo += 16.0 * vec4((uvec4(qh) >> uvec4(4 * v, 4 * v + 1, 4 * v + 2, 4 * v + 3)) & 1u);
        hi += 16.0 * vec4((uvec4(qh) >> uvec4(4 * v + 16, 4 * v + 17, 4 * v + 18, 4 * v + 19)) & 1u);
#endif
        w[v] = d * (lo - off);
        w[v + 4] = d * (hi - off);
    }
#elif defined(TYPE_Q4_1)
    const uint o = b * 5;                           // 20 bytes: f16 d, f16 m, qs[16]
    const vec2 dm = unpackHalf2x16(w32[o]);
    [[unroll]] for (uint v = 0; v < 4; v++) {
        const uint q = w32[o + 1 + v];
        w[v] = cnib_lo(q) * dm.x + dm.y;
        w[v + 4] = cnib_hi(q) * dm.x + dm.y;
    }
#elif defined(TYPE_Q4_K) || defined(TYPE_Q5_K)
    // the sub-block pair (2j, 2j + 1): low and high nibbles of qs[32j .. 32j + 31]
#if defined(TYPE_Q4_K)
    const uint SB = 9, QS = 1;                      // uvec4s: 144 bytes, qs at 16
#else
    const uint SB = 11, QS = 3;                     // 176 bytes, qh at 16, qs at 48
#endif
    const uint sb = (b >> 2) * SB, j = b & 3, s0 = 2 * j;
    const uvec4 hd = w4[sb];
    const vec2 dm = unpackHalf2x16(hd.x);
    float d[2], m[2];
    [[unroll]] for (uint t = 0; t < 2; t++) {
        const uvec2 sm = kscale_min(hd, s0 + t);
        d[t] = dm.x * float(sm.x);
        m[t] = dm.y * float(sm.y);
    }
    const uvec4 qa = w4[sb + QS + 2 * j], qb = w4[sb + QS + 2 * j + 1];
    const uint qw[8] = uint[8](qa.x, qa.y, qa.z, qa.w, qb.x, qb.y, qb.z, qb.w);
#if defined(TYPE_Q5_K)
    const uvec4 ha = w4[sb + 1], hb = w4[sb + 2];
    const uint hw[8] = uint[8](ha.x, ha.y, ha.z, ha.w, hb.x, hb.y, hb.z, hb.w);
#endif
    [[unroll]] for (uint v = 0; v < 8; v++) {
        vec4 lo = cnib_lo(qw[v]), hi = cnib_hi(qw[v]);
#if defined(TYPE_Q5_K)
        lo += 16.0 * vec4((uvec4(hw[v]) >> uvec4(s0, s0 + 8, s0 + 16, s0 + 24)) & 1u);
        hi += 16.0 * vec4((uvec4(hw[v]) >> uvec4(s0 + 1, s0 + 9, s0 + 17, s0 + 25)) & 1u);
#endif
        w[v] = d[0] * lo - m[0];
        w[v + 8] = d[1] * hi - m[1];
    }
#elif defined(TYPE_Q6_K)
    // weights 64j .. 64j + 63 of the super-block (105 u16: ql[128], qh[64], scales[16], d):
    // half n = j / 2, quarters k = 2(j & 1) and k + 1; weight l of quarter k has its low bits
    // in ql[64n + 32(k & 1) + l] (high nibble for k >= 2), two more at qh[32n + l] >> 2k,
    // and the scale scales[8n + 2k + l / 16]
    const uint base = (b >> 2) * 105, j = b & 3, n = j >> 1, hi = j & 1;
    const float d = cf16(base + 104);
    const uint s4 = cpair(base + 96 + 4 * n + 2 * hi);   // scales[8n + 4hi .. + 3]
    const vec4 scl = d * csbyte4(s4);
    [[unroll]] for (uint v = 0; v < 8; v++) {      // l = 4v .. 4v + 3
        const uint la = cpair(base + 32 * n + 2 * v) >> (4 * hi);
        const uint lb = cpair(base + 32 * n + 16 + 2 * v) >> (4 * hi);
        const uint hq = cpair(base + 64 + 16 * n + 2 * v) >> (4 * hi);
        const uvec4 h4 = uvec4(hq, hq >> 8, hq >> 16, hq >> 24);
        const uint half_ = v >> 2;                  // l / 16
        w[v] = scl[half_] * (cnib_lo(la) + 16.0 * vec4(h4 & 3u) - 32.0);
        w[v + 8] = scl[2 + half_] * (cnib_lo(lb) + 16.0 * vec4((h4 >> 2) & 3u) - 32.0);
    }
#else
#error "define one TYPE_*"
#endif
}
