#version 450
// y[r] (+)= sum_k W[r, k] * x[k]: the decode matrix-vector product (one token).
// A workgroup of WG lanes owns ROWS weight rows. Each row is cut into chunks (a block of 32
// weights, or a quarter of a 256-weight super-block) that a lane reads with a few wide loads;
// lanes take every WG-th chunk, and the partial sums meet through subgroup adds and a little
// shared memory. The activations come straight from x (f32), each chunk of x read once for
// all ROWS rows and, where ACT says so, rounded on the fly as ggml's CPU backend rounds
// activations for this weight type: 1 Q8_0, 2 Q8_1 (blocks of 32, one lane's chunk), 3 Q8_K
// (blocks of 256: the four lanes of one super-block agree through xor shuffles), 4 f16,
// 5 bf16.
// Scales apply once per sub-block: sum(q * x) * d, less the minimum times sum(x).
// XFORM fuses the op before the product into its reading of x, one dispatch and one barrier
// fewer: 1 rms_norm (x * w read, with w the norm's weight in binding 3; the sum of squares
// gathered on the way, its scale applied to the row sums), 2 the GLU (silu(x) * binding 3).
#include "common.glsl"
#extension GL_KHR_shader_subgroup_arithmetic : require
#extension GL_KHR_shader_subgroup_shuffle : require

layout(local_size_x_id = 0) in;
layout(constant_id = 1) const uint ROWS = 2;
layout(constant_id = 2) const uint ACC = 0;      // 1: add into y (fused residual add)
layout(constant_id = 3) const uint ACT = 0;      // activation rounding, see above
layout(constant_id = 4) const uint XFORM = 0;    // the fused op before, see above
layout(constant_id = 5) const uint MAP = 0;      // Q4_K, Q6_K: 1 = sixteen lanes a super-block

layout(std430, binding = 0) readonly buffer W4 { uvec4 w4[]; };
layout(std430, binding = 0) readonly buffer W16 { uint16_t w16[]; };
layout(std430, binding = 0) readonly buffer W32 { uint w32[]; };
layout(std430, binding = 1) readonly buffer X { vec4 x4[]; };
layout(std430, binding = 2) buffer Y { float y[]; };
layout(std430, binding = 3) readonly buffer X2 { vec4 x2[]; };   // XFORM's second input

layout(push_constant) uniform Push {
    uint n_in;       // K: a multiple of the chunk
    uint n_out;      // rows of W in this binding
    uint x_offset;   // in vec4 units
    uint y_offset;   // in floats: where row 0 of this binding lands
    float eps;       // XFORM 1: the norm's epsilon
} p;

#include "chunk.glsl"                               // CHUNK, NV and the bit helpers

// The vec4 of x (counted from the row's first weight) that holds chunk c's weights 4v..4v+3.
uint x_index(uint c, uint v) {
#if defined(TYPE_Q6_K)
    // chunk (super-block, half n, l-half h): weights 128n + 32k + 16h + 0..15, k = 0..3
    const uint sb = c >> 2, n = (c >> 1) & 1, h = c & 1;
    return sb * 64 + n * 32 + (v >> 2) * 8 + h * 4 + (v & 3);
#else
    return c * NV + v;
#endif
}

