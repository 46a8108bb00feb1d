// The register tile of mul_mat.comp and mul_mat_moe.comp: acc[r * NT + t] += W[wrow[r], :] .
// x[t], where token t's row of x starts at vec4 xrow[t]. The subgroup's lanes split K in
// units of 8 weights (a quarter of a block of 32: dequant8's lo and hi), each weight unit
// dequantized once for all NT tokens; the caller adds the lanes' sums. With ACT, x is
// rounded on the fly (act.glsl). Needs ROWS, NT, ACT, x4 and quant.glsl + act.glsl.
// The arrays are private globals: glslc's optimizer fails on arrays sized by specialization
// constants passed as function arguments.
float acc[ROWS * NT];
uint wrow[ROWS], xrow[NT];

void tile_dot(const uint nb) {
    for (uint u = gl_SubgroupInvocationID; u < nb * 4; u += gl_SubgroupSize) {
        const uint ib = u >> 2, q = u & 3;
        vec4 xa[NT], xb[NT];
        [[unroll]] for (uint t = 0; t < NT; t++) {
            xa[t] = x4[xrow[t] + ib * 8 + q];
            xb[t] = x4[xrow[t] + ib * 8 + 4 + q];
        }
        float corr[NT];
        if (ACT != 0) {
            [[unroll]] for (uint t = 0; t < NT; t++) corr[t] = round_act(ACT, xa[t], xb[t]);
        }
        [[unroll]] for (uint r = 0; r < ROWS; r++) {
            vec4 lo, hi;
            dequant8(wrow[r] * nb + ib, q, lo, hi);
            [[unroll]] for (uint t = 0; t < NT; t++) {
                acc[r * NT + t] += dot(lo, xa[t]) + dot(hi, xb[t]);
            }
#if defined(HAS_BLOCK_MIN)
            if (ACT == 2 && q == 0) {
                const float m = block_min(wrow[r] * nb + ib);
                [[unroll]] for (uint t = 0; t < NT; t++) acc[r * NT + t] += m * corr[t];
            }
#endif
        }
    }
}
