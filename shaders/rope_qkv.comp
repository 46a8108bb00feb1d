#version 450
// rope on q (in place, f32) and k (into the f16 K cache), and v into the f16 V cache, in one
// dispatch: the three small ops that follow the q/k/v projections in every layer.
// Token t goes into cache slot step.pos0 + t, which is its position too unless SEQS = 1 (then
// its position is the slot minus step.seq_first[t]: packed sequences each from position 0);
// a cache row for slot s starts at s * n_head_kv * head_dim. Dims past n_dims go into the K
// cache unrotated.
// NORM = 1 first RMS-norms each head of q and k over its head_dim, times the weights qn and kn
// (the per-head q/k norms of qwen3 and gemma3), so those two norm passes go too: then a
// workgroup of WG lanes takes one head of one token (gl_WorkGroupID.y the token, .x the head:
// q's, k's, then groups of WG values of v), its sum of squares gathered as rms_norm.comp
// gathers a row's (the same lanes, the same order: the same bits as the two passes).
#include "common.glsl"
#extension GL_KHR_shader_subgroup_arithmetic : require
layout(local_size_x = 64, local_size_x_id = 5) in;    // WG: 64 unless NORM
// NEOX = 0 rotates adjacent pairs (2i, 2i+1) (llama's GGUF layout); 1 rotates (i, i + n_dims/2)
layout(constant_id = 0) const uint NEOX = 0;
// TABLE = 1 reads (cos, sin) from a host-computed table [n_ctx, n_dims/2] that follows
// ggml's float32 recurrence theta_i = pos * theta_scale^i, instead of computing them here
layout(constant_id = 1) const uint TABLE = 0;
// TEMP = 1 then multiplies q (all head_dim of it) by 1 + temp_scale * ln(1 + floor(pos /
// temp_floor)): Llama 4's attention temperature (mistral3)
layout(constant_id = 2) const uint TEMP = 0;
layout(constant_id = 3) const uint SEQS = 0;
layout(constant_id = 4) const uint NORM = 0;
layout(std430, binding = 0) buffer Q { float q[]; };
layout(std430, binding = 1) readonly buffer K { float k[]; };
layout(std430, binding = 2) readonly buffer V { float v[]; };
layout(std430, binding = 3) writeonly buffer KC { float16_t kc[]; };
layout(std430, binding = 4) writeonly buffer VC { float16_t vc[]; };
#include "step.glsl"
layout(std430, binding = 6) readonly buffer CS { vec2 cs[]; };
layout(std430, binding = 7) readonly buffer QN { float qn[]; };
layout(std430, binding = 8) readonly buffer KN { float kn[]; };
layout(push_constant) uniform Push {
    uint n_head;
    uint n_head_kv;
    uint head_dim;
    uint n_dims;       // rotated dims (<= head_dim)
    uint n_tokens;
    float freq_base;
    float freq_scale;
    float temp_scale;
    uint temp_floor;
    float eps;         // NORM's
} p;

shared float sums[32];

vec2 cos_sin(uint pos, uint i) {
    if (TABLE != 0) return cs[pos * (p.n_dims / 2) + i];
    const float theta = float(pos) * p.freq_scale
                      * pow(p.freq_base, -2.0 * float(i) / float(p.n_dims));
    return vec2(cos(theta), sin(theta));
}

uint position(uint t) { return SEQS != 0 ? step.pos0 + t - step.seq_first[t] : step.pos0 + t; }

float temperature(uint pos) {
    return TEMP != 0 ? 1.0 + p.temp_scale * log(1.0 + float(pos / p.temp_floor)) : 1.0;
}

// head h of token t: its pair i rotated (x0, x1 its dims a and b), into q in place (times the
// temperature s) or into the K cache
void put(bool is_q, uint t, uint h, uint i, float x0, float x1, float s) {
    const uint half_dims = p.n_dims / 2;
    const vec2 c = cos_sin(position(t), i);
    const uint a = NEOX != 0 ? i : 2 * i;
    const uint b = NEOX != 0 ? i + half_dims : 2 * i + 1;
    const float ra = x0 * c.x - x1 * c.y, rb = x0 * c.y + x1 * c.x;
    if (is_q) {
        const uint row = (t * p.n_head + h) * p.head_dim;
        q[row + a] = ra * s;
        q[row + b] = rb * s;
    } else {
        const uint o = (step.pos0 + t) * p.n_head_kv * p.head_dim + h * p.head_dim;
        kc[o + a] = float16_t(ra);
        kc[o + b] = float16_t(rb);
    }
}

