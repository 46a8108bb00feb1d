// Shared by every kernel: extensions. (Kernels reading the per-step values include step.glsl.)
#extension GL_EXT_shader_16bit_storage : require
#extension GL_EXT_control_flow_attributes : enable

// x added over groups of `lanes` adjacent lanes (a power of two, at most 64) through xor
// shuffles, offsets 1, 2, 4...: every lane of a group holds the sum. A loop of a constant
// count that unrolls, where a doubling loop may not (a driver that bounds loop iterations,
// limits.py, counts those). Needs GL_KHR_shader_subgroup_shuffle.
#define LANES_ADD(x, lanes) \
    [[unroll]] for (uint lanes_b_ = 0; lanes_b_ < 6; lanes_b_++) { \
        if ((1u << lanes_b_) < (lanes)) x += subgroupShuffleXor(x, 1u << lanes_b_); \
    }
