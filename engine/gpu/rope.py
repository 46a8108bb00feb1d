"""Rotary position embeddings with the scalings GGUF files declare, as one table of (cos,
sin) per position and pair, computed the way ggml computes them (ggml_rope_cache_init and
rope_yarn in ggml-cpu's ops.cpp): theta starts at the position and is multiplied by
powf(base, -2 / n_dims) in float32 pair by pair; each pair's theta is divided by its
frequency factor (LongRoPE, llama 3), scaled by freq_scale (linear and YaRN), mixed with
the unscaled theta over YaRN's ramp, and cos and sin are multiplied by the attention factor
(times 1 + 0.1 ln(1 / freq_scale) under YaRN, as ggml does).

`rope_qkv` reads the table: every scaling costs the same as none at run time.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Rope:
    base: float
    n_dims: int                    # rotated dimensions of a head
    freq_scale: float = 1.0        # 1 / the scaling factor (linear, YaRN)
    ext_factor: float = 0.0        # YaRN: 1 mixes extrapolated angles in over its ramp
    attn_factor: float = 1.0       # multiplies cos and sin
    beta_fast: float = 32.0        # YaRN's ramp ends
    beta_slow: float = 1.0
    n_ctx_orig: int = 0            # the context the model was trained at (YaRN)
    freq_factors: tuple[float, ...] = ()   # per pair: theta is divided by it (n_dims / 2)

    @property
    def plain(self) -> bool:
        """No scaling: the kernels may compute the angles themselves."""
        return (self.freq_scale == 1.0 and self.ext_factor == 0.0 and self.attn_factor == 1.0
                and not self.freq_factors)

    def corr_dims(self) -> tuple[float, float]:
        """ggml_rope_yarn_corr_dims: the pairs between which YaRN's ramp runs."""
        def dim(beta: float) -> float:
            return self.n_dims * math.log(self.n_ctx_orig / (beta * 2 * math.pi)) \
                / (2 * math.log(self.base))
        start = math.floor(dim(self.beta_fast))
        end = math.ceil(dim(self.beta_slow))
        return float(max(0, start)), float(min(self.n_dims - 1, end))


@functools.lru_cache(maxsize=16)
def rope_table(n_ctx: int, rope: Rope) -> np.ndarray:
    """[n_ctx, n_dims / 2, (cos, sin)] float32; computed once per process (a full restore
    rebuilds the device table from it)."""
    half = rope.n_dims // 2
    if rope.freq_factors and len(rope.freq_factors) != half:
        raise ValueError(f"rope: {len(rope.freq_factors)} frequency factors for "
                         f"{half} pairs")
    f32 = np.float32
    theta_scale = f32(rope.base) ** f32(-2.0 / rope.n_dims)
    theta = np.empty((n_ctx, half), f32)
    theta[:, 0] = np.arange(n_ctx, dtype=f32)
    for i in range(1, half):
        theta[:, i] = theta[:, i - 1] * theta_scale
    mscale = f32(rope.attn_factor)
    if rope.freq_factors:
        theta = theta / np.asarray(rope.freq_factors, f32)
    extrap = theta
    theta = f32(rope.freq_scale) * extrap
    if rope.ext_factor != 0.0:
        lo, hi = rope.corr_dims()
        i0 = np.arange(half, dtype=f32) * 2
        y = (i0 / 2 - f32(lo)) / max(f32(0.001), f32(hi - lo))
        ramp = (1 - np.minimum(f32(1), np.maximum(f32(0), y))) * f32(rope.ext_factor)
        theta = theta * (1 - ramp) + extrap * ramp
        mscale = mscale * (f32(1) + f32(0.1) * f32(math.log(1.0 / rope.freq_scale)))
    t64 = theta.astype(np.float64)        # cosf and sinf to float32, then times the scale
    table = np.stack([np.cos(t64).astype(f32) * mscale, np.sin(t64).astype(f32) * mscale],
                     axis=-1).astype(f32)
    table.flags.writeable = False
    return table
