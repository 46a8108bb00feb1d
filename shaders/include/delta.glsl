// The gated delta rule's shared pieces (delta_net.comp, delta_chunk_prep.comp,
// delta_chunk.comp): which k head a v head reads, and its gates as llama.cpp computes them.
//   beta = sigmoid(b)                         (ssm_beta's projection)
//   g    = softplus(a + dt_bias) * ssm_a      (ssm_alpha's; ssm_a holds -exp(A_log))
// A v head h of n_head reads k head h / (n_head / n_head_k) (qwen3next: repeat-interleave), or
// h % n_head_k where tiled (qwen35, qwen35moe: ggml_repeat of the k heads).

uint delta_k_head(uint h, uint n_head, uint n_head_k, uint tiled) {
    return tiled != 0 ? h % n_head_k : h / (n_head / n_head_k);
}

// where v head h's gate sits in a token's row of gates: groups of n_head / n_head_k heads,
// `group` floats apart (qwen3next's fused beta|alpha rows interleave them per k head)
uint delta_gate_index(uint h, uint n_head, uint n_head_k, uint group) {
    const uint r = n_head / n_head_k;
    return (h / r) * group + h % r;
}

float delta_softplus(float x) {     // ggml's op_softplus
    return x > 20.0 ? x : log(1.0 + exp(x));
}

float delta_sigmoid(float x) {
    return 1.0 / (1.0 + exp(-x));
}
