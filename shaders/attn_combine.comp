#version 450
// out[h] = the sum of attn_split.comp's per-split outputs of head h, in split order.
#include "common.glsl"
layout(local_size_x = 64) in;
layout(std430, binding = 0) readonly buffer P { vec4 part[]; };     // [n_head, n_split, HD]
layout(std430, binding = 1) writeonly buffer O { vec4 o4[]; };      // [n_head, HD]
layout(push_constant) uniform Push { uint head_dim; uint n_split; } p;

void main() {
    const uint h = gl_WorkGroupID.x, d4 = p.head_dim / 4;
    for (uint d = gl_LocalInvocationIndex; d < d4; d += gl_WorkGroupSize.x) {
        vec4 sum = vec4(0.0);
        for (uint s = 0; s < p.n_split; s++) sum += part[(h * p.n_split + s) * d4 + d];
        o4[h * d4 + d] = sum;
    }
}
