#version 450
// Slots grouped by expert, on the device, for the batched expert product of prefill
// (mul_mat_moe): slot s = t * n_used + j is token t's j-th routed expert ids[s]. For expert e,
// groups[2e] is the first place in perm of its slots and groups[2e + 1] their count; perm
// lists each expert's slots in slot order (a stable counting sort, so runs are reproducible).
// One workgroup of one subgroup per expert. The first pass counts the slots routed below e
// (its offset) and to e; the second writes e's slots, each lane's place an exclusive prefix
// sum over the subgroup. Every expert reads all n * n_used ids (a few KB, from cache), which
// costs less than a scan kernel and its barrier would, and needs no atomics.
#include "common.glsl"
#extension GL_KHR_shader_subgroup_arithmetic : require

layout(local_size_x_id = 0) in;
layout(std430, binding = 0) readonly buffer Ids { uint ids[]; };
layout(std430, binding = 1) writeonly buffer Groups { uint groups[]; };
layout(std430, binding = 2) writeonly buffer Perm { uint perm[]; };

layout(push_constant) uniform Push {
    uint n_slots;      // n_tokens * n_used
} p;

void main() {
    const uint e = gl_WorkGroupID.x, lane = gl_SubgroupInvocationID;
    uint below = 0, mine = 0;
    for (uint s = lane; s < p.n_slots; s += gl_SubgroupSize) {
        const uint id = ids[s];
        below += uint(id < e);
        mine += uint(id == e);
    }
    const uint offset = subgroupAdd(below), count = subgroupAdd(mine);
    if (lane == 0) {
        groups[2 * e] = offset;
        groups[2 * e + 1] = count;
    }
    const uint end = offset + count;
    uint next = offset;
    // stops once the expert's last slot is placed
    for (uint s0 = 0; s0 < p.n_slots && next < end; s0 += gl_SubgroupSize) {
        const uint s = s0 + lane;
        const uint hit = uint(s < p.n_slots && ids[s] == e);
        const uint at = next + subgroupExclusiveAdd(hit);
        if (hit != 0) perm[at] = s;
        next += subgroupAdd(hit);
    }
}
