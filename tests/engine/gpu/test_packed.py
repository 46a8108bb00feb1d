"""Packed sequences in one pass (SEQS = 1: step.seq_first, the first cache slot of each token's
sequence): rope at each sequence's own positions, and every prefill attention path (per-token
attention, the mask and tiled flash attention, flash attention on matrix units) keeping each
token to the earlier tokens of its own sequence, against numpy."""
from __future__ import annotations

import numpy as np
import pytest

from engine.gpu.graph import run_once
from engine.gpu.rope import Rope
from shaders.registry import pack_step
from tests.engine.gpu.test_kernels import attn_inputs, buf, nmse, read, rope_ref

pytestmark = pytest.mark.gpu

LENGTHS = [5, 1, 9, 17, 3, 1, 24]          # 60 tokens: tiles that straddle sequences


def seq_first(lengths: list[int]) -> np.ndarray:
    starts = np.cumsum([0] + lengths[:-1])
    return np.repeat(starts, lengths).astype(np.uint32)


def packed_step(dev, pos0: int, n_past: int, first: np.ndarray):
    data = pack_step(pos0, n_past) + np.asarray(first, np.uint32).tobytes()
    return buf(dev, np.frombuffer(data, np.uint8))


def packed_ref(q, k, v, pos0, window, scale, first):
    """attention_ref with a per-token lower bound: token t (slot pos0 + t) sees slots
    max(first[t], window's first)..pos0 + t."""
    n_tok, n_head, hd = q.shape
    group = n_head // k.shape[1]
    out = np.zeros_like(q, dtype=np.float64)
    for t in range(n_tok):
        pos = pos0 + t
        lo = max(pos - window + 1 if window and pos >= window else 0, int(first[t]))
        for h in range(n_head):
            kk = k[lo:pos + 1, h // group].astype(np.float64)
            s = kk @ q[t, h].astype(np.float64) * scale
            p = np.exp(s - s.max())
            out[t, h] = (p / p.sum()) @ v[lo:pos + 1, h // group].astype(np.float64)
    return out


@pytest.mark.parametrize("neox", [0, 1])
@pytest.mark.parametrize("table", [0, 1])
def test_rope_qkv_packed(dev, kc, neox, table):
    """Each sequence's tokens rotated from position 0, written to their own cache slots."""
    from engine.gpu.runstate import RunState

    rng = np.random.default_rng(31)
    lengths = [3, 1, 5]
    n_tok, n_head, n_kv, hd, n_ctx = sum(lengths), 4, 2, 64, 16
    first = seq_first(lengths)
    q = rng.standard_normal((n_tok, n_head, hd)).astype(np.float32)
    k = rng.standard_normal((n_tok, n_kv, hd)).astype(np.float32)
    v = rng.standard_normal((n_tok, n_kv, hd)).astype(np.float32)
    rs = RunState(dev, "t", n_layer=1, n_embd=64, n_head=1, q_dim=64, kv_dim=64, n_ff=64,
                  n_vocab=64, n_ctx=n_ctx, max_tokens=16, rope=(Rope(1e4, hd),))
    rs.set_step([0] * n_tok, 0, first)
    bq, bk, bv = buf(dev, q), buf(dev, k), buf(dev, v)
    kc_, vc_ = (buf(dev, np.zeros((n_ctx, n_kv, hd), np.float16)) for _ in range(2))
    count = n_tok * ((n_head + n_kv) * hd // 2 + n_kv * hd)
    run_once(dev, kc, "rope_qkv", [bq, bk, bv, kc_, vc_, rs.step,
                                    rs.rope_table(Rope(1e4, hd)), bq, bq],
             (-(-count // 64), 1, 1), spec=dict(NEOX=neox, TABLE=table, SEQS=1), n_head=n_head,
             n_head_kv=n_kv, head_dim=hd, n_dims=hd, n_tokens=n_tok, freq_base=1e4,
             freq_scale=1.0, temp_scale=0.0, temp_floor=1, eps=0.0)
    wq = np.concatenate([rope_ref(x, 0, hd, 1e4, bool(neox)) for x in np.split(q, np.cumsum(
        lengths)[:-1])])
    wk = np.concatenate([rope_ref(x, 0, hd, 1e4, bool(neox)) for x in np.split(k, np.cumsum(
        lengths)[:-1])])
    assert nmse(read(dev, bq).reshape(q.shape), wq) < 1e-11
    kk = read(dev, kc_, np.float16).reshape(n_ctx, n_kv, hd).astype(np.float32)
    assert nmse(kk[:n_tok], wk) < 1e-6
    vv = read(dev, vc_, np.float16).reshape(n_ctx, n_kv, hd)
    assert np.array_equal(vv[:n_tok], v.astype(np.float16))
    assert not kk[n_tok:].any() and not vv[n_tok:].any()
    rs.close()


@pytest.mark.parametrize("hd,window", [(64, 0), (64, 6), (256, 0)])
def test_attention_packed(dev, kc, hd, window):
    """attention.comp, SEQS = 1: each token over its own sequence (and window) only; with
    every token in one sequence it gives SEQS = 0's bits."""
    q, k, v = attn_inputs(32, 64, 6, 2, hd, sum(LENGTHS))
    n, scale = len(q), hd ** -0.5
    first = seq_first(LENGTHS)
    bq, bk, bv = buf(dev, q), buf(dev, k), buf(dev, v)
    outs = []
    for seqs, f in ((1, first), (1, np.zeros(n)), (0, np.zeros(n))):
        bo, st = buf(dev, nbytes=q.nbytes), packed_step(dev, 0, n, f)
        run_once(dev, kc, "attention", [bq, bk, bv, bo, st, bq], (6, n, 1),
                 spec=dict(HD=hd, SEQS=seqs), n_head=6, n_head_kv=2, n_tokens=n,
                 window=window, scale=scale, softcap=0.0)
        outs.append(read(dev, bo).reshape(q.shape))
    assert nmse(outs[0], packed_ref(q, k, v, 0, window, scale, first)) < 1e-10
    assert np.array_equal(outs[1], outs[2])


def builder_packed(dev, kc, tuning, q, k, v, window: int, first) -> np.ndarray:
    """Builder.attention with seqs = 1 as a packed pass records it."""
    from engine.gpu.builder import Builder
    from engine.gpu.graph import Graph
    from engine.gpu.runstate import RunState

    n, n_head, hd = q.shape
    n_ctx, n_kv = k.shape[:2]
    rs = RunState(dev, "t", n_layer=1, n_embd=64, n_head=n_head, q_dim=n_head * hd,
                  kv_dim=n_kv * hd, n_ff=64, n_vocab=64, n_ctx=n_ctx, max_tokens=n,
                  windows=(window,), flash_block=tuning.flash_block(hd))
    bq, bk, bv, bo = buf(dev, q), buf(dev, k), buf(dev, v), buf(dev, nbytes=q.nbytes)
    g = Graph(dev, kc, "t")
    try:
        b = Builder(g, {}, rs, tuning)
        b.seqs = 1
        b.attention(bq, bk, bv, bo, n_head, n_kv, hd, n, hd ** -0.5, window)
        rs.set_step([0] * n, 0, first)
        g.replay()
        return read(dev, bo).reshape(q.shape)
    finally:
        g.close()
        rs.close()
        for x in (bq, bk, bv, bo):
            dev.allocator.free(x)


@pytest.mark.parametrize("hd,window", [(64, 0), (64, 6), (256, 0), (256, 20)])
def test_flash_attention_packed(dev, kc, hd, window):
    """The tiled path: attn_mask with SEQS = 1 bounds each row, flash_attn reads the mask;
    tile skipping on and off give the same bits."""
    from engine.gpu.paths import Tuning

    q, k, v = attn_inputs(33, 96, 6, 2, hd, sum(LENGTHS))
    first = seq_first(LENGTHS)
    t = Tuning.for_device(dev, "on")
    t.ggml_numerics, t.coopmat = False, False    # the shader-core path (matrix units: below)
    assert t.paths(hd).prefill_attention == "flash_attn"
    got = builder_packed(dev, kc, t, q, k, v, window, first)
    assert nmse(got, packed_ref(q, k, v, 0, window, hd ** -0.5, first)) < 1e-10
    t.flash_skip = False
    assert np.array_equal(builder_packed(dev, kc, t, q, k, v, window, first), got)


def test_attention_mask_packed(dev, kc):
    """The mask itself: visible exactly where a row's own sequence (and window) is."""
    from engine.gpu.builder import Builder
    from engine.gpu.graph import Graph
    from engine.gpu.paths import Tuning
    from engine.gpu.runstate import RunState

    n, n_ctx, window = sum(LENGTHS), 96, 8
    first = seq_first(LENGTHS)
    tuning = Tuning.for_device(dev)
    rows, cols = block = tuning.flash_block(64)
    rs = RunState(dev, "t", n_layer=1, n_embd=64, n_head=1, q_dim=64, kv_dim=64, n_ff=64,
                  n_vocab=64, n_ctx=n_ctx, max_tokens=n, windows=(window,), flash_block=block)
    g = Graph(dev, kc, "t")
    try:
        b = Builder(g, {}, rs, tuning)
        b.seqs = 1
        mask_buf, tiles_buf = b.attention_mask(n, window)
        rs.set_step([0] * n, 0, first)
        g.replay()
        stride = -(-n_ctx // cols) * cols
        mask = read(dev, mask_buf, np.float16).reshape(-1, stride)
        tiles = read(dev, tiles_buf, np.uint32).reshape(-1, stride // cols)
    finally:
        g.close()
        rs.close()
    pos = np.arange(n)[:, None]
    col = np.arange(stride)[None, :]
    lo = np.maximum(np.where(pos >= window, pos - window + 1, 0), first[:, None])
    visible = (col >= lo) & (col <= pos) & (col < n)
    written = -(-n // cols) * cols
    assert np.array_equal(mask[:n, :written] == 0, visible[:, :written])
    for ti in range(-(-n // rows)):
        for j in range(stride // cols):
            vis = visible[ti * rows:(ti + 1) * rows, j * cols:(j + 1) * cols]
            assert tiles[ti, j] == (2 if vis.all() else 1 if not vis.any() else 0), (ti, j)


@pytest.mark.parametrize("hd,window", [(64, 0), (128, 0), (64, 20)])
def test_flash_attention_on_matrix_units_packed(dev, kc, hd, window):
    """flash_attn_cm, SEQS = 1, over more than one 64-row tile; q rounded to f16 as the
    kernel takes it."""
    if not dev.coopmat:
        pytest.skip(f"{dev.name} has no 16x16x16 f16 cooperative matrices")
    lengths = LENGTHS + [40, 2, 30]
    q, k, v = attn_inputs(34, 160, 8, 2, hd, sum(lengths))
    n, scale = len(q), hd ** -0.5
    first = seq_first(lengths)
    bq, bk, bv = buf(dev, q), buf(dev, k), buf(dev, v)
    bo, st = buf(dev, nbytes=q.nbytes), packed_step(dev, 0, n, first)
    run_once(dev, kc, "flash_attn_cm", [bq, bk, bv, bo, st, bq], (-(-n // 64), 8, 1),
             spec=dict(HD=hd, SEQS=1), n_head=8, n_head_kv=2, n_tokens=n, window=window,
             scale=scale, softcap=0.0)
    want = packed_ref(q.astype(np.float16).astype(np.float32), k, v, 0, window, scale, first)
    assert nmse(read(dev, bo).reshape(q.shape), want) < 1e-5
