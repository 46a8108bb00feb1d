"""The gated delta-net kernels (qwen3next, qwen35) against numpy step by step: the short
convolution with its state, the delta rule token by token (delta_net) and by chunks
(delta_chunk_prep + delta_chunk) with the state carried across calls, and the gated norm."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from engine.arch import qwen35
from engine.formats.gguf_file import GGUFFile
from engine.gpu import vk
from engine.gpu.builder import Builder, DeltaGates, DeltaHeads
from engine.gpu.graph import Graph
from engine.gpu.paths import Tuning
from engine.gpu.runstate import RunState, run_state_args
from engine.gpu.tensors import Tensor

from .test_kernels import buf, nmse, read

SYNTH = Path(__file__).resolve().parents[2] / "data" / "synth"

pytestmark = pytest.mark.gpu
EPS = 1e-6


# -- numpy references, as llama.cpp's graphs compute them ------------------------------------

def conv_ref(x, w, state, heads: DeltaHeads, eps: float = EPS):
    """(out [n, conv_dim], new state): ssm_conv over concat(state, x^T), silu, q and k heads
    L2-normed (ggml: rms_norm(eps / d) / sqrt(d))."""
    n = x.shape[0]
    width = w.shape[1]
    src = np.concatenate([state, x.T], axis=1).astype(np.float64)    # [conv_dim, width-1+n]
    y = np.zeros((n, x.shape[1]))
    for k in range(width):
        y += src[:, k:k + n].T * w[:, k]
    y = y / (1 + np.exp(-y))
    d, nq = heads.head_dim, 2 * heads.n_head_k
    qk = y[:, :nq * d].reshape(n, nq, d)
    qk = qk / np.sqrt((qk ** 2).sum(-1, keepdims=True) + eps)
    y[:, :nq * d] = qk.reshape(n, -1)
    return y, src[:, n:]


def gates_ref(b, a, dt_bias, ssm_a):
    """(beta, g) [n, n_head] from the raw projections."""
    x = a.astype(np.float64) + dt_bias
    sp = np.where(x > 20, x, np.log1p(np.exp(np.minimum(x, 20))))
    return 1 / (1 + np.exp(-b.astype(np.float64))), sp * ssm_a


def delta_ref(qkv, beta, g, state, heads: DeltaHeads):
    """(out [n, n_head, d], new state [n_head, d (v), d (k)]): per token and head,
    S = exp(g) S; delta = beta (v - S^T k); S += k delta^T; out = S^T q / sqrt(d)."""
    n, d, H, Hk = qkv.shape[0], heads.head_dim, heads.n_head, heads.n_head_k
    q = qkv[:, :Hk * d].reshape(n, Hk, d).astype(np.float64)
    k = qkv[:, Hk * d:2 * Hk * d].reshape(n, Hk, d).astype(np.float64)
    v = qkv[:, 2 * Hk * d:].reshape(n, H, d).astype(np.float64)
    S = state.astype(np.float64).copy()          # S[h, j, i] = state S[i, j]
    out = np.zeros((n, H, d))
    for t in range(n):
        for h in range(H):
            hk = h % Hk if heads.tiled else h // (H // Hk)
            S[h] *= np.exp(g[t, h])
            delta = beta[t, h] * (v[t, h] - S[h] @ k[t, hk])
            S[h] += np.outer(delta, k[t, hk])
            out[t, h] = S[h] @ q[t, hk] / np.sqrt(d)
    return out, S


# -- inputs ----------------------------------------------------------------------------------

def layer_inputs(rng, heads: DeltaHeads, n: int, decay: float = 1.0, fused: bool = False):
    """qkv (q and k L2-normed, as delta_conv leaves them), raw gate inputs laid out as
    qwen3next (fused) or qwen35 writes them, and (beta, g) from them. decay scales -ssm_a:
    large values give strongly decaying states (g of -20 and below)."""
    H, Hk, d = heads.n_head, heads.n_head_k, heads.head_dim
    q = rng.standard_normal((n, Hk, d))
    k = rng.standard_normal((n, Hk, d))
    q /= np.linalg.norm(q, axis=-1, keepdims=True)
    k /= np.linalg.norm(k, axis=-1, keepdims=True)
    v = rng.standard_normal((n, H, d))
    qkv = np.concatenate([q.reshape(n, -1), k.reshape(n, -1), v.reshape(n, -1)], 1)
    b = rng.standard_normal((n, H)).astype(np.float32)
    a = rng.standard_normal((n, H)).astype(np.float32)
    dt_bias = rng.standard_normal(H).astype(np.float32)
    ssm_a = (-np.exp(rng.standard_normal(H)) * decay).astype(np.float32)
    if fused:       # per key head: its r betas, then its r alphas
        r = H // Hk
        raw = np.concatenate([b.reshape(n, Hk, r), a.reshape(n, Hk, r)], -1).reshape(n, -1)
    else:
        raw = (b, a)
    return qkv.astype(np.float32), raw, dt_bias, ssm_a, gates_ref(b, a, dt_bias, ssm_a)


def f32_tensor(dev, x: np.ndarray) -> Tensor:
    """A small F32 weight in an arena of its own (ggml shape: row length first)."""
    b = buf(dev, np.ascontiguousarray(x, np.float32), kind="weights")
    return Tensor("F32", tuple(reversed(x.shape)), [(0, 1 if x.ndim == 1 else x.shape[0], 0, 0,
                                                     b.nbytes)], [b])


class Layer:
    """One delta-net layer's buffers on the device, for runs of several calls."""

    def __init__(self, dev, kc, heads: DeltaHeads, dt_bias, ssm_a, max_tokens: int,
                 tuning: Tuning, fused: bool, state=None):
        self.dev, self.kc, self.heads, self.tuning, self.fused = dev, kc, heads, tuning, fused
        H, d = heads.n_head, heads.head_dim
        self.rs = RunState(dev, "t", n_layer=1, n_embd=64, n_head=1, q_dim=64, kv_dim=64,
                           n_ff=64, n_vocab=64, n_ctx=16, max_tokens=max_tokens,
                           delta_layers=(0,), delta_conv_dim=heads.conv_dim, delta_width=4,
                           delta_heads=H, delta_head_dim=d)
        self.dt, self.a = f32_tensor(dev, dt_bias), f32_tensor(dev, ssm_a)
        if state is not None:
            vk.upload(dev, self.rs.delta_state[0], np.ascontiguousarray(state, np.float32))

    def run(self, qkv, raw, chunked: bool | None = None) -> np.ndarray:
        rs, n, heads = self.rs, qkv.shape[0], self.heads
        vk.upload(self.dev, rs.dn_conv, qkv)
        if self.fused:
            vk.upload(self.dev, rs.dn_ba, raw)
            gates = DeltaGates.fused(rs.dn_ba, heads)
        else:
            vk.upload(self.dev, rs.dn_ba, raw[0])
            vk.upload(self.dev, rs.dn_alpha, raw[1])
            gates = DeltaGates.separate(rs.dn_ba, rs.dn_alpha, heads)
        g = Graph(self.dev, self.kc, "t")
        try:
            Builder(g, {}, rs, self.tuning).delta_net(rs.dn_conv, gates, self.dt, self.a,
                                                      rs.delta_state[0], rs.dn_out, n, heads,
                                                      chunked=chunked)
            g.replay()
        finally:
            g.close()
        return read(self.dev, rs.dn_out)[:n * heads.n_head * heads.head_dim].reshape(
            n, heads.n_head, heads.head_dim).copy()

    @property
    def state(self) -> np.ndarray:
        h = self.heads
        return read(self.dev, self.rs.delta_state[0]).reshape(h.n_head, h.head_dim,
                                                               h.head_dim).copy()

    def close(self):
        self.rs.close()
        for t in (self.dt, self.a):
            self.dev.allocator.free(t.arenas[0])


