"""The olmo2 architecture (OLMo 2), as llama.cpp's src/models/olmo2.cpp builds it.

No norm before the attention or the feed-forward: each output is normed before it joins the
residual (post-norms, under gemma's tensor names). RMS norms on q and k run over the whole
projection, not per head. NeoX rope; a SwiGLU feed-forward; an untied output. Olmo 3's
sliding-window layers (the same architecture with `attention.sliding_window`) are refused.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..formats.gguf_file import GGUFFile
from ..gpu.builder import Builder
from ..gpu.runstate import RunState
from . import blocks, config


@dataclass(frozen=True)
class Config(config.Config):
    window: int                # attention.sliding_window (Olmo 3): not run

    DEFAULTS = {**config.Config.DEFAULTS, "attention.layer_norm_rms_epsilon": None}

    @classmethod
    def extra(cls, g: GGUFFile, common: dict) -> dict:
        return dict(window=int(g.get(f"{g.arch}.attention.sliding_window", 0) or 0))

    def problems(self) -> list[str]:
        out = config.whole_rope_problems(self)
        if self.window:
            out.append(f"sliding-window layers (Olmo 3's, window {self.window})")
        return out

    def tensor_shapes(self) -> dict[str, tuple[int, ...]]:
        """Every tensor the forward pass reads, with its ggml shape (row length first)."""
        shapes = self.io_shapes()
        for i in range(self.n_layer):
            b = f"blk.{i}."
            shapes.update({**self.attention_shapes(i, qk_norm="whole", norm=False),
                           **self.ffn_shapes(i, norm=False),
                           b + "post_attention_norm.weight": (self.n_embd,),
                           b + "post_ffw_norm.weight": (self.n_embd,)})
        return shapes


def forward(b: Builder, c: Config, rs: RunState, n: int) -> None:
    """Tokens rs.ids[:n] at positions step.pos0.. -> logits of the last token in rs.logits."""
    blocks.embed(b, c, rs, n)
    for i in range(c.n_layer):
        blocks.attention(b, c, rs, i, n, c.rope, neox=True, scale=c.head_dim ** -0.5,
                         norm=None, qk_norm="whole", post_norm=True)
        blocks.ffn(b, c, rs, i, n, norm=None, post_norm=True)
    blocks.head(b, c, rs, n)
