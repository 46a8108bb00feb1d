"""Embeddings from a generative model, as llama-server's --embeddings makes them: each input
run as a sequence of its own from position 0 (Model.hidden: the final-normed hidden states of
every token), pooled over its tokens, then L2-normalized.

A batch packs its inputs into as few passes as it can, as llama.cpp's server puts several
sequences in one ubatch: in order, as many whole inputs as fit a pass (Model.hidden_packed).
Packed inputs share the KV cache, one after the other from slot 0; each token's position
restarts at 0 with its sequence, and it sees only the earlier tokens of its own sequence
(llama.cpp builds a KQ mask per token for that: here the host writes each token's first
visible slot, step.seq_first, which rope_qkv and every prefill attention path read when
specialized with SEQS = 1, as the sliding window bounds them). A pass is as wide as
Model.pass_tokens allows (the model's pass width, and the time a pass may take, measured);
an input longer than that runs alone, chunked as a prompt. Recurrent models (lfm2, the delta-net
hybrids) hold one state per pass: their inputs run one after the other.
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


def plan(lengths: list[int], width: int) -> list[list[int]]:
    """The inputs of each pass, by index, for passes of `width` tokens (what embed() runs
    when every pass has that width)."""
    out, i = [], 0
    while i < len(lengths):
        j = _fit(lengths, i, width)
        out.append(list(range(i, j)))
        i = j
    return out


def _fit(lengths: list[int], i: int, width: int) -> int:
    """The end of the inputs from i on that one pass of `width` takes: as many whole ones
    as fit, at least one (a longer one alone)."""
    j, used = i, 0
    while j < len(lengths) and used + lengths[j] <= width:
        used += lengths[j]
        j += 1
    return max(j, i + 1)


def embed(model: Model, inputs: list[list[int]], how: str,
          between: Callable[[], None] | None = None,
          width: int | None = None) -> list[np.ndarray]:
    """One pooled, normalized vector per token list, inputs packed into passes (above);
    width, if given, fixes the passes' width in tokens, else Model.pass_tokens picks it per
    pass. between() between passes (the arena's safe point, where a cancellation is
    seen). An input given twice or more is run once and its copies get its vector, the
    same bits (a packed pass's attention rounds with where in the pass an input sits)."""
    first: dict[tuple[int, ...], int] = {}
    for x in inputs:
        first.setdefault(tuple(x), len(first))
    if len(first) < len(inputs):
        vectors = embed(model, [list(x) for x in first], how, between, width)
        return [vectors[first[tuple(x)]] for x in inputs]
    out: list[np.ndarray] = []
    lengths = [len(x) for x in inputs]
    cap = min(model.chunk, model.n_ctx)
    i = 0
    while i < len(inputs):
        if i and between is not None:
            between()
        w = min(width if width is not None else model.pass_tokens(), cap)
        j = i + 1 if model.recurrent else _fit(lengths, i, w)
        if j == i + 1 and (model.recurrent or lengths[i] > w):    # alone, chunked
            out.append(pool(model.hidden(inputs[i], between), how))
        else:
            out.extend(pool(h, how) for h in model.hidden_packed(inputs[i:j]))
        i = j
    return out
