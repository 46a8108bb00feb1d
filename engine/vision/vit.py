"""The layer both vision encoders are built of (clip.cpp's build_vit): pre-norm, LayerNorm,
q, k and v with biases, attention over every patch both ways, the output product with its
bias onto the residual; LayerNorm, a GELU (tanh) feed-forward with biases onto it. q and k
are turned by the run state's rope where the encoder has one (qwen3vl_merger's 2-D rope),
else stored as they are (SigLIP)."""
from __future__ import annotations

from ..gpu.builder import Builder
from .config import VisionConfig


def layer(b: Builder, c: VisionConfig, s, i: int, n: int) -> None:
    """Layer i over the n patches of s.x (s: VisionState), in place."""
    w, d, hd, p = b.weights, c.n_embd, c.head_dim, f"v.blk.{i}."
    b.layer_norm(s.x, w[p + "ln1.weight"], w[p + "ln1.bias"], s.xn, n, c.eps)
    for name, y in (("attn_q", s.q), ("attn_k", s.k), ("attn_v", s.v)):
        b.matmul(w[p + name + ".weight"], s.xn, y, n)
        b.add_bias(y, w[p + name + ".bias"], n)
    rope = getattr(s, "vision_rope", None)
    if rope is not None:
        b.rope_qkv(s.q, s.k, s.v, s.k_cache, s.v_cache, c.n_head, c.n_head, hd, n, rope,
                   neox=True)
    else:
        b.kv_store(s.k, s.v, s.k_cache, s.v_cache, c.n_head, hd, n)
    b.attention(s.q, s.k_cache, s.v_cache, s.att, c.n_head, c.n_head, hd, n, scale=hd ** -0.5)
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
