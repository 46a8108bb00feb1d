#version 450
// y[t, r] (+)= sum_k W[r, k] * x[t, k] on the matrix units through VK_NV_cooperative_matrix2:
// workgroup-scope matrices (a BM x BK tile of W, BK x BN of x, BM x BN of f32 sums) that the
// driver spreads over the workgroup's subgroups and stages itself. W is read through tensor
// loads that call a decode function per weight (its block and the weight's place in it), so
// quantized rows become f16 inside the load; x is read as f32 the same way (or as f16 where
// a pass before has made it so: X16). Partial tiles at the edges are clamped by the tensor
// layouts (loads past them give 0, stores past them are dropped); the others take plain
// layouts, which spare the bounds checks. Where the tiles are too few to fill the GPU, K is
// split: workgroup z sums its slice of K into its own slice of y, and split_sum adds the
// slices after. The decoders: include/cm2_decode.glsl.
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
layout(constant_id = 5) const uint AHEAD = 0;    // K-quants: 1 fetches the next super-block's
                                                 // scales while this one's products run
layout(constant_id = 6) const uint F16DEC = 0;   // K-quants: 1 decodes in f16 (cm2_decode)
layout(constant_id = 7) const uint ACC16 = 0;    // 1: the tile's sums in f16 (half the
                                                 // registers), clamped to f16's range and
                                                 // widened to f32 at the end
layout(constant_id = 8) const uint UNROLL = 4;   // steps along K an iteration where the
                                                 // type has no super-blocks
layout(constant_id = 9) const uint GROUP = 0;    // Q8_0, Q4_0: 1 reads eight blocks as one
                                                 // group of 256 (n_in a multiple of 256, W's
                                                 // binding of 16 bytes), d in shared memory
const uint BK = 64;

layout(push_constant) uniform Push {
    uint n_in;       // K, a multiple of BK (of 256 for the K-quants and GROUP)
    uint n_out;      // rows of W in this binding
    uint n_tokens;
    uint x_offset;   // in vec4 units (X16: in halves, a multiple of 8): first token row to read
    uint y_offset;   // in floats
    uint y_stride;   // floats between token rows of y
    uint k_split;    // K a workgroup sums over, a multiple of 256 (split K: workgroup z
                     // takes the z-th slice), or 0: all of it
    uint y_slice;    // floats between the slices' sums in y (split K: split_sum adds them)
} p;

#include "cm2_decode.glsl"

// x as f32, four values a block, turned to f16 as the tile is loaded; or as f16 (X16)
layout(std430, binding = 1) readonly buffer X { vec4 x4[]; };
layout(std430, binding = 1) readonly buffer X16s { float16_t x16[]; };
layout(buffer_reference, std430, buffer_reference_align = 16) buffer DecX { vec4 v; };
float16_t decode_x(const in DecX bl, const in uint blockCoords[2], const in uint coordInBlock[2]) {
    return float16_t(bl.v[coordInBlock[1]]);
}
layout(std430, binding = 2) buffer Y { float y[]; };

// one step along K: W's tile and x's, then the product; TW and TX are clamping layouts at
// the edges and plain ones inside
#if defined(TYPE_F16)
#define LOAD_W(TW, k0) coopMatLoadTensorNV(a, w, 0, sliceTensorLayoutNV(TW, row0, BM, k0, BK));
#elif defined(TYPE_Q8_0) || defined(TYPE_Q4_0)
#define LOAD_W(TW, k0) \
    if (GROUP != 0) \
        coopMatLoadTensorNV(a, w8, 0, sliceTensorLayoutNV(TW, row0, BM, k0, BK), decode8); \
    else \
        coopMatLoadTensorNV(a, w, 0, sliceTensorLayoutNV(TW, row0, BM, k0, BK), decode);
#else
#define LOAD_W(TW, k0) \
    coopMatLoadTensorNV(a, w, 0, sliceTensorLayoutNV(TW, row0, BM, k0, BK), decode);
#endif
#define PRODUCT(TW, TX, TX16, k0) \
    LOAD_W(TW, k0) \
    if (X16 != 0) \
        coopMatLoadTensorNV(b, x16, p.x_offset & ~7u, sliceTensorLayoutNV(TX16, t0, BN, k0, BK), \
                            transposed); \
    else \
        coopMatLoadTensorNV(b, x4, p.x_offset, sliceTensorLayoutNV(TX, t0, BN, k0, BK), \
                            transposed, decode_x); \
    if (ACC16 != 0) \
        acc16 = coopMatMulAdd(a, b, acc16); \
    else \
        acc = coopMatMulAdd(a, b, acc);
