"""The ops a vision encoder adds (LayerNorm, plain GELU, average pooling, K and V stored
unrotated) against numpy, and prefill attention over a pass whose tokens see each other both
ways (an image's soft tokens) on each prefill kernel."""
from __future__ import annotations

import numpy as np
import pytest

from engine.gpu.builder import Builder
from engine.gpu.graph import Graph
from engine.gpu.paths import Tuning
from engine.gpu.runstate import RunState
from engine.gpu.tensors import Tensor
from tests.engine.gpu.test_kernels import attn_inputs, buf, builder_attention, nmse, read

pytestmark = pytest.mark.gpu


def f32_tensor(dev, a: np.ndarray) -> Tensor:
    b = buf(dev, np.ascontiguousarray(a, np.float32), kind="weights")
    return Tensor("F32", tuple(reversed(a.shape)), [(0, 1, 0, 0, b.nbytes)], [b])


def one_pass(dev, kc, record, rs=None) -> None:
    g = Graph(dev, kc, "t")
    try:
        record(Builder(g, {}, rs, Tuning.for_device(dev)))
        g.replay()
    finally:
        g.close()


def test_layer_norm(dev, kc):
    rng = np.random.default_rng(1)
    n, d = 5, 200
    x = (rng.standard_normal((n, d)) * 3 + 2).astype(np.float32)
    w, b = rng.standard_normal(d).astype(np.float32), rng.standard_normal(d).astype(np.float32)
    bx, bo = buf(dev, x), buf(dev, nbytes=x.nbytes)
    one_pass(dev, kc, lambda B: B.layer_norm(bx, f32_tensor(dev, w), f32_tensor(dev, b), bo,
                                             n, 1e-6))
    x64 = x.astype(np.float64)
    m, var = x64.mean(-1, keepdims=True), x64.var(-1, keepdims=True)
    want = (x64 - m) / np.sqrt(var + 1e-6) * w + b
    assert nmse(read(dev, bo)[:n * d].reshape(n, d), want) < 1e-12


def test_plain_gelu(dev, kc):
    x = np.linspace(-12, 12, 1001).astype(np.float32)
    bx, bo = buf(dev, x), buf(dev, nbytes=x.nbytes)
    one_pass(dev, kc, lambda B: B.gelu(bx, bo, len(x)))
    x64 = x.astype(np.float64)
    want = 0.5 * x64 * (1 + np.tanh(np.sqrt(2 / np.pi) * (x64 + 0.044715 * x64 ** 3)))
    assert np.abs(read(dev, bo)[:len(x)] - want).max() < 1e-5


@pytest.mark.parametrize("side,k", [(8, 4), (6, 3), (64, 4)])
def test_pool2d(dev, kc, side, k):
    rng = np.random.default_rng(2)
    d = 24
    x = rng.standard_normal((side * side, d)).astype(np.float32)
    bx, bo = buf(dev, x), buf(dev, nbytes=x.nbytes)
    one_pass(dev, kc, lambda B: B.pool2d(bx, bo, d, side, k))
    o = side // k
    want = x.astype(np.float64).reshape(o, k, o, k, d).mean(axis=(1, 3)).reshape(o * o, d)
    assert nmse(read(dev, bo)[:o * o * d].reshape(o * o, d), want) < 1e-12


def test_pool2d_refuses_a_grid_it_cannot_divide(dev, kc):
    with pytest.raises(ValueError, match="does not pool by 4"):
        one_pass(dev, kc, lambda B: B.pool2d(None, None, 8, 10, 4))


def test_kv_store_keeps_k_and_v_as_they_are(dev, kc):
    rng = np.random.default_rng(3)
    n, n_kv, hd, pos0, n_ctx = 6, 2, 72, 3, 12
    k = rng.standard_normal((n, n_kv, hd)).astype(np.float32) * 4
    v = rng.standard_normal((n, n_kv, hd)).astype(np.float32) * 4
    rs = RunState(dev, "t", n_layer=1, n_embd=64, n_head=1, q_dim=64, kv_dim=64, n_ff=64,
                  n_vocab=64, n_ctx=n_ctx, max_tokens=8)
    rs.set_step([0] * n, pos0)
    bk, bv = buf(dev, k), buf(dev, v)
    kc_, vc_ = (buf(dev, np.zeros((n_ctx, n_kv, hd), np.float16)) for _ in range(2))
    one_pass(dev, kc, lambda B: B.kv_store(bk, bv, kc_, vc_, n_kv, hd, n), rs)
    got_k = read(dev, kc_, np.float16).reshape(n_ctx, n_kv, hd)
    got_v = read(dev, vc_, np.float16).reshape(n_ctx, n_kv, hd)
    assert np.array_equal(got_k[pos0:pos0 + n], k.astype(np.float16))
    assert np.array_equal(got_v[pos0:pos0 + n], v.astype(np.float16))
    assert not got_k[:pos0].any() and not got_k[pos0 + n:].any()


def both_ways_ref(q, k, v, pos0, window, scale):
    """Each token sees the cache up to the pass's last position (its window still bounding
    the keys before it): llama.cpp's non-causal batch."""
    n_tok, n_head, hd = q.shape
    group = n_head // k.shape[1]
    last = pos0 + n_tok
    out = np.zeros_like(q, dtype=np.float64)
    for t in range(n_tok):
        pos = pos0 + t
        lo = pos - window + 1 if window and pos >= window else 0
        for h in range(n_head):
            kk = k[lo:last, h // group].astype(np.float64)
            s = kk @ q[t, h].astype(np.float64) * scale
            p = np.exp(s - s.max())
            out[t, h] = (p / p.sum()) @ v[lo:last, h // group].astype(np.float64)
    return out


@pytest.mark.parametrize("kernel", ["attention", "flash_attn", "flash_attn_cm"])
@pytest.mark.parametrize("n,pos0,window", [(40, 0, 0), (70, 13, 0), (70, 13, 30)])
def test_attention_both_ways(dev, kc, kernel, n, pos0, window):
    hd = 64
    if kernel == "flash_attn_cm" and not dev.coopmat:
        pytest.skip(f"{dev.name} has no cooperative matrices")
    t = Tuning.for_device(dev, "off" if kernel == "attention" else "on")
    t.ggml_numerics = False
    t.coopmat = kernel == "flash_attn_cm"
    assert t.paths(hd).prefill_attention == kernel
    q, k, v = attn_inputs(5, pos0 + n + 9, 4, 2, hd, n)
    got = builder_attention(dev, kc, t, q, k, v, pos0, window,
                            before=lambda rs: rs.set_step([0] * n, pos0, bidir=True))
    want = both_ways_ref(q, k, v, pos0, window, hd ** -0.5)
    if kernel == "flash_attn_cm":        # q and P through f16
        want = both_ways_ref(q.astype(np.float16).astype(np.float32), k, v, pos0, window,
                             hd ** -0.5)
    assert nmse(got, want) < (1e-5 if kernel == "flash_attn_cm" else 1e-10)
    # and the same pass causal is another answer
    causal = builder_attention(dev, kc, t, q, k, v, pos0, window)
    assert nmse(causal, want) > 1e-3
