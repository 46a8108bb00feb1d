"""The gemma3 architecture (Gemma 3 text models), as llama.cpp defines it in GGUF.

Differences from llama: embeddings scaled by sqrt(n_embd); per-head RMS norms on q and k;
post-attention and post-feed-forward norms before each residual add; GELU (tanh) gating;
NeoX-style rope; and interleaved attention: five sliding-window (local) layers, rope base
10000, then one global layer, rope base `rope.freq_base`. GGUF norm weights already hold
Gemma's (1 + w), so they are used as stored.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ..formats.gguf_file import GGUFFile
from . import config
from .gemma2 import forward  # noqa: F401 (the same graph, with this Config's flags)
from ..gpu.rope import Rope

SWA_PATTERN = 6          # every sixth layer attends globally
LOCAL_ROPE_BASE = 10000.0


@dataclass(frozen=True)
class Config(config.SlidingWindows, config.Config):
    rope_base_local: float     # sliding-window layers (rope_base: global layers)
    window: int
    attn_scale: float
    final_softcap: float       # 0: none

    attn_softcap: ClassVar[float] = 0.0     # gemma2's graph, without its attention soft-cap
    QK_NORM: ClassVar[str] = "head"        # and with per-head Q/K norms

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

    def local_rope(self) -> Rope:
        """The sliding-window layers' rope: base 10000, unscaled (the global layers take
        the file's scaling: Gemma 3 4B and larger declare linear 8)."""
        return Rope(self.rope_base_local, self.rope.n_dims)

    def is_local(self, layer: int) -> bool:
        return (layer + 1) % SWA_PATTERN != 0

    def tensor_shapes(self) -> dict[str, tuple[int, ...]]:
        """Every tensor the forward pass reads, with its ggml shape (row length first)."""
        shapes = self.io_shapes()
        for i in range(self.n_layer):
            b = f"blk.{i}."
            shapes.update({**self.attention_shapes(i, qk_norm="head"), **self.ffn_shapes(i),
                           b + "post_attention_norm.weight": (self.n_embd,),
                           b + "post_ffw_norm.weight": (self.n_embd,)})
        return shapes
