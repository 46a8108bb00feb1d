#version 450
// out[h] = attn_decode.comp's splits of head h joined: each split's output and sum rescaled
// to the largest max, the outputs' total divided by the sums' (empty splits count nothing).
#include "common.glsl"
layout(local_size_x = 64) in;
layout(std430, binding = 0) readonly buffer T { vec2 stats[]; };    // [n_head, n_split]
layout(std430, binding = 1) readonly buffer P { vec4 part[]; };     // [n_head, n_split, HD]
layout(std430, binding = 2) writeonly buffer O { vec4 o4[]; };      // [n_head, HD]
layout(push_constant) uniform Push { uint head_dim; uint n_split; } p;

void main() {
    const uint h = gl_WorkGroupID.x, d4 = p.head_dim / 4, st = h * p.n_split;
    float M = -1.0 / 0.0;
    for (uint s = 0; s < p.n_split; s++) M = max(M, stats[st + s].x);
    float L = 0.0;
    for (uint s = 0; s < p.n_split; s++) {
        const vec2 x = stats[st + s];
        if (x.y > 0.0) L += x.y * exp(x.x - M);
    }
    for (uint d = gl_LocalInvocationIndex; d < d4; d += gl_WorkGroupSize.x) {
        vec4 sum = vec4(0.0);
        for (uint s = 0; s < p.n_split; s++) {
            const vec2 x = stats[st + s];
            if (x.y > 0.0) sum += exp(x.x - M) * part[(st + s) * d4 + d];
        }
        o4[h * d4 + d] = sum / L;
    }
}
