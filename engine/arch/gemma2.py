"""The gemma2 architecture (Gemma 2 text models), as llama.cpp defines it in GGUF.

As gemma3 without Q/K norms: embeddings scaled by sqrt(n_embd), post-attention and
post-feed-forward norms before each residual add, GELU (tanh) gating, NeoX-style rope. Its
own: attention logits soft-capped at `attn_logit_softcapping` (cap * tanh(s / cap), on the
scaled scores) and the final logits at `final_logit_softcapping`; sliding-window attention on
alternate layers (`attention.sliding_window_pattern`, 2 by default: layers 0, 2, ... slide),
their rope base `rope.freq_base_swa`; Q scaled by 1/sqrt(head_dim), except in the 27B (46
layers), which llama.cpp scales by 1/sqrt(n_embd / n_head). GGUF norm weights already hold
Gemma's (1 + w), so they are used as stored.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ..formats.gguf_file import GGUFFile
from . import blocks, config
from ..gpu.builder import Builder
from ..gpu.runstate import RunState


@dataclass(frozen=True)
class Config(config.SlidingWindows, config.Config):
    window: int                # sliding window of the local layers, in tokens
    swa_layers: tuple[bool, ...]
    rope_base_local: float     # sliding-window layers (rope_base: global layers)
    attn_scale: float
    attn_softcap: float        # 0: none
    final_softcap: float       # 0: none

    QK_NORM: ClassVar[str] = ""       # "head": per-head RMS norms on q and k (gemma3)

    DEFAULTS = {"context_length": 8192, "rope.freq_base": 10000.0,
                "attention.layer_norm_rms_epsilon": 1e-6}

    @classmethod
    def extra(cls, g: GGUFFile, common: dict) -> dict:
        a, n_layer = g.arch, common["n_layer"]
        per_head = common["n_embd"] // common["n_head"] if n_layer == 46 else common["head_dim"]
        return dict(
            window=int(g.get(f"{a}.attention.sliding_window", 4096)),
            swa_layers=config.swa_layers(g, n_layer),
            rope_base_local=float(g.get(f"{a}.rope.freq_base_swa", common["rope_base"])),
            attn_scale=per_head ** -0.5,
            attn_softcap=float(g.get(f"{a}.attn_logit_softcapping", 50.0) or 0.0),
            final_softcap=float(g.get(f"{a}.final_logit_softcapping", 30.0) or 0.0),
        )

    def is_local(self, layer: int) -> bool:
        return self.swa_layers[layer]

    def tensor_shapes(self) -> dict[str, tuple[int, ...]]:
        """Every tensor the forward pass reads, with its ggml shape (row length first)."""
        e = self.n_embd
        shapes = self.io_shapes()
        for i in range(self.n_layer):
            b = f"blk.{i}."
            shapes.update({**self.attention_shapes(i), **self.ffn_shapes(i),
                           b + "post_attention_norm.weight": (e,),
                           b + "post_ffw_norm.weight": (e,)})
        return shapes








def forward(b: Builder, c: Config, rs: RunState, n: int) -> None:
    """Tokens rs.ids[:n] at positions step.pos0.. -> logits of the last token in rs.logits."""
    blocks.embed(b, c, rs, n, scale=c.n_embd ** 0.5)
    for i in range(c.n_layer):
        blocks.attention(b, c, rs, i, n, c.layer_rope(i), neox=True,
                         scale=c.attn_scale, window=c.layer_window(i),
                         softcap=c.attn_softcap, qk_norm=c.QK_NORM, post_norm=True)
        blocks.ffn(b, c, rs, i, n, gelu=True, post_norm=True)
    blocks.head(b, c, rs, n, softcap=c.final_softcap)
