#version 450
// Expert routing, one token per workgroup of one subgroup (include/route.glsl): the n_used
// largest router scores into ids[t, :] and their weights into w[t, :]. NORM and SOFTMAX_K
// as route() takes them. One token's decode routes inside its experts' first product
// instead (mul_mat_vecq's ROUTE).
#include "common.glsl"
#extension GL_KHR_shader_subgroup_arithmetic : require

layout(local_size_x_id = 0) in;
layout(constant_id = 1) const uint NORM = 1;
layout(constant_id = 2) const uint SOFTMAX_K = 0;
layout(std430, binding = 0) readonly buffer L { float logits[]; };
layout(std430, binding = 1) writeonly buffer I { uint ids[]; };
layout(std430, binding = 2) writeonly buffer Wt { float w[]; };
layout(push_constant) uniform Push {
    uint n_expert;     // at most MAX_EXPERT
    uint n_used;       // at most ROUTE_MAX_USED
} p;

const uint MAX_EXPERT = 512;
shared float route_prob[MAX_EXPERT];
#define ROUTE_LOGIT(e) logits[gl_WorkGroupID.x * p.n_expert + (e)]
#include "route.glsl"

void main() {
    const uint t = gl_WorkGroupID.x;
    route(p.n_expert, p.n_used, NORM, SOFTMAX_K);
    if (gl_SubgroupInvocationID != 0) return;
    for (uint j = 0; j < p.n_used; j++) {
        ids[t * p.n_used + j] = route_id[j];
        w[t * p.n_used + j] = route_w[j];
    }
}
