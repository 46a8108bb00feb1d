#version 450
// rope on q (in place, f32) and k (into the f16 K cache), and v into the f16 V cache, in one
// dispatch: the three small ops that follow the q/k/v projections in every layer.
// Token t goes into cache slot step.pos0 + t, which is its position too unless SEQS = 1 (then
// its position is the slot minus step.seq_first[t]: packed sequences each from position 0);
// a cache row for slot s starts at s * n_head_kv * head_dim. Dims past n_dims go into the K
// cache unrotated.
#include "common.glsl"
layout(local_size_x = 64) in;
// NEOX = 0 rotates adjacent pairs (2i, 2i+1) (llama's GGUF layout); 1 rotates (i, i + n_dims/2)
layout(constant_id = 0) const uint NEOX = 0;
// TABLE = 1 reads (cos, sin) from a host-computed table [n_ctx, n_dims/2] that follows
// ggml's float32 recurrence theta_i = pos * theta_scale^i, instead of computing them here
layout(constant_id = 1) const uint TABLE = 0;
// TEMP = 1 then multiplies q (all head_dim of it) by 1 + temp_scale * ln(1 + floor(pos /
// temp_floor)): Llama 4's attention temperature (mistral3)
layout(constant_id = 2) const uint TEMP = 0;
layout(constant_id = 3) const uint SEQS = 0;
layout(std430, binding = 0) buffer Q { float q[]; };
layout(std430, binding = 1) readonly buffer K { float k[]; };
layout(std430, binding = 2) readonly buffer V { float v[]; };
layout(std430, binding = 3) writeonly buffer KC { float16_t kc[]; };
layout(std430, binding = 4) writeonly buffer VC { float16_t vc[]; };
#include "step.glsl"
layout(std430, binding = 6) readonly buffer CS { vec2 cs[]; };
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
} p;

vec2 cos_sin(uint pos, uint i) {
    if (TABLE != 0) return cs[pos * (p.n_dims / 2) + i];
    const float theta = float(pos) * p.freq_scale
                      * pow(p.freq_base, -2.0 * float(i) / float(p.n_dims));
    return vec2(cos(theta), sin(theta));
}

void main() {
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
        const uint slot = step.pos0 + t;
        const uint pos = SEQS != 0 ? slot - step.seq_first[t] : slot;
        const vec2 c = cos_sin(pos, i);
        const uint a = NEOX != 0 ? i : 2 * i;
        const uint b = NEOX != 0 ? i + half_dims : 2 * i + 1;
        const uint row = (t * heads + h) * p.head_dim;
        if (is_q) {
            const float x0 = q[row + a], x1 = q[row + b];
            const float ra = x0 * c.x - x1 * c.y, rb = x0 * c.y + x1 * c.x;
            if (TEMP != 0) {
                const float s = 1.0 + p.temp_scale * log(1.0 + float(pos / p.temp_floor));
                q[row + a] = ra * s;
                q[row + b] = rb * s;
                if (i == 0) for (uint d = p.n_dims; d < p.head_dim; d++) q[row + d] *= s;
            } else {
                q[row + a] = ra;
                q[row + b] = rb;
            }
        } else {
            const float x0 = k[row + a], x1 = k[row + b];
            const uint o = slot * kv_row + h * p.head_dim;
            kc[o + a] = float16_t(x0 * c.x - x1 * c.y);
            kc[o + b] = float16_t(x0 * c.y + x1 * c.x);
            if (i == 0) for (uint d = p.n_dims; d < p.head_dim; d++) kc[o + d] = float16_t(k[row + d]);
        }
        return;
    }
    idx -= nq + nk;
    if (idx >= p.n_tokens * kv_row) return;
    vc[step.pos0 * kv_row + idx] = float16_t(v[idx]);
}
