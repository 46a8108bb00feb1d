"""Gemma 3's vision encoder as llama.cpp's clip builds it (clip_graph_siglip, with the gemma3
projector): patches through the patch embedding (a convolution, here a product with its
kernel) and the position embedding; pre-norm layers of LayerNorm, attention over every
patch both ways (no rope, no mask), LayerNorm, GELU feed-forward, each with biases; a last
LayerNorm; then the projector: the patch grid average-pooled by `merge` a side, an RMS norm
(its weight stored as 1 + w, used as stored) and the product into the text model's width."""
from __future__ import annotations

from ..gpu.builder import Builder
from .config import Geometry, VisionConfig


def forward(b: Builder, c: VisionConfig, s, g: Geometry) -> None:
    """s.patches [n_patches, patch_len] -> s.out [n_tokens, n_embd_text] (s: VisionState)."""
    w, n, d, hd = b.weights, g.n_patches, c.n_embd, c.head_dim
    b.matmul(w["v.patch_embd.weight"], s.patches, s.x, n)
    b.add_bias(s.x, w["v.patch_embd.bias"], n)
    b.add(s.x, w["v.position_embd.weight"].binding(), s.x, n * d)
    for i in range(c.n_layer):
        p = f"v.blk.{i}."
        b.layer_norm(s.x, w[p + "ln1.weight"], w[p + "ln1.bias"], s.xn, n, c.eps)
        for name, y in (("attn_q", s.q), ("attn_k", s.k), ("attn_v", s.v)):
            b.matmul(w[p + name + ".weight"], s.xn, y, n)
            b.add_bias(y, w[p + name + ".bias"], n)
        b.kv_store(s.k, s.v, s.k_cache, s.v_cache, c.n_head, hd, n)
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
    b.pool2d(s.xn, s.pooled, d, g.gw, c.merge)
    b.rms_norm(s.pooled, w["mm.soft_emb_norm.weight"], s.pooled, g.n_tokens, c.eps)
    b.matmul(w["mm.input_projection.weight"], s.pooled, s.out, g.n_tokens)
