"""The rope table (engine/gpu/rope.py) against the numpy reference's rope, which builds its
angles apart from it; and the rope the architectures read from GGUF keys."""
from __future__ import annotations

import numpy as np
import pytest

from tests.helpers import reference
from engine.gpu.rope import Rope, rope_table

CASES = {
    "plain": Rope(10000.0, 64),
    "partial": Rope(1e6, 32),
    "linear": Rope(10000.0, 64, freq_scale=0.25),
    "yarn": Rope(150000.0, 64, freq_scale=1 / 32, ext_factor=1.0, attn_factor=0.74,
                 n_ctx_orig=4096),
    "yarn-betas": Rope(1e6, 128, freq_scale=1 / 4, ext_factor=1.0, beta_fast=16.0,
                       beta_slow=2.0, n_ctx_orig=8192),
    "factors": Rope(500000.0, 64, freq_factors=tuple(np.linspace(1, 8, 32).tolist())),
}


@pytest.mark.parametrize("name", CASES)
def test_table_matches_the_reference_rope(name):
    r = CASES[name]
    n_ctx = 300
    table = rope_table(n_ctx, r)                         # [n_ctx, n_dims / 2, 2]
    x = np.zeros((n_ctx, 1, r.n_dims), np.float32)
    x[..., 0::2] = 1.0                                   # pairs (1, 0) turn into (cos, sin)
    pos = np.arange(n_ctx)
    got = reference.rope(x, pos, r.base, neox=False, n_dims=r.n_dims,
                         freq_scale=r.freq_scale, ext_factor=r.ext_factor,
                         attn_factor=r.attn_factor,
                         corr_dims=r.corr_dims() if r.ext_factor else (0.0, 0.0),
                         freq_factors=np.array(r.freq_factors, np.float32)
                         if r.freq_factors else None)[:, 0]
    np.testing.assert_array_equal(table[..., 0], got[:, 0::2])
    np.testing.assert_array_equal(table[..., 1], got[:, 1::2])


def test_yarn_ramp_ends_follow_ggml():
    # ggml_rope_yarn_corr_dims for n_dims 64, base 150000, original context 4096
    lo, hi = CASES["yarn"].corr_dims()
    assert (lo, hi) == (8.0, 18.0)
    assert Rope(10000.0, 128, n_ctx_orig=4096).corr_dims() == (20.0, 46.0)


def test_wrong_factor_count_is_refused():
    with pytest.raises(ValueError, match="3 frequency factors for 32 pairs"):
        rope_table(16, Rope(10000.0, 64, freq_factors=(1.0, 2.0, 3.0)))
