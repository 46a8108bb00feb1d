#version 450
// y[s, r] = sum_k W[e, r, k] * x[t (or s), k]   for every slot s = t * n_used + j routed to
// expert e, on the matrix units (VK_KHR_cooperative_matrix): mul_mat_moe's grouping (moe_group's
// perm and groups) with mul_mat_cm's tiles. Workgroups are (row tiles of BM, tiles of BN
// slots): workgroup y takes the y-th tile that moe_tiles listed for this part of W's
// experts (moe_tile.glsl), those past them exit at once.
// A tile's x rows are gathered through perm into shared memory as f16 beside the expert's
// dequantized rows, as mul_mat_cm stages them (from f32 x, or X16's f16: the same halves);
// sums in f32, y in slot order [n_tokens, n_used, n_out] for moe_combine.
// X_SLOT 0: a slot reads its token's row of x (gate, up); 1: its own row s (down).
// W bound in parts holds whole experts, expert_base and n_experts of them.
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"
#extension GL_KHR_cooperative_matrix : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_KHR_shader_subgroup_basic : require

layout(local_size_x = 128) in;
layout(constant_id = 0) const uint BM = 64;      // weight rows per workgroup: 64 or 128
layout(constant_id = 1) const uint BN = 32;      // slots per tile: 32 or 64
layout(constant_id = 2) const uint X_SLOT = 0;
layout(constant_id = 3) const uint PREFETCH = 0;  // 1: the next step's W and x loaded into
                                                  // registers while this step multiplies;
                                                  // 0: loaded after the step's barrier
                                                  // (fewer registers a lane; on an H100
                                                  // Q4_K's 2048 x 768 for 256 tokens 142
                                                  // us against 164)
layout(constant_id = 4) const uint X16 = 0;       // 1: x is f16 (a pass before made it so)

layout(std430, binding = 0) readonly buffer W4 { uvec4 w4[]; };
layout(std430, binding = 0) readonly buffer W16 { uint16_t w16[]; };
layout(std430, binding = 0) readonly buffer W32 { uint w32[]; };
#include "chunk.glsl"
layout(std430, binding = 1) readonly buffer X { vec4 x4[]; };
layout(std430, binding = 1) readonly buffer Xh { f16vec4 xh4[]; };   // X16: the same places
layout(std430, binding = 2) readonly buffer Groups { uint groups[]; };
layout(std430, binding = 3) readonly buffer Perm { uint perm[]; };
layout(std430, binding = 4) writeonly buffer Y { float y[]; };

layout(push_constant) uniform Push {
    uint n_in;         // K, a multiple of BK
    uint n_out;        // rows of one expert
    uint n_used;       // experts per token
    uint expert_base;  // first expert held by this part of W
    uint n_experts;    // experts in this part
    uint n_expert;     // experts in all
} p;
#include "moe_tile.glsl"

const uint BK = 64, BK4 = BK / 4, S4 = BK4 + 2;   // f16vec4s per row, padded
const uint CPR = BK / CHUNK;                       // chunks of a row per step: 1 or 2
const uint MF = BM / 32, NF = BN / 32;             // 16x16 tiles per subgroup
shared f16vec4 As[BM * S4];                       // W tile, row-major: rows x k
shared f16vec4 Bs[BN * S4];                       // x tile, slot-major: slots x k
shared float Cs[4 * 256];                         // per subgroup: one 16x16 tile of sums
shared uint slot_of[BN];                          // the tile's slots (perm), 0 past count
shared uint xrow_of[BN];                          // ... and their x rows, in vec4

#define ACCUM coopmat<float, gl_ScopeSubgroup, 16, 16, gl_MatrixUseAccumulator>
const uint A_TASKS = BM * CPR, A_PER = (A_TASKS + 127) / 128;     // chunks per lane
const uint B_PER = BN * BK4 / 128;                                 // vec4s of x per lane

vec4 wa[A_PER][NV];
vec4 xb[B_PER];

