"""Choosing the next token from logits, with llama.cpp's default sampler chain.

The order is llama.cpp's: logit bias, penalties (repetition, frequency, presence), top-k,
top-p, min-p, temperature, then a draw. top-p and min-p therefore judge the untempered
distribution, as they do there. The draw uses a numpy Generator, so one seed gives one
sequence (not llama.cpp's sequence: its RNG is std::mt19937 inside the C++ library).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

# Below this a temperature is greedy: dividing logits by it would overflow to inf and nan
# (llama.cpp's own cut-off is temp <= 0; nobody samples meaningfully at 1e-6).
MIN_TEMPERATURE = 1e-6
BAN = -math.inf                          # a logit bias that removes the token


class SamplingError(ValueError):
    """A sampling parameter that cannot work; `param` names it."""

    def __init__(self, param: str, message: str):
        super().__init__(message)
        self.param = param


@dataclass
class SamplingParams:
    temperature: float = 0.8        # < MIN_TEMPERATURE: greedy
    top_k: int = 40                 # <= 0: off
    top_p: float = 0.95             # >= 1: off
    min_p: float = 0.05             # <= 0: off
    repeat_penalty: float = 1.0     # 1: off; > 0
    repeat_last_n: int = 64         # 0: off (all three penalties), -1: the whole history
    seed: int | None = None         # None: fresh entropy
    frequency_penalty: float = 0.0  # minus this times a recent token's count: 0 off
    presence_penalty: float = 0.0   # minus this once for a recent token: 0 off
    logit_bias: dict[int, float] = field(default_factory=dict)   # token id -> added; BAN

    def __post_init__(self) -> None:
        for key in ("temperature", "top_p", "min_p", "repeat_penalty", "frequency_penalty",
                    "presence_penalty"):
            v = getattr(self, key)
            if not isinstance(v, (int, float)) or not math.isfinite(v):
                raise SamplingError(key, f"{key} must be a finite number, got {v!r}")
        if self.repeat_penalty <= 0:
            # logits divided by 0 are inf: every penalised token wins, or nan
            raise SamplingError("repeat_penalty", f"repeat_penalty must be > 0 (1 is off), "
                                                  f"got {self.repeat_penalty}")
        if self.repeat_last_n < -1:
            raise SamplingError("repeat_last_n", f"repeat_last_n must be >= -1, got "
                                                 f"{self.repeat_last_n}")
        for tok, bias in self.logit_bias.items():
            if tok < 0 or math.isnan(bias) or bias == math.inf:
                raise SamplingError("logit_bias", f"logit_bias: token {tok} with bias {bias} "
                                                  "cannot work")

    @property
    def greedy(self) -> bool:
        return self.temperature < MIN_TEMPERATURE

    @property
    def penalised(self) -> bool:
        """Whether the penalties change any logit."""
        return self.repeat_last_n != 0 and (self.repeat_penalty != 1.0
                                            or self.frequency_penalty != 0.0
                                            or self.presence_penalty != 0.0)

    @property
    def plain_greedy(self) -> bool:
        """Greedy on the model's own logits: the device's argmax is the answer."""
        return self.greedy and not self.penalised and not self.logit_bias


def apply_logit_bias(logits: np.ndarray, bias: dict[int, float]) -> np.ndarray:
    """llama.cpp's logit-bias sampler: each bias added to its token's logit (a BAN makes it
    -inf). Ids past the vocabulary are skipped. Returns a new array."""
    out = np.array(logits, dtype=np.float32, copy=True)
    for tok, b in bias.items():
        if 0 <= tok < out.shape[0]:
            out[tok] += np.float32(b)
    return out


def apply_mask(logits: np.ndarray, allowed: np.ndarray) -> np.ndarray:
    """A grammar's mask, before the whole chain: every token not `allowed` (bool per id;
    ids past it are not allowed) gets -inf, so that no later step can bring it back.
    Returns a new array."""
    n = min(logits.shape[0], allowed.shape[0])
    out = np.full(logits.shape, BAN, dtype=np.float32)
    np.copyto(out[:n], logits[:n], where=allowed[:n])
    return out


def apply_penalties(logits: np.ndarray, history: list[int], repeat: float, last_n: int,
                    frequency: float = 0.0, presence: float = 0.0) -> np.ndarray:
    """llama.cpp's penalties sampler over the last `last_n` tokens of history (-1: all).

    For every token that occurs there, `count` times: a positive logit is divided by the
    repetition penalty and any other multiplied (both push the token down, once however
    often it occurs), then `count * frequency + presence` is subtracted. Float32
    arithmetic, as there. Returns a new array."""
    out = np.array(logits, dtype=np.float32, copy=True)
    if last_n == 0 or not history or (repeat == 1.0 and frequency == 0.0 and presence == 0.0):
        return out
    recent = history if last_n < 0 else history[-last_n:]
    ids, counts = np.unique(np.asarray(recent, dtype=np.int64), return_counts=True)
    keep = (ids >= 0) & (ids < out.shape[0])
    ids, counts = ids[keep], counts[keep].astype(np.float32)
    vals = out[ids]
    rp = np.float32(repeat)
    vals = np.where(vals <= 0, vals * rp, vals / rp)
    out[ids] = vals - (counts * np.float32(frequency) + np.float32(presence))
    return out


def apply_repeat_penalty(logits: np.ndarray, history: list[int], penalty: float,
                         last_n: int) -> np.ndarray:
    """The repetition penalty alone (apply_penalties without frequency and presence)."""
    return apply_penalties(logits, history, penalty, last_n)


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
        x = logits
        if p.logit_bias:
            x = apply_logit_bias(logits, p.logit_bias)
            if not x.max() > BAN:
                raise SamplingError("logit_bias", "logit_bias bans every token")
        x = apply_penalties(x, history or [], p.repeat_penalty, p.repeat_last_n,
                            p.frequency_penalty, p.presence_penalty)
        if p.greedy:
            return np.array([int(np.argmax(x))]), np.ones(1)
        ids = _top_k_ids(x, p.top_k)
        lg = x[ids].astype(np.float64)
        n = int(np.count_nonzero(lg > -math.inf))
        ids, lg = ids[:max(n, 1)], lg[:max(n, 1)]       # banned tokens never take part
        if p.top_p < 1.0:
            cum = np.cumsum(_softmax(lg))
            keep = int(np.searchsorted(cum, p.top_p, side="left")) + 1   # first cum >= p
            ids, lg = ids[:keep], lg[:keep]
        if p.min_p > 0.0 and lg.shape[0] > 1:
            keep = max(1, int(np.count_nonzero(lg >= lg[0] + math.log(p.min_p))))
            ids, lg = ids[:keep], lg[:keep]
        # shifted before the division, so that a small temperature cannot overflow
        return ids, _softmax((lg - lg[0]) / p.temperature)

    def sample(self, logits: np.ndarray, history: list[int] | None = None) -> int:
        """The next token id. `history` is the context so far (prompt and generated ids)."""
        ids, probs = self.candidates(logits, history)
        if ids.shape[0] == 1:
            return int(ids[0])
        u = self.rng.random()
        i = int(np.searchsorted(np.cumsum(probs), u * probs.sum(), side="right"))
        return int(ids[min(i, ids.shape[0] - 1)])