// sum over chunk c of row `row`: W * x; xs holds x's sums per 32 weights (per 16 for Q6_K's
// four sub-blocks of this chunk), for the block minimums.
float chunk_dot(uint row, uint c, const uint nc, in vec4 xv[NV], in float xs[4]) {
    const uint b = row * nc + c;
    float acc = 0.0;
#if defined(TYPE_Q5_1)
    // 24 bytes = 6 words: f16 d, f16 m, qh (bit j: weight j), qs[16]; as Q4_1 with Q5_0's bits
    const uint o = b * 6;
    const vec2 dm = unpackHalf2x16(w32[o]);
    const uint qh = w32[o + 1];
    [[unroll]] for (uint v = 0; v < 4; v++) {
        const uint q = w32[o + 2 + v];
        const vec4 lo = cnib_lo(q)
            + 16.0 * vec4((uvec4(qh) >> uvec4(4 * v, 4 * v + 1, 4 * v + 2, 4 * v + 3)) & 1u);
        const vec4 hi = cnib_hi(q)
            + 16.0 * vec4((uvec4(qh) >> uvec4(4 * v + 16, 4 * v + 17, 4 * v + 18, 4 * v + 19)) & 1u);
        acc += dot(lo, xv[v]) + dot(hi, xv[v + 4]);
    }
    acc = dm.x * acc + dm.y * xs[0];
#elif defined(DEQUANT8_TYPE)
    // the types without a chunk reader of their own: the chunk dequantized, then one dot
    vec4 w[NV];
    dequant_chunk(b, w);
    [[unroll]] for (uint v = 0; v < NV; v++) acc += dot(w[v], xv[v]);
#elif defined(TYPE_F32)
    [[unroll]] for (uint v = 0; v < NV; v++) acc += dot(uintBitsToFloat(w4[b * NV + v]), xv[v]);
#elif defined(TYPE_F16)
    [[unroll]] for (uint v = 0; v < NV; v += 2) {
        const uvec4 h = w4[b * 4 + v / 2];
        acc += dot(vec4(unpackHalf2x16(h.x), unpackHalf2x16(h.y)), xv[v])
             + dot(vec4(unpackHalf2x16(h.z), unpackHalf2x16(h.w)), xv[v + 1]);
    }
#elif defined(TYPE_Q8_0)
    // 34 bytes: f16 d, int8 qs[32]
    const uint o = b * 17;
    [[unroll]] for (uint v = 0; v < NV; v++) acc += dot(csbyte4(cpair(o + 1 + 2 * v)), xv[v]);
    acc *= cf16(o);
#elif defined(TYPE_Q4_0) || defined(TYPE_Q5_0)
#if defined(TYPE_Q4_0)
    const uint o = b * 9, q0 = o + 1;               // 18 bytes: f16 d, qs[16]
    const float off = 8.0;
#else
    const uint o = b * 11, q0 = o + 3;              // 22 bytes: f16 d, qh[4], qs[16]
    const uint qh = cpair(o + 1);
    const float off = 16.0;
#endif
    [[unroll]] for (uint v = 0; v < 4; v++) {      // byte j: weight j (low), j + 16 (high)
        const uint q = cpair(q0 + 2 * v);
        vec4 lo = cnib_lo(q), hi = cnib_hi(q);
#if defined(TYPE_Q5_0)
        lo += 16.0 * vec4((uvec4(qh) >> uvec4(4 * v, 4 * v + 1, 4 * v + 2, 4 * v + 3)) & 1u);
        hi += 16.0 * vec4((uvec4(qh) >> uvec4(4 * v + 16, 4 * v + 17, 4 * v + 18, 4 * v + 19)) & 1u);
#endif
        acc += dot(lo, xv[v]) + dot(hi, xv[v + 4]);
    }
    acc = cf16(o) * (acc - off * xs[0]);
#elif defined(TYPE_Q4_1)
    // 20 bytes = 5 words: f16 d, f16 m, qs[16]
    const uint o = b * 5;
    const vec2 dm = unpackHalf2x16(w32[o]);
    [[unroll]] for (uint v = 0; v < 4; v++) {
        const uint q = w32[o + 1 + v];
        acc += dot(cnib_lo(q), xv[v]) + dot(cnib_hi(q), xv[v + 4]);
    }
    acc = dm.x * acc + dm.y * xs[0];
#elif defined(TYPE_Q4_K) || defined(TYPE_Q5_K)
    // super-block: f16 d, f16 dmin, scales[12], [Q5_K: qh[32]], qs[128]; this chunk is the
    // sub-block pair (2j, 2j + 1) sharing qs[32j .. 32j + 31] (low nibbles, high nibbles)
#if defined(TYPE_Q4_K)
    const uint SB = 9, QS = 1;                        // uvec4s: 144 bytes, qs at 16
#else
    const uint SB = 11, QS = 3;                       // 176 bytes, qh at 16, qs at 48
#endif
    const uint sb = (b >> 2) * SB, j = b & 3;
    const uvec4 hd = w4[sb];
    const vec2 dm = unpackHalf2x16(hd.x);
    // 6-bit scales and mins of sub-blocks s = 2j and 2j + 1 (bytes 4..15 of the block)
    const uint s0 = 2 * j;
    const uvec2 sm0 = kscale_min(hd, s0), sm1 = kscale_min(hd, s0 + 1);
    const uint sc[2] = uint[2](sm0.x, sm1.x), mn[2] = uint[2](sm0.y, sm1.y);
    const uvec4 qa = w4[sb + QS + 2 * j], qb = w4[sb + QS + 2 * j + 1];
    const uint qw[8] = uint[8](qa.x, qa.y, qa.z, qa.w, qb.x, qb.y, qb.z, qb.w);
#if defined(TYPE_Q5_K)
    const uvec4 ha = w4[sb + 1], hb = w4[sb + 2];
    const uint hw[8] = uint[8](ha.x, ha.y, ha.z, ha.w, hb.x, hb.y, hb.z, hb.w);
#endif
    float dlo = 0.0, dhi = 0.0;
    [[unroll]] for (uint v = 0; v < 8; v++) {
        vec4 lo = cnib_lo(qw[v]), hi = cnib_hi(qw[v]);
#if defined(TYPE_Q5_K)
        lo += 16.0 * vec4((uvec4(hw[v]) >> uvec4(s0, s0 + 8, s0 + 16, s0 + 24)) & 1u);
        hi += 16.0 * vec4((uvec4(hw[v]) >> uvec4(s0 + 1, s0 + 9, s0 + 17, s0 + 25)) & 1u);
#endif
        dlo += dot(lo, xv[v]);
        dhi += dot(hi, xv[v + 8]);
    }
    acc = dm.x * (float(sc[0]) * dlo + float(sc[1]) * dhi)
        - dm.y * (float(mn[0]) * xs[0] + float(mn[1]) * xs[1]);
#elif defined(TYPE_Q6_K)
    // super-block (105 u16): ql[128], qh[64], int8 scales[16], f16 d. Chunk (n, h): weights
    // 128n + 32k + 16h + l (l < 16) of quarters k = 0..3: low bits in ql[64n + 32(k & 1) +
    // 16h + l] (high nibble for k >= 2), two high bits at qh[32n + 16h + l] >> 2k, scale
    // scales[8n + 2k + h].
    const uint base = (b >> 2) * 105, n = (b >> 1) & 1, h = b & 1;
    const uint ql0 = base + 32 * n + 8 * h, ql1 = ql0 + 16, qh0 = base + 64 + 16 * n + 8 * h;
    const uint sc0 = base + 96 + 4 * n;              // scales[8n .. 8n + 7] as 4 u16
    float part[4] = float[4](0.0, 0.0, 0.0, 0.0);
    [[unroll]] for (uint v = 0; v < 4; v++) {      // l = 4v .. 4v + 3
        const uint la = cpair(ql0 + 2 * v), lb = cpair(ql1 + 2 * v);
        const uint hq = cpair(qh0 + 2 * v);
        const uvec4 hq4 = uvec4(hq, hq >> 8, hq >> 16, hq >> 24);
        part[0] += dot(cnib_lo(la) + 16.0 * vec4(hq4 & 3u), xv[v]);
        part[1] += dot(cnib_lo(lb) + 16.0 * vec4((hq4 >> 2) & 3u), xv[4 + v]);
        part[2] += dot(cnib_hi(la) + 16.0 * vec4((hq4 >> 4) & 3u), xv[8 + v]);
        part[3] += dot(cnib_hi(lb) + 16.0 * vec4((hq4 >> 6) & 3u), xv[12 + v]);
    }
    // scales[8n + 2k + h], k = 0..3: bytes h, h + 2, h + 4, h + 6 of scales[8n ..]
    const uint s01 = cpair(sc0) >> (8 * h), s23 = cpair(sc0 + 2) >> (8 * h);
    const vec4 scl = csbyte4((s01 & 0xFFu) | ((s01 >> 8) & 0xFF00u) | ((s23 & 0xFFu) << 16)
                            | (((s23 >> 16) & 0xFFu) << 24));
    acc = cf16(base + 104) * (scl.x * (part[0] - 32.0 * xs[0]) + scl.y * (part[1] - 32.0 * xs[1])
                             + scl.z * (part[2] - 32.0 * xs[2]) + scl.w * (part[3] - 32.0 * xs[3]));
#else
#error "define one TYPE_*"
#endif
    return acc;
}

