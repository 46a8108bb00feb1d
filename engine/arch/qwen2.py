"""The qwen2 architecture (Qwen2, Qwen2.5 and their coder and math GGUFs), as llama.cpp
defines it: llama's graph (engine/arch/llama.py) with biases on the Q, K and V projections
(large on K in trained models) and NeoX rope (halves rotated)."""
from __future__ import annotations

from dataclasses import dataclass

from . import llama
from .llama import forward  # noqa: F401  (the llama graph)


@dataclass(frozen=True)
class Config(llama.Config):
    ROPE_FREQS = False
    NEOX = True
    BIASES = ("attn_q", "attn_k", "attn_v")
