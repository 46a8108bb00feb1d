"""Gemma 3's vision encoder as llama.cpp's clip builds it (clip_graph_siglip, with the gemma3
projector): patches through the patch embedding (a convolution, here a product with its
kernel) and the position embedding; pre-norm layers of LayerNorm, attention over every
patch both ways (no rope, no mask), LayerNorm, GELU feed-forward, each with biases; a last
LayerNorm; then the projector: the patch grid average-pooled by `merge` a side, an RMS norm
(its weight stored as 1 + w, used as stored) and the product into the text model's width."""
from __future__ import annotations

from ..gpu.builder import Builder
from . import vit
from .config import Geometry, VisionConfig


def forward(b: Builder, c: VisionConfig, s, g: Geometry) -> None:
    """s.patches [n_patches, patch_len] -> s.out [n_tokens, n_embd_text] (s: VisionState)."""
    w, n, d = b.weights, g.n_patches, c.n_embd
    b.matmul(w["v.patch_embd.weight"], s.patches, s.x, n)
    b.add_bias(s.x, w["v.patch_embd.bias"], n)
    b.add(s.x, w["v.position_embd.weight"].binding(), s.x, n * d)
    for i in range(c.n_layer):
        vit.layer(b, c, s, i, n)
    b.layer_norm(s.x, w["v.post_ln.weight"], w["v.post_ln.bias"], s.xn, n, c.eps)
    b.pool2d(s.xn, s.pooled, d, g.gw, c.merge)
    b.rms_norm(s.pooled, w["mm.soft_emb_norm.weight"], s.pooled, g.n_tokens, c.eps)
    b.matmul(w["mm.input_projection.weight"], s.pooled, s.out, g.n_tokens)
