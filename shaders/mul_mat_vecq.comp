#version 450
// y[r] (+)= sum_k W[r, k] * x[k] for one token, with x rounded to 8-bit integers: the decode
// product of GPUs that read weights faster than they convert them to floats.
// A workgroup first stages all of x in shared memory: the op before the product applied
// (XFORM 1 rms_norm with its weight in binding 3, 2 the GLU silu(x) * binding 3), then each
// block of 32 rounded to int8 with one f32 scale (amax / 127, as ggml's Q8_0), and each half
// block's sum kept for the weight types' offsets and minimums. Then every subgroup walks its
// own rows, ROWS at a time, with no barrier: wide loads of the weights, 4-wide integer dot
// products (SPV_KHR_integer_dot_product) against the staged x, one float scale per block.
// Workgroups loop over row tiles, so the grid can be a few per core and x is staged once
// per workgroup, not once per row.
#include "common.glsl"
#extension GL_KHR_shader_subgroup_arithmetic : require
#extension GL_EXT_spirv_intrinsics : require

// OpSDot (4450) of two packed 4 x int8 vectors (PackedVectorFormat4x8Bit = 0)
spirv_instruction(extensions = ["SPV_KHR_integer_dot_product"], capabilities = [6019, 6018],
                  id = 4450)
int sdot4(uint a, uint b, spirv_literal int packed_format);
#define DOT4(a, b) sdot4(a, b, 0)

layout(local_size_x_id = 0) in;
layout(constant_id = 1) const uint ROWS = 2;     // rows a subgroup takes at once
layout(constant_id = 2) const uint ACC = 0;      // 1: add into y (fused residual add)
layout(constant_id = 3) const uint XFORM = 0;    // the fused op before, see above
layout(constant_id = 4) const uint KMAX = 4096;  // the longest x staged (a multiple of 32)
layout(constant_id = 5) const uint UNROLL = 1;   // super-blocks a lane reads before it sums
layout(constant_id = 6) const uint PAIR = 0;     // 1: y = silu(W x) * (W2 x), W2 in binding 4
                                                 // from its row p.row2 (SwiGLU's gate and up);
                                                 // 2: gelu (tanh form, gemma's GeGLU) for silu;
                                                 // 3: gpt-oss's clamped SwiGLU (silu_mul.comp)
// ROPE rotates the rows as rope_qkv.comp does (one token at step.pos0, every dim of a head
// rotated): 1 adjacent pairs, 2 NeoX halves; a subgroup takes a pair's two rows (ROWS = 2).
// TABLE reads the angles' (cos, sin) from binding 6 as rope_qkv does. OUT16 writes f16 into a
// KV cache's row for step.pos0 (kv_row values a row) instead of f32 into y.
layout(constant_id = 7) const uint ROPE = 0;
layout(constant_id = 8) const uint TABLE = 0;
layout(constant_id = 9) const uint OUT16 = 0;
// EXPERTS (k > 0): W holds experts of n_out rows (expert_base .. + n_experts of them in this
// binding) and ids (binding 7) the k the router chose. Without SUM, workgroup row y takes
// slot y: y[slot, :] = W[ids[slot]] x, x the token's. With SUM, x holds each slot's input
// ([k, n_in]) and y (+)= sum over slots of weights[slot] (binding 8) * W[ids[slot]] x[slot]:
// the experts' down products and their weighted sum in one pass.
layout(constant_id = 10) const uint EXPERTS = 0;
layout(constant_id = 11) const uint SUM = 0;
// BIAS: each row's sum plus bias[row] (binding 9; PAIR's second sum plus bias2[row], binding
// 10) before anything else is done with it, the row counted in the expert (EXPERTS: bias is
// [n_experts, n_out]) or from y_offset (a weight bound in parts)
layout(constant_id = 12) const uint BIAS = 0;
// ROUTE (EXPERTS without SUM, W whole): the routing made here rather than read from ids, by
// every workgroup alike from the router's logits (binding 6, n_experts of them) as
// moe_router does it (include/route.glsl): 1 softmax, the weights normalised; 2 softmax;
// 3 the softmax over the chosen (gpt-oss). Workgroup (0, 0) writes the ids (binding 7) and
// the weights (binding 8) for the down products. ROUTE_N: the logits' shared memory.
layout(constant_id = 13) const uint ROUTE = 0;
layout(constant_id = 14) const uint ROUTE_N = 1;
// HNORM (ROPE 0, no BIAS): the rows are heads of head_dim with an RMS norm of their own (the
// per-head q and k norms of qwen3 and gemma3) before rope, 1 on adjacent pairs, 2 on NeoX
// halves. Each row's sum goes to y as it is; the subgroup that completes a head (a counter
// per head in binding 7, back to 0 after) norms it as rope_qkv does, times binding 8's
// weights (the norm's epsilon is eps), rotates it and writes it over itself in y, or with
// OUT16 as f16 into the K cache's row for step.pos0 (binding 9).
layout(constant_id = 15) const uint HNORM = 0;
// GATED (not with EXPERTS): each sum, after PAIR's GLU, times sigmoid(binding 8's first
// value), as mul.comp's gate takes it (Qwen3.5's shared expert, scaled by its own gate)
layout(constant_id = 16) const uint GATED = 0;