#include "round.glsl"

// Rounds chunk c's activations in place (ACT) and fills xs, the sums the minimums multiply.
void prepare(uint c, inout vec4 xv[NV], out float xs[4]) {
    if (ACT == 4) {
        [[unroll]] for (uint v = 0; v < NV; v++)
            xv[v] = f16_rne(xv[v]);
    }
    if (ACT == 5) {
        [[unroll]] for (uint v = 0; v < NV; v++)
            xv[v] = bf16_rne(xv[v]);
    }
    float qsum = 0.0, d = 0.0;
    if (ACT == 1 || ACT == 2) {                     // Q8_0 / Q8_1: this chunk is the block
        float amax = 0.0;
        [[unroll]] for (uint v = 0; v < NV; v++) {
            const vec4 a = abs(xv[v]);
            amax = max(amax, max(max(a.x, a.y), max(a.z, a.w)));
        }
        d = div_rn(amax, 127.0);
        const float id = amax != 0.0 ? div_rn(127.0, amax) : 0.0;
        const float dh = f16_rne(d);
        [[unroll]] for (uint v = 0; v < NV; v++) {
            const vec4 q = roundEven(xv[v] * id);
            qsum += dot(q, vec4(1.0));
            xv[v] = q * dh;
        }
    }
    if (ACT == 3) {                                 // Q8_K: the 256 weights of 4 lanes
        // the value of largest magnitude, the first in the super-block on ties
        float amax = -1.0, vmax = 0.0, pos = 0.0;
        [[unroll]] for (uint v = 0; v < NV; v++) {
            [[unroll]] for (uint e = 0; e < 4; e++) {
                const float a = abs(xv[v][e]);
                if (a > amax) { amax = a; vmax = xv[v][e]; pos = float(4 * v + e); }
            }
        }
#if defined(TYPE_Q6_K)
        // chunk h holds positions 16h + 32k + l, so the order in the block is (k, h, l)
        pos = float(((c >> 1) & 1) * 128 + (uint(pos) >> 4) * 32 + (c & 1) * 16
                    + (uint(pos) & 15));
#else
        pos += float((c & 3) * 64);
#endif
        [[unroll]] for (uint b = 0; b < 2; b++) {
            const uint m = 1u << b;
            const float oa = subgroupShuffleXor(amax, m), ov = subgroupShuffleXor(vmax, m);
            const float op = subgroupShuffleXor(pos, m);
            if (oa > amax || (oa == amax && op < pos)) { amax = oa; vmax = ov; pos = op; }
        }
        const float iscale = vmax != 0.0 ? div_rn(-127.0, vmax) : 0.0;
        const float dk = iscale != 0.0 ? div_rn(1.0, iscale) : 0.0;
        [[unroll]] for (uint v = 0; v < NV; v++) xv[v] = min(roundEven(iscale * xv[v]), 127.0) * dk;
    }
    // the sums the block minimums multiply: per 32 weights (per 16 l of one quarter, Q6_K)
    const uint per = CHUNK == 64 ? 4 : 8;           // vec4s per sum; Q6_K: 4 quarters of 4
    [[unroll]] for (uint s = 0; s < 4; s++) {
        float t = 0.0;
        if (s * per < NV) {
            [[unroll]] for (uint v = 0; v < per; v++) {
                if (s * per + v < NV) t += dot(xv[s * per + v], vec4(1.0));
            }
        }
        xs[s] = t;
    }
#if !defined(TYPE_Q6_K)
    if (CHUNK == 64) {                              // Q4_K, Q5_K: two sub-blocks of 32
        xs[0] = xs[0] + xs[1];
        xs[1] = xs[2] + xs[3];
    }
#endif
    if (ACT == 2) xs[0] = f16_rne(d * qsum);           // ggml's Q8_1 block sum, fp16(d * sum q)
}