def tuning_for(dev, chunk: int = 64) -> Tuning:
    return replace(Tuning.for_device(dev), delta_chunk=chunk)


HEADS = [DeltaHeads(2, 2, 16, False), DeltaHeads(4, 1, 32, False), DeltaHeads(4, 2, 16, True),
         DeltaHeads(6, 2, 16, False), DeltaHeads(8, 4, 64, True)]


def _id(h: DeltaHeads) -> str:
    return f"{h.n_head}v{h.n_head_k}k{h.head_dim}{'t' if h.tiled else 'g'}"


# -- the short convolution -------------------------------------------------------------------

@pytest.mark.parametrize("heads,width,calls", [
    (DeltaHeads(2, 2, 16, False), 4, (5, 1, 1)),
    (DeltaHeads(4, 2, 32, True), 4, (1, 2, 40)),       # a first call shorter than the state
    (DeltaHeads(2, 1, 128, True), 3, (37,)),
    (DeltaHeads(1, 1, 256, True), 4, (17, 3)),
], ids=["16", "32-short-first", "128", "256"])
def test_delta_conv_carries_its_state(dev, kc, heads, width, calls):
    rng = np.random.default_rng(1)
    ch = heads.conv_dim
    w = rng.standard_normal((ch, width)).astype(np.float32) * 0.5
    state = rng.standard_normal((ch, width - 1)).astype(np.float32)
    tw = f32_tensor(dev, w)
    bs = buf(dev, state)
    n_max = max(calls)
    bx, bo = buf(dev, nbytes=4 * n_max * ch), buf(dev, nbytes=4 * n_max * ch)
    want_state = state.astype(np.float64)
    try:
        for n in calls:
            x = rng.standard_normal((n, ch)).astype(np.float32)
            vk.upload(dev, bx, x)
            g = Graph(dev, kc, "t")
            Builder(g, {}, None, tuning_for(dev)).delta_conv(bx, tw, bs, bo, n, heads, EPS)
            g.replay()
            g.close()
            want, want_state = conv_ref(x, w, want_state, heads)
            got = read(dev, bo)[:n * ch].reshape(n, ch)
            assert nmse(got, want) < 1e-12
            # the q and k heads come out unit length
            qk = got[:, :2 * heads.n_head_k * heads.head_dim].reshape(n, -1, heads.head_dim)
            assert np.allclose(np.linalg.norm(qk, axis=-1), 1, atol=1e-5)
            assert np.array_equal(read(dev, bs).reshape(ch, width - 1),
                                  want_state.astype(np.float32))
    finally:
        for b in (bs, bx, bo, tw.arenas[0]):
            dev.allocator.free(b)


