"""The options architectures set on the shared ops, each against numpy: attention's logit
soft-cap and sinks on every attention path (per-token, flash, both decode paths; the
matrix-unit one where the device has them), the final logit soft-cap, gpt-oss's clamped
SwiGLU, its router (softmax over the chosen logits) and its expert biases (add_id)."""
from __future__ import annotations

import numpy as np
import pytest

from engine.gpu.graph import Graph, run_once
from engine.gpu.paths import Tuning
from engine.gpu.tensors import Tensor
from tests.engine.gpu.test_kernels import attn_inputs, buf, nmse, read, step_buffer

pytestmark = pytest.mark.gpu

N_CTX, N_HEAD, N_KV = 160, 6, 2
SOFTCAP = 1.5           # small enough to bite: the scores below reach about +-6


def tensor(dev, data: np.ndarray) -> Tensor:
    """An F32 weight tensor of its own buffer, as a model's sinks and biases are bound."""
    b = buf(dev, data)
    shape = tuple(reversed(data.shape))                 # ggml order: row length first
    rows = int(np.prod(shape[1:])) if len(shape) > 1 else 1
    return Tensor("F32", shape, [(0, rows, 0, 0, data.nbytes)], [b])


def attention_ref(q, k, v, pos0, window, scale, softcap=0.0, sinks=None, ggml=False):
    """float64 attention with the options; ggml: q and the probabilities rounded to f16 and
    the rest in float32, as ggml's CPU attention (softmax with sinks as
    ggml_soft_max_add_sinks: the sink joins the max and the sum)."""
    n_tok, n_head, hd = q.shape
    group = n_head // k.shape[1]
    ft = np.float32 if ggml else np.float64
    qq = q.astype(np.float16).astype(ft) if ggml else q.astype(ft)
    out = np.zeros(q.shape, ft)
    for t in range(n_tok):
        pos = pos0 + t
        lo = pos - window + 1 if window and pos >= window else 0
        for h in range(n_head):
            s = (k[lo:pos + 1, h // group].astype(ft) @ qq[t, h]) * ft(scale)
            if softcap:
                s = np.tanh(s * ft(1 / softcap)) * ft(softcap)
            mx = s.max() if sinks is None else max(s.max(), ft(sinks[h]))
            e = np.exp(s - mx)
            total = e.sum() + (0 if sinks is None else np.exp(ft(sinks[h]) - mx))
            p = e / total
            if ggml:
                p = p.astype(np.float16).astype(ft)
            out[t, h] = p @ v[lo:pos + 1, h // group].astype(ft)
    return out


def run_attention(dev, kc, tuning, q, k, v, pos0, window, softcap, sinks) -> np.ndarray:
    """Builder.attention with the options, as a model records it: [n, n_head, hd]."""
    from engine.gpu.builder import Builder
    from engine.gpu.runstate import RunState

    n, n_head, hd = q.shape
    rs = RunState(dev, "t", n_layer=1, n_embd=64, n_head=n_head, q_dim=n_head * hd,
                  kv_dim=N_KV * hd, n_ff=64, n_vocab=64, n_ctx=len(k), max_tokens=n,
                  windows=(window,), flash_block=tuning.flash_block(hd))
    bq, bk, bv, bo = buf(dev, q), buf(dev, k), buf(dev, v), buf(dev, nbytes=q.nbytes)
    sk = tensor(dev, sinks) if sinks is not None else None
    g = Graph(dev, kc, "t")
    try:
        Builder(g, {}, rs, tuning).attention(bq, bk, bv, bo, n_head, N_KV, hd, n, hd ** -0.5,
                                             window, softcap=softcap, sinks=sk)
        rs.set_step([0] * n, pos0)
        g.replay()
        return read(dev, bo).reshape(q.shape)
    finally:
        g.close()
        rs.close()
        for b in (bq, bk, bv, bo) + ((sk.arenas[0],) if sk else ()):
            dev.allocator.free(b)


# (path, ggml numerics): each attention kernel the Paths table can pick on a plain device
# (with ggml's rounding, decode takes the prefill's kernel: "attention" for one token)
PATHS = [("attention", False), ("attention", True), ("flash_attn", False), ("flash_attn", True),
         ("attn_split", False), ("attn_decode", False), ("attn_decode_wide", False),
         ("attn_decode_grouped", False), ("attn_decode_ahead", False), ("decode", True)]


def tuning_for(dev, path: str, ggml: bool) -> Tuning:
    t = Tuning.for_device(dev, "on" if path == "flash_attn" else "off")
    t.coopmat = False                          # the plain paths, also where matrix units are
    t.ggml_numerics = ggml
    t.matvec = path.startswith("attn_decode")  # decode: attn_decode with mul_mat_vec
    if path.startswith("attn_"):               # several splits, one holding no sink
        t.split_max, t.split_chunk = 16, 8
    t.decode_wg = 256 if path == "attn_decode_wide" else 64   # position groups in a split
    t.decode_heads = 4 if path == "attn_decode_grouped" else 1  # query heads a workgroup
    t.decode_ahead = path == "attn_decode_ahead"                # next K and V rows in flight
    return t


@pytest.mark.parametrize("path,ggml", PATHS)
@pytest.mark.parametrize("softcap,sinks,window", [(SOFTCAP, False, 0), (0.0, True, 0),
                                                  (SOFTCAP, True, 9)])
def test_attention_options(dev, kc, path, ggml, softcap, sinks, window):
    hd = 64
    decode = path.startswith("attn_") or path == "decode"
    # decode: a context long enough for several splits (one split per 128 positions)
    n, pos0, n_ctx = (1, 300, 2048) if decode else (37, 50, N_CTX)
    q, k, v = attn_inputs(30, n_ctx, N_HEAD, N_KV, hd, n)
    # sinks around the scores' range: some dominate a head's softmax, some vanish in it
    sk = np.array([-3.0, 0.5, 2.0, 4.0, 8.0, -20.0], np.float32) if sinks else None
    t = tuning_for(dev, path, ggml)
    if decode:
        p = t.paths(hd).decode_attention
    else:
        p = t.paths(hd).prefill_attention
    assert p == ("attention" if path == "decode" else
                 path.removesuffix("_wide").removesuffix("_grouped").removesuffix("_ahead"))
    if path.startswith("attn_"):
        assert t.decode_splits(n_ctx) == 16
    if path == "attn_decode_grouped":             # the three heads of a KV head together
        assert t.decode_group(hd, N_HEAD, N_KV) == 3
    got = run_attention(dev, kc, t, q, k, v, pos0, window, softcap, sk)
    want = attention_ref(q, k, v, pos0, window, hd ** -0.5, softcap, sk, ggml)
    plain = attention_ref(q, k, v, pos0, window, hd ** -0.5)
    assert nmse(plain, want) > 1e-4             # the options change the output
    if ggml:    # p rounded to f16 on both sides: one score's last bit can move it one step
        # (NVIDIA's exp and f16 conversions move more of them: as split attention's bound)
        bound = 1e-7 if dev.info.kind == "cpu" else 5e-7
        assert np.abs(got - want).max() < 2e-3 and nmse(got, want) < bound
    else:
        assert nmse(got, want) < 1e-10


@pytest.mark.parametrize("hd", [64, 128])
def test_attention_options_on_matrix_units(dev, kc, hd):
    """flash_attn_cm with both options (P goes through f16: 1e-5, as its plain test)."""
    if not dev.coopmat:
        pytest.skip(f"{dev.name} has no 16x16x16 f16 cooperative matrices")
    rng = np.random.default_rng(25)
    n_tok, pos0, window = 100, 37, 48
    n_ctx = pos0 + n_tok + 3
    k = rng.standard_normal((n_ctx, N_KV, hd)).astype(np.float16)
    v = rng.standard_normal((n_ctx, N_KV, hd)).astype(np.float16)
    q = (rng.standard_normal((n_tok, N_HEAD, hd)) * 2).astype(np.float32)
    sk = np.array([-3.0, 0.5, 2.0, 4.0, 8.0, -20.0], np.float32)
    bq, bk, bv, bsk = buf(dev, q), buf(dev, k), buf(dev, v), buf(dev, sk)
    bo = buf(dev, nbytes=q.nbytes)
    st = step_buffer(dev, pos0, pos0 + n_tok)
    scale = hd ** -0.5
    run_once(dev, kc, "flash_attn_cm", [bq, bk, bv, bo, st, bsk], (-(-n_tok // 64), N_HEAD, 1),
             spec=dict(HD=hd, SINKS=1), n_head=N_HEAD, n_head_kv=N_KV, n_tokens=n_tok,
             window=window, scale=scale, softcap=SOFTCAP)
    want = attention_ref(q.astype(np.float16).astype(np.float32), k, v, pos0, window, scale,
                         SOFTCAP, sk)
    assert nmse(read(dev, bo).reshape(q.shape), want) < 1e-5


def test_sinks_must_be_one_f32_per_head(dev, kc):
    t = tuning_for(dev, "attention", False)
    q, k, v = attn_inputs(31, 32, N_HEAD, N_KV, 64, 4)
    with pytest.raises(ValueError, match="sinks"):
        run_attention(dev, kc, t, q, k, v, 0, 0, 0.0, np.zeros(N_HEAD - 1, np.float32))


# -- the final logit soft-cap --------------------------------------------------------------

def test_final_softcap(dev, kc):
    x = (np.random.default_rng(8).standard_normal(5000) * 30).astype(np.float32)
    x[:4] = [0.0, 1e30, -1e30, 400.0]                   # saturates without NaN
    bx = buf(dev, x)
    run_once(dev, kc, "softcap", [bx], (79, 1, 1), n=5000, cap=10.0)
    want = np.tanh(x.astype(np.float64) / 10.0) * 10.0
    got = read(dev, bx)
    assert np.all(np.isfinite(got)) and np.abs(got - want).max() < 1e-5


# -- gpt-oss's feed-forward ---------------------------------------------------------------

def test_clamped_swiglu(dev, kc):
    rng = np.random.default_rng(9)
    g, u = (rng.standard_normal(1000).astype(np.float32) * 6 for _ in range(2))
    bg, bu, bo = buf(dev, g), buf(dev, u), buf(dev, nbytes=g.nbytes)
    run_once(dev, kc, "silu_mul", [bg, bu, bo, bo], (16, 1, 1), spec=dict(CLAMPED=1), n=1000)
    gc = np.minimum(g.astype(np.float64), 7.0)
    want = gc / (1 + np.exp(-1.702 * gc)) * (np.clip(u.astype(np.float64), -7.0, 7.0) + 1)
    assert (g > 7).any() and (np.abs(u) > 7).any()      # both clamps are exercised
    assert nmse(read(dev, bo), want) < 1e-12


def router_chosen_softmax_ref(logits: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """gpt-oss: the k largest logits (lowest index on ties), softmax over those alone."""
    ids = np.argsort(-logits, axis=-1, kind="stable")[:, :k]
    top = np.take_along_axis(logits, ids, -1)
    e = np.exp(top - top[:, :1])
    return ids, e / e.sum(-1, keepdims=True)


@pytest.mark.parametrize("n_expert,k", [(4, 2), (32, 4), (128, 8), (5, 5)])
def test_router_softmax_over_chosen(dev, kc, n_expert, k):
    rng = np.random.default_rng(21)
    T = 6
    logits = (rng.standard_normal((T, n_expert)) * 3 - 40).astype(np.float32)   # all < 0
    logits[0, [1, 3 % n_expert]] = 9.0                 # a tie: the lower index first
    bl, bi, bw = buf(dev, logits), buf(dev, nbytes=4 * T * k), buf(dev, nbytes=4 * T * k)
    run_once(dev, kc, "moe_router", [bl, bi, bw], (T, 1, 1), spec=dict(SOFTMAX_K=1),
             n_expert=n_expert, n_used=k)
    ids, w = router_chosen_softmax_ref(logits.astype(np.float64), k)
    assert np.array_equal(read(dev, bi, np.uint32).reshape(T, k), ids)
    assert nmse(read(dev, bw).reshape(T, k), w) < 1e-12


def test_expert_bias_by_id(dev, kc):
    from engine.gpu.builder import Builder
    from engine.gpu.runstate import RunState

    rng = np.random.default_rng(22)
    T, k, n_cols, n_expert = 5, 3, 70, 6
    x = rng.standard_normal((T * k, n_cols)).astype(np.float32)
    bias = rng.standard_normal((n_expert, n_cols)).astype(np.float32)   # [n_expert, n_cols]
    ids = rng.integers(0, n_expert, T * k).astype(np.uint32)
    bx, bi, tb = buf(dev, x), buf(dev, ids), tensor(dev, bias)
    rs = RunState(dev, "t", n_layer=1, n_embd=64, n_head=1, q_dim=64, kv_dim=64, n_ff=64,
                  n_vocab=64, n_ctx=16, max_tokens=1)
    g = Graph(dev, kc, "t")
    try:
        Builder(g, {}, rs, Tuning.for_device(dev)).add_id(bx, tb, bi, T * k)
        g.replay()
    finally:
        g.close()
        rs.close()
    assert tb.shape == (n_cols, n_expert)
    assert np.array_equal(read(dev, bx).reshape(T * k, n_cols), x + bias[ids])
