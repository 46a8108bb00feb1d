// The KV walk that attn_split.comp (pass 0) and attn_decode.comp share: decode attention with
// the visible positions of a head split across n_split workgroups. Split s covers `chunk`
// positions from first + s * chunk, where chunk is ceil(n_visible / n_split) but at least
// min_chunk, so short contexts use fewer splits (the rest get an empty range). The token
// sits at position pos and sees keys 0..pos, or only the last `window` of them when
// window > 0. Needs HD, LP and the K cache k4.
// The attention options (include/attn.glsl): a split's kernel soft-caps each score, and split 0
// starts its first position group's softmax from the head's sink, so that the splits' joined
// max and sum hold it once.
#include "attn.glsl"
const uint D4 = HD / 4, DL = D4 / LP;

// [a, b): the positions split s covers
uvec2 split_range(uint s, uint pos, uint window, uint n_split, uint min_chunk) {
    const uint first = (window > 0 && pos >= window) ? pos - window + 1 : 0;
    const uint n_vis = pos + 1 - first;
    const uint chunk = max((n_vis + n_split - 1) / n_split, min_chunk);
    const uint a = min(first + s * chunk, pos + 1);
    return uvec2(a, min(a + chunk, pos + 1));
}

// This lane's part of q (vec4s lane, lane + LP, ...), filled by the caller. A private global:
// glslc's optimizer fails on arrays sized by specialization constants passed to functions.
vec4 qv[DL];

// q . k for the key whose vec4s start at kb (this lane's offset within the LP adjacent lanes
// that share a position included): each lane takes every LP-th vec4 and the LP lanes add up
// through xor shuffles, so all of them hold the sum.
float qk_dot(uint kb) {
    float d = 0.0;
    [[unroll]] for (uint i = 0; i < DL; i++) d += dot(qv[i], vec4(k4[kb + LP * i]));
    LANES_ADD(d, LP);
    return d;
}
