#version 450
// y[t, r] (+)= sum_k W[r, k] * x[t, k] on NVIDIA's workgroup-scope matrices, W staged by the
// lanes: mul_mat_cm's loads (each lane dequantizes whole chunks of W rows, include/
// chunk.glsl, and turns x to f16, into shared memory; the next step's global loads issued
// before this step's product) with mul_mat_cm2's product (a BM x 64 tile of W times 64 x BN
// of x into BM x BN f32 sums, matrices of the whole workgroup, which the driver spreads
// over its subgroups). Every weight type. The sums leave through a clamped tensor store
// (the residual add loads y as the sums first).
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_KHR_cooperative_matrix : require
#extension GL_NV_cooperative_matrix2 : require

layout(local_size_x_id = 0) in;                  // 128 or 256 lanes
layout(constant_id = 1) const uint BM = 128;     // weight rows per workgroup
layout(constant_id = 2) const uint BN = 128;     // tokens per workgroup
layout(constant_id = 3) const uint ACC = 0;      // 1: add into y (fused residual add)

layout(std430, binding = 0) readonly buffer W4 { uvec4 w4[]; };
layout(std430, binding = 0) readonly buffer W16 { uint16_t w16[]; };
layout(std430, binding = 0) readonly buffer W32 { uint w32[]; };
#include "chunk.glsl"
layout(std430, binding = 1) readonly buffer X { vec4 x4[]; };
layout(std430, binding = 2) buffer Y { float y[]; };

layout(push_constant) uniform Push {
    uint n_in;       // K, a multiple of BK
    uint n_out;      // rows of W in this binding
    uint n_tokens;
    uint x_offset;   // in vec4 units: first token row to read
    uint y_offset;   // in floats
    uint y_stride;   // floats between token rows of y
} p;

const uint BK = 64, BK4 = BK / 4, S4 = BK4 + 2;   // f16vec4s per row, padded
const uint CPR = BK / CHUNK;                       // chunks of a row per step: 1 or 2
shared f16vec4 As[BM * S4];                       // W tile, row-major: rows x k
shared f16vec4 Bs[BN * S4];                       // x tile, token-major: tokens x k

const uint LANES = gl_WorkGroupSize.x;
const uint A_TASKS = BM * CPR, A_PER = (A_TASKS + LANES - 1) / LANES;   // chunks per lane
const uint B_PER = (BN * BK4 + LANES - 1) / LANES;                       // vec4s of x per lane

vec4 wa[A_PER][NV];
vec4 xb[B_PER];

void fetch(uint k0, uint row0, uint t0, uint nc, uint xs) {
    [[unroll]] for (uint i = 0; i < A_PER; i++) {
        const uint task = gl_LocalInvocationID.x + LANES * i;
        if (task < A_TASKS) {
            const uint r = task / CPR, c = task % CPR;
            const uint row = min(row0 + r, p.n_out - 1);
            dequant_chunk(row * nc + k0 / CHUNK + c, wa[i]);
        }
    }
    [[unroll]] for (uint i = 0; i < B_PER; i++) {
        const uint u = gl_LocalInvocationID.x + LANES * i;
        const uint t = u / BK4, v = u % BK4;
        xb[i] = u < BN * BK4 && t0 + t < p.n_tokens
            ? x4[p.x_offset + (t0 + t) * xs + k0 / 4 + v] : vec4(0.0);
    }
}

void stash() {
    [[unroll]] for (uint i = 0; i < A_PER; i++) {
        const uint task = gl_LocalInvocationID.x + LANES * i;
        if (task < A_TASKS) {
            const uint r = task / CPR, c = task % CPR;
            [[unroll]] for (uint v = 0; v < NV; v++) As[r * S4 + c * NV + v] = f16vec4(wa[i][v]);
        }
    }
    [[unroll]] for (uint i = 0; i < B_PER; i++) {
        const uint u = gl_LocalInvocationID.x + LANES * i;
        if (u < BN * BK4) Bs[(u / BK4) * S4 + u % BK4] = f16vec4(xb[i]);
    }
}

void main() {
    const uint row0 = gl_WorkGroupID.x * BM, t0 = gl_WorkGroupID.y * BN;
    const uint nc = p.n_in / CHUNK, xs = p.n_in / 4;

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
    fetch(0, row0, t0, nc, xs);
    for (uint k0 = 0; k0 < p.n_in; k0 += BK) {
        barrier();                                        // the last step's reads are done
        stash();
        barrier();
        if (k0 + BK < p.n_in) fetch(k0 + BK, row0, t0, nc, xs);
        coopmat<float16_t, gl_ScopeWorkgroup, BM, BK, gl_MatrixUseA> a;
        coopmat<float16_t, gl_ScopeWorkgroup, BK, BN, gl_MatrixUseB> b;
        coopMatLoad(a, As, 0, S4, gl_CooperativeMatrixLayoutRowMajor);
        coopMatLoad(b, Bs, 0, S4, gl_CooperativeMatrixLayoutColumnMajor);   // K x N, token-major
        acc = coopMatMulAdd(a, b, acc);
    }
    coopMatStoreTensorNV(acc, y, 0, sliceTensorLayoutNV(ty, t0, BN, p.y_offset + row0, BM),
                         transposed);
}
