// Q4_K/Q5_K: the 6-bit (scale, min) of sub-block s from the super-block's first 16 bytes
// (f16 d and dmin in hd.x, the 12 scale bytes in hd.y..hd.w), as ggml's get_scale_min_k4
#ifndef KSCALE_GLSL
#define KSCALE_GLSL
uvec2 kscale_min(uvec4 hd, uint s) {
    if (s < 4) return uvec2((hd.y >> (8 * s)) & 63u, (hd.z >> (8 * s)) & 63u);
    const uint lo4 = (hd.w >> (8 * (s - 4))) & 0xFFu;
    return uvec2((lo4 & 0xFu) | (((hd.y >> (8 * (s - 4))) >> 6 & 3u) << 4),
                 (lo4 >> 4) | (((hd.z >> (8 * (s - 4))) >> 6 & 3u) << 4));
}
#endif
