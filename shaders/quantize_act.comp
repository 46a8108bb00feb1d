#version 450
// Round activations the way ggml's CPU backend does before a quantized matrix product, so
// greedy decoding follows llama.cpp's more closely. Per block of x (32 values, 256 for
// Q8_K), out holds the dequantized rounded values. (mul_mat rounds Q8_0 and Q8_1 blocks
// itself; this pass serves the formats whose blocks span more lanes than a subgroup has.)
//   FMT 0: Q8_0   d = fp16(amax / 127), q = rne(x * 127 / amax)
//   FMT 2: Q8_K   blocks of 256, iscale = -127 / max (signed), q = min(127, rne(iscale x)),
//                 d = 1 / iscale in f32
//   FMT 3: F16    x rounded to f16
//   FMT 4: BF16   x rounded to bf16
#include "common.glsl"
layout(local_size_x = 64) in;
layout(constant_id = 0) const uint FMT = 0;
layout(std430, binding = 0) readonly buffer X { float x[]; };
layout(std430, binding = 1) writeonly buffer O { float o[]; };
layout(push_constant) uniform Push {
    uint n_cols;
    uint n_rows;
    uint x_offset;     // rows of x to skip
} p;

#include "round.glsl"

void main() {
    const uint bs = FMT == 2 ? 256 : (FMT >= 3 ? 4 : 32);
    const uint nb = p.n_cols / bs;
    const uint gid = gl_GlobalInvocationID.x;
    if (gid >= nb * p.n_rows) return;
    const uint row = gid / nb, b = gid % nb;
    const uint src = (row + p.x_offset) * p.n_cols + b * bs;
    const uint dst = row * p.n_cols + b * bs;
    if (FMT == 3) {
        for (uint j = 0; j < bs; j++) o[dst + j] = f16_rne(x[src + j]);
        return;
    }
    if (FMT == 4) {
        for (uint j = 0; j < bs; j++) o[dst + j] = bf16_rne(x[src + j]);
        return;
    }
    float amax = 0.0, vmax = 0.0;
    for (uint j = 0; j < bs; j++) {
        const float v = x[src + j];
        if (abs(v) > amax) { amax = abs(v); vmax = v; }
    }
    if (FMT == 2) {
        const float iscale = vmax != 0.0 ? div_rn(-127.0, vmax) : 0.0;
        const float d = iscale != 0.0 ? div_rn(1.0, iscale) : 0.0;
        for (uint j = 0; j < bs; j++) o[dst + j] = min(127.0, roundEven(iscale * x[src + j])) * d;
        return;
    }
    const float d = div_rn(amax, 127.0);
    const float id = amax != 0.0 ? div_rn(127.0, amax) : 0.0;
    const float dh = f16_rne(d);
    for (uint j = 0; j < bs; j++) o[dst + j] = roundEven(x[src + j] * id) * dh;
}
