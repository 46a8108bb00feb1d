"""The llama architecture (SmolLM2, Llama, Mistral-style GGUFs), as llama.cpp defines it.

Weights keep their GGUF tensor names. Q and K in llama GGUFs are already permuted for
rotary embedding of adjacent pairs, so rope runs in "normal" (non-NeoX) mode.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..formats.gguf_file import GGUFFile
from . import config
from ..gpu.builder import Builder
from ..gpu.rope import Rope
from ..gpu.runstate import RunState


@dataclass(frozen=True)
class Config(config.Config):
    """The common hyperparameters only."""
    ROPE_FREQS = True          # llama 3.1 and later: rope_freqs divides low frequencies

    def tensor_shapes(self) -> dict[str, tuple[int, ...]]:
        """Every tensor the forward pass reads, with its ggml shape (row length first)."""
        e, hd = self.n_embd, self.head_dim
        shapes = {"token_embd.weight": (e, self.n_vocab), "output_norm.weight": (e,)}
        if not self.tied_output:
            shapes["output.weight"] = (e, self.n_vocab)
        for i in range(self.n_layer):
            b = f"blk.{i}."
            shapes.update({
                b + "attn_norm.weight": (e,),
                b + "attn_q.weight": (e, self.n_head * hd),
                b + "attn_k.weight": (e, self.n_head_kv * hd),
                b + "attn_v.weight": (e, self.n_head_kv * hd),
                b + "attn_output.weight": (self.n_head * hd, e),
                b + "ffn_norm.weight": (e,),
                b + "ffn_gate.weight": (e, self.n_ff),
                b + "ffn_up.weight": (e, self.n_ff),
                b + "ffn_down.weight": (self.n_ff, e),
            })
        return shapes

def rope_tables(c: Config) -> tuple[Rope, ...]:
    """Every rope the layers use; RunState precomputes their angles."""
    return (c.rope,)


def attn_windows(c: Config) -> tuple[int, ...]:
    """The sliding windows of the attention layers (0: full causal); one mask each."""
    return (0,)


def forward(b: Builder, c: Config, rs: RunState, n: int) -> None:
    """Tokens rs.ids[:n] at positions step.pos0.. -> logits of the last token in rs.logits."""
    w = b.weights
    x = rs.x                                                   # [n, n_embd] residual stream
    b.get_rows(w["token_embd.weight"], rs.ids, x, n)
    for i in range(c.n_layer):
        p = f"blk.{i}."
        # attention
        b.rms_norm(x, w[p + "attn_norm.weight"], rs.xn, n, c.rms_eps)
        b.matmul(w[p + "attn_q.weight"], rs.xn, rs.q, n)       # [n, n_head * head_dim]
        b.matmul(w[p + "attn_k.weight"], rs.xn, rs.k, n)       # [n, n_head_kv * head_dim]
        b.matmul(w[p + "attn_v.weight"], rs.xn, rs.v, n)       # [n, n_head_kv * head_dim]
        b.rope_qkv(rs.q, rs.k, rs.v, rs.k_cache[i], rs.v_cache[i], c.n_head, c.n_head_kv,
                   c.head_dim, n, c.rope, neox=False)
        b.attention(rs.q, rs.k_cache[i], rs.v_cache[i], rs.att, c.n_head, c.n_head_kv,
                    c.head_dim, n, scale=c.head_dim ** -0.5)  # [n, n_head * head_dim]
        b.matmul(w[p + "attn_output.weight"], rs.att, x, n, accumulate=True)
        # feed-forward
        b.rms_norm(x, w[p + "ffn_norm.weight"], rs.xn, n, c.rms_eps)
        b.matmul(w[p + "ffn_gate.weight"], rs.xn, rs.gate, n)  # [n, n_ff]
        b.matmul(w[p + "ffn_up.weight"], rs.xn, rs.up, n)      # [n, n_ff]
        b.silu_mul(rs.gate, rs.up, rs.gate, n * c.n_ff)
        b.matmul(w[p + "ffn_down.weight"], rs.gate, x, n, accumulate=True)
    # only the last token's logits are needed
    b.rms_norm(x, w["output_norm.weight"], rs.xn, 1, c.rms_eps, row_offset=n - 1)
    head = w["token_embd.weight" if c.tied_output else "output.weight"]
    b.matmul(head, rs.xn, rs.logits, 1, x_row=n - 1)           # [1, n_vocab]
