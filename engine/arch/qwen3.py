"""The qwen3 architecture (dense Qwen3 GGUFs), as llama.cpp defines it: llama's graph
(engine/arch/llama.py) with per-head RMS norms on q and k before the rope, NeoX rope (halves
rotated), and no biases. The head size is the file's key_length, so n_head * head_dim may
differ from n_embd."""
from __future__ import annotations

from dataclasses import dataclass

from . import llama
from .llama import forward  # noqa: F401  (the llama graph)


@dataclass(frozen=True)
class Config(llama.Config):
    ROPE_FREQS = False
    NEOX = True
    QK_NORM = "head"
    BIASES = ()