// the K-quants a super-block at a time (and Q8_0, Q4_0 a group at a time): its scales into
// shared memory first (Q4_K and the groups; Q6_K with AHEAD), with AHEAD fetched during the
// super-block before
#define STEP_SCALED(TW, TX, TX16) \
    if (AHEAD != 0) \
        fetch_scales(row0, p.n_out, p.n_in, k_begin / QG); \
    for (uint kb = k_begin / QG; kb < k_end / QG; kb++) { \
        if (AHEAD != 0) { \
            store_scales(row0); \
            if (kb + 1 < k_end / QG) \
                fetch_scales(row0, p.n_out, p.n_in, kb + 1); \
        } else if (QK_SHARED) { \
            fetch_scales(row0, p.n_out, p.n_in, kb); \
            store_scales(row0); \
        } \
        [[unroll]] for (uint j = 0; j < QG / BK; j++) { \
            PRODUCT(TW, TX, TX16, kb * QG + j * BK) \
        } \
    }
// the other types UNROLL steps along K an iteration, so that a step's loads are issued
// while the products before it run (a loop of one step a turn waits on each load), then
// the steps left over
#define STEP_PLAIN(TW, TX, TX16) \
    uint k0 = k_begin; \
    for (; k0 + UNROLL * BK <= k_end; k0 += UNROLL * BK) { \
        [[unroll]] for (uint j = 0; j < UNROLL; j++) { \
            PRODUCT(TW, TX, TX16, k0 + j * BK) \
        } \
    } \
    for (; k0 < k_end; k0 += BK) { \
        PRODUCT(TW, TX, TX16, k0) \
    }
#if defined(TYPE_Q4_K) || defined(TYPE_Q6_K)
#define STEP(TW, TX, TX16) STEP_SCALED(TW, TX, TX16)
#elif defined(TYPE_Q8_0) || defined(TYPE_Q4_0)
#define STEP(TW, TX, TX16) \
    if (GROUP != 0) { \
        STEP_SCALED(TW, TX, TX16) \
    } else { \
        STEP_PLAIN(TW, TX, TX16) \
    }
#else
#define STEP(TW, TX, TX16) STEP_PLAIN(TW, TX, TX16)
#endif

