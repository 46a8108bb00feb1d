"""Each kernel whose loops grow with the vocabulary, the context or the experts, run at the
largest size the engine gives it on this device, as the engine dispatches it (Builder),
against numpy. On lavapipe this is where the driver's bound on loop iterations would cut a
walk short (engine/gpu/limits.py): the data put what matters at the end of each walk (the
best logit last, the key that takes the attention at the last position), so a walk cut
short shows as a wrong answer, not as a rounding error."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from engine.gpu import limits
from engine.gpu.builder import Builder
from engine.gpu.graph import Graph
from engine.gpu.paths import Tuning
from engine.gpu.runstate import RunState
from engine.gpu.tensors import Tensor
from shaders.registry import WEIGHT_TYPES
from tests.engine.gpu.test_kernels import (attention_ggml_ref, attention_ref,
                                           builder_attention, buf, moe_product_ref, nmse,
                                           quantized, read, routed_ids)
from tests.engine.gpu.test_logprobs import log_softmax, top_ref

pytestmark = pytest.mark.gpu

VOCABS = (262144, 1 << 22)       # Gemma 3's, and the most a model file may declare (config.py)
N_EXPERT = 256


def worst_ctx(dev) -> int:
    """The longest context this device takes (lavapipe: its loop bound's), at most 2^17 here:
    beyond, no driver the engine knows bounds a loop."""
    return min(Tuning.for_device(dev).max_ctx, 1 << 17)


def test_driver_table(dev):
    t = Tuning.for_device(dev)
    lim = limits.for_device(dev.info)
    assert (t.loop_ticks, t.max_ctx) == (lim.loop_ticks, lim.max_ctx)
    if dev.info.name.startswith("llvmpipe"):
        assert lim == limits.LLVMPIPE and t.max_ctx >= 32768
        # the widest walk at that context: the per-token attention's three over it
        assert 3 * (-(-t.max_ctx // dev.subgroup_size) + 1) < t.loop_ticks


def run_reduction(dev, kc, x: np.ndarray, logprobs: bool):
    n = x.shape[0]
    rs = RunState(dev, "t", n_layer=1, n_embd=64, n_head=1, q_dim=64, kv_dim=64, n_ff=64,
                  n_vocab=n, n_ctx=16, max_tokens=1)
    bx, bo = buf(dev, x), buf(dev, nbytes=4 * 41)
    g = Graph(dev, kc, "t")
    try:
        b = Builder(g, {}, rs, Tuning.for_device(dev))
        if logprobs:
            b.logprobs(bx, bo, n, 20)
        else:
            b.argmax(bx, bo, n)
        g.replay()
        return read(dev, bo, np.uint32)
    finally:
        g.close()
        rs.close()
        for b_ in (bx, bo):
            dev.allocator.free(b_)


@pytest.mark.parametrize("n", VOCABS)
def test_argmax_at_the_largest_vocabulary(dev, kc, n):
    x = np.random.default_rng(1).standard_normal(n).astype(np.float32)
    x[n - 1] = 10.0                      # the best last, an equal one before it
    x[n - 5] = 10.0
    assert run_reduction(dev, kc, x, False)[0] == n - 5
    x[n - 5] = 0.0
    assert run_reduction(dev, kc, x, False)[0] == n - 1


@pytest.mark.parametrize("n", VOCABS)
def test_logprobs_at_the_largest_vocabulary(dev, kc, n):
    """Rising logits, the worst order for the lanes' sorted lists, and banned ones (-inf)."""
    rng = np.random.default_rng(2)
    x = (np.sort(rng.standard_normal(n)) * 4).astype(np.float32)
    x[rng.choice(n, 1000, replace=False)] = -np.inf
    raw = run_reduction(dev, kc, x, True)
    lse, lp, ids = raw[:1].view(np.float32)[0], raw[1:21].view(np.float32), raw[21:41]
    ref = log_softmax(x[np.isfinite(x)])
    want = top_ref(x, 20)
    finite = x[np.isfinite(x)].astype(np.float64)
    assert ids.tolist() == want.tolist()
    assert np.abs(lp - log_softmax(x)[want]).max() < 1e-4
    assert abs(lse - (finite.max() + np.log(np.exp(finite - finite.max()).sum()))) < 1e-4
    assert np.isfinite(ref).all()


def attn_case(n_ctx: int, hd: int, n_tok: int, seed: int):
    """q, k, v over n_ctx positions: random, except that the key at each query's position
    matches its query, so the last position takes most of the attention."""
    rng = np.random.default_rng(seed)
    n_head, n_kv = 2, 1
    k = rng.standard_normal((n_ctx, n_kv, hd)).astype(np.float16)
    v = rng.standard_normal((n_ctx, n_kv, hd)).astype(np.float16)
    q = (rng.standard_normal((n_tok, n_head, hd)) * 0.3).astype(np.float32)
    for t in range(n_tok):
        k[n_ctx - n_tok + t, 0] = (q[t, 0] * 8).astype(np.float16)
    return q, k, v


@pytest.mark.parametrize("hd", [64, 256])
@pytest.mark.parametrize("path", ["ggml", "split", "decode"])
def test_decode_attention_at_the_longest_context(dev, kc, hd, path):
    """One token at the last position of the longest context: the per-token kernel (ggml's
    rounding: decode takes the prefill's), attn_split and attn_decode with their splits."""
    n_ctx = worst_ctx(dev)
    q, k, v = attn_case(n_ctx, hd, 1, hd)
    t = replace(Tuning.for_device(dev), coopmat=False, ggml_numerics=path == "ggml",
                matvec=path == "decode", flash_attn="off")
    assert t.paths(hd).decode_attention == {"ggml": "attention", "split": "attn_split",
                                            "decode": "attn_decode"}[path]
    got = builder_attention(dev, kc, t, q, k, v, n_ctx - 1, 0)
    if path == "ggml":
        want = attention_ggml_ref(q, k, v, n_ctx - 1, 0, hd ** -0.5)
        assert np.abs(got - want).max() < 2e-3
    else:
        assert nmse(got, attention_ref(q, k, v, n_ctx - 1, 0, hd ** -0.5)) < 1e-8


@pytest.mark.parametrize("ggml", [True, False])
def test_flash_attention_at_the_longest_context(dev, kc, ggml):
    """Tiled attention (forced on) for the last 4 tokens of the longest context and, with
    ggml's rounding, for one token (decode takes it too); heads of 256, the most blocks."""
    n_ctx, hd = worst_ctx(dev), 256
    t = replace(Tuning.for_device(dev, "on"), coopmat=False, ggml_numerics=ggml, matvec=False)
    assert t.paths(hd).prefill_attention == "flash_attn"
    for n in (4, 1) if ggml else (4,):
        q, k, v = attn_case(n_ctx, hd, n, 7)
        got = builder_attention(dev, kc, t, q, k, v, n_ctx - n, 0)
        if ggml:
            assert np.abs(got - attention_ggml_ref(q, k, v, n_ctx - n, 0, hd ** -0.5)).max() \
                < 2e-3
        else:
            assert nmse(got, attention_ref(q, k, v, n_ctx - n, 0, hd ** -0.5)) < 1e-8


def test_expert_products_with_every_token_on_one_expert(dev, kc):
    """A full prefill pass whose tokens all pick one expert of 256 (a repeated token can):
    every one of that expert's tiles gets its own workgroup, each a walk over K (test_ops
    holds a walk to the loop bound at any K)."""
    rng = np.random.default_rng(3)
    t = Tuning.for_device(dev)
    n, k_used, n_out, n_in = 256, 8, 8, 4096
    raw, w = quantized("Q4_0", N_EXPERT * n_out, n_in, rng)
    w = w.reshape(N_EXPERT, n_out, n_in)
    ids = routed_ids(rng, n, k_used, N_EXPERT, hot=n)        # expert 1 in every token's last slot
    x = rng.standard_normal((n, n_in)).astype(np.float32)
    rs = RunState(dev, "t", n_layer=1, n_embd=n_in, n_head=1, q_dim=64, kv_dim=64, n_ff=n_out,
                  n_vocab=64, n_ctx=16, max_tokens=n, n_expert=N_EXPERT, n_expert_used=k_used)
    bw, bx, bi = buf(dev, raw, kind="weights"), buf(dev, x), buf(dev, ids)
    by = buf(dev, nbytes=4 * n * k_used * n_out)
    tensor = Tensor("Q4_0", (n_in, n_out, N_EXPERT), [(0, N_EXPERT * n_out, 0, 0, raw.nbytes)],
                    [bw])
    g = Graph(dev, kc, "t")
    try:
        Builder(g, {}, rs, replace(t, ggml_numerics=False)).matmul_id(tensor, bx, bi, by, n,
                                                                       k_used)
        g.replay()
        got = read(dev, by).reshape(n, k_used, n_out)
    finally:
        g.close()
        rs.close()
    assert nmse(got, moe_product_ref(w, x, ids, False)) < 1e-10


def test_router_over_256_experts(dev, kc):
    from tests.engine.gpu.test_kernels import router_ref
    from engine.gpu.graph import run_once

    rng = np.random.default_rng(4)
    T, k = 4, 8
    logits = (rng.standard_normal((T, N_EXPERT)) * 3).astype(np.float32)
    logits[:, -k:] += 20.0               # the chosen ones last
    bl, bi, bw = buf(dev, logits), buf(dev, nbytes=4 * T * k), buf(dev, nbytes=4 * T * k)
    run_once(dev, kc, "moe_router", [bl, bi, bw], (T, 1, 1), spec=dict(NORM=1),
             n_expert=N_EXPERT, n_used=k)
    ids, w = router_ref(logits.astype(np.float64), k, True)
    assert np.array_equal(read(dev, bi, np.uint32).reshape(T, k), ids)
    assert nmse(read(dev, bw).reshape(T, k), w) < 1e-12


@pytest.mark.parametrize("wtype", WEIGHT_TYPES)
def test_products_over_the_longest_rows(dev, kc, wtype):
    """A row as long as a feed-forward layer may be (2^20, config.py's bound), one token (as
    decode) and a full tile of tokens, rounded as this device rounds them."""
    rng = np.random.default_rng(5)
    n_out, n_in, n = 4, 1 << 20, 8
    raw, w = quantized(wtype, n_out, n_in, rng)
    x = rng.standard_normal((n, n_in)).astype(np.float32)
    t = Tuning.for_device(dev)
    rs = RunState(dev, "t", n_layer=1, n_embd=n_in, n_head=1, q_dim=64, kv_dim=64, n_ff=64,
                  n_vocab=64, n_ctx=16, max_tokens=n)
    bw, bx = buf(dev, raw, kind="weights"), buf(dev, x)
    tensor = Tensor(wtype, (n_in, n_out), [(0, n_out, 0, 0, raw.nbytes)], [bw])
    t = replace(t, ggml_numerics=False)
    try:
        for tokens in (1, n):
            by = buf(dev, nbytes=4 * tokens * n_out)
            g = Graph(dev, kc, "t")
            Builder(g, {}, rs, t).matmul(tensor, bx, by, tokens)
            g.replay()
            g.close()
            got = read(dev, by)[:tokens * n_out].reshape(tokens, n_out)
            # the matrix units take x as f16 (a relative error of 2^-11 per value)
            f16 = tokens > 1 and t.paths(64).prefill_matmul == "mul_mat_cm"
            assert nmse(got, x[:tokens] @ w.T) < (1e-5 if f16 else 1e-9), tokens
            dev.allocator.free(by)
    finally:
        rs.close()
        dev.allocator.free(bw)
        dev.allocator.free(bx)


def test_norm_of_the_widest_embedding(dev, kc):
    n_embd = 65536                               # config.py's bound
    rng = np.random.default_rng(6)
    x = rng.standard_normal((2, n_embd)).astype(np.float32)
    x[:, -1] = 300.0                             # the last column dominates the sum of squares
    gamma = rng.standard_normal(n_embd).astype(np.float32)
    rs = RunState(dev, "t", n_layer=1, n_embd=n_embd, n_head=1, q_dim=64, kv_dim=64, n_ff=64,
                  n_vocab=64, n_ctx=16, max_tokens=2)
    bx, bo, bg = buf(dev, x), buf(dev, nbytes=x.nbytes), buf(dev, gamma, kind="weights")
    norm = Tensor("F32", (n_embd,), [(0, 1, 0, 0, gamma.nbytes)], [bg])
    g = Graph(dev, kc, "t")
    try:
        Builder(g, {}, rs, Tuning.for_device(dev)).rms_norm(bx, norm, bo, 2, 1e-6)
        g.replay()
        got = read(dev, bo).reshape(2, n_embd)
    finally:
        g.close()
        rs.close()
    want = x / np.sqrt((x.astype(np.float64) ** 2).mean(-1, keepdims=True) + 1e-6) * gamma
    assert nmse(got, want) < 1e-10


def test_a_longer_context_than_the_device_takes_is_refused(dev, kc, smollm2_path):
    """`hotseat check` lists it as a problem and a load refuses it, naming the device."""
    from engine.residency.check import Target, check_file
    from engine.residency.model import Model

    t = Tuning.for_device(dev)
    if t.max_ctx >= limits.MAX_CTX:
        pytest.skip(f"{dev.name} takes any context up to {limits.MAX_CTX}")
    report = check_file(smollm2_path, t.max_ctx + 1, Target.of_device(dev))
    assert not report["runs"]
    assert any(f"out of range (16 to {t.max_ctx} on {dev.name})" in p
               for p in report["problems"])
    assert check_file(smollm2_path, t.max_ctx, Target.of_device(dev))["runs"]
    with pytest.raises(ValueError, match=f"16 to {t.max_ctx} on"):
        Model(dev, kc, smollm2_path, n_ctx=t.max_ctx + 1)