# -- the delta rule --------------------------------------------------------------------------

def _run_calls(dev, kc, heads, calls, chunked, chunk=64, decay=1.0, fused=False, seed=2):
    """GPU and numpy over consecutive calls of `calls` tokens from a random state: the
    outputs and states after each call."""
    rng = np.random.default_rng(seed)
    H, d = heads.n_head, heads.head_dim
    state = rng.standard_normal((H, d, d)).astype(np.float32) * 0.3
    inputs = [layer_inputs(rng, heads, n, decay, fused) for n in calls]
    dt_bias, ssm_a = inputs[0][2], inputs[0][3]
    layer = Layer(dev, kc, heads, dt_bias, ssm_a, max(calls), tuning_for(dev, chunk), fused,
                  state)
    want_state = state
    try:
        for (qkv, raw, _, _, _), n in zip(inputs, calls):
            # every call's gates from the first call's dt_bias and ssm_a (one layer)
            b, a = (raw if not fused else _unfuse(raw, heads))
            beta, g = gates_ref(b, a, dt_bias, ssm_a)
            got = layer.run(qkv, raw, chunked)
            want, want_state = delta_ref(qkv, beta, g, want_state, heads)
            yield got, want, layer.state, want_state, g
    finally:
        layer.close()


def _unfuse(raw, heads):
    n, r = raw.shape[0], heads.n_head // heads.n_head_k
    x = raw.reshape(n, heads.n_head_k, 2, r)
    return x[:, :, 0].reshape(n, -1), x[:, :, 1].reshape(n, -1)


@pytest.mark.parametrize("heads", HEADS, ids=_id)
@pytest.mark.parametrize("fused", [False, True], ids=["separate", "fused"])
def test_delta_net_token_by_token(dev, kc, heads, fused):
    """delta_net (decode's kernel), several tokens per call, the state carried across calls."""
    for got, want, s_got, s_want, _ in _run_calls(dev, kc, heads, (7, 1, 1, 3), False,
                                                  fused=fused):
        assert nmse(got, want) < 1e-10
        assert nmse(s_got, s_want) < 1e-10