layout(std430, binding = 0) readonly buffer W4 { uvec4 w4[]; };
layout(std430, binding = 0) readonly buffer W16 { uint16_t w16[]; };
layout(std430, binding = 0) readonly buffer W32 { uint w32[]; };
layout(std430, binding = 1) readonly buffer X { vec4 x4[]; };
layout(std430, binding = 2) buffer Y { float y[]; };
layout(std430, binding = 2) writeonly buffer Y16 { float16_t y16[]; };   // OUT16
layout(std430, binding = 3) readonly buffer X2 { vec4 x2[]; };   // XFORM's second input
layout(std430, binding = 4) readonly buffer V4 { uvec4 v4[]; };   // PAIR's second weight
layout(std430, binding = 4) readonly buffer V16 { uint16_t v16[]; };
layout(std430, binding = 9) readonly buffer B1 { float bias[]; };          // BIAS
layout(std430, binding = 10) readonly buffer B2 { float bias2[]; };
#include "step.glsl"
layout(std430, binding = 6) readonly buffer CS { vec2 cs[]; };   // TABLE
layout(std430, binding = 7) readonly buffer Ids { uint ids[]; };         // EXPERTS
layout(std430, binding = 8) readonly buffer Wt { float expert_w[]; };    // SUM
layout(std430, binding = 6) readonly buffer RL { float router_logits[]; };   // ROUTE
layout(std430, binding = 7) writeonly buffer IdsOut { uint ids_out[]; };
layout(std430, binding = 8) writeonly buffer WtOut { float w_out[]; };
layout(std430, binding = 2) coherent buffer YC { float yc[]; };             // HNORM
layout(std430, binding = 7) coherent buffer HC { uint heads_done[]; };
layout(std430, binding = 8) readonly buffer HN { float head_w[]; };
layout(std430, binding = 9) writeonly buffer KC { float16_t kc16[]; };

layout(push_constant) uniform Push {
    uint n_in;       // K: a multiple of the type's block (256 for the K-quants)
    uint n_out;      // rows of W in this binding
    uint x_offset;   // in vec4 units
    uint y_offset;   // in floats: where row 0 of this binding lands
    float eps;       // XFORM 1: the norm's epsilon
    uint row2;       // PAIR: the second weight's first row in binding 4
    uint head_dim;   // ROPE: the rotated heads' size
    float freq_base; // ROPE without TABLE: theta_i = pos * freq_scale * base^(-2i / head_dim)
    float freq_scale;
    uint kv_row;     // OUT16: values a cache row holds (n_head_kv * head_dim)
    uint expert_base;  // EXPERTS: the first expert this binding of W holds
    uint n_experts;    // ... and how many
} p;
// EXPERTS: the expert's first row in W, and where its slot's x starts among the staged
// blocks of 32 (set per slot before row_dots)
uint expert_row = 0, x_block = 0;

shared uvec4 xq[KMAX / 16];        // x as int8, sixteen to an entry
shared vec4 xb[KMAX / 32];         // each block of 32: its scale d, d * sum(q) of each half
shared float red[32];

#include "chunk.glsl"                               // e8m0_half (MXFP4)
shared float route_prob[ROUTE_N];
#define ROUTE_LOGIT(e) router_logits[e]
#include "route.glsl"