shared float partial[32][ROWS];                     // per subgroup, per row
shared float partial_ss[32];                        // XFORM 1: sums of squares per subgroup

// x's vec4 i (counted from the row's first weight) as the product reads it (XFORM); ss
// gathers the squares for the norm
vec4 load_x(uint i, inout float ss) {
    vec4 v = x4[p.x_offset + i];
    if (XFORM == 1) {
        ss += dot(v, v);
        v *= x2[i];
    }
    if (XFORM == 2) v = v / (1.0 + exp(-v)) * x2[p.x_offset + i];
    return v;
}

// The lanes' sums meet; row r's total (scaled by the norm, XFORM 1) lands in y.
void finish(const uint row0, in float acc[ROWS], const float ss) {
    const uint tid = gl_LocalInvocationID.x;
    [[unroll]] for (uint r = 0; r < ROWS; r++) {
        const float s = subgroupAdd(acc[r]);
        if (gl_SubgroupInvocationID == 0) partial[gl_SubgroupID][r] = s;
    }
    if (XFORM == 1) {
        const float s = subgroupAdd(ss);
        if (gl_SubgroupInvocationID == 0) partial_ss[gl_SubgroupID] = s;
    }
    barrier();
    if (tid < ROWS && row0 + tid < p.n_out) {
        float s = 0.0;
        for (uint g = 0; g < gl_NumSubgroups; g++) s += partial[g][tid];
        if (XFORM == 1) {
            float t = 0.0;
            for (uint g = 0; g < gl_NumSubgroups; g++) t += partial_ss[g];
            s *= 1.0 / sqrt(t / float(p.n_in) + p.eps);
        }
        const uint o = p.y_offset + row0 + tid;
        y[o] = ACC != 0 ? y[o] + s : s;
    }
}

