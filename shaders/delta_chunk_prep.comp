#version 450
// The gated delta rule over chunks of C tokens, first pass: what each (v head, chunk) needs of
// its keys, queries and gates alone, for every chunk at once (delta_chunk.comp then carries
// the state through them in order). Within a chunk, with G the running sum of g from its
// first token (G_t includes g_t) and beta its gates:
//   A[t, s] = beta_t exp(G_t - G_s) k_t . k_s       (s < t; else 0)
//   T       = (I + A)^-1                            (unit lower triangular: the WY/UT form)
//   M[t, s] = scale exp(G_t - G_s) q_t . k_s        (s <= t; else 0)
// Tokens past n_tokens (the last chunk's padding) have q = k = 0, g = 0, beta = 0: they
// change nothing. scratch per (h, chunk), at (h * n_chunks + chunk) * (2 C C + 2 C) floats:
// T [C, C], M [C, C], G [C], beta [C]. Inputs as delta_net.comp's.
#include "common.glsl"
#include "delta.glsl"
layout(local_size_x_id = 0) in;
layout(constant_id = 1) const uint C = 64;      // tokens per chunk
layout(constant_id = 2) const uint HD = 128;    // head dim d
layout(constant_id = 3) const uint DT = 16;     // key dims per shared tile
layout(std430, binding = 0) readonly buffer QKV { float qkv[]; };
layout(std430, binding = 1) readonly buffer Beta { float beta_in[]; };
layout(std430, binding = 2) readonly buffer Alpha { float alpha_in[]; };
layout(std430, binding = 3) readonly buffer Dt { float dt_bias[]; };
layout(std430, binding = 4) readonly buffer A { float ssm_a[]; };
layout(std430, binding = 5) writeonly buffer Scratch { float scratch[]; };
layout(push_constant) uniform Push {
    uint n_head;
    uint n_head_k;
    uint tiled;
    uint n_tokens;
    uint qkv_stride;
    uint k_offset;
    uint gate_stride;
    uint gate_group;
    uint beta_offset;
    uint alpha_offset;
    float scale;
} p;

const uint E = (C * C + gl_WorkGroupSize.x - 1) / gl_WorkGroupSize.x;
shared float sa[C * C];                 // A, then T in its place
shared float kt[C * DT], qt[C * DT];
shared float gs[C], bs[C];

void main() {
    const uint h = gl_WorkGroupID.x, chunk = gl_WorkGroupID.y, n_chunks = gl_NumWorkGroups.y;
    const uint lid = gl_LocalInvocationID.x, wg = gl_WorkGroupSize.x;
    const uint t0 = chunk * C;
    const uint hk = delta_k_head(h, p.n_head, p.n_head_k, p.tiled);
    const uint gi = delta_gate_index(h, p.n_head, p.n_head_k, p.gate_group);
    for (uint i = lid; i < C; i += wg) {
        const uint t = t0 + i;
        float g = 0.0, beta = 0.0;
        if (t < p.n_tokens) {
            const uint gate = t * p.gate_stride + gi;
            beta = delta_sigmoid(beta_in[p.beta_offset + gate]);
            g = delta_softplus(alpha_in[p.alpha_offset + gate] + dt_bias[h]) * ssm_a[h];
        }
        gs[i] = g;
        bs[i] = beta;
    }
    barrier();
    if (lid == 0) {                     // in token order, as ggml_cumsum sums
        for (uint i = 1; i < C; i++) gs[i] += gs[i - 1];
    }
    // k_t . k_s and q_t . k_s: each lane owns the entries e = lid + m wg, (t, s) = (e / C, e % C)
    float kk[E], qk[E];
    for (uint m = 0; m < E; m++) { kk[m] = 0.0; qk[m] = 0.0; }
    for (uint d0 = 0; d0 < HD; d0 += DT) {
        barrier();
        for (uint e = lid; e < C * DT; e += wg) {
            const uint tt = e / DT, t = t0 + tt;
            const uint at = t * p.qkv_stride + hk * HD + d0 + e % DT;
            const bool live = t < p.n_tokens && d0 + e % DT < HD;
            kt[e] = live ? qkv[at + p.k_offset] : 0.0;
            qt[e] = live ? qkv[at] : 0.0;
        }
        barrier();
        for (uint m = 0; m < E; m++) {
            const uint e = lid + m * wg;
            if (e >= C * C) break;
            const uint tt = e / C, s = e % C;
            float a = 0.0, b = 0.0;
            [[unroll]] for (uint dd = 0; dd < DT; dd++) {
                a += kt[tt * DT + dd] * kt[s * DT + dd];
                b += qt[tt * DT + dd] * kt[s * DT + dd];
            }
            kk[m] += a;
            qk[m] += b;
        }
    }
    const uint at = (h * n_chunks + chunk) * (2 * C * C + 2 * C);
    for (uint m = 0; m < E; m++) {
        const uint e = lid + m * wg;
        if (e >= C * C) break;
        const uint tt = e / C, s = e % C;
        const float decay = s <= tt ? exp(gs[tt] - gs[s]) : 0.0;
        sa[e] = s < tt ? bs[tt] * decay * kk[m] : s == tt ? 1.0 : 0.0;   // T's diagonal
        scratch[at + C * C + e] = p.scale * decay * qk[m];
    }
    barrier();
    // T = (I + A)^-1 by forward substitution, a row at a time: lane j owns column j,
    // T[i, j] = [i == j] - sum_{j <= s < i} A[i, s] T[s, j]  (rows above i already hold T;
    // wg >= C)
    for (uint i = 1; i < C; i++) {
        float acc = 0.0;
        if (lid < i) {
            for (uint s = lid; s < i; s++) acc += sa[i * C + s] * sa[s * C + lid];
        }
        barrier();
        if (lid < i) sa[i * C + lid] = -acc;
        barrier();
    }
    for (uint e = lid; e < C * C; e += wg) scratch[at + e] = sa[e];
    for (uint i = lid; i < C; i += wg) {
        scratch[at + 2 * C * C + i] = gs[i];
        scratch[at + 2 * C * C + C + i] = bs[i];
    }
}
