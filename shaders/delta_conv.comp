#version 450
// The short convolution of a gated delta-net layer, as llama.cpp's qwen3next/qwen35 graphs run
// it: ggml_ssm_conv over concat(state, x^T), silu, then q and k L2-normed per head; the conv
// state moves on by n_tokens inputs, in place.
//   y[t, c]   = silu(sum_k src(c, t + k) * w[c, k]),  src(c, j) = j < width - 1 ? state[c, j]
//                                                              : x[j - (width - 1), c]
//   out[t, c] = y[t, c] / sqrt(sum over c's head of y^2 + eps)   (channels below n_norm: q, k)
//             = y[t, c]                                          (the others: v)
//   state[c, :] = the last width - 1 of src(c, :)
// x [n_tokens, n_channels] (the qkv projection), w [n_channels, width] f32, state
// [n_channels, width - 1], out [n_tokens, n_channels]. One workgroup per (head of head_dim
// channels, TB tokens); TB >= width - 1, so only the first token block reads the state, and
// its lanes write the new state of their own channels once their reads are done. ggml's L2
// norm here is rms_norm(eps / n) / sqrt(n), i.e. y / sqrt(sum y^2 + eps).
#include "common.glsl"
#extension GL_KHR_shader_subgroup_arithmetic : require
layout(local_size_x_id = 0) in;
layout(constant_id = 1) const uint TB = 16;
const uint CPT = 4;                     // channels per lane: head_dim <= 4 * WG
layout(std430, binding = 0) readonly buffer X { float x[]; };
layout(std430, binding = 1) readonly buffer Wt { float w[]; };
layout(std430, binding = 2) buffer State { float state[]; };
layout(std430, binding = 3) writeonly buffer O { float o[]; };
layout(push_constant) uniform Push {
    uint n_channels;
    uint n_tokens;
    uint width;      // kernel length (ssm.conv_kernel)
    uint head_dim;   // channels per head (ssm.state_size)
    uint n_norm;     // the first n_norm channels (q and k) are L2-normed per head
    float eps;
} p;

shared float sums[32];

float src(uint c, uint j) {
    const uint k1 = p.width - 1;
    return j < k1 ? state[c * k1 + j] : x[(j - k1) * p.n_channels + c];
}

void main() {
    const uint lid = gl_LocalInvocationID.x, wg = gl_WorkGroupSize.x;
    const uint c0 = gl_WorkGroupID.x * p.head_dim, t0 = gl_WorkGroupID.y * TB;
    const bool norm = c0 < p.n_norm;
    const uint t1 = min(t0 + TB, p.n_tokens);
    for (uint t = t0; t < t1; t++) {
        float y[CPT];
        float ss = 0.0;
        [[unroll]] for (uint r = 0; r < CPT; r++) {
            const uint i = r * wg + lid;
            y[r] = 0.0;
            if (i < p.head_dim) {
                const uint c = c0 + i;
                float sum = 0.0;
                for (uint k = 0; k < p.width; k++) {
                    sum += src(c, t + k) * w[c * p.width + k];
                }
                y[r] = sum / (1.0 + exp(-sum));
                ss += y[r] * y[r];
            }
        }
        if (norm) {
            ss = subgroupAdd(ss);
            if (gl_NumSubgroups > 1) {
                if (gl_SubgroupInvocationID == 0) sums[gl_SubgroupID] = ss;
                barrier();
                ss = 0.0;
                for (uint g = 0; g < gl_NumSubgroups; g++) ss += sums[g];
                barrier();
            }
            const float scale = 1.0 / sqrt(ss + p.eps);
            [[unroll]] for (uint r = 0; r < CPT; r++) y[r] *= scale;
        }
        [[unroll]] for (uint r = 0; r < CPT; r++) {
            const uint i = r * wg + lid;
            if (i < p.head_dim) o[t * p.n_channels + c0 + i] = y[r];
        }
    }
    if (gl_WorkGroupID.y == 0) {
        // ascending j reads src(c, n_tokens + j), past every slot written so far
        const uint k1 = p.width - 1;
        [[unroll]] for (uint r = 0; r < CPT; r++) {
            const uint i = r * wg + lid;
            if (i < p.head_dim) {
                const uint c = c0 + i;
                for (uint j = 0; j < k1; j++) state[c * k1 + j] = src(c, p.n_tokens + j);
            }
        }
    }
}
