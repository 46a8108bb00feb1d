#version 450
// out[i, :] = dequant(table[ids[i], :])   (embedding lookup)
// Tables larger than one storage buffer come in parts; each part fills the rows it holds.
#include "common.glsl"
layout(local_size_x = 64) in;
#define WEIGHT_BINDING 0
#include "quant.glsl"
layout(std430, binding = 1) readonly buffer Ids { uint ids[]; };
layout(std430, binding = 2) writeonly buffer Out { vec4 out4[]; };
layout(push_constant) uniform Push {
    uint n_cols;     // a multiple of 32
    uint n_rows;
    float scale;     // applied to every value (gemma scales embeddings)
    uint row_base;   // this table part holds rows row_base .. row_base + part_rows - 1
    uint part_rows;
} p;

void main() {
    const uint row = gl_WorkGroupID.x;
    if (row >= p.n_rows) return;
    const uint nb = p.n_cols / 32;
    const uint id = ids[row];
    if (id < p.row_base || id - p.row_base >= p.part_rows) return;
    const uint src = id - p.row_base;
    for (uint u = gl_LocalInvocationID.x; u < nb * 4; u += gl_WorkGroupSize.x) {
        const uint ib = u >> 2, q = u & 3;
        vec4 lo, hi;
        dequant8(src * nb + ib, q, lo, hi);
        const uint o = row * (p.n_cols / 4) + ib * 8 + q;
        out4[o] = lo * p.scale;
        out4[o + 4] = hi * p.scale;
    }
}
