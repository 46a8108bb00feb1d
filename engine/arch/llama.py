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
from . import blocks, config
from ..gpu.builder import Builder
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
    QK_NORM: ClassVar[str] = ""       # "head": per-head RMS norms on q and k (qwen3)
    FUSED: ClassVar[bool] = False      # Q | K | V in one weight, gate | up in one (phi3)
    MOE: ClassVar[bool] = False        # a mixture of experts for the feed-forward (qwen3moe)
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
            shapes.update({**self.attention_shapes(i, qk_norm=self.QK_NORM),
                           **self.ffn_shapes(i)})
            if self.qkv_bias:
                shapes.update({b + "attn_q.bias": (self.n_head * hd,),
                               b + "attn_k.bias": (self.n_head_kv * hd,),
                               b + "attn_v.bias": (self.n_head_kv * hd,)})
            if self.out_bias:
                shapes[b + "attn_output.bias"] = (e,)
        return shapes


def unread_biases(g: GGUFFile, read: tuple[str, ...]) -> tuple[str, ...]:
    """The bias tensors of a file (layer numbers dropped) that are not among `read`: a graph
    that ignored them would compute something else than the model."""
    names = {re.sub(r"^blk\.\d+\.", "", n) for n in g.tensors if n.endswith(".bias")}
    return tuple(sorted(names - {f"{r}.bias" for r in read}))



def forward(b: Builder, c: Config, rs: RunState, n: int) -> None:
    """Tokens rs.ids[:n] at positions step.pos0.. -> logits of the last token in rs.logits."""
    blocks.embed(b, c, rs, n)
    for i in range(c.n_layer):
        blocks.attention(b, c, rs, i, n, c.rope, neox=c.NEOX, scale=c.head_dim ** -0.5,
                         qkv_bias=c.qkv_bias, out_bias=c.out_bias, qk_norm=c.QK_NORM,
                         fused_qkv=c.FUSED, temp=(c.attn_temp_scale, c.attn_temp_floor))
        if c.MOE:
            blocks.moe(b, c, rs, i, n)
        else:
            blocks.ffn(b, c, rs, i, n, fused_up=c.FUSED)
    blocks.head(b, c, rs, n)