@pytest.mark.parametrize("heads", HEADS, ids=_id)
@pytest.mark.parametrize("chunk,calls", [
    (64, (64,)), (64, (100, 30)), (64, (3,)), (16, (16, 48, 5)), (16, (37, 1, 70)),
], ids=["whole", "ragged", "short", "c16-aligned", "c16-ragged"])
def test_delta_net_chunked(dev, kc, heads, chunk, calls):
    """The chunked form equals the step recurrence: whole chunks, a ragged last chunk, fewer
    tokens than a chunk, the state carried across calls."""
    for got, want, s_got, s_want, _ in _run_calls(dev, kc, heads, calls, True, chunk):
        assert nmse(got, want) < 1e-10
        assert nmse(s_got, s_want) < 1e-10


@pytest.mark.parametrize("decay", [8.0, 60.0])
@pytest.mark.parametrize("chunked", [False, True], ids=["per-token", "chunked"])
def test_delta_net_strong_decay(dev, kc, decay, chunked):
    """Gates that all but erase the state each token (exp(G) underflows within a chunk)."""
    heads = DeltaHeads(4, 2, 32, False)
    for got, want, s_got, s_want, g in _run_calls(dev, kc, heads, (90, 20), chunked,
                                                  decay=decay, fused=True):
        assert g.min() < -5
        assert nmse(got, want) < 1e-10
        assert nmse(s_got, s_want) < 1e-10


@pytest.mark.parametrize("heads", [DeltaHeads(4, 2, 16, True), DeltaHeads(4, 2, 128, False)],
                         ids=_id)
def test_decode_after_chunked_prefill_equals_per_token(dev, kc, heads):
    """A chunked prefill then one-token decodes gives what token-by-token all along gives."""
    rng = np.random.default_rng(5)
    calls = (75, 1, 1, 1)
    inputs = [layer_inputs(rng, heads, n) for n in calls]
    dt_bias, ssm_a = inputs[0][2], inputs[0][3]
    runs = []
    for chunked in (True, False):
        layer = Layer(dev, kc, heads, dt_bias, ssm_a, max(calls), tuning_for(dev), False)
        try:
            outs = [layer.run(qkv, raw, chunked and n > 1)
                    for (qkv, raw, *_), n in zip(inputs, calls)]
            runs.append((outs, layer.state))
        finally:
            layer.close()
    (a_outs, a_state), (b_outs, b_state) = runs
    for a, b in zip(a_outs, b_outs):
        assert nmse(a, b) < 1e-11
    assert nmse(a_state, b_state) < 1e-11


def test_chunked_needs_the_run_states_scratch(dev, kc):
    heads = DeltaHeads(2, 2, 16, False)
    rng = np.random.default_rng(6)
    qkv, raw, dt_bias, ssm_a, _ = layer_inputs(rng, heads, 8)
    layer = Layer(dev, kc, heads, dt_bias, ssm_a, 8, tuning_for(dev), False)
    try:
        g = Graph(dev, kc, "t")
        b = Builder(g, {}, layer.rs, tuning_for(dev))
        gates = DeltaGates.separate(layer.rs.dn_ba, layer.rs.dn_alpha, heads)
        with pytest.raises(ValueError, match="scratch"):
            b.delta_net(layer.rs.dn_conv, gates, layer.dt, layer.a, layer.rs.delta_state[0],
                        layer.rs.dn_out, 200, heads)
        g.close()
    finally:
        layer.close()


# -- the gated norm --------------------------------------------------------------------------

@pytest.mark.parametrize("d,rows", [(16, 7), (128, 40), (256, 3)])
def test_norm_gated(dev, kc, d, rows):
    rng = np.random.default_rng(7)
    x = rng.standard_normal((rows, d)).astype(np.float32)
    z = rng.standard_normal((rows, d)).astype(np.float32)
    w = rng.standard_normal(d).astype(np.float32)
    tw, bx, bz = f32_tensor(dev, w), buf(dev, x), buf(dev, z)
    try:
        g = Graph(dev, kc, "t")
        Builder(g, {}, None, tuning_for(dev)).norm_gated(bx, tw, bz, bx, rows, EPS)  # in place
        g.replay()
        g.close()
        x64 = x.astype(np.float64)
        want = x64 / np.sqrt((x64 ** 2).mean(-1, keepdims=True) + EPS) * w * z / (1 + np.exp(-z))
        assert nmse(read(dev, bx).reshape(rows, d), want) < 1e-12
    finally:
        for b in (bx, bz, tw.arenas[0]):
            dev.allocator.free(b)


