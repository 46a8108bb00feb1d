#version 450
// y[t, r] (+)= sum_k W[r, k] * x[t, k] on the matrix units (VK_KHR_cooperative_matrix):
// the prefill product where the device has them. A workgroup of four subgroups computes a
// tile of BM weight rows x BN tokens. Per step of BK along K, its lanes dequantize the W
// tile (include/quant.glsl) and convert the x tile to f16 in shared memory; each subgroup
// then multiplies its 32 rows x 64 tokens as 2 x 4 16x16 f16 products with f32 sums.
// The sums leave through a small per-subgroup staging area, with bounds checks and the
// optional residual add.
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"
#extension GL_KHR_cooperative_matrix : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_KHR_shader_subgroup_basic : require

layout(local_size_x = 128) in;
layout(constant_id = 0) const uint ACC = 0;      // 1: add into y (fused residual add)

#define WEIGHT_BINDING 0
#include "quant.glsl"
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

const uint BM = 128, BN = 64, BK = 64;
const uint AS = BK + 8, BS = BK + 8;             // padded rows against bank conflicts
shared float16_t As[BM * AS];                     // W tile: row-major, rows x k
shared float16_t Bs[BN * BS];                     // x tile: token-major, tokens x k
shared float Cs[4 * 256];                         // per subgroup: one 16x16 tile of sums

#define ACCUM coopmat<float, gl_ScopeSubgroup, 16, 16, gl_MatrixUseAccumulator>

void main() {
    const uint tid = gl_LocalInvocationID.x, sg = gl_SubgroupID, lane = gl_SubgroupInvocationID;
    const uint row0 = gl_WorkGroupID.x * BM, t0 = gl_WorkGroupID.y * BN;
    const uint nb = p.n_in / 32, xs = p.n_in / 4;

    ACCUM acc[2][4];
    [[unroll]] for (uint i = 0; i < 2; i++)
        [[unroll]] for (uint j = 0; j < 4; j++) acc[i][j] = ACCUM(0.0);

    for (uint k0 = 0; k0 < p.n_in; k0 += BK) {
        // W: BM rows x BK = BM x 2 blocks of 32 = BM * 8 units of 8 weights
        [[unroll]] for (uint i = 0; i < BM * 8 / 128; i++) {
            const uint u = tid + 128 * i;
            const uint r = u >> 3, kb = (u >> 2) & 1, q = u & 3;
            const uint row = min(row0 + r, p.n_out - 1);
            vec4 lo, hi;
            dequant8(row * nb + k0 / 32 + kb, q, lo, hi);
            const uint o = r * AS + kb * 32 + 4 * q;
            [[unroll]] for (uint e = 0; e < 4; e++) {
                As[o + e] = float16_t(lo[e]);
                As[o + 16 + e] = float16_t(hi[e]);
            }
        }
        // x: BN tokens x BK = BN * 16 vec4
        [[unroll]] for (uint i = 0; i < BN * 16 / 128; i++) {
            const uint u = tid + 128 * i;
            const uint t = u >> 4, v = u & 15;
            const vec4 xv = t0 + t < p.n_tokens
                ? x4[p.x_offset + (t0 + t) * xs + k0 / 4 + v] : vec4(0.0);
            const uint o = t * BS + 4 * v;
            [[unroll]] for (uint e = 0; e < 4; e++) Bs[o + e] = float16_t(xv[e]);
        }
        barrier();
        [[unroll]] for (uint kk = 0; kk < BK; kk += 16) {
            coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseA> a[2];
            coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseB> b[4];
            [[unroll]] for (uint i = 0; i < 2; i++)
                coopMatLoad(a[i], As, (sg * 32 + i * 16) * AS + kk, AS,
                            gl_CooperativeMatrixLayoutRowMajor);
            [[unroll]] for (uint j = 0; j < 4; j++)   // K x N from token-major rows
                coopMatLoad(b[j], Bs, (j * 16) * BS + kk, BS,
                            gl_CooperativeMatrixLayoutColumnMajor);
            [[unroll]] for (uint i = 0; i < 2; i++)
                [[unroll]] for (uint j = 0; j < 4; j++) acc[i][j] = coopMatMulAdd(a[i], b[j], acc[i][j]);
        }
        barrier();
    }

    // out: tile (i, j) is rows row0 + sg*32 + 16i .., tokens t0 + 16j ..; Cs is token-major
    [[unroll]] for (uint i = 0; i < 2; i++) {
        [[unroll]] for (uint j = 0; j < 4; j++) {
            coopMatStore(acc[i][j], Cs, sg * 256, 16, gl_CooperativeMatrixLayoutColumnMajor);
            subgroupMemoryBarrierShared();
            subgroupBarrier();
            [[unroll]] for (uint e = 0; e < 8; e++) {
                const uint idx = lane + 32 * e;          // token idx / 16, row idx % 16
                const uint t = t0 + j * 16 + idx / 16, row = row0 + sg * 32 + i * 16 + idx % 16;
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
