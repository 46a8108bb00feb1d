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
from . import vit
from .config import Geometry, VisionConfig


def forward(b: Builder, c: VisionConfig, s, g: Geometry) -> None:
    """s.patches [n_patches, patch_len] -> s.out [n_tokens, n_embd_text] (s: VisionState)."""
    w, n, d = b.weights, g.n_patches, c.n_embd
    b.matmul(w["v.patch_embd.weight"], s.patches, s.x, n)
    b.matmul(w["v.patch_embd.weight.1"], s.patches, s.x, n, accumulate=True)
    b.add_bias(s.x, w["v.patch_embd.bias"], n)
    b.add(s.x, s.pos, s.x, n * d)
    for i in range(c.n_layer):
        vit.layer(b, c, s, i, n)
    b.layer_norm(s.x, w["v.post_ln.weight"], w["v.post_ln.bias"], s.xn, n, c.eps)
    t = g.n_tokens                                 # s.xn as [t, 4 d]: a block a row
    merged = w["mm.0.weight"]
    b.matmul(merged, s.xn, s.merged, t)
    b.add_bias(s.merged, w["mm.0.bias"], t)
    b.gelu(s.merged, s.merged, t * merged.rows)
    b.matmul(w["mm.2.weight"], s.merged, s.out, t)
    b.add_bias(s.out, w["mm.2.bias"], t)
