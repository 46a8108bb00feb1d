#version 450
// Rotary position embedding. x: [n_tokens, n_heads, head_dim] f32, token t at position
// step.pos0 + t. NEOX = 0 rotates adjacent pairs (2i, 2i+1) (llama's GGUF layout);
// NEOX = 1 rotates (i, i + n_dims/2). OUT_F16 = 1 writes into an f16 KV cache whose row for
// position p starts at p * n_heads * head_dim, so the rotated keys land in the cache directly.
#include "common.glsl"
layout(local_size_x = 64) in;
layout(constant_id = 0) const uint NEOX = 0;
layout(constant_id = 1) const uint OUT_F16 = 0;
// TABLE = 1 reads (cos, sin) from a host-computed table [n_ctx, n_dims/2] that follows
// ggml's float32 recurrence theta_i = pos * theta_scale^i, instead of computing them here.
layout(constant_id = 2) const uint TABLE = 0;
layout(std430, binding = 0) readonly buffer X { float x[]; };
layout(std430, binding = 1) buffer O32 { float o32[]; };
layout(std430, binding = 2) buffer O16 { float16_t o16[]; };
STEP_BUFFER(3)
layout(std430, binding = 4) readonly buffer CS { vec2 cs[]; };
layout(push_constant) uniform Push {
    uint n_heads;
    uint head_dim;
    uint n_dims;       // rotated dims (<= head_dim)
    uint n_tokens;
    float freq_base;
    float freq_scale;
} p;

void main() {
    const uint half_dims = p.n_dims / 2;
    const uint idx = gl_GlobalInvocationID.x;        // one invocation per rotated pair
    const uint per_token = p.n_heads * half_dims;
    if (idx >= per_token * p.n_tokens) return;
    const uint t = idx / per_token;
    const uint h = (idx % per_token) / half_dims;
    const uint i = idx % half_dims;
    const uint pos = step.pos0 + t;
    float c, s;
    if (TABLE != 0) {
        const vec2 v = cs[pos * half_dims + i];
        c = v.x;
        s = v.y;
    } else {
        const float theta = float(pos) * p.freq_scale * pow(p.freq_base, -2.0 * float(i) / float(p.n_dims));
        c = cos(theta);
        s = sin(theta);
    }
    const uint row = (t * p.n_heads + h) * p.head_dim;
    const uint a = NEOX != 0 ? i : 2 * i;
    const uint b = NEOX != 0 ? i + half_dims : 2 * i + 1;
    const float x0 = x[row + a], x1 = x[row + b];
    const float y0 = x0 * c - x1 * s, y1 = x0 * s + x1 * c;
    if (OUT_F16 != 0) {
        const uint orow = ((pos) * p.n_heads + h) * p.head_dim;
        o16[orow + a] = float16_t(y0);
        o16[orow + b] = float16_t(y1);
        // dims past n_dims are copied unrotated
        if (i == 0) for (uint d = p.n_dims; d < p.head_dim; d++) o16[orow + d] = float16_t(x[row + d]);
    } else {
        o32[row + a] = y0;
        o32[row + b] = y1;
    }
}
