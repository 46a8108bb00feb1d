#version 450
// y[s, r] = sum_k W[e, r, k] * x[t (or s), k]   for every slot s = t * n_used + j routed to
// expert e, on NVIDIA's workgroup-scope matrices (VK_NV_cooperative_matrix2): mul_mat_moe's
// grouping (moe_group's perm and groups) with mul_mat_cm2's tiles. Workgroups are (row
// tiles of BM, tiles of BN slots): workgroup y takes the y-th tile that moe_tiles listed
// for this part of W's experts (moe_tile.glsl), those past them exit at once. W's rows come through the tensor loads' decode
// functions (include/cm2_decode.glsl); a tile's x rows are gathered by a decode function of
// their own, which reads each slot's row through the tile's table in shared memory; the
// sums leave element by element to their slots' rows of y ([n_tokens, n_used, n_out], for
// moe_combine).
// X_SLOT 0: a slot reads its token's row of x (gate, up); 1: its own row s (down).
// X16 1: x is f16 (a pass before made it so), else f32 turned to f16 in the gather.
// W bound in parts holds whole experts, expert_base and n_experts of them.
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
layout(constant_id = 2) const uint BN = 64;      // slots per tile
layout(constant_id = 3) const uint X_SLOT = 0;
layout(constant_id = 4) const uint F16DEC = 0;   // K-quants: 1 decodes in f16 (cm2_decode)
layout(constant_id = 5) const uint X16 = 0;
layout(constant_id = 6) const uint ACC16 = 0;    // 1: the tile's sums in f16 (mul_mat_cm2's)
const uint BK = 64;
const uint UNROLL = 4;             // steps along K an iteration (STEP)
const uint AHEAD = 0;              // the K-quants' scales: at each super-block (cm2_decode)

layout(push_constant) uniform Push {
    uint n_in;         // K, a multiple of BK
    uint n_out;        // rows of one expert
    uint n_used;       // experts per token
    uint expert_base;  // first expert held by this part of W
    uint n_experts;    // experts in this part
    uint n_expert;     // experts in all
} p;

#include "cm2_decode.glsl"
layout(std430, binding = 1) readonly buffer X { vec4 x4[]; };
layout(std430, binding = 1) readonly buffer X16s { float16_t x16[]; };
layout(std430, binding = 2) readonly buffer Groups { uint groups[]; };
layout(std430, binding = 3) readonly buffer Perm { uint perm[]; };
layout(std430, binding = 4) writeonly buffer Y { float y[]; };
#include "moe_tile.glsl"

shared uint slot_of[BN];           // the tile's slots (perm), 0 past its live ones
shared uint xrow_of[BN];           // ... and their x rows, in vec4

// x's tile: row c of the tile is slot c's row of x, read through xrow_of; the block the
// load points at (row 0's) is not the one read
layout(buffer_reference, std430, buffer_reference_align = 16) buffer DecX { vec4 v; };
float16_t gather_x(const in DecX bl, const in uint blockCoords[2], const in uint coordInBlock[2]) {
    if (X16 != 0)       // the same places in halves
        return x16[(xrow_of[blockCoords[0]] + blockCoords[1]) * 4 + coordInBlock[1]];
    return float16_t(x4[xrow_of[blockCoords[0]] + blockCoords[1]][coordInBlock[1]]);
}

// the sums of tile row r, slot c, to that slot's row of y
float store_y(const in uint r, const in uint c, const in float v, const in uint row0,
              const in uint live) {
    if (row0 + r < p.n_out && c < live) y[slot_of[c] * p.n_out + row0 + r] = v;
    return v;
}

#if defined(TYPE_F16)
#define LOAD_W(TW, k0) \
    coopMatLoadTensorNV(a, w, 0, sliceTensorLayoutNV(TW, w0 + row0, BM, k0, BK));
#else
#define LOAD_W(TW, k0) \
    coopMatLoadTensorNV(a, w, 0, sliceTensorLayoutNV(TW, w0 + row0, BM, k0, BK), decode);
#endif
#if defined(TYPE_Q4_K)
#define SCALES(k0) \
    if ((k0) % QK == 0) { \
        fetch_scales(w0 + row0, w0 + p.n_out, p.n_in, (k0) / QK); \
        store_scales(w0 + row0); \
    }
#else
#define SCALES(k0)
#endif
#define PRODUCT(TW, TX, k0) \
    SCALES(k0) \
    LOAD_W(TW, k0) \
    coopMatLoadTensorNV(b, x4, 0, sliceTensorLayoutNV(TX, 0, BN, k0, BK), transposed, \
                        gather_x); \
    if (ACC16 != 0) \
        acc16 = coopMatMulAdd(a, b, acc16); \
    else \
        acc = coopMatMulAdd(a, b, acc);