// x (with the op before) as int8 blocks in shared memory, one lane a block of 32, in one
// pass: rounding is scale-free, so the norm's scale (returned; 1 for no norm) multiplies the
// row sums at the end, from the squares gathered on the way.
float stage() {
    const uint tid = gl_LocalInvocationID.x, nb = p.n_in / 32 * (SUM != 0 ? EXPERTS : 1);
    float ss = 0.0;
    for (uint b = tid; b < nb; b += gl_WorkGroupSize.x) {
        vec4 v[8];
        float amax = 0.0;
        [[unroll]] for (uint k = 0; k < 8; k++) {
            v[k] = x4[p.x_offset + 8 * b + k];
            if (XFORM == 1) {
                ss += dot(v[k], v[k]);
                v[k] *= x2[8 * b + k];
            }
            if (XFORM == 2) v[k] = v[k] / (1.0 + exp(-v[k])) * x2[p.x_offset + 8 * b + k];
            const vec4 a = abs(v[k]);
            amax = max(amax, max(max(a.x, a.y), max(a.z, a.w)));
        }
        const float d = amax / 127.0, id = amax > 0.0 ? 127.0 / amax : 0.0;
        uint w[8];
        float s0 = 0.0, s1 = 0.0;
        [[unroll]] for (uint k = 0; k < 8; k++) {
            const ivec4 q = ivec4(roundEven(v[k] * id));
            w[k] = uint(q.x & 0xFF) | (uint(q.y & 0xFF) << 8) | (uint(q.z & 0xFF) << 16)
                 | (uint(q.w) << 24);
            if (k < 4) s0 += float(q.x + q.y + q.z + q.w);
            else s1 += float(q.x + q.y + q.z + q.w);
        }
        xq[2 * b] = uvec4(w[0], w[1], w[2], w[3]);
        xq[2 * b + 1] = uvec4(w[4], w[5], w[6], w[7]);
        xb[b] = vec4(d, d * s0, d * s1, 0.0);
    }
    if (XFORM == 1) {
        ss = subgroupAdd(ss);
        if (gl_SubgroupInvocationID == 0) red[gl_SubgroupID] = ss;
    }
    barrier();
    if (XFORM != 1) return 1.0;
    float t = 0.0;
    for (uint g = 0; g < gl_NumSubgroups; g++) t += red[g];
    return 1.0 / sqrt(t / float(p.n_in) + p.eps);
}

// Weight reads from binding 0 (m = 0) or PAIR's binding 4 (m = 1), uniform in a subgroup
uvec4 ld4(uint m, uint i) {
    if (m == 0) return w4[i];
    return v4[i];
}
uint ld16(uint m, uint i) {
    if (m == 0) return uint(w16[i]);
    return uint(v16[i]);
}
uint ldpair(uint m, uint i) { return ld16(m, i) | (ld16(m, i + 1) << 16); }
float ldf16(uint m, uint i) { return unpackHalf2x16(ld16(m, i)).x; }
uint first_row(uint m, uint row) {
    return min(row, p.n_out - 1) + (m == 0 ? 0 : p.row2) + expert_row;
}

// The row a subgroup's r-th sum is: row0 + r, but under NeoX rope the pair of a head's dims
// i and i + head_dim / 2 (row0 counts pairs twice over)
uint row_at(uint row0, uint r) {
    if (ROPE != 2) return row0 + r;
    const uint j = row0 / 2, half_dims = p.head_dim / 2;
    return (j / half_dims) * p.head_dim + j % half_dims + r * half_dims;
}

// rope_qkv.comp's angle of pair i at position pos
vec2 cos_sin(uint pos, uint i) {
    if (TABLE != 0) return cs[pos * (p.head_dim / 2) + i];
    const float theta = float(pos) * p.freq_scale
                      * pow(p.freq_base, -2.0 * float(i) / float(p.head_dim));
    return vec2(cos(theta), sin(theta));
}

