"""Choosing the next token from logits, with llama.cpp's default sampler chain.

The order is llama.cpp's: repetition penalty, top-k, top-p, min-p, temperature, then a draw.
top-p and min-p therefore judge the untempered distribution, as they do there. The draw uses
a numpy Generator, so one seed gives one sequence (not llama.cpp's sequence: its RNG is
std::mt19937 inside the C++ library).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


@dataclass
class SamplingParams:
    temperature: float = 0.8        # <= 0: greedy
    top_k: int = 40                 # <= 0: off
    top_p: float = 0.95             # >= 1: off
    min_p: float = 0.05             # <= 0: off
    repeat_penalty: float = 1.0     # 1: off
    repeat_last_n: int = 64         # 0: off, -1: the whole history
    seed: int | None = None         # None: fresh entropy

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0


def apply_repeat_penalty(logits: np.ndarray, history: list[int], penalty: float,
                         last_n: int) -> np.ndarray:
    """llama.cpp's rule, once per distinct recent token: positive logits are divided by the
    penalty, the others multiplied (both push the token down). Returns a new array."""
    out = np.array(logits, dtype=np.float32, copy=True)
    if penalty == 1.0 or last_n == 0 or not history:
        return out
    recent = history if last_n < 0 else history[-last_n:]
    ids = np.unique(np.asarray(recent, dtype=np.int64))
    ids = ids[(ids >= 0) & (ids < out.shape[0])]
    vals = out[ids]
    out[ids] = np.where(vals <= 0, vals * penalty, vals / penalty)
    return out


def _top_k_ids(logits: np.ndarray, k: int) -> np.ndarray:
    """Ids of the k largest logits, largest first; equal logits keep the lower id first."""
    n = logits.shape[0]
    if k <= 0 or k >= n:
        return np.argsort(-logits, kind="stable")
    part = np.argpartition(-logits, k - 1)[:k]
    kth = logits[part].min()
    above = np.flatnonzero(logits > kth)
    ties = np.flatnonzero(logits == kth)[:k - above.shape[0]]
    ids = np.concatenate([above, ties])
    return ids[np.argsort(-logits[ids], kind="stable")]


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max())
    return e / e.sum()


class Sampler:
    """Stateful only in its random generator: same params and seed, same choices."""

    def __init__(self, params: SamplingParams | None = None):
        self.params = params or SamplingParams()
        self.rng = np.random.default_rng(self.params.seed)

    def candidates(self, logits: np.ndarray,
                   history: list[int] | None = None) -> tuple[np.ndarray, np.ndarray]:
        """The distribution the draw uses: (ids, probabilities), most likely first."""
        p = self.params
        x = apply_repeat_penalty(logits, history or [], p.repeat_penalty, p.repeat_last_n)
        if p.greedy:
            return np.array([int(np.argmax(x))]), np.ones(1)
        ids = _top_k_ids(x, p.top_k)
        lg = x[ids].astype(np.float64)
        if p.top_p < 1.0:
            cum = np.cumsum(_softmax(lg))
            keep = int(np.searchsorted(cum, p.top_p, side="left")) + 1   # first cum >= p
            ids, lg = ids[:keep], lg[:keep]
        if p.min_p > 0.0 and lg.shape[0] > 1:
            keep = max(1, int(np.count_nonzero(lg >= lg[0] + math.log(p.min_p))))
            ids, lg = ids[:keep], lg[:keep]
        return ids, _softmax(lg / p.temperature)

    def sample(self, logits: np.ndarray, history: list[int] | None = None) -> int:
        """The next token id. `history` is the context so far (prompt and generated ids)."""
        ids, probs = self.candidates(logits, history)
        if ids.shape[0] == 1:
            return int(ids[0])
        u = self.rng.random()
        i = int(np.searchsorted(np.cumsum(probs), u * probs.sum(), side="right"))
        return int(ids[min(i, ids.shape[0] - 1)])
