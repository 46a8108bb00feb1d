"""Qwen3.5's vision encoder as llama.cpp's clip builds it (clip_graph_qwen3vl, without
deepstack): patches through two patch kernels (the halves of a 2-frame Conv3d on a still
image, summed), plus their bias and the position table resampled to the image's grid (done
on the host, in s.pos); pre-norm layers of LayerNorm, attention over every patch both ways
with a 2-D rope (the first half of each head's pairs turned by the patch's row, the second
by its column: a table made on the host, in s.rope), LayerNorm, GELU feed-forward, each with
biases; a last LayerNorm; then the merger: each 2 x 2 block's four patches side by side (the
patches come in that order), an MLP of GELU (tanh) into the text model's width."""
from __future__ import annotations

from ..gpu.builder import Builder
from .config import Geometry, VisionConfig


def forward(b: Builder, c: VisionConfig, s, g: Geometry) -> None:
    """s.patches [n_patches, patch_len] -> s.out [n_tokens, n_embd_text] (s: VisionState)."""
    w, n, d, hd = b.weights, g.n_patches, c.n_embd, c.head_dim
    b.matmul(w["v.patch_embd.weight"], s.patches, s.x, n)
    b.matmul(w["v.patch_embd.weight.1"], s.patches, s.x, n, accumulate=True)
    b.add_bias(s.x, w["v.patch_embd.bias"], n)
    b.add(s.x, s.pos, s.x, n * d)
    for i in range(c.n_layer):
        p = f"v.blk.{i}."
        b.layer_norm(s.x, w[p + "ln1.weight"], w[p + "ln1.bias"], s.xn, n, c.eps)
        for name, y in (("attn_q", s.q), ("attn_k", s.k), ("attn_v", s.v)):
            b.matmul(w[p + name + ".weight"], s.xn, y, n)
            b.add_bias(y, w[p + name + ".bias"], n)
        b.rope_qkv(s.q, s.k, s.v, s.k_cache, s.v_cache, c.n_head, c.n_head, hd, n,
                   s.vision_rope, neox=True)
        b.attention(s.q, s.k_cache, s.v_cache, s.att, c.n_head, c.n_head, hd, n,
                    scale=hd ** -0.5)
        b.matmul(w[p + "attn_out.weight"], s.att, s.xn, n)
        b.add_bias(s.xn, w[p + "attn_out.bias"], n)
        b.add(s.x, s.xn, s.x, n * d)
        b.layer_norm(s.x, w[p + "ln2.weight"], w[p + "ln2.bias"], s.xn, n, c.eps)
        b.matmul(w[p + "ffn_up.weight"], s.xn, s.ff, n)
        b.add_bias(s.ff, w[p + "ffn_up.bias"], n)
        b.gelu(s.ff, s.ff, n * c.ff_len)
        b.matmul(w[p + "ffn_down.weight"], s.ff, s.xn, n)
        b.add_bias(s.xn, w[p + "ffn_down.bias"], n)
        b.add(s.x, s.xn, s.x, n * d)
    b.layer_norm(s.x, w["v.post_ln.weight"], w["v.post_ln.bias"], s.xn, n, c.eps)
    t = g.n_tokens                                 # s.xn as [t, 4 d]: a block a row
    merged = w["mm.0.weight"]
    b.matmul(merged, s.xn, s.merged, t)
    b.add_bias(s.merged, w["mm.0.bias"], t)
    b.gelu(s.merged, s.merged, t * merged.rows)
    b.matmul(w["mm.2.weight"], s.merged, s.out, t)
    b.add_bias(s.out, w["mm.2.bias"], t)