// UNROLL steps along K an iteration, so that a step's loads are issued while the products
// before it run (a loop of one step a turn waits on each load), then the steps left over
#define STEP(TW, TX) \
    uint k0 = 0; \
    for (; k0 + UNROLL * BK <= p.n_in; k0 += UNROLL * BK) { \
        [[unroll]] for (uint j = 0; j < UNROLL; j++) { \
            PRODUCT(TW, TX, k0 + j * BK) \
        } \
    } \
    for (; k0 < p.n_in; k0 += BK) { \
        PRODUCT(TW, TX, k0) \
    }

void main() {
    const uint row0 = gl_WorkGroupID.x * BM;
    uint e, offset, count, i0;
    if (!moe_tile(e, offset, count, i0, BN)) return;
    const uint xs = p.n_in / 4, w0 = e * p.n_out;

    // W: this part's experts' rows one after another, in blocks of QK; a tile past its
    // expert's last row reads the next one's (its sums are not stored), past the part's
    // last row zeros. x: BN rows of n_in, all at row 0's address (gather_x finds them).
    const uint rows = p.n_experts * p.n_out;
    // (f16 rows, QK 1: plain, at a stride the compiler sees is a multiple of 8 halves)
    const uint w_stride = QK == 1 ? p.n_in & ~7u : p.n_in / QK;
    tensorLayoutNV<2, gl_CooperativeMatrixClampModeConstantNV> twc =
        createTensorLayoutNV(2, gl_CooperativeMatrixClampModeConstantNV);
#if !defined(TYPE_F16)
    twc = setTensorLayoutBlockSizeNV(twc, 1, QK);
#endif
    twc = setTensorLayoutDimensionNV(twc, rows, p.n_in);
    twc = setTensorLayoutStrideNV(twc, w_stride, 1);
    tensorLayoutNV<2> tw = createTensorLayoutNV(2);
#if !defined(TYPE_F16)
    tw = setTensorLayoutBlockSizeNV(tw, 1, QK);
#endif
    tw = setTensorLayoutDimensionNV(tw, rows, p.n_in);
    tw = setTensorLayoutStrideNV(tw, w_stride, 1);
    tensorViewNV<2, false, 1, 0> transposed = createTensorViewNV(2, false, 1, 0);

    coopmat<float16_t, gl_ScopeWorkgroup, BM, BK, gl_MatrixUseA> a;
    coopmat<float16_t, gl_ScopeWorkgroup, BK, BN, gl_MatrixUseB> b;
    const uint live = min(BN, count - i0);
    for (uint t = gl_LocalInvocationID.x; t < BN; t += gl_WorkGroupSize.x) {
        const uint s = t < live ? perm[offset + i0 + t] : 0;
        slot_of[t] = s;
        xrow_of[t] = (X_SLOT != 0 ? s : s / p.n_used) * xs;
    }
    barrier();
    // slots past live: zeros, gather_x not called for them
    tensorLayoutNV<2, gl_CooperativeMatrixClampModeConstantNV> tx =
        createTensorLayoutNV(2, gl_CooperativeMatrixClampModeConstantNV);
    tx = setTensorLayoutBlockSizeNV(tx, 1, 4);
    tx = setTensorLayoutDimensionNV(tx, live, p.n_in);
    tx = setTensorLayoutStrideNV(tx, 0, 1);

    coopmat<float, gl_ScopeWorkgroup, BM, BN, gl_MatrixUseAccumulator> acc =
        coopmat<float, gl_ScopeWorkgroup, BM, BN, gl_MatrixUseAccumulator>(0.0);
    coopmat<float16_t, gl_ScopeWorkgroup, BM, BN, gl_MatrixUseAccumulator> acc16 =
        coopmat<float16_t, gl_ScopeWorkgroup, BM, BN, gl_MatrixUseAccumulator>(0.0);
    if (row0 + BM <= p.n_out) {
        STEP(tw, tx)
    } else {
        STEP(twc, tx)
    }
    if (ACC16 != 0) {
        [[unroll]] for (int i = 0; i < acc16.length(); i++) {
            acc16[i] = clamp(acc16[i], float16_t(-65504.0), float16_t(65504.0));
        }
        acc = coopmat<float, gl_ScopeWorkgroup, BM, BN, gl_MatrixUseAccumulator>(acc16);
    }
    coopMatPerElementNV(acc, acc, store_y, row0, live);
}
