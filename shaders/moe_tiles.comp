#version 450
// The tiles of the grouped expert products (mul_mat_moe, mul_mat_moe_cm, mul_mat_moe_cm2),
// listed after moe_group has grouped the slots: each expert's count of slots cut into tiles
// of BN, one workgroup of those products a tile, so an expert that most tokens take gets as
// many workgroups as its tiles (a hot expert walked by a few workgroups in turn held the
// rest of the GPU idle). One workgroup; groups is moe_group's buffer, laid out as
//   [0, 2E)          (offset, count) per expert (moe_group's)
//   [2E, 3E + 1)     tiles of the experts below e, for e = 0..E (the last: all tiles)
//   [3E + 1, ...)    per tile, in expert order: e | (its tile in the expert << 16)
// An exclusive scan over the experts' tile counts, 256 experts a round (their rounds' sums
// carried), in shared memory: a fixed count of steps, whatever the subgroup size.
#include "common.glsl"

layout(local_size_x = 256) in;
layout(std430, binding = 0) buffer Groups { uint groups[]; };

layout(push_constant) uniform Push {
    uint n_expert;
    uint bn;           // slots a tile
} p;

shared uint scan[256];

void main() {
    const uint lane = gl_LocalInvocationID.x;
    const uint pre = 2 * p.n_expert, list = 3 * p.n_expert + 1;
    uint carry = 0;
    for (uint e0 = 0; e0 < p.n_expert; e0 += 256) {
        const uint e = e0 + lane;
        const uint n = e < p.n_expert ? (groups[2 * e + 1] + p.bn - 1) / p.bn : 0;
        scan[lane] = n;
        barrier();
        [[unroll]] for (uint d = 1; d < 256; d <<= 1) {     // inclusive, Hillis-Steele
            const uint v = lane >= d ? scan[lane - d] : 0;
            barrier();
            scan[lane] += v;
            barrier();
        }
        const uint start = carry + scan[lane] - n;
        if (e < p.n_expert) {
            groups[pre + e] = start;
            for (uint j = 0; j < n; j++) groups[list + start + j] = e | (j << 16);
        }
        carry += scan[255];
        barrier();                                            // scan is read before reuse
    }
    if (lane == 0) groups[pre + p.n_expert] = carry;
}
