"""The phi3 architecture (Phi-3, Phi-3.5 and Phi-4 mini GGUFs), as llama.cpp defines it.

Llama's graph with two fused weights: `attn_qkv` holds the Q, K and V rows in that order,
`ffn_up` the gate rows then the up rows. Each product runs on a row slice of the fused
weight where it lies (Tensor.row_slice: no copy). NeoX rope (halves rotated). LongRoPE:
the rope's per-pair frequency factors are `rope_factors_long` when the context (padded to
256, as llama.cpp pads it) exceeds the rope's original context, else `rope_factors_short`,
with the file's attention factor; so the rope depends on the context size (`at_context`).
phi3.cpp reads a sliding window but runs every layer global, and so does this.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from ..formats.gguf_file import GGUFFile
from . import config, llama
from .llama import forward  # noqa: F401  (the llama graph, with its fused weights)
from ..gpu.rope import Rope

CTX_PAD = 256            # llama_context pads the context to this before choosing factors


@dataclass(frozen=True)
class Config(llama.Config):
    rope_short: Rope           # LongRoPE's two ropes; `rope` is the one in use
    rope_long: Rope

    ROPE_FREQS = False
    LONGROPE = True
    NEOX = True
    FUSED = True
    BIASES = ()                # this graph adds none

    @classmethod
    def extra(cls, g: GGUFFile, common: dict) -> dict:
        args = (g, common["rope_base"], common["rope_dims"], common["n_ctx_train"])
        short = config.rope_from_gguf(*args, "rope_factors_short.weight")
        return {**super().extra(g, common), "rope": short, "rope_short": short,
                "rope_long": config.rope_from_gguf(*args, "rope_factors_long.weight")}

    def at_context(self, n_ctx: int) -> "Config":
        """With the long factors past the original context, else the short ones."""
        long = -(-n_ctx // CTX_PAD) * CTX_PAD > self.rope_long.n_ctx_orig
        return replace(self, rope=self.rope_long if long else self.rope_short)

    def tensor_shapes(self) -> dict[str, tuple[int, ...]]:
        """Every tensor the forward pass reads, with its ggml shape (row length first)."""
        e, hd = self.n_embd, self.head_dim
        shapes = self.io_shapes()
        for i in range(self.n_layer):
            b = f"blk.{i}."
            shapes.update({
                b + "attn_norm.weight": (e,),
                b + "attn_qkv.weight": (e, (self.n_head + 2 * self.n_head_kv) * hd),
                b + "attn_output.weight": (self.n_head * hd, e),
                b + "ffn_norm.weight": (e,),
                b + "ffn_up.weight": (e, 2 * self.n_ff),
                b + "ffn_down.weight": (self.n_ff, e),
            })
        return shapes