// HNORM: this subgroup's rows row0 .. (one head's) counted in; the subgroup that completes
// the head norms, rotates and writes it. The sums were written through yc, the counter
// taken after a buffer barrier, so the last subgroup sees every row of the head.
void end_head(uint row0) {
    const uint lane = gl_SubgroupInvocationID, sgs = gl_SubgroupSize, hd = p.head_dim;
    const uint head = row0 / hd, n = min(ROWS, p.n_out - row0);
    uint before = 0;
    if (lane == 0) {
        memoryBarrierBuffer();
        before = atomicAdd(heads_done[head], n);
    }
    if (subgroupMax(before) + n != hd) return;
    memoryBarrierBuffer();
    const uint base = p.y_offset + head * hd;
    float ss = 0.0;
    for (uint d = lane; d < hd; d += sgs) ss += yc[base + d] * yc[base + d];
    const float scale = 1.0 / sqrt(subgroupAdd(ss) / float(hd) + p.eps);
    for (uint i = lane; i < hd / 2; i += sgs) {
        const uint a = HNORM == 2 ? i : 2 * i, b = HNORM == 2 ? i + hd / 2 : 2 * i + 1;
        const float x0 = yc[base + a] * scale * head_w[a], x1 = yc[base + b] * scale * head_w[b];
        const vec2 c = cos_sin(step.pos0, i);
        const float ra = x0 * c.x - x1 * c.y, rb = x0 * c.y + x1 * c.x;
        if (OUT16 != 0) {
            kc16[step.pos0 * p.kv_row + head * hd + a] = float16_t(ra);
            kc16[step.pos0 * p.kv_row + head * hd + b] = float16_t(rb);
        } else {
            yc[base + a] = ra;
            yc[base + b] = rb;
        }
    }
    if (lane == 0) heads_done[head] = 0;
}

int dot16(uvec4 q, uvec4 x) {
    return DOT4(q.x, x.x) + DOT4(q.y, x.y) + DOT4(q.z, x.z) + DOT4(q.w, x.w);
}

