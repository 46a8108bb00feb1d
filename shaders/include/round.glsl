// Rounding as ggml's CPU code rounds, spelled out in integer and exact float operations: a
// driver may fold a conversion round trip (f32 -> f16 -> f32) away or round it its own way,
// and '/' may be approximate (SPIR-V allows 2.5 ulp), so neither is left to the driver.

// f16_rne: x rounded to the nearest f16 value, ties to even (as F16C's vcvtps2ph rounds);
// beyond f16's range it becomes +-inf, NaN stays NaN.
float f16_rne(float v) {
    const uint u = floatBitsToUint(v), a = u & 0x7FFFFFFFu, sign = u & 0x80000000u;
    if (a >= 0x7F800000u) return v;                                    // inf, NaN
    if (a >= 0x477FF000u) return uintBitsToFloat(sign | 0x7F800000u);  // >= 65520: inf
    if (a < 0x38800000u) {            // below 2^-14: f16's subnormal grid, steps of 2^-24
        // scaling by powers of two is exact here, and roundEven is exact
        return uintBitsToFloat(sign | floatBitsToUint(roundEven(abs(v) * 16777216.0)
                                                      * (1.0 / 16777216.0)));
    }
    return uintBitsToFloat(sign | ((a + 0xFFFu + ((a >> 13) & 1u)) & 0xFFFFE000u));
}
vec4 f16_rne(vec4 v) { return vec4(f16_rne(v.x), f16_rne(v.y), f16_rne(v.z), f16_rne(v.w)); }

// a / b rounded to nearest: the quotient's residual a - q * b is computed exactly in plain
// f32 products and sums (Dekker's split into 12-bit halves; `precise` keeps the compiler from
// fusing them), then corrects q. A q already rounded to nearest stays as it is. Where the
// device's own '/' rounds to nearest (lavapipe), DIV_RN is 0 and '/' is taken as it is: the
// same bits in every kernel, whatever its compiler makes of the correction there.
layout(constant_id = 90) const uint DIV_RN = 1;     // set per device by KernelCache

float div_rn(float a, float b) {
    if (DIV_RN == 0) return a / b;
    precise const float q = a / b;
    if (isinf(q) || q == 0.0) return q;
    precise const float cq = 4097.0 * q, qh = cq - (cq - q), ql = q - qh;
    precise const float cb = 4097.0 * b, bh = cb - (cb - b), bl = b - bh;
    precise const float p = q * b;
    precise const float pl = ((qh * bh - p) + qh * bl + ql * bh) + ql * bl;  // q*b - p
    precise const float e = (a - p) - pl;                                     // a - q*b
    precise const float qc = q + e / b;
    return qc;
}

// bf16_rne: x rounded to bf16 (the top half of its f32) to nearest even, as ggml's
// GGML_FP32_TO_BF16 rounds (NaN kept a quiet NaN)
float bf16_rne(float v) {
    const uint u = floatBitsToUint(v);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) return uintBitsToFloat((u & 0xFFFF0000u) | 0x00400000u);
    return uintBitsToFloat((u + 0x7FFFu + ((u >> 16) & 1u)) & 0xFFFF0000u);
}
vec4 bf16_rne(vec4 v) { return vec4(bf16_rne(v.x), bf16_rne(v.y), bf16_rne(v.z), bf16_rne(v.w)); }
