#version 450
// y[i] (+)= sum over z of part[z * n + i]: the slices of a product whose K was split over
// workgroups (mul_mat_cm2's k_split), added in slice order, so a run gives the same bits
// every time. ACC 1 adds them into y (the residual add fused into the product).
layout(local_size_x = 64) in;
layout(constant_id = 0) const uint ACC = 0;
layout(std430, binding = 0) readonly buffer Part { float part[]; };
layout(std430, binding = 1) buffer Y { float y[]; };
layout(push_constant) uniform Push {
    uint n;            // floats a slice (the product's tokens x outputs)
    uint slices;
} p;

void main() {
    const uint i = gl_GlobalInvocationID.x + gl_GlobalInvocationID.y * gl_NumWorkGroups.x * 64;
    if (i >= p.n) return;
    float s = part[i];
    for (uint z = 1; z < p.slices; z++)
        s += part[z * p.n + i];
    y[i] = ACC != 0 ? y[i] + s : s;
}
