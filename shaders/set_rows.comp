#version 450
// dst_f16[(step.pos0 + r) * n_cols + c] = src[r * n_cols + c]   (append rows to the KV cache)
#include "common.glsl"
layout(local_size_x = 64) in;
layout(std430, binding = 0) readonly buffer Src { float src[]; };
layout(std430, binding = 1) writeonly buffer Dst { float16_t dst[]; };
STEP_BUFFER(2)
layout(push_constant) uniform Push { uint n_cols; uint n_rows; } p;

void main() {
    const uint i = gl_GlobalInvocationID.x;
    if (i >= p.n_cols * p.n_rows) return;
    dst[step.pos0 * p.n_cols + i] = float16_t(src[i]);
}
