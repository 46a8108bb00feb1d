"""The gemma3 architecture (Gemma 3 text models), as llama.cpp defines it in GGUF.

Differences from llama: embeddings scaled by sqrt(n_embd); per-head RMS norms on q and k;
post-attention and post-feed-forward norms before each residual add; GELU (tanh) gating;
NeoX-style rope; and interleaved attention: five sliding-window (local) layers, rope base
10000, then one global layer, rope base `rope.freq_base`. GGUF norm weights already hold
Gemma's (1 + w), so they are used as stored.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..formats.gguf_file import GGUFFile
from . import config
from ..gpu.builder import Builder
from ..gpu.rope import Rope
from ..gpu.runstate import RunState

SWA_PATTERN = 6          # every sixth layer attends globally
LOCAL_ROPE_BASE = 10000.0


@dataclass(frozen=True)
class Config(config.Config):
    rope_base_local: float     # sliding-window layers (rope_base: global layers)
    window: int
    attn_scale: float
    final_softcap: float       # 0: none

    DEFAULTS = {"context_length": 32768, "rope.freq_base": 1e6,
                "attention.layer_norm_rms_epsilon": 1e-6}

    @classmethod
    def extra(cls, g: GGUFFile, common: dict) -> dict:
        a = g.arch
        return dict(
            rope_base_local=LOCAL_ROPE_BASE,
            window=int(g.get(f"{a}.attention.sliding_window", 512)),
            attn_scale=common["head_dim"] ** -0.5,
            final_softcap=float(g.get(f"{a}.final_logit_softcapping", 0.0) or 0.0),
        )

    def is_local(self, layer: int) -> bool:
        return (layer + 1) % SWA_PATTERN != 0

    def tensor_shapes(self) -> dict[str, tuple[int, ...]]:
        e, hd = self.n_embd, self.head_dim
        shapes = {"token_embd.weight": (e, self.n_vocab), "output_norm.weight": (e,)}
        for i in range(self.n_layer):
            b = f"blk.{i}."
            shapes.update({
                b + "attn_norm.weight": (e,),
                b + "attn_q.weight": (e, self.n_head * hd),
                b + "attn_k.weight": (e, self.n_head_kv * hd),
                b + "attn_v.weight": (e, self.n_head_kv * hd),
                b + "attn_q_norm.weight": (hd,),
                b + "attn_k_norm.weight": (hd,),
                b + "attn_output.weight": (self.n_head * hd, e),
                b + "post_attention_norm.weight": (e,),
                b + "ffn_norm.weight": (e,),
                b + "ffn_gate.weight": (e, self.n_ff),
                b + "ffn_up.weight": (e, self.n_ff),
                b + "ffn_down.weight": (self.n_ff, e),
                b + "post_ffw_norm.weight": (e,),
            })
        return shapes

def rope_tables(c: Config) -> tuple[Rope, ...]:
    """Every rope the layers use; RunState precomputes their angles: the global layers'
    (with the file's scaling: Gemma 3 4B and larger declare linear 8) and the sliding-window
    layers' (base 10000, unscaled)."""
    return (c.rope, local_rope(c))


def local_rope(c: Config) -> Rope:
    return Rope(c.rope_base_local, c.rope.n_dims)


def attn_windows(c: Config) -> tuple[int, ...]:
    """The sliding windows of the attention layers (0: full causal); one mask each."""
    return tuple(sorted({c.window if c.is_local(i) else 0 for i in range(c.n_layer)}))


def forward(b: Builder, c: Config, rs: RunState, n: int) -> None:
    """Tokens rs.ids[:n] at positions step.pos0.. -> logits of the last token in rs.logits."""
    w = b.weights
    x = rs.x                                                   # [n, n_embd] residual stream
    b.get_rows(w["token_embd.weight"], rs.ids, x, n, scale=c.n_embd ** 0.5)
    for i in range(c.n_layer):
        p = f"blk.{i}."
        local = c.is_local(i)
        rope = local_rope(c) if local else c.rope
        # attention
        b.rms_norm(x, w[p + "attn_norm.weight"], rs.xn, n, c.rms_eps)
        b.matmul(w[p + "attn_q.weight"], rs.xn, rs.q, n)       # [n, n_head, head_dim]
        b.matmul(w[p + "attn_k.weight"], rs.xn, rs.k, n)       # [n, n_head_kv, head_dim]
        b.matmul(w[p + "attn_v.weight"], rs.xn, rs.v, n)       # [n, n_head_kv, head_dim]
        b.rms_norm(rs.q, w[p + "attn_q_norm.weight"], rs.q, n * c.n_head, c.rms_eps)
        b.rms_norm(rs.k, w[p + "attn_k_norm.weight"], rs.k, n * c.n_head_kv, c.rms_eps)
        b.rope_qkv(rs.q, rs.k, rs.v, rs.k_cache[i], rs.v_cache[i], c.n_head, c.n_head_kv,
                   c.head_dim, n, rope, neox=True)
        b.attention(rs.q, rs.k_cache[i], rs.v_cache[i], rs.att, c.n_head, c.n_head_kv,
                    c.head_dim, n, scale=c.attn_scale, window=c.window if local else 0)
        b.matmul(w[p + "attn_output.weight"], rs.att, rs.xn, n)   # [n, n_embd]
        b.rms_norm(rs.xn, w[p + "post_attention_norm.weight"], rs.xn, n, c.rms_eps)
        b.add(x, rs.xn, x, n * c.n_embd)
        # feed-forward
        b.rms_norm(x, w[p + "ffn_norm.weight"], rs.xn, n, c.rms_eps)
        b.matmul(w[p + "ffn_gate.weight"], rs.xn, rs.gate, n)  # [n, n_ff]
        b.matmul(w[p + "ffn_up.weight"], rs.xn, rs.up, n)      # [n, n_ff]
        b.silu_mul(rs.gate, rs.up, rs.gate, n * c.n_ff, gelu=True)
        b.matmul(w[p + "ffn_down.weight"], rs.gate, rs.xn, n)  # [n, n_embd]
        b.rms_norm(rs.xn, w[p + "post_ffw_norm.weight"], rs.xn, n, c.rms_eps)
        b.add(x, rs.xn, x, n * c.n_embd)
    b.rms_norm(x, w["output_norm.weight"], rs.xn, 1, c.rms_eps, row_offset=n - 1)
    b.matmul(w["token_embd.weight"], rs.xn, rs.logits, 1, x_row=n - 1)   # [1, n_vocab] tied
    if c.final_softcap:
        b.softcap(rs.logits, c.n_vocab, c.final_softcap)
