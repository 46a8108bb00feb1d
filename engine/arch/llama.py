"""The llama architecture (SmolLM2, Llama, Mistral-style GGUFs), as llama.cpp defines it, and
the graph the llama-like architectures share: qwen2, qwen3 and mistral3 (their modules) are
this graph with its options set.

Weights keep their GGUF tensor names. Q and K in llama GGUFs are already permuted for
rotary embedding of adjacent pairs, so rope runs in "normal" (non-NeoX) mode; qwen2 and
qwen3 rotate halves (NeoX). Options: Q, K, V (and output) projection biases where the file
has them, per-head RMS norms on q and k (qwen3), and an attention temperature on q
(mistral3).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import ClassVar

from ..formats.gguf_file import GGUFFile
from . import config
from ..gpu.builder import Builder
from ..gpu.rope import Rope
from ..gpu.runstate import RunState


@dataclass(frozen=True)
class Config(config.Config):
    """The common hyperparameters, and the graph's options."""
    qkv_bias: bool             # q, k and v projections add biases (qwen2; llama may)
    out_bias: bool             # the attention output projection adds one (llama may)
    attn_temp_scale: float     # q *= 1 + s ln(1 + floor(pos / attn_temp_floor)); 0: none
    attn_temp_floor: int
    unread: tuple[str, ...]    # bias tensors in the file that this graph would not add

    ROPE_FREQS = True          # llama 3.1 and later: rope_freqs divides low frequencies
    NEOX: ClassVar[bool] = False       # rotate halves, not adjacent pairs (qwen2, qwen3)
    QK_NORM: ClassVar[bool] = False    # per-head RMS norms on q and k (qwen3)
    # the biases llama.cpp's graph for the architecture adds where the file has them
    BIASES: ClassVar[tuple[str, ...]] = ("attn_q", "attn_k", "attn_v", "attn_output")

    @classmethod
    def extra(cls, g: GGUFFile, common: dict) -> dict:
        return dict(qkv_bias="attn_q" in cls.BIASES and "blk.0.attn_q.bias" in g.tensors,
                    out_bias="attn_output" in cls.BIASES and
                    "blk.0.attn_output.bias" in g.tensors,
                    attn_temp_scale=0.0, attn_temp_floor=0,
                    unread=unread_biases(g, cls.BIASES))

    def problems(self) -> list[str]:
        return [f"bias tensors this graph does not add ({', '.join(self.unread)})"] \
            if self.unread else []

    def tensor_types(self) -> dict[str, tuple[str, ...]]:
        """The tensors that must be of given types: the biases, added as F32 rows."""
        return {n: ("F32",) for n in self.tensor_shapes() if n.endswith(".bias")}

    def tensor_shapes(self) -> dict[str, tuple[int, ...]]:
        """Every tensor the forward pass reads, with its ggml shape (row length first)."""
        e, hd = self.n_embd, self.head_dim
        shapes = self.io_shapes()
        for i in range(self.n_layer):
            b = f"blk.{i}."
            shapes.update({
                **self.attention_shapes(i),
                b + "ffn_norm.weight": (e,),
                b + "ffn_gate.weight": (e, self.n_ff),
                b + "ffn_up.weight": (e, self.n_ff),
                b + "ffn_down.weight": (self.n_ff, e),
            })
            if self.qkv_bias:
                shapes.update({b + "attn_q.bias": (self.n_head * hd,),
                               b + "attn_k.bias": (self.n_head_kv * hd,),
                               b + "attn_v.bias": (self.n_head_kv * hd,)})
            if self.out_bias:
                shapes[b + "attn_output.bias"] = (e,)
            if self.QK_NORM:
                shapes.update({b + "attn_q_norm.weight": (hd,), b + "attn_k_norm.weight": (hd,)})
        return shapes


def unread_biases(g: GGUFFile, read: tuple[str, ...]) -> tuple[str, ...]:
    """The bias tensors of a file (layer numbers dropped) that are not among `read`: a graph
    that ignored them would compute something else than the model."""
    names = {re.sub(r"^blk\.\d+\.", "", n) for n in g.tensors if n.endswith(".bias")}
    return tuple(sorted(names - {f"{r}.bias" for r in read}))

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
        b.norm_matmuls(x, w[p + "attn_norm.weight"], c.rms_eps, rs.xn, n, [
            (w[p + "attn_q.weight"], rs.q),                    # [n, n_head * head_dim]
            (w[p + "attn_k.weight"], rs.k),                    # [n, n_head_kv * head_dim]
            (w[p + "attn_v.weight"], rs.v)])                   # [n, n_head_kv * head_dim]
        if c.qkv_bias:
            b.add_bias(rs.q, w[p + "attn_q.bias"], n)
            b.add_bias(rs.k, w[p + "attn_k.bias"], n)
            b.add_bias(rs.v, w[p + "attn_v.bias"], n)
        if c.QK_NORM:                                          # per head
            b.rms_norm(rs.q, w[p + "attn_q_norm.weight"], rs.q, n * c.n_head, c.rms_eps)
            b.rms_norm(rs.k, w[p + "attn_k_norm.weight"], rs.k, n * c.n_head_kv, c.rms_eps)
        b.rope_qkv(rs.q, rs.k, rs.v, rs.k_cache[i], rs.v_cache[i], c.n_head, c.n_head_kv,
                   c.head_dim, n, c.rope, neox=c.NEOX, temp_scale=c.attn_temp_scale,
                   temp_floor=c.attn_temp_floor)
        b.attention(rs.q, rs.k_cache[i], rs.v_cache[i], rs.att, c.n_head, c.n_head_kv,
                    c.head_dim, n, scale=c.head_dim ** -0.5)  # [n, n_head * head_dim]
        b.matmul(w[p + "attn_output.weight"], rs.att, x, n, accumulate=True)
        if c.out_bias:
            b.add_bias(x, w[p + "attn_output.bias"], n)
        # feed-forward
        b.norm_matmuls(x, w[p + "ffn_norm.weight"], c.rms_eps, rs.xn, n, [
            (w[p + "ffn_gate.weight"], rs.gate),               # [n, n_ff]
            (w[p + "ffn_up.weight"], rs.up)])                  # [n, n_ff]
        b.swiglu_matmul(w[p + "ffn_down.weight"], rs.gate, rs.up, x, n, c.n_ff)
    # only the last token's logits are needed
    b.rms_norm(x, w["output_norm.weight"], rs.xn, 1, c.rms_eps, row_offset=n - 1)
    head = w["token_embd.weight" if c.tied_output else "output.weight"]
    b.matmul(head, rs.xn, rs.logits, 1, x_row=n - 1)           # [1, n_vocab]
