#version 450
// y[t, r] (+)= sum_k W[r, k] * x[t, k] on the matrix units through VK_NV_cooperative_matrix2:
// workgroup-scope matrices (a BM x BK tile of W, BK x BN of x, BM x BN of f32 sums) that the
// driver spreads over the workgroup's subgroups and stages itself. W is read through tensor
// loads that call a decode function per weight (its block and the weight's place in it), so
// quantized rows become f16 inside the load; x is read as f32 the same way (or as f16 where
// a pass before has made it so: X16). Partial tiles at the edges are clamped by the tensor
// layouts (loads past them give 0, stores past them are dropped); the others take plain
// layouts, which spare the bounds checks. Q4_K's sub-block scales and mins are worked out once per super-block and
// tile row into shared memory, where its decode function reads them.
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
#extension GL_EXT_shader_16bit_storage : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_EXT_shader_explicit_arithmetic_types_int16 : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_KHR_cooperative_matrix : require
#extension GL_NV_cooperative_matrix2 : require
#extension GL_EXT_buffer_reference : require

layout(local_size_x_id = 0) in;                  // 128 or 256 lanes
layout(constant_id = 1) const uint BM = 128;     // weight rows per workgroup
layout(constant_id = 2) const uint BN = 128;     // tokens per workgroup
layout(constant_id = 3) const uint ACC = 0;      // 1: add into y (fused residual add)
layout(constant_id = 4) const uint X16 = 0;      // 1: x is f16 already (x_offset in halves)
const uint BK = 64;

layout(push_constant) uniform Push {
    uint n_in;       // K, a multiple of BK
    uint n_out;      // rows of W in this binding
    uint n_tokens;
    uint x_offset;   // in vec4 units (X16: in halves): first token row to read
    uint y_offset;   // in floats
    uint y_stride;   // floats between token rows of y
} p;

// W's blocks as the decode functions see them (QK weights a block), and the same bytes as
// words where the workgroup reads Q4_K's headers itself
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
shared vec2 dmin[8 * BM];          // (scale, min) of sub-block s of tile row r at [s * BM + r]
float16_t decode(const in Dec bl, const in uint blockCoords[2], const in uint coordInBlock[2]) {
    // weights 64j .. 64j + 31 are the low nibbles of qs bytes 32j .., the next 32 the high
    const uint i = coordInBlock[1];
    const uint byte = (i >> 6) * 32 + (i & 31u);
    const uint q = (bl.b.qs[byte >> 2] >> (8 * (byte & 3) + 4 * ((i >> 5) & 1))) & 15u;
    const vec2 sm = dmin[(i >> 5) * BM + blockCoords[0] % BM];
    return float16_t(sm.x * float(q) - sm.y);
}
// ggml's get_scale_min_k4 from the block's first 16 bytes (d and dmin, then 12 scale bytes)
uvec2 scale_min(uvec4 hd, uint s) {
    if (s < 4) return uvec2((hd.y >> (8 * s)) & 63u, (hd.z >> (8 * s)) & 63u);
    const uint lo4 = (hd.w >> (8 * (s - 4))) & 0xFFu;
    return uvec2((lo4 & 0xFu) | (((hd.y >> (8 * (s - 4))) >> 6 & 3u) << 4),
                 (lo4 >> 4) | (((hd.z >> (8 * (s - 4))) >> 6 & 3u) << 4));
}
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

// x as f32, four values a block, turned to f16 as the tile is loaded; or as f16 (X16)
layout(std430, binding = 1) readonly buffer X { vec4 x4[]; };
layout(std430, binding = 1) readonly buffer X16s { float16_t x16[]; };
layout(buffer_reference, std430, buffer_reference_align = 16) buffer DecX { vec4 v; };
float16_t decode_x(const in DecX bl, const in uint blockCoords[2], const in uint coordInBlock[2]) {
    return float16_t(bl.v[coordInBlock[1]]);
}
layout(std430, binding = 2) buffer Y { float y[]; };

// one step along K: Q4_K's scales at each super-block, then W's tile and x's, then the
// product; TW and TX are clamping layouts at the edges and plain ones inside
#if defined(TYPE_Q4_K)
#define SCALES(k0) if ((k0) % QK == 0) load_scales(row0, (k0) / QK);
#else
#define SCALES(k0)
#endif
#if defined(TYPE_F16)
#define LOAD_W(TW, k0) coopMatLoadTensorNV(a, w, 0, sliceTensorLayoutNV(TW, row0, BM, k0, BK));
#else
#define LOAD_W(TW, k0) \
    coopMatLoadTensorNV(a, w, 0, sliceTensorLayoutNV(TW, row0, BM, k0, BK), decode);
#endif
#define STEP(TW, TX, TX16) \
    for (uint k0 = 0; k0 < p.n_in; k0 += BK) { \
        SCALES(k0) \
        LOAD_W(TW, k0) \
        if (X16 != 0) \
            coopMatLoadTensorNV(b, x16, p.x_offset, sliceTensorLayoutNV(TX16, t0, BN, k0, BK), \
                                transposed); \
        else \
            coopMatLoadTensorNV(b, x4, p.x_offset, sliceTensorLayoutNV(TX, t0, BN, k0, BK), \
                                transposed, decode_x); \
        acc = coopMatMulAdd(a, b, acc); \
    }

