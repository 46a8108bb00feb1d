"""The granite architecture (IBM Granite 3 dense), as llama.cpp's src/models/granite.cpp builds
it: llama's graph with four scales.
- The token embeddings are multiplied by `embedding_scale`.
- Each attention and feed-forward output is multiplied by `residual_scale` before it joins
  the residual.
- Attention scores are scaled by `attention.scale`, in place of 1/sqrt(head_dim).
- The logits are divided by `logit_scale`.
A scale of 0 or a missing key means none, as in llama.cpp. Files without rope
(`rope.scaling.finetuned` false) are refused; Granite's MoE and hybrid models are other
architectures.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..formats.gguf_file import GGUFFile
from ..gpu.builder import Builder
from ..gpu.runstate import RunState
from . import blocks, llama


@dataclass(frozen=True)
class Config(llama.Config):
    embedding_scale: float
    residual_scale: float
    attention_scale: float
    logit_scale: float
    rope_on: bool              # rope.scaling.finetuned: granite's switch for rope

    @classmethod
    def extra(cls, g: GGUFFile, common: dict) -> dict:
        a = g.arch
        return {**super().extra(g, common),
                "embedding_scale": float(g.get(f"{a}.embedding_scale", 0.0)) or 1.0,
                "residual_scale": float(g.get(f"{a}.residual_scale", 0.0)) or 1.0,
                "attention_scale": float(g.get(f"{a}.attention.scale", 0.0)) or
                common["head_dim"] ** -0.5,
                "logit_scale": float(g.require(f"{a}.logit_scale")),
                "rope_on": bool(g.get(f"{a}.rope.scaling.finetuned", True))}

    def problems(self) -> list[str]:
        out = super().problems()
        if not self.rope_on:
            out.append("no rope (rope.scaling.finetuned false)")
        if not self.logit_scale:
            out.append("logit_scale 0")
        return out


def forward(b: Builder, c: Config, rs: RunState, n: int) -> None:
    """Tokens rs.ids[:n] at positions step.pos0.. -> logits of the last token in rs.logits."""
    blocks.embed(b, c, rs, n, scale=c.embedding_scale)
    for i in range(c.n_layer):
        blocks.attention(b, c, rs, i, n, c.rope, neox=False, scale=c.attention_scale,
                         qkv_bias=c.qkv_bias, out_bias=c.out_bias, residual=c.residual_scale)
        blocks.ffn(b, c, rs, i, n, residual=c.residual_scale)
    # ggml_scale by 1 / logit_scale, the quotient taken in f32
    blocks.head(b, c, rs, n, scale=float(np.float32(1.0) / np.float32(c.logit_scale)))
