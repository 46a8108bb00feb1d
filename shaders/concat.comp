#version 450
// dst = concat(a, b) along dim 0, ggml-style: dim 0 is the contiguous row of dst
// [ne2][ne1][ne00 + ne10]; a and b are read through element strides (nb*0, nb*1, nb*2).
// TILED = 0: one invocation per dst element (any strides).
// TILED = 1: 32 x 32 dst tiles; the source TSRC (0: a, 1: b) is stored transposed (its dim 1
// contiguous), so it is read along dim 1 into shared memory and written out along dim 0;
// the other source is copied straight through. Both sides of the tile stay coalesced.
#include "common.glsl"
layout(local_size_x = 32, local_size_y = 8) in;
layout(constant_id = 0) const uint TILED = 0;
layout(constant_id = 1) const uint TSRC = 1;
layout(std430, binding = 0) readonly buffer A { float a[]; };
layout(std430, binding = 1) readonly buffer B { float b[]; };
layout(std430, binding = 2) writeonly buffer D { float d[]; };
layout(push_constant) uniform Push {
    uint ne00;       // a's dim 0: dst columns 0 .. ne00 - 1
    uint ne10;       // b's dim 0: dst columns ne00 .. ne00 + ne10 - 1
    uint ne1;
    uint ne2;
    uint a_nb0, a_nb1, a_nb2;    // strides in floats
    uint b_nb0, b_nb1, b_nb2;
    uint a_offset;   // floats
    uint b_offset;
} p;

const uint TILE = 32;
shared float tile[TILE][TILE + 1];   // + 1: columns of the tile fall in different banks

float src(uint i0, uint i1, uint i2) {
    if (i0 < p.ne00) return a[p.a_offset + i0 * p.a_nb0 + i1 * p.a_nb1 + i2 * p.a_nb2];
    return b[p.b_offset + (i0 - p.ne00) * p.b_nb0 + i1 * p.b_nb1 + i2 * p.b_nb2];
}

void main() {
    const uint ne0 = p.ne00 + p.ne10;
    if (TILED == 0) {
        const uint group = gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x;
        const uint i = group * 256 + gl_LocalInvocationIndex;
        if (i >= ne0 * p.ne1 * p.ne2) return;
        const uint row = i / ne0, i2 = row / p.ne1;      // two divisions, not four
        const uint i0 = i - row * ne0, i1 = row - i2 * p.ne1;
        d[i] = src(i0, i1, i2);
        return;
    }
    const uint x0 = gl_WorkGroupID.x * TILE, y0 = gl_WorkGroupID.y * TILE, i2 = gl_WorkGroupID.z;
    const uint tx = gl_LocalInvocationID.x, ty = gl_LocalInvocationID.y;
    // dst columns [lo, hi) come from the transposed source
    const uint lo = TSRC == 0 ? 0 : p.ne00, hi = TSRC == 0 ? p.ne00 : ne0;
    const bool crosses = x0 < hi && x0 + TILE > lo;      // the same for the whole workgroup
    if (crosses) {
        const uint i1 = y0 + tx;
        [[unroll]] for (uint r = 0; r < TILE; r += 8) {
            const uint i0 = x0 + ty + r;
            if (i0 >= lo && i0 < hi && i1 < p.ne1) tile[ty + r][tx] = src(i0, i1, i2);
        }
        barrier();
    }
    const uint i0 = x0 + tx;
    [[unroll]] for (uint r = 0; r < TILE; r += 8) {
        const uint i1 = y0 + ty + r;
        if (i0 >= ne0 || i1 >= p.ne1) continue;
        const float v = (i0 >= lo && i0 < hi) ? tile[tx][ty + r] : src(i0, i1, i2);
        d[i0 + (i1 + i2 * p.ne1) * ne0] = v;
    }
}