// Sums over rows row_at(row0, r) of W * x into acc[r] (and under PAIR of W2 * x into acc2[r]),
// this lane's share: lane `t` of the LANES that share a super-block (or block), super-blocks
// i0, i0 + step, ... A pair's two weights are read in the same steps: each staged x value is
// loaded once for both, and both weights' loads are in flight together.
const uint NM = PAIR != 0 ? 2u : 1u;      // weights read: W, and W2 under PAIR
#if defined(TYPE_Q4_K)
// 144 bytes = 9 uvec4: f16 d, f16 dmin, scales[12], qs[128]. Eight lanes a super-block, one
// uvec4 of qs each: qs bytes 16t .. 16t + 15 hold weights 64j + 16h + l (low nibbles,
// sub-block 2j) and 64j + 32 + 16h + l (high, sub-block 2j + 1), j = t / 2, h = t % 2.
const uint LANES = 8;
// the 6-bit (scale, min) of sub-blocks 2j and 2j + 1 (kscale_min's), as two bytes each:
// scales in .x, mins in .y. Both sit in the half-word j % 2 of the packed words (sub-blocks
// 0-3 whole in hd.y, hd.z; 4-7 split between hd.w's nibbles and the top bits of hd.y, hd.z),
// so a lane takes them with the same shifts whichever j it has: no branch.
uvec2 kscale_min2(uvec4 hd, uint j) {
    const uint sh = 16 * (j & 1);
    const uint y = hd.y >> sh, z = hd.z >> sh, w = hd.w >> sh;
    const uvec2 low = uvec2(y & 0x3F3Fu, z & 0x3F3Fu);
    const uvec2 high = uvec2((w & 0x0F0Fu) | ((y >> 2) & 0x3030u),
                             ((w >> 4) & 0x0F0Fu) | ((z >> 2) & 0x3030u));
    return mix(high, low, bvec2(j < 2));
}
void row_dots(const uint row0, const uint t, const uint i0, const uint step,
              inout float acc[ROWS], inout float acc2[ROWS]) {
    const uint nsb = p.n_in / 256, j = t >> 1, h = t & 1;
    for (uint i1 = i0; i1 < nsb; i1 += step * UNROLL) [[unroll]]
    for (uint u = 0; u < UNROLL; u++) {   // UNROLL super-blocks' loads in flight at once
        const uint i = min(i1 + u * step, nsb - 1);
        const float live = i1 + u * step < nsb ? 1.0 : 0.0;
        const uint xw = 2 * x_block + i * 16 + 4 * j + h;  // x's uvec4 of the low nibbles
        const uvec4 xl = xq[xw], xh = xq[xw + 2];
        const vec4 bl = xb[x_block + i * 8 + 2 * j], bh = xb[x_block + i * 8 + 2 * j + 1];
        const float dl = bl.x, dh = bh.x, ml = bl[1 + h], mh = bh[1 + h];
        [[unroll]] for (uint r = 0; r < ROWS; r++) [[unroll]] for (uint m = 0; m < NM; m++) {
            const uint sb = (first_row(m, row_at(row0, r)) * nsb + i) * 9;
            const uvec4 hd = ld4(m, sb), q = ld4(m, sb + 1 + t);
            const uvec2 sm = kscale_min2(hd, j);
            const int il = dot16(q & 0x0F0F0F0Fu, xl), ih = dot16((q >> 4) & 0x0F0F0F0Fu, xh);
            const vec2 dm = unpackHalf2x16(hd.x);
            const float v = live * dm.x * (float(sm.x & 0xFFu) * dl * float(il)
                                           + float(sm.x >> 8) * dh * float(ih))
                          - live * dm.y * (float(sm.y & 0xFFu) * ml + float(sm.y >> 8) * mh);
            if (m == 0) acc[r] += v; else acc2[r] += v;
        }
    }
}
#elif defined(TYPE_Q6_K)
// 210 bytes = 105 u16: ql[128], qh[64], int8 scales[16], f16 d. Sixteen lanes a super-block:
// lane t takes weights 128n + 32k + l0 .. + 3 of quarters k = 0..3 (n = t / 8, l0 = 4 (t % 8)):
// low bits in ql[64n + 32(k & 1) + l0] (high nibbles for k >= 2), two high bits at
// qh[32n + l0] >> 2k, scale scales[8n + 2k + l0 / 16]. The 6-bit q goes in as is and its
// offset of 32 comes off through the x sums.
const uint LANES = 16;
void row_dots(const uint row0, const uint t, const uint i0, const uint step,
              inout float acc[ROWS], inout float acc2[ROWS]) {
    const uint nsb = p.n_in / 256, n = t >> 3, l0 = 4 * (t & 7), is = l0 >> 4;
    for (uint i1 = i0; i1 < nsb; i1 += step * UNROLL) [[unroll]]
    for (uint u = 0; u < UNROLL; u++) {   // UNROLL super-blocks' loads in flight at once
        const uint i = min(i1 + u * step, nsb - 1);
        const float live = i1 + u * step < nsb ? 1.0 : 0.0;
        const uint xw = 2 * x_block + i * 16 + 8 * n + l0 / 16;      // weight 128n + l0
        const uint c = (l0 / 4) & 3;
        const uvec4 xv = uvec4(xq[xw][c], xq[xw + 2][c], xq[xw + 4][c], xq[xw + 6][c]);
        const ivec4 xsum = ivec4(DOT4(xv.x, 0x01010101u), DOT4(xv.y, 0x01010101u),
                                 DOT4(xv.z, 0x01010101u), DOT4(xv.w, 0x01010101u));
        const uint xd = x_block + i * 8 + 4 * n;
        const vec4 dx = vec4(xb[xd].x, xb[xd + 1].x, xb[xd + 2].x, xb[xd + 3].x);
        [[unroll]] for (uint r = 0; r < ROWS; r++) [[unroll]] for (uint m = 0; m < NM; m++) {
            const uint base = (first_row(m, row_at(row0, r)) * nsb + i) * 105;
            const uint la = ldpair(m, base + 32 * n + l0 / 2);
            const uint lb = ldpair(m, base + 32 * n + 16 + l0 / 2);
            const uint hq = ldpair(m, base + 64 + 16 * n + l0 / 2);
            const uint q0 = (la & 0x0F0F0F0Fu) | ((hq << 4) & 0x30303030u);
            const uint q1 = (lb & 0x0F0F0F0Fu) | ((hq << 2) & 0x30303030u);
            const uint q2 = ((la >> 4) & 0x0F0F0F0Fu) | (hq & 0x30303030u);
            const uint q3 = ((lb >> 4) & 0x0F0F0F0Fu) | ((hq >> 2) & 0x30303030u);
            const ivec4 s = ivec4(DOT4(q0, xv.x), DOT4(q1, xv.y), DOT4(q2, xv.z), DOT4(q3, xv.w))
                          - 32 * xsum;
            // scales[8n + is + 2k]: byte `is` of u16 words 96 + 4n + k
            const uint sw = base + 96 + 4 * n, sh = 8 * is;
            const vec4 scl = vec4(int(ld16(m, sw) >> sh << 24) >> 24,
                                  int(ld16(m, sw + 1) >> sh << 24) >> 24,
                                  int(ld16(m, sw + 2) >> sh << 24) >> 24,
                                  int(ld16(m, sw + 3) >> sh << 24) >> 24);
            const float v = live * ldf16(m, base + 104) * dot(scl * dx, vec4(s));
            if (m == 0) acc[r] += v; else acc2[r] += v;
        }
    }
}
#elif defined(TYPE_Q4_0)
// 18 bytes = 9 u16 a block of 32: f16 d, qs[16] (byte l: weight l low, l + 16 high). One lane
// a block: the nibbles go in as 0..15 and the offset of 8 comes off through the x sums.
const uint LANES = 1;
void row_dots(const uint row0, const uint t, const uint i0, const uint step,
              inout float acc[ROWS], inout float acc2[ROWS]) {
    const uint nb = p.n_in / 32;
    for (uint i1 = i0; i1 < nb; i1 += step * UNROLL) [[unroll]]
    for (uint u = 0; u < UNROLL; u++) {   // UNROLL super-blocks' loads in flight at once
        const uint i = min(i1 + u * step, nb - 1);
        const float live = i1 + u * step < nb ? 1.0 : 0.0;
        const uvec4 xl = xq[2 * (x_block + i)], xh = xq[2 * (x_block + i) + 1];
        const vec4 bx = xb[x_block + i];
        const float dx = bx.x, sx = bx.y + bx.z;
        [[unroll]] for (uint r = 0; r < ROWS; r++) [[unroll]] for (uint m = 0; m < NM; m++) {
            const uint o = (first_row(m, row_at(row0, r)) * nb + i) * 9;
            const uvec4 q = uvec4(ldpair(m, o + 1), ldpair(m, o + 3), ldpair(m, o + 5),
                                  ldpair(m, o + 7));
            const int s = dot16(q & 0x0F0F0F0Fu, xl) + dot16((q >> 4) & 0x0F0F0F0Fu, xh);
            const float v = live * ldf16(m, o) * (dx * float(s) - 8.0 * sx);
            if (m == 0) acc[r] += v; else acc2[r] += v;
        }
    }
}
#elif defined(TYPE_Q8_0)
// 34 bytes = 17 u16 a block of 32: f16 d, int8 qs[32]. One lane a block.
const uint LANES = 1;
void row_dots(const uint row0, const uint t, const uint i0, const uint step,
              inout float acc[ROWS], inout float acc2[ROWS]) {
    const uint nb = p.n_in / 32;
    for (uint i1 = i0; i1 < nb; i1 += step * UNROLL) [[unroll]]
    for (uint u = 0; u < UNROLL; u++) {   // UNROLL blocks' loads in flight at once
        const uint i = min(i1 + u * step, nb - 1);
        const float live = i1 + u * step < nb ? 1.0 : 0.0;
        const uvec4 xl = xq[2 * (x_block + i)], xh = xq[2 * (x_block + i) + 1];
        const float dx = xb[x_block + i].x;
        [[unroll]] for (uint r = 0; r < ROWS; r++) [[unroll]] for (uint m = 0; m < NM; m++) {
            const uint o = (first_row(m, row_at(row0, r)) * nb + i) * 17;
            const uvec4 ql = uvec4(ldpair(m, o + 1), ldpair(m, o + 3), ldpair(m, o + 5),
                                   ldpair(m, o + 7));
            const uvec4 qh = uvec4(ldpair(m, o + 9), ldpair(m, o + 11), ldpair(m, o + 13),
                                   ldpair(m, o + 15));
            const float v = live * ldf16(m, o) * dx * float(dot16(ql, xl) + dot16(qh, xh));
            if (m == 0) acc[r] += v; else acc2[r] += v;
        }
    }
}
#elif defined(TYPE_MXFP4)
// 17 bytes a block of 32, at any byte: uint8 e (e8m0 scale), qs[16] (byte l: weight l low,
// l + 16 high), w = e2m1(nibble) * 2^(e - 127). One lane a block, read in u16s (a range that
// ends half-way into a word keeps its last byte readable); the e2m1 values go in doubled as
// int8 and the scale is taken at half.
const uint LANES = 1;
// four nibbles, one a byte -> their doubled e2m1 values as int8: 0 1 2 3 4 6 8 12 for the
// magnitude codes m = 0..7 (m, plus m - 4 from 4 on, plus 2 more at 7), negated where the
// nibble's top bit is set and the value is not 0 (no borrow between bytes)
uint e2m1x2(uint n) {
    const uint m = n & 0x07070707u;
    const uint from4 = ((m >> 2) & 0x01010101u) * 0xFFu;
    const uint v = m + (m & 0x03030303u & from4) + 2u * (m & (m >> 1) & (m >> 2) & 0x01010101u);
    const uint neg = (n >> 3) & (m | (m >> 1) | (m >> 2)) & 0x01010101u;
    return (v ^ (neg * 0xFFu)) + neg;
}
void row_dots(const uint row0, const uint t, const uint i0, const uint step,
              inout float acc[ROWS], inout float acc2[ROWS]) {
    const uint nb = p.n_in / 32;
    for (uint i1 = i0; i1 < nb; i1 += step * UNROLL) [[unroll]]
    for (uint u = 0; u < UNROLL; u++) {   // UNROLL blocks' loads in flight at once
        const uint i = min(i1 + u * step, nb - 1);
        const float live = i1 + u * step < nb ? 1.0 : 0.0;
        const uvec4 xl = xq[2 * (x_block + i)], xh = xq[2 * (x_block + i) + 1];
        const float dx = xb[x_block + i].x;
        [[unroll]] for (uint r = 0; r < ROWS; r++) [[unroll]] for (uint m = 0; m < NM; m++) {
            const uint o = (first_row(m, row_at(row0, r)) * nb + i) * 17, h = o >> 1;
            uint w[9];
            [[unroll]] for (uint k = 0; k < 9; k++) w[k] = ld16(m, h + k);
            uint e;
            uvec4 q;
            if ((o & 1u) == 0) {          // e low in word 0, qs from its high byte on
                e = w[0] & 0xFFu;
                [[unroll]] for (uint k = 0; k < 4; k++)
                    q[k] = (w[2 * k] >> 8) | (w[2 * k + 1] << 8) | ((w[2 * k + 2] & 0xFFu) << 24);
            } else {                      // e high in word 0, qs from word 1 on
                e = w[0] >> 8;
                [[unroll]] for (uint k = 0; k < 4; k++) q[k] = w[2 * k + 1] | (w[2 * k + 2] << 16);
            }
            const float d = e8m0_half(e);                  // dequant8.glsl, via chunk.glsl
            const uvec4 lo = uvec4(e2m1x2(q.x & 0x0F0F0F0Fu), e2m1x2(q.y & 0x0F0F0F0Fu),
                                   e2m1x2(q.z & 0x0F0F0F0Fu), e2m1x2(q.w & 0x0F0F0F0Fu));
            const uvec4 hi = uvec4(e2m1x2((q.x >> 4) & 0x0F0F0F0Fu),
                                   e2m1x2((q.y >> 4) & 0x0F0F0F0Fu),
                                   e2m1x2((q.z >> 4) & 0x0F0F0F0Fu),
                                   e2m1x2((q.w >> 4) & 0x0F0F0F0Fu));
            const float v = live * d * dx * float(dot16(lo, xl) + dot16(hi, xh));
            if (m == 0) acc[r] += v; else acc2[r] += v;
        }
    }
}
#else
#error "mul_mat_vecq: no reader for this weight type"
#endif

