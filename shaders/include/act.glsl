// Activation rounding inside a matrix product, as ggml's CPU backend rounds activations for
// the weight type (its vec_dot_type): mode 1 = Q8_0, 2 = Q8_1 blocks of 32. The four lanes
// holding one block (lane ^ 1, lane ^ 2), 8 values each, agree on its scale through xor
// shuffles. Clustered subgroup operations would say it shorter, but Mesa's lavapipe reduces
// over the whole subgroup.
#extension GL_KHR_shader_subgroup_shuffle : require
#include "round.glsl"

float quad_max(float v) {
    v = max(v, subgroupShuffleXor(v, 1));
    return max(v, subgroupShuffleXor(v, 2));
}
float quad_add(float v) {
    v += subgroupShuffleXor(v, 1);
    return v + subgroupShuffleXor(v, 2);
}

// xa, xb rounded in place. Returns Q8_1's correction fp16(d * sum q) - fp16(d) * sum q, which
// Q4_1 rows add scaled by their block minimum (ggml adds m * the stored block sum); 0 for Q8_0.
float round_act(const uint mode, inout vec4 xa, inout vec4 xb) {
    const vec4 m4 = max(abs(xa), abs(xb));
    const float amax = quad_max(max(max(m4.x, m4.y), max(m4.z, m4.w)));
    const float d = div_rn(amax, 127.0);
    const float id = amax != 0.0 ? div_rn(127.0, amax) : 0.0;
    const float dh = f16_rne(d);
    const vec4 qa = roundEven(xa * id), qb = roundEven(xb * id);
    xa = qa * dh;
    xb = qb * dh;
    if (mode != 2) return 0.0;
    const float qs = quad_add(dot(qa + qb, vec4(1.0)));
    return f16_rne(d * qs) - dh * qs;
}