#if defined(TYPE_Q4_K)
// MAP 1: sixteen lanes share a super-block, each taking 4 weights of 4 of its sub-blocks
// (two u32 of qs): small loads, many super-blocks in flight per workgroup.
void main_fine() {
    const uint tid = gl_LocalInvocationID.x;
    const uint row0 = gl_WorkGroupID.x * ROWS;
    const uint nsb = p.n_in / 256;
    const uint t = tid & 15, jl = t >> 3, l0 = 4 * (t & 7);
    // qs bytes 32 jl + l0 .. + 3 hold weights 64 jl + l0 .. (low nibbles: sub-block 2 jl)
    // and 64 jl + 32 + l0 .. (high: 2 jl + 1); 64 bytes on, the same of sub-blocks + 4
    const uint xo = 16 * jl + l0 / 4, qo = 4 + 8 * jl + l0 / 4;
    const uint s0 = 2 * jl;
    float acc[ROWS];
    [[unroll]] for (uint r = 0; r < ROWS; r++) acc[r] = 0.0;
    float ss = 0.0;
    for (uint i = tid >> 4; i < nsb; i += gl_WorkGroupSize.x / 16) {
        const uint xb = i * 64 + xo;
        const vec4 xa = load_x(xb, ss), xb1 = load_x(xb + 8, ss);
        const vec4 xc = load_x(xb + 32, ss), xd = load_x(xb + 40, ss);
        const vec4 xsum = vec4(dot(xa, vec4(1.0)), dot(xb1, vec4(1.0)), dot(xc, vec4(1.0)),
                               dot(xd, vec4(1.0)));
        [[unroll]] for (uint r = 0; r < ROWS; r++) {
            const uint sb = (min(row0 + r, p.n_out - 1) * nsb + i) * 9;
            const uvec4 hd = w4[sb];
            const uint qa = w32[sb * 4 + qo], qb = w32[sb * 4 + qo + 16];
            const vec2 dm = unpackHalf2x16(hd.x);
            const uvec2 k0 = kscale_min(hd, s0), k1 = kscale_min(hd, s0 + 1);
            const uvec2 k4 = kscale_min(hd, s0 + 4), k5 = kscale_min(hd, s0 + 5);
            const vec4 dots = vec4(dot(cnib_lo(qa), xa), dot(cnib_hi(qa), xb1),
                                   dot(cnib_lo(qb), xc), dot(cnib_hi(qb), xd));
            acc[r] += dm.x * dot(vec4(k0.x, k1.x, k4.x, k5.x), dots)
                    - dm.y * dot(vec4(k0.y, k1.y, k4.y, k5.y), xsum);
        }
    }
    finish(row0, acc, ss);
}
#endif

