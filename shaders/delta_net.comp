#version 450
// The gated delta rule, one token after another (decode; any n_tokens), all heads, the state
// read and written in place. Per v head h and token t, with S its [d, d] state (S[i, j]: key
// dim i, value dim j), q, k the L2-normed rows of k head delta_k_head(h) and the gates of
// include/delta.glsl:
//   S = exp(g) S;  delta = beta (v - S^T k);  S += k delta^T;  out = scale S^T q
// State layout [n_head, d (j), d (i)] f32 (llama.cpp's: S[i, j] at (h d + j) d + i).
// Columns j are independent: L lanes share one, each holding HD / L of its rows in
// registers. qkv [n_tokens, qkv_stride] holds q (head hk at hk * d), k (at k_offset) and v
// (at v_offset, head h at h * d); out [n_tokens, n_head, d].
#include "common.glsl"
#include "delta.glsl"
#extension GL_KHR_shader_subgroup_shuffle : require
layout(local_size_x_id = 0) in;
layout(constant_id = 1) const uint L = 8;       // lanes per column (divides the subgroup)
layout(constant_id = 2) const uint HD = 128;    // head dim d
const uint ROWS = HD / L;
layout(std430, binding = 0) readonly buffer QKV { float qkv[]; };
layout(std430, binding = 1) readonly buffer Beta { float beta_in[]; };
layout(std430, binding = 2) readonly buffer Alpha { float alpha_in[]; };
layout(std430, binding = 3) readonly buffer Dt { float dt_bias[]; };
layout(std430, binding = 4) readonly buffer A { float ssm_a[]; };
layout(std430, binding = 5) buffer State { float state[]; };
layout(std430, binding = 6) writeonly buffer O { float o[]; };
layout(push_constant) uniform Push {
    uint n_head;        // v heads
    uint n_head_k;      // k heads (divides n_head)
    uint tiled;         // k head of v head h: h % n_head_k (1) or h / (n_head / n_head_k) (0)
    uint n_tokens;
    uint qkv_stride;    // floats per token row of qkv
    uint k_offset;
    uint v_offset;
    uint gate_stride;   // floats per token row of the gate inputs
    uint gate_group;    // see delta_gate_index
    uint beta_offset;
    uint alpha_offset;
    float scale;        // 1 / sqrt(d)
} p;

float column_sum(float x) {
    // off = L/2, L/4, ..., 1, as a loop of a constant count (one that unrolls: a driver
    // that bounds loop iterations counts a halving loop's)
    [[unroll]] for (uint b = 0; b < 6; b++) {
        const uint off = 32u >> b;
        if (off < L) x += subgroupShuffleXor(x, off);
    }
    return x;
}

void main() {
    const uint h = gl_WorkGroupID.x, lane = gl_LocalInvocationID.x % L;
    const uint col = gl_WorkGroupID.y * (gl_WorkGroupSize.x / L) + gl_LocalInvocationID.x / L;
    const uint hk = delta_k_head(h, p.n_head, p.n_head_k, p.tiled);
    const uint gi = delta_gate_index(h, p.n_head, p.n_head_k, p.gate_group);
    const uint base = (h * HD + col) * HD;
    const float bias = dt_bias[h], a_h = ssm_a[h];
    float s[ROWS];
    [[unroll]] for (uint r = 0; r < ROWS; r++) s[r] = state[base + r * L + lane];
    for (uint t = 0; t < p.n_tokens; t++) {
        const uint row = t * p.qkv_stride;
        const uint gate = t * p.gate_stride + gi;
        const float beta = delta_sigmoid(beta_in[p.beta_offset + gate]);
        const float eg = exp(delta_softplus(alpha_in[p.alpha_offset + gate] + bias) * a_h);
        float kv = 0.0;
        [[unroll]] for (uint r = 0; r < ROWS; r++) {
            s[r] *= eg;
            kv += s[r] * qkv[row + p.k_offset + hk * HD + r * L + lane];
        }
        const float d = beta * (qkv[row + p.v_offset + h * HD + col] - column_sum(kv));
        float y = 0.0;
        [[unroll]] for (uint r = 0; r < ROWS; r++) {
            const uint i = hk * HD + r * L + lane;
            s[r] += qkv[row + p.k_offset + i] * d;
            y += s[r] * qkv[row + i];
        }
        y = column_sum(y);
        if (lane == 0) o[(t * p.n_head + h) * HD + col] = y * p.scale;
    }
    [[unroll]] for (uint r = 0; r < ROWS; r++) state[base + r * L + lane] = s[r];
}
