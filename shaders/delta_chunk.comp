#version 450
// The gated delta rule over chunks of C tokens, second pass: the state carried through the
// chunks in order, with delta_chunk_prep.comp's T, M, G and beta per (v head, chunk). A
// chunk's value columns are independent, so a workgroup takes JB columns of one head and
// every chunk in turn. For a chunk starting from state S (its columns here):
//   U = T (beta (V - exp(G) K S))              the chunk's deltas, all at once
//   O = scale exp(G) Q S + M U                 its outputs
//   S = exp(G_last) S + (exp(G_last - G) K)^T U
// (llama.cpp's build_delta_net_chunking, computed per column block). K and Q pass through
// shared memory TT tokens at a time. Layouts as delta_net.comp's; out [n_tokens, n_head, d].
#include "common.glsl"
#include "delta.glsl"
layout(local_size_x_id = 0) in;
layout(constant_id = 1) const uint C = 64;      // tokens per chunk
layout(constant_id = 2) const uint HD = 128;    // head dim d
layout(constant_id = 3) const uint JB = 16;     // value columns per workgroup
layout(constant_id = 4) const uint TT = 8;      // tokens per shared tile of K and Q (divides C)
const uint EU = (C * JB + gl_WorkGroupSize.x - 1) / gl_WorkGroupSize.x;
const uint ES = (JB * HD + gl_WorkGroupSize.x - 1) / gl_WorkGroupSize.x;
layout(std430, binding = 0) readonly buffer QKV { float qkv[]; };
layout(std430, binding = 1) readonly buffer Scratch { float scratch[]; };
layout(std430, binding = 2) buffer State { float state[]; };
layout(std430, binding = 3) writeonly buffer O { float o[]; };
layout(push_constant) uniform Push {
    uint n_head;
    uint n_head_k;
    uint tiled;
    uint n_tokens;
    uint qkv_stride;
    uint k_offset;
    uint v_offset;
    float scale;
} p;

shared float st[JB * HD];               // st[jj * HD + i] = S[i, col0 + jj]
shared float ub[C * JB];                // beta (V - exp(G) K S), then U
shared float yq[C * JB];                // scale exp(G) Q S
shared float eg[C], ed[C], bs[C];       // exp(G), exp(G_last - G), beta
shared float kt[TT * HD], qt[TT * HD];  // TT tokens' k and q rows

// the k (and q) rows of tokens t0 .. t0 + TT - 1 into kt (qt); zeros past n_tokens
void load_tile(uint t0, uint hk, bool with_q) {
    barrier();
    for (uint e = gl_LocalInvocationID.x; e < TT * HD; e += gl_WorkGroupSize.x) {
        const uint t = t0 + e / HD;
        const uint at = t * p.qkv_stride + hk * HD + e % HD;
        const bool live = t < p.n_tokens;
        kt[e] = live ? qkv[at + p.k_offset] : 0.0;
        if (with_q) qt[e] = live ? qkv[at] : 0.0;
    }
    barrier();
}

void main() {
    const uint h = gl_WorkGroupID.x, col0 = gl_WorkGroupID.y * JB;
    const uint lid = gl_LocalInvocationID.x, wg = gl_WorkGroupSize.x;
    const uint hk = delta_k_head(h, p.n_head, p.n_head_k, p.tiled);
    const uint n_chunks = (p.n_tokens + C - 1) / C;
    for (uint e = lid; e < JB * HD; e += wg) {
        st[e] = state[(h * HD + col0) * HD + e];
    }
    for (uint chunk = 0; chunk < n_chunks; chunk++) {
        const uint t0 = chunk * C;
        const uint at = (h * n_chunks + chunk) * (2 * C * C + 2 * C);
        const float g_last = scratch[at + 2 * C * C + C - 1];
        for (uint i = lid; i < C; i += wg) {
            const float g = scratch[at + 2 * C * C + i];
            eg[i] = exp(g);
            ed[i] = exp(g_last - g);
            bs[i] = scratch[at + 2 * C * C + C + i];
        }
        barrier();
        // K S and Q S, a tile of TT tokens at a time
        for (uint tile = 0; tile < C; tile += TT) {
            load_tile(t0 + tile, hk, true);
            for (uint e = lid; e < TT * JB; e += wg) {
                const uint tl = e / JB, jj = e % JB, tt = tile + tl, t = t0 + tt;
                float x = 0.0, y = 0.0;
                for (uint i = 0; i < HD; i++) {
                    x += kt[tl * HD + i] * st[jj * HD + i];
                    y += qt[tl * HD + i] * st[jj * HD + i];
                }
                ub[tt * JB + jj] = t < p.n_tokens ? bs[tt] * (
                    qkv[t * p.qkv_stride + p.v_offset + h * HD + col0 + jj] - eg[tt] * x) : 0.0;
                yq[tt * JB + jj] = p.scale * eg[tt] * y;
            }
        }
        barrier();
        float u[EU];
        for (uint m = 0; m < EU; m++) {
            const uint e = lid + m * wg;
            u[m] = 0.0;
            if (e < C * JB) {
                const uint tt = e / JB, jj = e % JB;
                for (uint s = 0; s <= tt; s++) u[m] += scratch[at + tt * C + s] * ub[s * JB + jj];
            }
        }
        barrier();
        for (uint m = 0; m < EU; m++) {
            const uint e = lid + m * wg;
            if (e < C * JB) ub[e] = u[m];
        }
        barrier();
        for (uint e = lid; e < C * JB; e += wg) {
            const uint tt = e / JB, jj = e % JB, t = t0 + tt;
            if (t >= p.n_tokens) continue;
            float y = yq[e];
            for (uint s = 0; s <= tt; s++) y += scratch[at + C * C + tt * C + s] * ub[s * JB + jj];
            o[(t * p.n_head + h) * HD + col0 + jj] = y;
        }
        // the state: each lane its ES entries (jj, i) = (e / HD, e % HD), over K in tiles
        const float decay = exp(g_last);
        const uint n_live = min(C, p.n_tokens - t0);
        float acc[ES];
        for (uint m = 0; m < ES; m++) {
            const uint e = lid + m * wg;
            acc[m] = e < JB * HD ? decay * st[e] : 0.0;
        }
        for (uint tile = 0; tile < n_live; tile += TT) {
            load_tile(t0 + tile, hk, false);
            for (uint m = 0; m < ES; m++) {
                const uint e = lid + m * wg, jj = e / HD, i = e % HD;
                if (e >= JB * HD) break;
                for (uint tl = 0; tl < TT; tl++) {
                    acc[m] += kt[tl * HD + i] * ed[tile + tl] * ub[(tile + tl) * JB + jj];
                }
            }
        }
        barrier();
        for (uint m = 0; m < ES; m++) {
            const uint e = lid + m * wg;
            if (e < JB * HD) st[e] = acc[m];
        }
        barrier();
    }
    for (uint e = lid; e < JB * HD; e += wg) {
        state[(h * HD + col0) * HD + e] = st[e];
    }
}
