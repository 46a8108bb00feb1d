#version 450
// y[i] (+)= sum over z of part[z * n + i]: the slices of a product whose K was split over
// workgroups (mul_mat_cm2's k_split), added in slice order, so a run gives the same bits
// every time. ACC 1 adds them into y (the residual add fused into the product). Four
// floats a lane, as vec4 loads where n is a multiple of 4 (each slice then starts on 16
// bytes); the workgroups may be laid out in rows of any width.
layout(local_size_x = 64) in;
layout(constant_id = 0) const uint ACC = 0;
layout(std430, binding = 0) readonly buffer Part { float part[]; };
layout(std430, binding = 0) readonly buffer Part4 { vec4 part4[]; };
layout(std430, binding = 1) buffer Y { float y[]; };
layout(std430, binding = 1) buffer Y4 { vec4 y4[]; };
layout(push_constant) uniform Push {
    uint n;            // floats a slice (the product's tokens x outputs)
    uint slices;
} p;

void main() {
    const uint i4 = gl_GlobalInvocationID.x + gl_GlobalInvocationID.y * gl_NumWorkGroups.x * 64;
    if (4 * i4 >= p.n) return;
    if (p.n % 4 == 0) {
        const uint n4 = p.n / 4;
        vec4 s = part4[i4];
        for (uint z = 1; z < p.slices; z++)
            s += part4[z * n4 + i4];
        y4[i4] = ACC != 0 ? y4[i4] + s : s;
        return;
    }
    for (uint i = 4 * i4; i < min(4 * i4 + 4, p.n); i++) {
        float s = part[i];
        for (uint z = 1; z < p.slices; z++)
            s += part[z * p.n + i];
        y[i] = ACC != 0 ? y[i] + s : s;
    }
}