#if defined(TYPE_Q6_K)
// MAP 1: sixteen lanes share a super-block (105 u16: ql[128], qh[64], int8 scales[16], f16
// d), each taking weights l0 .. l0 + 3 of the four quarters of one 128-weight half: 4 bytes
// of ql twice and 4 of qh, read as u16 pairs (a block starts on an even byte only).
void main_fine() {
    const uint tid = gl_LocalInvocationID.x;
    const uint row0 = gl_WorkGroupID.x * ROWS;
    const uint nsb = p.n_in / 256;
    const uint t = tid & 15, n = t >> 3, l0 = 4 * (t & 7), is = l0 / 16;
    const uint xo = 32 * n + l0 / 4;             // weights 128 n + l0 + 32 k, k = 0..3
    float acc[ROWS];
    [[unroll]] for (uint r = 0; r < ROWS; r++) acc[r] = 0.0;
    float ss = 0.0;
    for (uint i = tid >> 4; i < nsb; i += gl_WorkGroupSize.x / 16) {
        const uint xb = i * 64 + xo;
        const vec4 x0 = load_x(xb, ss), x1 = load_x(xb + 8, ss);
        const vec4 x2v = load_x(xb + 16, ss), x3 = load_x(xb + 24, ss);
        const vec4 xsum = vec4(dot(x0, vec4(1.0)), dot(x1, vec4(1.0)), dot(x2v, vec4(1.0)),
                               dot(x3, vec4(1.0)));
        [[unroll]] for (uint r = 0; r < ROWS; r++) {
            const uint base = (min(row0 + r, p.n_out - 1) * nsb + i) * 105;
            const uint la = cpair(base + 32 * n + l0 / 2), lb = cpair(base + 32 * n + 16 + l0 / 2);
            const uint hq = cpair(base + 64 + 16 * n + l0 / 2);
            // scales[8 n + is + 2 k]: byte `is` of u16 words 96 + 4 n + k
            const uint sw = base + 96 + 4 * n, sh = 8 * is;
            const vec4 scl = vec4(ivec4(int(uint(w16[sw]) >> sh << 24) >> 24,
                                        int(uint(w16[sw + 1]) >> sh << 24) >> 24,
                                        int(uint(w16[sw + 2]) >> sh << 24) >> 24,
                                        int(uint(w16[sw + 3]) >> sh << 24) >> 24));
            const uvec4 h4 = uvec4(hq, hq >> 8, hq >> 16, hq >> 24);
            const vec4 dots = vec4(dot(cnib_lo(la) + 16.0 * vec4(h4 & 3u), x0),
                                   dot(cnib_lo(lb) + 16.0 * vec4((h4 >> 2) & 3u), x1),
                                   dot(cnib_hi(la) + 16.0 * vec4((h4 >> 4) & 3u), x2v),
                                   dot(cnib_hi(lb) + 16.0 * vec4((h4 >> 6) & 3u), x3));
            acc[r] += cf16(base + 104) * dot(scl, dots - 32.0 * xsum);
        }
    }
    finish(row0, acc, ss);
}
#endif

void main() {
#if defined(TYPE_Q4_K) || defined(TYPE_Q6_K)
    if (MAP == 1 && ACT == 0) {
        main_fine();
        return;
    }
#endif
    const uint tid = gl_LocalInvocationID.x;
    const uint row0 = gl_WorkGroupID.x * ROWS;
    const uint nc = p.n_in / CHUNK;
    float acc[ROWS];
    [[unroll]] for (uint r = 0; r < ROWS; r++) acc[r] = 0.0;
    float ss = 0.0;

    for (uint c = tid; c < nc; c += gl_WorkGroupSize.x) {
        vec4 xv[NV];
        [[unroll]] for (uint v = 0; v < NV; v++) xv[v] = load_x(x_index(c, v), ss);
        float xs[4];
        prepare(c, xv, xs);
        [[unroll]] for (uint r = 0; r < ROWS; r++) {
            acc[r] += chunk_dot(min(row0 + r, p.n_out - 1), c, nc, xv, xs);
        }
    }
    finish(row0, acc, ss);
}
