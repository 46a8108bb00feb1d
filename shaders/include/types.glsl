// Weight-type classes, from the TYPE_* a variant is compiled with (shaders/registry.py).
#ifndef TYPES_GLSL
#define TYPES_GLSL
// 256-weight super-blocks: rows of 256k weights; mul_mat_vec's chunks are their quarters
#if defined(TYPE_Q2_K) || defined(TYPE_Q3_K) || defined(TYPE_Q4_K) || defined(TYPE_Q5_K) \
    || defined(TYPE_Q6_K) || defined(TYPE_IQ4_XS) || defined(TYPE_IQ2_XXS) \
    || defined(TYPE_IQ2_XS) || defined(TYPE_IQ2_S) || defined(TYPE_IQ3_XXS) || defined(TYPE_IQ3_S)
#define SUPER_BLOCK
#endif
// Types whose dequant8 (include/dequant8.glsl) also serves the chunked products (chunk.glsl,
// mul_mat_vec.comp) instead of a chunk reader of their own
#if defined(TYPE_Q5_1) || defined(TYPE_BF16) || defined(TYPE_Q2_K) || defined(TYPE_Q3_K) \
    || defined(TYPE_IQ4_NL) || defined(TYPE_IQ4_XS) || defined(TYPE_MXFP4) \
    || defined(TYPE_IQ2_XXS) || defined(TYPE_IQ2_XS) || defined(TYPE_IQ2_S) \
    || defined(TYPE_IQ3_XXS) || defined(TYPE_IQ3_S)
#define DEQUANT8_TYPE
#endif
#endif
