"""Embeddings from a generative model, as llama-server's --embeddings makes them: each input
run as a sequence of its own from position 0 (Model.hidden: the final-normed hidden states of
every token), pooled over its tokens, then L2-normalized.

A batch runs back to back, one input after the other. One pass for several sequences would
need each token to attend only to its own sequence: rope_qkv and the attention kernels
(attention, flash_attn, attn_mask, attn_split) read one first position per pass from the
step buffer and mask causally against every cached position before a token, so they would
need per-token positions and a per-token first visible position (a lower bound like the
sliding window's), written by the host per pass.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from .model import Model

POOLINGS = ("mean", "cls", "last")
# llama.cpp's LLAMA_POOLING_TYPE_* as GGUF's {arch}.pooling_type holds them
GGUF_POOLING = {1: "mean", 2: "cls", 3: "last"}


def declared_pooling(model: Model) -> str | None:
    """The pooling the model file declares ({arch}.pooling_type), if it is one of ours."""
    v = model.gguf.get(f"{model.gguf.arch}.pooling_type")
    return GGUF_POOLING.get(int(v)) if isinstance(v, (int, np.integer)) else None


def pool(hidden: np.ndarray, how: str) -> np.ndarray:
    """[n, n_embd] -> [n_embd]: their mean, the first (cls) or the last, L2-normalized as
    llama-server's default (embd_normalize 2)."""
    if how == "mean":
        v = hidden.astype(np.float64).mean(axis=0)
    elif how == "cls":
        v = hidden[0].astype(np.float64)
    elif how == "last":
        v = hidden[-1].astype(np.float64)
    else:
        raise ValueError(f"pooling must be one of {', '.join(POOLINGS)}, got {how!r}")
    norm = np.sqrt(np.sum(v * v))
    return (v / norm if norm > 0 else v).astype(np.float32)


def embed(model: Model, inputs: list[list[int]], how: str,
          between: Callable[[], None] | None = None) -> list[np.ndarray]:
    """One pooled, normalized vector per token list; between() between prefill passes and
    inputs (the arena's safe point, and where a cancellation is seen)."""
    out = []
    for i, ids in enumerate(inputs):
        if i and between is not None:
            between()
        out.append(pool(model.hidden(ids, between), how))
    return out
