#version 450
// Flash attention for prefill on NVIDIA's workgroup-scope matrices (VK_NV_cooperative_
// matrix2), with flash_attn_cm's semantics: grouped-query heads over the f16 KV cache,
// causal (or both ways), an optional sliding window, packed sequences (SEQS), soft-capped
// scores, a sink logit per head. A workgroup takes BR query rows of one head and walks the
// keys they can see in blocks of BC: S = Q K^T (BR x BC, f32), the running max M and sum L
// kept as BR x BC matrices whose rows repeat one value, P = exp(S - M) as f16, O += P V
// with O (BR x HD, f32) rescaled by exp(M_old - M) first. Rows past the tokens and keys
// past the cache load as zeros and are masked; the output leaves through a clamped store.
// The mask and the cap are applied element by element only in blocks that need them.
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_KHR_cooperative_matrix : require
#extension GL_NV_cooperative_matrix2 : require

layout(local_size_x_id = 0) in;                  // 128 lanes
layout(constant_id = 1) const uint HD = 128;     // head dim: 64 or 128
layout(constant_id = 2) const uint BR = 64;      // query rows a workgroup
layout(constant_id = 3) const uint BC = 64;      // keys a block
layout(constant_id = 4) const uint SINKS = 0;
layout(constant_id = 5) const uint SEQS = 0;

layout(std430, binding = 0) readonly buffer Q { float q[]; };            // [n_tokens, n_head, HD]
layout(std430, binding = 1) readonly buffer K { float16_t k[]; };        // [n_ctx, n_head_kv, HD]
layout(std430, binding = 2) readonly buffer V { float16_t v[]; };        // [n_ctx, n_head_kv, HD]
layout(std430, binding = 3) writeonly buffer O { float o[]; };           // [n_tokens, n_head, HD]
#include "step.glsl"
layout(std430, binding = 5) readonly buffer Sk { float sinks[]; };      // [n_head] (SINKS)
layout(push_constant) uniform Push {
    uint n_head;
    uint n_head_kv;
    uint n_tokens;
    uint window;       // 0: full causal attention
    float scale;
    float softcap;     // 0: none
} p;
#include "attn.glsl"

#define ROWS(T, C) coopmat<T, gl_ScopeWorkgroup, BR, C, gl_MatrixUseAccumulator>
const float NEG_INF = -1.0 / 0.0;
// the running max starts finite, so that a row with no key seen yet gives exp(-inf) = 0
const float FLOOR = -1.7014117e38;               // -FLT_MAX / 2

// score of query row r, key column c of the block starting at key k0 (tile rows from row0)
float masked(const in uint r, const in uint c, const in float s, const in uint row0,
             const in uint k0) {
    const uint t = row0 + r, kp = k0 + c, qp = step.pos0 + t;
    const bool seen = t < p.n_tokens && kp < step.n_past && (kp <= qp || step.bidir != 0)
                      && (p.window == 0 || kp + p.window > qp)
                      && (SEQS == 0 || kp >= step.seq_first[t]);
    return seen ? soft_cap(s * p.scale, p.softcap) : NEG_INF;
}
float rowmax(const in float a, const in float b) { return max(a, b); }
float smear(const in float a, const in float b) { return a; }
float maxof(const in uint r, const in uint c, const in float a, const in float b) {
    return max(a, b);
}
float expof(const in uint r, const in uint c, const in float a) { return exp(a); }
float divide(const in uint r, const in uint c, const in float a, const in float b) {
    return b > 0.0 ? a / b : 0.0;
}