# -- the recurrent states in the run state ---------------------------------------------------

HYBRID = dict(n_layer=4, n_embd=64, n_head=2, q_dim=64, kv_dim=32, n_ff=96, n_vocab=50,
              n_ctx=32, max_tokens=20, kv_layers=[3], delta_layers=(0, 1, 2),
              delta_conv_dim=DeltaHeads(4, 2, 16, True).conv_dim, delta_width=4, delta_heads=4,
              delta_head_dim=16)



def test_run_state_sizes_its_delta_layers(dev):
    """bytes_for (what the arbiter grants) is what the constructor allocates; the states are
    the "recurrent" bytes, conv [conv_dim, width - 1] and delta [n_head, d, d] per layer."""
    rs = RunState(dev, "t", **HYBRID)
    try:
        bufs = rs.buffers()
        assert sum(b.nbytes for b in bufs) == RunState.bytes_for(**HYBRID)
        recurrent = sum(b.nbytes for b in bufs if b.kind == "recurrent")
        per_layer = 4 * (HYBRID["delta_conv_dim"] * 3 + 4 * 16 * 16)
        assert recurrent == RunState.recurrent_bytes(**HYBRID) == 3 * per_layer
        assert list(rs.recurrent_states()) == ["conv.0", "conv.1", "conv.2", "delta.0",
                                               "delta.1", "delta.2"]
        assert set(rs.k_cache) == {3}
    finally:
        rs.close()


def test_recurrent_states_survive_capture_and_restore(dev):
    """What a release copies out and a restore writes back into a fresh run state comes back
    bit for bit, conv and delta states alike; reset_recurrent zeroes them all."""
    rng = np.random.default_rng(8)
    rs = RunState(dev, "t", **HYBRID)
    try:
        written = {}
        for key, b in rs.recurrent_states().items():
            written[key] = rng.integers(0, 256, b.nbytes, dtype=np.uint8)
            vk.upload(dev, b, written[key])
        copies = rs.capture_recurrent()
    finally:
        rs.close()
    assert set(copies) == set(written)
    fresh = RunState(dev, "t", **HYBRID)
    try:
        assert fresh.restore_recurrent(copies) == sum(c.nbytes for c in written.values())
        for key, b in fresh.recurrent_states().items():
            assert np.array_equal(vk.download(dev, b).view(np.uint8), written[key]), key
        fresh.reset_recurrent()
        for b in fresh.recurrent_states().values():
            assert not vk.download(dev, b).view(np.uint8).any()
        with pytest.raises(RuntimeError, match="do not fit"):
            fresh.restore_recurrent({k: v for k, v in copies.items() if k != "delta.2"})
    finally:
        fresh.close()


def test_decode_resumes_from_restored_states(dev, kc):
    """A delta layer's state captured mid-sequence and written into a fresh run state goes on
    as if never released."""
    heads = DeltaHeads(4, 2, 16, True)
    rng = np.random.default_rng(9)
    first, second = layer_inputs(rng, heads, 30), layer_inputs(rng, heads, 1)
    dt_bias, ssm_a = first[2], first[3]
    outs = []
    for release in (False, True):
        layer = Layer(dev, kc, heads, dt_bias, ssm_a, 30, tuning_for(dev), False)
        try:
            layer.run(first[0], first[1])
            if release:
                copies = layer.rs.capture_recurrent()
                layer.rs.close()
                layer.rs = RunState(dev, "t", n_layer=1, n_embd=64, n_head=1, q_dim=64,
                                    kv_dim=64, n_ff=64, n_vocab=64, n_ctx=16, max_tokens=30,
                                    delta_layers=(0,), delta_conv_dim=heads.conv_dim,
                                    delta_width=4, delta_heads=4, delta_head_dim=16)
                layer.rs.restore_recurrent(copies)
            outs.append((layer.run(second[0], second[1]), layer.state))
        finally:
            layer.close()
    assert np.array_equal(outs[0][0], outs[1][0]) and np.array_equal(outs[0][1], outs[1][1])


