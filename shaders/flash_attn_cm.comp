#version 450
// Flash attention for prefill on the matrix units (VK_KHR_cooperative_matrix): grouped-query
// heads over the f16 KV cache, causal, with an optional sliding window. A workgroup of four
// subgroups takes BR = 64 query rows of one head, 16 rows per subgroup, and walks the KV
// positions they can see in blocks of BC = 32 staged in shared memory. S = Q K^T and
// P V are 16x16 f16 products with f32 sums; between them two lanes per row fold the block
// into the row's running max and sum (online softmax) and write P back as f16. The output
// rows stay in registers, two lanes per row, and leave divided by the sum.
// Token t sits at position step.pos0 + t and sees keys 0..pos, or only the last `window`
// of them when window > 0, and with SEQS = 1 none before step.seq_first[t] (packed
// sequences), as attention.comp.
// Options (include/attn.glsl): scores soft-capped (softcap > 0), a sink logit per head (SINKS).
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"
#extension GL_KHR_cooperative_matrix : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_shuffle : require

layout(local_size_x = 128) in;
layout(constant_id = 0) const uint HD = 64;         // head dim: 64, 128 or 256 (47 KiB of
                                                    // shared memory: fa_cm_shared_bytes)
layout(constant_id = 1) const uint SINKS = 0;
layout(constant_id = 2) const uint SEQS = 0;

layout(std430, binding = 0) readonly buffer Q { vec4 q4[]; };       // [n_tokens, n_head, HD]
layout(std430, binding = 1) readonly buffer K { f16vec4 k4[]; };    // [n_ctx, n_head_kv, HD]
layout(std430, binding = 2) readonly buffer V { f16vec4 v4[]; };    // [n_ctx, n_head_kv, HD]
layout(std430, binding = 3) writeonly buffer O { vec4 o4[]; };      // [n_tokens, n_head, HD]
#include "step.glsl"
layout(std430, binding = 5) readonly buffer Sk { float sinks[]; };  // [n_head] (SINKS)
layout(push_constant) uniform Push {
    uint n_head;
    uint n_head_kv;
    uint n_tokens;
    uint window;       // 0: full causal attention
    float scale;
    float softcap;     // 0: none
} p;
#include "attn.glsl"

const uint BR = 64, BC = 32, D4 = HD / 4, DT = HD / 16;
const uint KS = D4 + 2;                 // f16vec4s per staged K/V row (padded)
const uint PS = BC / 4 + 2;             // f16vec4s per row of P
shared f16vec4 Ks[BC * KS];             // K block, key-major (also stages Q, 32 rows a time)
shared f16vec4 Vs[BC * KS];             // V block, key-major
shared float Sc[4 * 16 * BC];           // per subgroup: S (16 x BC), then 16x16 P.V tiles
shared f16vec4 Ps[4 * 16 * PS];         // per subgroup: P (16 x BC), f16

#define MAT_A coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseA>
#define MAT_B coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseB>
#define ACCUM coopmat<float, gl_ScopeSubgroup, 16, 16, gl_MatrixUseAccumulator>