// PAIR's GLU of the gate's sum s and the up's u
float glu(float s, float u) {
    if (PAIR == 3) {                        // gpt-oss: alpha 1.702, limit 7 (silu_mul.comp)
        const float g = min(s, 7.0);
        return g / (1.0 + exp(-1.702 * g)) * (clamp(u, -7.0, 7.0) + 1.0);
    }
    if (PAIR == 2) {
        const float c = 0.7978845608028654;     // sqrt(2 / pi)
        return 0.5 * s * (1.0 + tanh(c * s * (1.0 + 0.044715 * s * s))) * u;
    }
    return s / (1.0 + exp(-s)) * u;
}

// BIAS's index of sum r: its row in the expert, or in the whole weight
uint bias_at(uint row0, uint r) {
    return (EXPERTS != 0 ? expert_row : p.y_offset) + min(row_at(row0, r), p.n_out - 1);
}

void main() {
    uint y_slot = 0;
    if (ROUTE != 0) {                    // the first subgroup routes while the rest stage x
        if (gl_SubgroupID == 0)
            route(p.n_experts, EXPERTS, ROUTE == 1 ? 1 : 0, ROUTE == 3 ? 1 : 0);
    } else if (EXPERTS != 0 && SUM == 0) {   // this workgroup's slot, if its expert is here
        const uint e = ids[gl_WorkGroupID.y] - p.expert_base;   // below the part it wraps
        if (e >= p.n_experts) return;
        expert_row = e * p.n_out;
        y_slot = gl_WorkGroupID.y * p.n_out;
    }
    const float scale = stage();                           // its barrier: the routing seen
    if (ROUTE != 0) {
        expert_row = route_id[gl_WorkGroupID.y] * p.n_out;
        y_slot = gl_WorkGroupID.y * p.n_out;
        const uint tid = gl_LocalInvocationID.x;
        if (gl_WorkGroupID.x == 0 && gl_WorkGroupID.y == 0 && tid < EXPERTS) {
            ids_out[tid] = route_id[tid];
            w_out[tid] = route_w[tid];
        }
    }
    const uint sg = gl_SubgroupID, lane = gl_SubgroupInvocationID;
    const uint n_sg = gl_NumSubgroups, sgs = gl_SubgroupSize;
    // lanes of a subgroup: (lane % LANES) is the share of a super-block, lane / LANES which
    // super-block; a subgroup narrower than LANES takes the other shares in turn
    const uint per = max(sgs / LANES, 1u), turns = max(LANES / sgs, 1u);
    for (uint row0 = (gl_WorkGroupID.x * n_sg + sg) * ROWS; row0 < p.n_out;
         row0 += gl_NumWorkGroups.x * n_sg * ROWS) {
        float acc[ROWS], acc2[ROWS];
        [[unroll]] for (uint r = 0; r < ROWS; r++) {
            acc[r] = 0.0;
            acc2[r] = 0.0;
        }
        float sums[ROWS];
        if (SUM != 0) {
            [[unroll]] for (uint r = 0; r < ROWS; r++) sums[r] = 0.0;
            for (uint j = 0; j < EXPERTS; j++) {
                const uint e = ids[j] - p.expert_base;
                if (e >= p.n_experts) continue;
                expert_row = e * p.n_out;
                x_block = j * (p.n_in / 32);
                [[unroll]] for (uint r = 0; r < ROWS; r++) acc[r] = 0.0;
                for (uint u = 0; u < turns; u++) {
                    const uint v = lane + u * sgs;
                    row_dots(row0, v % LANES, v / LANES, per, acc, acc2);
                }
                [[unroll]] for (uint r = 0; r < ROWS; r++)
                    sums[r] += expert_w[j] * (subgroupAdd(acc[r])
                                              + (BIAS != 0 ? bias[bias_at(row0, r)] : 0.0));
            }
        } else {
            for (uint u = 0; u < turns; u++) {
                const uint v = lane + u * sgs;
                row_dots(row0, v % LANES, v / LANES, per, acc, acc2);
            }
            [[unroll]] for (uint r = 0; r < ROWS; r++) {
                float s = subgroupAdd(acc[r]) * scale;
                if (BIAS != 0) s += bias[bias_at(row0, r)];
                if (PAIR != 0) {
                    float u = subgroupAdd(acc2[r]) * scale;
                    if (BIAS != 0) u += bias2[bias_at(row0, r)];
                    s = glu(s, u);
                }
                if (GATED != 0) s *= 1.0 / (1.0 + exp(-expert_w[0]));
                sums[r] = s;
            }
        }
        if (ROPE != 0) {                            // the pair's two rows, rotated
            const uint i = ROPE == 1 ? (row0 % p.head_dim) / 2 : (row0 / 2) % (p.head_dim / 2);
            const vec2 c = cos_sin(step.pos0, i);
            const float a = sums[0], b = sums[ROWS - 1];
            sums[0] = a * c.x - b * c.y;
            sums[ROWS - 1] = a * c.y + b * c.x;
        }
        [[unroll]] for (uint r = 0; r < ROWS; r++) {
            if (lane == 0 && row0 + r < p.n_out) {
                const uint o = p.y_offset + y_slot + row_at(row0, r);
                if (HNORM != 0) {
                    yc[o] = sums[r];
                } else if (OUT16 != 0) {
                    y16[step.pos0 * p.kv_row + o] = float16_t(sums[r]);
                } else {
                    y[o] = ACC != 0 ? y[o] + sums[r] : sums[r];
                }
            }
        }
        if (HNORM != 0) end_head(row0);
    }
}