def test_run_state_args_of_a_hybrid_config():
    """qwen35's Config declares its delta layers' states, and the run state is sized by it."""
    with GGUFFile(str(SYNTH / "qwen35-f16.gguf")) as g:
        c = qwen35.Config.from_gguf(g)
    args = run_state_args(c, n_ctx=32, max_tokens=8)
    assert args["kv_layers"] == c.kv_layers and args["q_gate"]
    assert (args["delta_layers"], args["delta_conv_dim"], args["delta_width"],
            args["delta_heads"], args["delta_head_dim"]) == \
        (c.delta_layers, c.conv_channels, c.conv_kernel, c.n_v_heads, c.ssm_d_state)
    per_layer = 4 * (c.conv_channels * (c.conv_kernel - 1) + c.n_v_heads * c.ssm_d_state ** 2)
    assert RunState.recurrent_bytes(**args) == len(c.delta_layers) * per_layer == \
        c.recurrent_bytes()


# -- a whole delta-net layer between its projections -----------------------------------------

@pytest.mark.parametrize("arch", ["qwen3next", "qwen35"])
def test_delta_layer_between_projections(dev, kc, arch):
    """conv -> delta rule -> gated norm on the run state's buffers, as a forward chains them
    (qwen3next: grouped heads, one fused beta|alpha projection; qwen35: tiled heads, two),
    a chunked prefill then a decode step, against numpy."""
    heads = DeltaHeads(4, 2, 16, arch == "qwen35")
    fused = arch == "qwen3next"
    H, d, ch, width = heads.n_head, heads.head_dim, heads.conv_dim, 4
    rng = np.random.default_rng(10)
    w_conv = (rng.standard_normal((ch, width)) * 0.5).astype(np.float32)
    w_norm = rng.standard_normal(d).astype(np.float32)
    dt_bias = rng.standard_normal(H).astype(np.float32)
    ssm_a = -np.exp(rng.standard_normal(H)).astype(np.float32)
    layer = Layer(dev, kc, heads, dt_bias, ssm_a, 40, tuning_for(dev, 16), fused)
    rs = layer.rs
    tw, tn = f32_tensor(dev, w_conv), f32_tensor(dev, w_norm)
    conv_state, state = np.zeros((ch, width - 1)), np.zeros((H, d, d))
    try:
        for n in (37, 1):
            x = rng.standard_normal((n, ch)).astype(np.float32)
            z = rng.standard_normal((n, H * d)).astype(np.float32)
            b = rng.standard_normal((n, H)).astype(np.float32)
            a = rng.standard_normal((n, H)).astype(np.float32)
            vk.upload(dev, rs.dn_qkv, x)
            vk.upload(dev, rs.dn_z, z)
            if fused:
                r = H // heads.n_head_k
                vk.upload(dev, rs.dn_ba, np.concatenate(
                    [b.reshape(n, -1, r), a.reshape(n, -1, r)], -1).reshape(n, -1))
                gates = DeltaGates.fused(rs.dn_ba, heads)
            else:
                vk.upload(dev, rs.dn_ba, b)
                vk.upload(dev, rs.dn_alpha, a)
                gates = DeltaGates.separate(rs.dn_ba, rs.dn_alpha, heads)
            g = Graph(dev, kc, "t")
            bld = Builder(g, {}, rs, layer.tuning)
            bld.delta_conv(rs.dn_qkv, tw, rs.conv_state[0], rs.dn_conv, n, heads, EPS)
            bld.delta_net(rs.dn_conv, gates, layer.dt, layer.a, rs.delta_state[0], rs.dn_out,
                          n, heads)
            bld.norm_gated(rs.dn_out, tn, rs.dn_z, rs.dn_out, n * H, EPS)
            g.replay()
            g.close()

            qkv, conv_state = conv_ref(x, w_conv, conv_state, heads)
            beta, gate = gates_ref(b, a, dt_bias, ssm_a)
            o, state = delta_ref(qkv, beta, gate, state, heads)
            o = o.reshape(n * H, d)
            zz = z.reshape(n * H, d).astype(np.float64)
            want = o / np.sqrt((o ** 2).mean(-1, keepdims=True) + EPS) * w_norm \
                * zz / (1 + np.exp(-zz))
            got = read(dev, rs.dn_out)[:n * H * d].reshape(n * H, d)
            assert nmse(got, want) < 1e-10
            assert nmse(layer.state, state) < 1e-10
    finally:
        layer.close()
        for t in (tw, tn):
            dev.allocator.free(t.arenas[0])