#if defined(TYPE_Q4_K)
// the super-block kb's (scale, min) per sub-block, for every row of the tile
void load_scales(uint row0, uint kb) {
    barrier();                       // the last super-block's loads are done
    const uint nb = p.n_in / QK;
    for (uint e = gl_LocalInvocationID.x; e < 2 * BM; e += gl_WorkGroupSize.x) {
        const uint r = e >> 1, row = min(row0 + r, p.n_out - 1);
        const uvec4 hd = w4[(row * nb + kb) * 9];
        const vec2 dm = unpackHalf2x16(hd.x);
        [[unroll]] for (uint s = 4 * (e & 1); s < 4 * (e & 1) + 4; s++) {
            const uvec2 sm = scale_min(hd, s);
            dmin[s * BM + r] = vec2(dm.x * float(sm.x), dm.y * float(sm.y));
        }
    }
    barrier();
}
#endif

void main() {
    const uint row0 = gl_WorkGroupID.x * BM, t0 = gl_WorkGroupID.y * BN;

    // W: rows of n_in weights in blocks of QK; x: token rows of n_in, f32 four a block (or
    // f16); each in a clamping form for the edge tiles and a plain one for the others
    tensorLayoutNV<2, gl_CooperativeMatrixClampModeConstantNV> twc =
        createTensorLayoutNV(2, gl_CooperativeMatrixClampModeConstantNV);
    twc = setTensorLayoutBlockSizeNV(twc, 1, QK);
    twc = setTensorLayoutDimensionNV(twc, p.n_out, p.n_in);
    twc = setTensorLayoutStrideNV(twc, p.n_in / QK, 1);
    tensorLayoutNV<2> tw = createTensorLayoutNV(2);
    tw = setTensorLayoutBlockSizeNV(tw, 1, QK);
    tw = setTensorLayoutDimensionNV(tw, p.n_out, p.n_in);
    tw = setTensorLayoutStrideNV(tw, p.n_in / QK, 1);
    tensorLayoutNV<2, gl_CooperativeMatrixClampModeConstantNV> txc =
        createTensorLayoutNV(2, gl_CooperativeMatrixClampModeConstantNV);
    txc = setTensorLayoutBlockSizeNV(txc, 1, 4);
    txc = setTensorLayoutDimensionNV(txc, p.n_tokens, p.n_in);
    txc = setTensorLayoutStrideNV(txc, p.n_in / 4, 1);
    tensorLayoutNV<2> tx = createTensorLayoutNV(2);
    tx = setTensorLayoutBlockSizeNV(tx, 1, 4);
    tx = setTensorLayoutDimensionNV(tx, p.n_tokens, p.n_in);
    tx = setTensorLayoutStrideNV(tx, p.n_in / 4, 1);
    tensorLayoutNV<2, gl_CooperativeMatrixClampModeConstantNV> thc =
        createTensorLayoutNV(2, gl_CooperativeMatrixClampModeConstantNV);
    thc = setTensorLayoutDimensionNV(thc, p.n_tokens, p.n_in);
    thc = setTensorLayoutStrideNV(thc, p.n_in, 1);
    tensorLayoutNV<2> th = createTensorLayoutNV(2);
    th = setTensorLayoutDimensionNV(th, p.n_tokens, p.n_in);
    th = setTensorLayoutStrideNV(th, p.n_in, 1);
    // y: token rows of y_stride floats; this binding's rows start at y_offset
    tensorLayoutNV<2, gl_CooperativeMatrixClampModeConstantNV> ty =
        createTensorLayoutNV(2, gl_CooperativeMatrixClampModeConstantNV);
    ty = setTensorLayoutDimensionNV(ty, p.n_tokens, p.y_offset + p.n_out);
    ty = setTensorLayoutStrideNV(ty, p.y_stride, 1);
    tensorViewNV<2, false, 1, 0> transposed = createTensorViewNV(2, false, 1, 0);

    coopmat<float, gl_ScopeWorkgroup, BM, BN, gl_MatrixUseAccumulator> acc;
    if (ACC != 0) {
        coopMatLoadTensorNV(acc, y, 0, sliceTensorLayoutNV(ty, t0, BN, p.y_offset + row0, BM),
                            transposed);
    } else {
        acc = coopmat<float, gl_ScopeWorkgroup, BM, BN, gl_MatrixUseAccumulator>(0.0);
    }
    coopmat<float16_t, gl_ScopeWorkgroup, BM, BK, gl_MatrixUseA> a;
    coopmat<float16_t, gl_ScopeWorkgroup, BK, BN, gl_MatrixUseB> b;
    if (row0 + BM <= p.n_out && t0 + BN <= p.n_tokens) {
        STEP(tw, tx, th)
    } else {
        STEP(twc, txc, thc)
    }
    coopMatStoreTensorNV(acc, y, 0, sliceTensorLayoutNV(ty, t0, BN, p.y_offset + row0, BM),
                         transposed);
}