void main() {
    const uint tile = gl_WorkGroupID.x, h = gl_WorkGroupID.y;
    const uint tid = gl_LocalInvocationID.x, sg = gl_SubgroupID, lane = gl_SubgroupInvocationID;
    const uint row0 = tile * BR;
    if (row0 >= p.n_tokens) return;
    const uint kvh = h / (p.n_head / p.n_head_kv);
    const uint pos0 = step.pos0, n_kv = step.n_past;

    // Q rows of this subgroup as f16 A tiles, staged through Ks 32 rows at a time
    MAT_A qa[DT];
    [[unroll]] for (uint half_ = 0; half_ < 2; half_++) {
        for (uint i = tid; i < 32 * D4; i += 128) {
            const uint r = i / D4, d = i % D4, t = row0 + 32 * half_ + r;
            Ks[r * KS + d] = t < p.n_tokens ? f16vec4(q4[(t * p.n_head + h) * D4 + d])
                                            : f16vec4(0.0);
        }
        barrier();
        if (sg / 2 == half_) {
            [[unroll]] for (uint dt = 0; dt < DT; dt++)
                coopMatLoad(qa[dt], Ks, (sg % 2) * 16 * KS + dt * 4, KS,
                            gl_CooperativeMatrixLayoutRowMajor);
        }
        barrier();
    }

    // this lane's row and half of each 16-wide piece of it
    const uint r = lane >> 1, hh = lane & 1;
    const uint t = row0 + sg * 16 + r, qp = pos0 + t;
    const bool live = t < p.n_tokens;
    const uint seq_lo = SEQS != 0 && live ? step.seq_first[t] : 0;     // this row's first key
    const float NEG_INF = -1.0 / 0.0;
    float m = SINKS != 0 ? sinks[h] : NEG_INF, l = SINKS != 0 ? 1.0 : 0.0;
    float o[DT][8];
    [[unroll]] for (uint dt = 0; dt < DT; dt++)
        [[unroll]] for (uint c = 0; c < 8; c++) o[dt][c] = 0.0;

    // the keys any row of this tile sees
    const uint last_row = min(row0 + BR, p.n_tokens) - 1;
    const uint hi_key = step.bidir != 0 ? n_kv - 1 : min(pos0 + last_row, n_kv - 1);
    const uint win_lo = (p.window > 0 && pos0 + row0 >= p.window) ? pos0 + row0 - p.window + 1 : 0;
    // sequences start in slot order: the tile's first row has the lowest first key
    const uint lo_key = SEQS != 0 ? max(win_lo, step.seq_first[row0]) : win_lo;
    const uint sbase = sg * 16 * BC;

    for (uint kb = lo_key / BC; kb * BC <= hi_key; kb++) {
        barrier();                                   // the last block's reads are done
        for (uint i = tid; i < BC * D4; i += 128) {
            const uint kr = i / D4, d = i % D4, kp = kb * BC + kr;
            const uint src = (kp * p.n_head_kv + kvh) * D4 + d;
            Ks[kr * KS + d] = kp < n_kv ? k4[src] : f16vec4(0.0);
            Vs[kr * KS + d] = kp < n_kv ? v4[src] : f16vec4(0.0);
        }
        barrier();

        // S = Q K^T: 16 rows x BC keys; K^T (d x key) is K read column-major
        [[unroll]] for (uint jt = 0; jt < BC / 16; jt++) {
            ACCUM s = ACCUM(0.0);
            [[unroll]] for (uint dt = 0; dt < DT; dt++) {
                MAT_B kt;
                coopMatLoad(kt, Ks, jt * 16 * KS + dt * 4, KS, gl_CooperativeMatrixLayoutColumnMajor);
                s = coopMatMulAdd(qa[dt], kt, s);
            }
            coopMatStore(s, Sc, sbase + jt * 16, BC, gl_CooperativeMatrixLayoutRowMajor);
        }
        subgroupMemoryBarrierShared();
        subgroupBarrier();

        // online softmax over this row's half of the block
        float sv[16];
        float bmax = NEG_INF;
        [[unroll]] for (uint c = 0; c < 16; c++) {
            const uint kp = kb * BC + hh * 16 + c;
            const bool seen = live && (kp <= qp || step.bidir != 0) && kp < n_kv && (p.window == 0 || kp + p.window > qp)
                              && (SEQS == 0 || kp >= seq_lo);
            sv[c] = seen ? soft_cap(Sc[sbase + r * BC + hh * 16 + c] * p.scale, p.softcap)
                         : NEG_INF;
            bmax = max(bmax, sv[c]);
        }
        bmax = max(bmax, subgroupShuffleXor(bmax, 1));
        const float mn = max(m, bmax);
        const float f = mn == NEG_INF ? 1.0 : exp(m - mn);
        float rsum = 0.0;
        [[unroll]] for (uint c = 0; c < 16; c++) {
            sv[c] = sv[c] == NEG_INF ? 0.0 : exp(sv[c] - mn);
            rsum += sv[c];
        }
        rsum += subgroupShuffleXor(rsum, 1);
        l = l * f + rsum;
        m = mn;
        [[unroll]] for (uint v = 0; v < 4; v++)
            Ps[sg * 16 * PS + r * PS + hh * 4 + v] =
                f16vec4(sv[4 * v], sv[4 * v + 1], sv[4 * v + 2], sv[4 * v + 3]);
        [[unroll]] for (uint dt = 0; dt < DT; dt++)
            [[unroll]] for (uint c = 0; c < 8; c++) o[dt][c] *= f;
        subgroupMemoryBarrierShared();
        subgroupBarrier();

        // O += P V, one 16-wide piece of the head at a time, folded through Sc
        MAT_A pa[BC / 16];
        [[unroll]] for (uint kt = 0; kt < BC / 16; kt++)
            coopMatLoad(pa[kt], Ps, sg * 16 * PS + kt * 4, PS, gl_CooperativeMatrixLayoutRowMajor);
        [[unroll]] for (uint dt = 0; dt < DT; dt++) {
            ACCUM pv = ACCUM(0.0);
            [[unroll]] for (uint kt = 0; kt < BC / 16; kt++) {
                MAT_B vb;
                coopMatLoad(vb, Vs, kt * 16 * KS + dt * 4, KS, gl_CooperativeMatrixLayoutRowMajor);
                pv = coopMatMulAdd(pa[kt], vb, pv);
            }
            coopMatStore(pv, Sc, sbase, 16, gl_CooperativeMatrixLayoutRowMajor);
            subgroupMemoryBarrierShared();
            subgroupBarrier();
            [[unroll]] for (uint c = 0; c < 8; c++) o[dt][c] += Sc[sbase + r * 16 + hh * 8 + c];
            subgroupBarrier();
        }
    }

    if (live) {
        const float inv = l > 0.0 ? 1.0 / l : 0.0;
        const uint ob = (t * p.n_head + h) * D4;
        [[unroll]] for (uint dt = 0; dt < DT; dt++) {
            o4[ob + dt * 4 + hh * 2] = vec4(o[dt][0], o[dt][1], o[dt][2], o[dt][3]) * inv;
            o4[ob + dt * 4 + hh * 2 + 1] = vec4(o[dt][4], o[dt][5], o[dt][6], o[dt][7]) * inv;
        }
    }
}