void main() {
    const uint row0 = gl_WorkGroupID.x * BM, t0 = gl_WorkGroupID.y * BN;
    const uint k_begin = gl_WorkGroupID.z * p.k_split;
    const uint k_end = p.k_split == 0 ? p.n_in : min(p.n_in, k_begin + p.k_split);
    const uint y_base = gl_WorkGroupID.z * p.y_slice;

    // W: rows of n_in weights in blocks of QK, or groups of eight (f16 rows, QK 1: plain,
    // at a stride the compiler sees is a multiple of 8 halves, so that they load 16 bytes at
    // a time; n_in is a multiple of 64); x: token rows of n_in, f32 four a block (or f16);
    // each in a clamping form for the edge tiles and a plain one for the others
#if defined(TYPE_Q8_0) || defined(TYPE_Q4_0)
    const uint QW = GROUP != 0 ? QG : QK;          // the weights a decode call's block holds
#else
    const uint QW = QK;
#endif
    const uint w_stride = QW == 1 ? p.n_in & ~7u : p.n_in / QW;
    tensorLayoutNV<2, gl_CooperativeMatrixClampModeConstantNV> twc =
        createTensorLayoutNV(2, gl_CooperativeMatrixClampModeConstantNV);
#if !defined(TYPE_F16)
    twc = setTensorLayoutBlockSizeNV(twc, 1, QW);
#endif
    twc = setTensorLayoutDimensionNV(twc, p.n_out, p.n_in);
    twc = setTensorLayoutStrideNV(twc, w_stride, 1);
    tensorLayoutNV<2> tw = createTensorLayoutNV(2);
#if !defined(TYPE_F16)
    tw = setTensorLayoutBlockSizeNV(tw, 1, QW);
#endif
    tw = setTensorLayoutDimensionNV(tw, p.n_out, p.n_in);
    tw = setTensorLayoutStrideNV(tw, w_stride, 1);
    tensorLayoutNV<2, gl_CooperativeMatrixClampModeConstantNV> txc =
        createTensorLayoutNV(2, gl_CooperativeMatrixClampModeConstantNV);
    txc = setTensorLayoutBlockSizeNV(txc, 1, 4);
    txc = setTensorLayoutDimensionNV(txc, p.n_tokens, p.n_in);
    txc = setTensorLayoutStrideNV(txc, p.n_in / 4, 1);
    tensorLayoutNV<2> tx = createTensorLayoutNV(2);
    tx = setTensorLayoutBlockSizeNV(tx, 1, 4);
    tx = setTensorLayoutDimensionNV(tx, p.n_tokens, p.n_in);
    tx = setTensorLayoutStrideNV(tx, p.n_in / 4, 1);
    // (f16 x: a stride the compiler sees is a multiple of 8 halves, so rows load 16 bytes
    // at a time; n_in is a multiple of 64)
    tensorLayoutNV<2, gl_CooperativeMatrixClampModeConstantNV> thc =
        createTensorLayoutNV(2, gl_CooperativeMatrixClampModeConstantNV);
    thc = setTensorLayoutDimensionNV(thc, p.n_tokens, p.n_in);
    thc = setTensorLayoutStrideNV(thc, p.n_in & ~7u, 1);
    tensorLayoutNV<2> th = createTensorLayoutNV(2);
    th = setTensorLayoutDimensionNV(th, p.n_tokens, p.n_in);
    th = setTensorLayoutStrideNV(th, p.n_in & ~7u, 1);
    // y: token rows of y_stride floats; this binding's rows start at y_offset
    tensorLayoutNV<2, gl_CooperativeMatrixClampModeConstantNV> ty =
        createTensorLayoutNV(2, gl_CooperativeMatrixClampModeConstantNV);
    ty = setTensorLayoutDimensionNV(ty, p.n_tokens, p.y_offset + p.n_out);
    ty = setTensorLayoutStrideNV(ty, p.y_stride, 1);
    tensorViewNV<2, false, 1, 0> transposed = createTensorViewNV(2, false, 1, 0);

    // the sums: f32 (acc, which a fused residual add starts from y), or f16 (acc16, from 0;
    // y is added in f32 at the end)
    coopmat<float, gl_ScopeWorkgroup, BM, BN, gl_MatrixUseAccumulator> acc =
        coopmat<float, gl_ScopeWorkgroup, BM, BN, gl_MatrixUseAccumulator>(0.0);
    coopmat<float16_t, gl_ScopeWorkgroup, BM, BN, gl_MatrixUseAccumulator> acc16 =
        coopmat<float16_t, gl_ScopeWorkgroup, BM, BN, gl_MatrixUseAccumulator>(0.0);
    if (ACC != 0 && ACC16 == 0) {
        coopMatLoadTensorNV(acc, y, 0, sliceTensorLayoutNV(ty, t0, BN, p.y_offset + row0, BM),
                            transposed);
    }
    coopmat<float16_t, gl_ScopeWorkgroup, BM, BK, gl_MatrixUseA> a;
    coopmat<float16_t, gl_ScopeWorkgroup, BK, BN, gl_MatrixUseB> b;
    if (row0 + BM <= p.n_out && t0 + BN <= p.n_tokens) {
        STEP(tw, tx, th)
    } else {
        STEP(twc, txc, thc)
    }
    if (ACC16 != 0) {
        [[unroll]] for (int i = 0; i < acc16.length(); i++) {
            acc16[i] = clamp(acc16[i], float16_t(-65504.0), float16_t(65504.0));
        }
        coopmat<float, gl_ScopeWorkgroup, BM, BN, gl_MatrixUseAccumulator> sums =
            coopmat<float, gl_ScopeWorkgroup, BM, BN, gl_MatrixUseAccumulator>(acc16);
        if (ACC != 0) {
            coopmat<float, gl_ScopeWorkgroup, BM, BN, gl_MatrixUseAccumulator> y0;
            coopMatLoadTensorNV(y0, y, 0,
                                sliceTensorLayoutNV(ty, t0, BN, p.y_offset + row0, BM),
                                transposed);
            sums += y0;
        }
        coopMatStoreTensorNV(sums, y, y_base,
                             sliceTensorLayoutNV(ty, t0, BN, p.y_offset + row0, BM), transposed);
    } else {
        coopMatStoreTensorNV(acc, y, y_base,
                             sliceTensorLayoutNV(ty, t0, BN, p.y_offset + row0, BM), transposed);
    }
}
