#version 450
// y[t, r] (+)= sum_k W[r, k] * x[t, k] on the matrix units (VK_KHR_cooperative_matrix):
// the prefill product where the device has them. A workgroup of four subgroups (2 x 2)
// computes a tile of BM weight rows x BN tokens; each subgroup owns (BM/2) x (BN/2) as
// 16x16 f16 products with f32 sums. Per step of BK = 64 along K, lanes dequantize whole
// chunks of W rows (include/chunk.glsl) and convert x to f16 into shared memory; the next
// step's global loads are issued before this step's products, so they overlap. The sums
// leave through a small per-subgroup staging area, with bounds checks and the optional
// residual add.
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"
#extension GL_KHR_cooperative_matrix : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_KHR_shader_subgroup_basic : require

layout(local_size_x = 128) in;
layout(constant_id = 0) const uint ACC = 0;      // 1: add into y (fused residual add)
layout(constant_id = 1) const uint BM = 128;     // weight rows per workgroup: 64 or 128
layout(constant_id = 2) const uint BN = 64;      // tokens per workgroup: 32, 64 or 128

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
const uint MF = BM / 32, NF = BN / 32;             // 16x16 tiles per subgroup
shared f16vec4 As[BM * S4];                       // W tile, row-major: rows x k
shared f16vec4 Bs[BN * S4];                       // x tile, token-major: tokens x k
shared float Cs[4 * 256];                         // per subgroup: one 16x16 tile of sums

#define ACCUM coopmat<float, gl_ScopeSubgroup, 16, 16, gl_MatrixUseAccumulator>
const uint A_TASKS = BM * CPR, A_PER = (A_TASKS + 127) / 128;     // chunks per lane
const uint B_PER = BN * BK4 / 128;                                 // vec4s of x per lane

vec4 wa[A_PER][NV];
vec4 xb[B_PER];

void fetch(uint k0, uint row0, uint t0, uint nc, uint xs) {
    [[unroll]] for (uint i = 0; i < A_PER; i++) {
        const uint task = gl_LocalInvocationID.x + 128 * i;
        if (task < A_TASKS) {
            const uint r = task / CPR, c = task % CPR;
            const uint row = min(row0 + r, p.n_out - 1);
            dequant_chunk(row * nc + k0 / CHUNK + c, wa[i]);
        }
    }
    [[unroll]] for (uint i = 0; i < B_PER; i++) {
        const uint u = gl_LocalInvocationID.x + 128 * i;
        const uint t = u / BK4, v = u % BK4;
        xb[i] = t0 + t < p.n_tokens ? x4[p.x_offset + (t0 + t) * xs + k0 / 4 + v] : vec4(0.0);
    }
}

void stash() {
    [[unroll]] for (uint i = 0; i < A_PER; i++) {
        const uint task = gl_LocalInvocationID.x + 128 * i;
        if (task < A_TASKS) {
            const uint r = task / CPR, c = task % CPR;
            [[unroll]] for (uint v = 0; v < NV; v++) As[r * S4 + c * NV + v] = f16vec4(wa[i][v]);
        }
    }
    [[unroll]] for (uint i = 0; i < B_PER; i++) {
        const uint u = gl_LocalInvocationID.x + 128 * i;
        Bs[(u / BK4) * S4 + u % BK4] = f16vec4(xb[i]);
    }
}

void main() {
    const uint sg = gl_SubgroupID, lane = gl_SubgroupInvocationID;
    const uint sm = sg & 1, sn = sg >> 1;                  // this subgroup's quarter
    const uint row0 = gl_WorkGroupID.x * BM, t0 = gl_WorkGroupID.y * BN;
    const uint nc = p.n_in / CHUNK, xs = p.n_in / 4;

    ACCUM acc[MF][NF];
    [[unroll]] for (uint i = 0; i < MF; i++)
        [[unroll]] for (uint j = 0; j < NF; j++) acc[i][j] = ACCUM(0.0);

    fetch(0, row0, t0, nc, xs);
    for (uint k0 = 0; k0 < p.n_in; k0 += BK) {
        barrier();                                        // the last step's reads are done
        stash();
        barrier();
        if (k0 + BK < p.n_in) fetch(k0 + BK, row0, t0, nc, xs);
        [[unroll]] for (uint kk = 0; kk < BK4; kk += 4) {   // 16 k at a time
            coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseA> a[MF];
            coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseB> b;
            [[unroll]] for (uint i = 0; i < MF; i++)
                coopMatLoad(a[i], As, (sm * BM / 2 + i * 16) * S4 + kk, S4,
                            gl_CooperativeMatrixLayoutRowMajor);
            [[unroll]] for (uint j = 0; j < NF; j++) {    // K x N from token-major rows
                coopMatLoad(b, Bs, (sn * BN / 2 + j * 16) * S4 + kk, S4,
                            gl_CooperativeMatrixLayoutColumnMajor);
                [[unroll]] for (uint i = 0; i < MF; i++) acc[i][j] = coopMatMulAdd(a[i], b, acc[i][j]);
            }
        }
    }

    // tile (i, j): rows row0 + sm*BM/2 + 16i .., tokens t0 + sn*BN/2 + 16j ..; Cs token-major
    [[unroll]] for (uint i = 0; i < MF; i++) {
        [[unroll]] for (uint j = 0; j < NF; j++) {
            coopMatStore(acc[i][j], Cs, sg * 256, 16, gl_CooperativeMatrixLayoutColumnMajor);
            subgroupMemoryBarrierShared();
            subgroupBarrier();
            [[unroll]] for (uint e = 0; e < 8; e++) {
                const uint idx = lane + 32 * e;          // token idx / 16, row idx % 16
                const uint t = t0 + sn * BN / 2 + j * 16 + idx / 16;
                const uint row = row0 + sm * BM / 2 + i * 16 + idx % 16;
                if (t < p.n_tokens && row < p.n_out) {
                    const uint o = p.y_offset + t * p.y_stride + row;
                    const float v = Cs[sg * 256 + idx];
                    y[o] = ACC != 0 ? y[o] + v : v;
                }
            }
            subgroupBarrier();
        }
    }
}
