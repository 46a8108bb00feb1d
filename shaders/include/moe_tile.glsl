// The tile of slots this workgroup takes in a grouped expert product: workgroup y is the
// y-th of the tiles that moe_tiles listed for this part's experts (expert_base ..
// expert_base + n_experts). Needs `groups` (moe_group's and moe_tiles' buffer) and push
// constants n_expert (all experts), n_experts, expert_base. False past the part's tiles.
// e: the expert in this part; offset, count: its slots in perm; i0: the tile's first.
bool moe_tile(out uint e, out uint offset, out uint count, out uint i0, uint bn) {
    const uint pre = 2 * p.n_expert, list = 3 * p.n_expert + 1;
    const uint t = groups[pre + p.expert_base] + gl_WorkGroupID.y;
    if (t >= groups[pre + p.expert_base + p.n_experts]) return false;
    const uint entry = groups[list + t];
    const uint eg = entry & 0xFFFFu;
    e = eg - p.expert_base;
    offset = groups[2 * eg];
    count = groups[2 * eg + 1];
    i0 = (entry >> 16) * bn;
    return true;
}