void normed() {
    const uint t = gl_WorkGroupID.y, lane = gl_LocalInvocationID.x, wg = gl_WorkGroupSize.x;
    const uint kv_row = p.n_head_kv * p.head_dim;
    uint h = gl_WorkGroupID.x;
    if (h >= p.n_head + p.n_head_kv) {                       // v: wg values a group
        const uint j = (h - p.n_head - p.n_head_kv) * wg + lane;
        if (j < kv_row) vc[(step.pos0 + t) * kv_row + j] = float16_t(v[t * kv_row + j]);
        return;
    }
    const bool is_q = h < p.n_head;
    if (!is_q) h -= p.n_head;
    const uint row = (t * (is_q ? p.n_head : p.n_head_kv) + h) * p.head_dim;
    float ss = 0.0;
    for (uint d = lane; d < p.head_dim; d += wg) {
        const float x = is_q ? q[row + d] : k[row + d];
        ss += x * x;
    }
    ss = subgroupAdd(ss);
    if (gl_NumSubgroups > 1) {
        if (gl_SubgroupInvocationID == 0) sums[gl_SubgroupID] = ss;
        barrier();
        ss = 0.0;
        for (uint g = 0; g < gl_NumSubgroups; g++) ss += sums[g];
    }
    barrier();                                   // every lane has read q before any writes
    const float scale = 1.0 / sqrt(ss / float(p.head_dim) + p.eps);
    const float s = is_q ? temperature(position(t)) : 1.0;
    const uint half_dims = p.n_dims / 2;
    for (uint i = lane; i < half_dims; i += wg) {
        const uint a = NEOX != 0 ? i : 2 * i;
        const uint b = NEOX != 0 ? i + half_dims : 2 * i + 1;
        const float x0 = is_q ? q[row + a] * scale * qn[a] : k[row + a] * scale * kn[a];
        const float x1 = is_q ? q[row + b] * scale * qn[b] : k[row + b] * scale * kn[b];
        put(is_q, t, h, i, x0, x1, s);
    }
    const uint o = (step.pos0 + t) * kv_row + h * p.head_dim;
    for (uint d = p.n_dims + lane; d < p.head_dim; d += wg) {      // the unrotated dims
        if (is_q) q[row + d] = q[row + d] * scale * qn[d] * s;      // the norm's, then s
        else kc[o + d] = float16_t(k[row + d] * scale * kn[d]);
    }
}

void main() {
    if (NORM != 0) {
        normed();
        return;
    }
    const uint half_dims = p.n_dims / 2;
    const uint nq = p.n_tokens * p.n_head * half_dims;
    const uint nk = p.n_tokens * p.n_head_kv * half_dims;
    const uint kv_row = p.n_head_kv * p.head_dim;
    uint idx = gl_GlobalInvocationID.x;
    if (idx < nq + nk) {
        const bool is_q = idx < nq;
        if (!is_q) idx -= nq;
        const uint heads = is_q ? p.n_head : p.n_head_kv;
        const uint t = idx / (heads * half_dims);
        const uint h = (idx / half_dims) % heads;
        const uint i = idx % half_dims;
        const uint a = NEOX != 0 ? i : 2 * i;
        const uint b = NEOX != 0 ? i + half_dims : 2 * i + 1;
        const uint row = (t * heads + h) * p.head_dim;
        if (is_q) {
            const float s = temperature(position(t));
            put(true, t, h, i, q[row + a], q[row + b], s);
            if (TEMP != 0 && i == 0) for (uint d = p.n_dims; d < p.head_dim; d++) q[row + d] *= s;
        } else {
            put(false, t, h, i, k[row + a], k[row + b], 1.0);
            const uint o = (step.pos0 + t) * kv_row + h * p.head_dim;
            if (i == 0)
                for (uint d = p.n_dims; d < p.head_dim; d++) kc[o + d] = float16_t(k[row + d]);
        }
        return;
    }
    idx -= nq + nk;
    if (idx >= p.n_tokens * kv_row) return;
    vc[step.pos0 * kv_row + idx] = float16_t(v[idx]);
}