void main() {
    const uint row0 = gl_WorkGroupID.x * BR, h = gl_WorkGroupID.y;
    if (row0 >= p.n_tokens) return;
    const uint kvh = h / (p.n_head / p.n_head_kv);
    const uint pos0 = step.pos0, n_kv = step.n_past;

    // q and o: token rows of n_head * HD; k and v: cache rows of n_head_kv * HD (strides
    // the compiler sees are multiples of 8, HD being 64 or 128)
    tensorLayoutNV<2, gl_CooperativeMatrixClampModeConstantNV> tq =
        createTensorLayoutNV(2, gl_CooperativeMatrixClampModeConstantNV);
    tq = setTensorLayoutDimensionNV(tq, p.n_tokens, p.n_head * HD);
    tq = setTensorLayoutStrideNV(tq, (p.n_head * HD) & ~7u, 1);
    tensorLayoutNV<2, gl_CooperativeMatrixClampModeConstantNV> tkv =
        createTensorLayoutNV(2, gl_CooperativeMatrixClampModeConstantNV);
    tkv = setTensorLayoutDimensionNV(tkv, n_kv, p.n_head_kv * HD);
    tkv = setTensorLayoutStrideNV(tkv, (p.n_head_kv * HD) & ~7u, 1);
    tensorViewNV<2, false, 1, 0> transposed = createTensorViewNV(2, false, 1, 0);

    // Q as f16, unscaled (the scale is applied to S in f32, as flash_attn_cm does)
    ROWS(float, HD) qf;
    coopMatLoadTensorNV(qf, q, 0, sliceTensorLayoutNV(tq, row0, BR, h * HD, HD));
    coopmat<float16_t, gl_ScopeWorkgroup, BR, HD, gl_MatrixUseA> qa =
        coopmat<float16_t, gl_ScopeWorkgroup, BR, HD, gl_MatrixUseA>(qf);

    ROWS(float, HD) acc = ROWS(float, HD)(0.0);
    ROWS(float, BC) m = ROWS(float, BC)(SINKS != 0 ? sinks[h] : FLOOR);
    ROWS(float, BC) l = ROWS(float, BC)(SINKS != 0 ? 1.0 : 0.0);
    coopmat<float16_t, gl_ScopeWorkgroup, BC, BC, gl_MatrixUseB> ones =
        coopmat<float16_t, gl_ScopeWorkgroup, BC, BC, gl_MatrixUseB>(1.0);

    // the keys any row of this tile sees (flash_attn_cm's bounds)
    const uint last_row = min(row0 + BR, p.n_tokens) - 1;
    const uint hi_key = step.bidir != 0 ? n_kv - 1 : min(pos0 + last_row, n_kv - 1);
    const uint win_lo = (p.window > 0 && pos0 + row0 >= p.window) ? pos0 + row0 - p.window + 1 : 0;
    const uint lo_key = SEQS != 0 ? max(win_lo, step.seq_first[row0]) : win_lo;

    for (uint kb = lo_key / BC; kb * BC <= hi_key; kb++) {
        const uint k0 = kb * BC;
        coopmat<float16_t, gl_ScopeWorkgroup, HD, BC, gl_MatrixUseB> kt;
        coopMatLoadTensorNV(kt, k, 0, sliceTensorLayoutNV(tkv, k0, BC, kvh * HD, HD), transposed);
        ROWS(float, BC) s = ROWS(float, BC)(0.0);
        s = coopMatMulAdd(qa, kt, s);
        // every row sees every key of the block (before the diagonal, inside the cache and
        // the window, rows all tokens, one sequence): the scale alone
        const bool whole = (step.bidir != 0 || k0 + BC <= pos0 + row0 + 1) && k0 + BC <= n_kv
                           && (p.window == 0 || k0 + p.window > pos0 + last_row)
                           && row0 + BR <= p.n_tokens && SEQS == 0 && p.softcap == 0.0;
        if (whole) {
            s *= p.scale;
        } else {
            coopMatPerElementNV(s, s, masked, row0, k0);
        }
        ROWS(float, BC) bmax, mn, pf, f;
        coopMatReduceNV(bmax, s, gl_CooperativeMatrixReduceRowNV, rowmax);
        coopMatPerElementNV(mn, bmax, maxof, m);
        coopMatPerElementNV(pf, s - mn, expof);
        coopMatPerElementNV(f, m - mn, expof);
        m = mn;
        coopmat<float16_t, gl_ScopeWorkgroup, BR, BC, gl_MatrixUseA> pa =
            coopmat<float16_t, gl_ScopeWorkgroup, BR, BC, gl_MatrixUseA>(pf);
        // the row sums of P as it enters P V (f16), through a product with ones
        ROWS(float, BC) rsum = ROWS(float, BC)(0.0);
        rsum = coopMatMulAdd(pa, ones, rsum);
        l = f * l + rsum;
        ROWS(float, HD) fd;
        coopMatReduceNV(fd, f, gl_CooperativeMatrixReduceRowNV, smear);
        acc = acc * fd;
        coopmat<float16_t, gl_ScopeWorkgroup, BC, HD, gl_MatrixUseB> vb;
        coopMatLoadTensorNV(vb, v, 0, sliceTensorLayoutNV(tkv, k0, BC, kvh * HD, HD));
        acc = coopMatMulAdd(pa, vb, acc);
    }

    ROWS(float, HD) ld;
    coopMatReduceNV(ld, l, gl_CooperativeMatrixReduceRowNV, smear);
    coopMatPerElementNV(acc, acc, divide, ld);
    coopMatStoreTensorNV(acc, o, 0, sliceTensorLayoutNV(tq, row0, BR, h * HD, HD));
}