// rows w0 + row0 .. of this part (the expert's), and the tile's live slots (< live)
void fetch(uint k0, uint w0, uint row0, uint live, uint nc) {
    [[unroll]] for (uint i = 0; i < A_PER; i++) {
        const uint task = gl_LocalInvocationID.x + 128 * i;
        if (task < A_TASKS) {
            const uint r = task / CPR, c = task % CPR;
            const uint row = w0 + min(row0 + r, p.n_out - 1);
            dequant_chunk(row * nc + k0 / CHUNK + c, wa[i]);
        }
    }
    [[unroll]] for (uint i = 0; i < B_PER; i++) {
        const uint u = gl_LocalInvocationID.x + 128 * i;
        const uint t = u / BK4, v = u % BK4;
        const uint at = xrow_of[t] + k0 / 4 + v;
        xb[i] = t >= live ? vec4(0.0) : X16 != 0 ? vec4(xh4[at]) : x4[at];
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
    const uint row0 = gl_WorkGroupID.x * BM;
    uint e, offset, count, i0;
    if (!moe_tile(e, offset, count, i0, BN)) return;
    const uint nc = p.n_in / CHUNK, xs = p.n_in / 4, w0 = e * p.n_out;

    const uint live = min(BN, count - i0);
    for (uint t = gl_LocalInvocationID.x; t < BN; t += 128) {
        const uint s = t < live ? perm[offset + i0 + t] : 0;
        slot_of[t] = s;
        xrow_of[t] = (X_SLOT != 0 ? s : s / p.n_used) * xs;
    }
    barrier();

    ACCUM acc[MF][NF];
    [[unroll]] for (uint i = 0; i < MF; i++)
        [[unroll]] for (uint j = 0; j < NF; j++) acc[i][j] = ACCUM(0.0);
    if (PREFETCH != 0) fetch(0, w0, row0, live, nc);
    for (uint k0 = 0; k0 < p.n_in; k0 += BK) {
        barrier();                                     // the last step's reads are done
        if (PREFETCH == 0) fetch(k0, w0, row0, live, nc);
        stash();
        barrier();
        if (PREFETCH != 0 && k0 + BK < p.n_in) fetch(k0 + BK, w0, row0, live, nc);
        [[unroll]] for (uint kk = 0; kk < BK4; kk += 4) {   // 16 k at a time
            coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseA> a[MF];
            coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseB> b;
            [[unroll]] for (uint i = 0; i < MF; i++)
                coopMatLoad(a[i], As, (sm * BM / 2 + i * 16) * S4 + kk, S4,
                            gl_CooperativeMatrixLayoutRowMajor);
            [[unroll]] for (uint j = 0; j < NF; j++) {    // K x N from slot-major rows
                coopMatLoad(b, Bs, (sn * BN / 2 + j * 16) * S4 + kk, S4,
                            gl_CooperativeMatrixLayoutColumnMajor);
                [[unroll]] for (uint i = 0; i < MF; i++)
                    acc[i][j] = coopMatMulAdd(a[i], b, acc[i][j]);
            }
        }
    }

    // tile (i, j): rows row0 + sm*BM/2 + 16i .., slots sn*BN/2 + 16j .. of the tile
    [[unroll]] for (uint i = 0; i < MF; i++) {
        [[unroll]] for (uint j = 0; j < NF; j++) {
            coopMatStore(acc[i][j], Cs, sg * 256, 16, gl_CooperativeMatrixLayoutColumnMajor);
            subgroupMemoryBarrierShared();
            subgroupBarrier();
            [[unroll]] for (uint q = 0; q < 8; q++) {
                const uint idx = lane + 32 * q;          // slot idx / 16, row idx % 16
                const uint t = sn * BN / 2 + j * 16 + idx / 16;
                const uint row = row0 + sm * BM / 2 + i * 16 + idx % 16;
                if (t < live && row < p.n_out)
                    y[slot_of[t] * p.n_out + row] = Cs[sg * 256 + idx];
            }
            subgroupBarrier();
        }
    }
}
