"""Every kernel against a numpy reference (gguf.quants for dequantization), by NMSE."""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from engine import vk
from engine.graph import run_once
from engine.kernels import K_QUANTS, KERNELS, WEIGHT_TYPES, KernelCache

pytestmark = pytest.mark.gpu
SHADERS = Path(__file__).resolve().parents[2] / "shaders"


def nmse(got: np.ndarray, want: np.ndarray) -> float:
    want = np.asarray(want, np.float64)
    return float(np.sum((np.asarray(got, np.float64) - want) ** 2) / max(np.sum(want ** 2), 1e-30))


@pytest.fixture(scope="module")
def dev():
    d = vk.Device()
    yield d
    d.close()


@pytest.fixture(scope="module")
def kc(dev):
    k = KernelCache(dev)
    yield k
    k.close()


def buf(dev, data: np.ndarray | None = None, nbytes: int | None = None, kind="compute"):
    n = data.nbytes if data is not None else nbytes
    b = dev.allocator.alloc(n, "test", kind)
    if data is not None:
        vk.upload(dev, b, np.ascontiguousarray(data))
    return b


def read(dev, b, dtype=np.float32):
    return vk.download(dev, b).view(dtype)


def step_buffer(dev, pos0: int):
    return buf(dev, np.array([pos0, 0, 0, 0], np.uint32))


def quantized(wtype: str, rows: int, cols: int, rng) -> tuple[np.ndarray, np.ndarray]:
    """(raw bytes as stored in GGUF, their dequantized float32 values)."""
    import gguf
    from gguf.quants import dequantize, quantize

    w = rng.standard_normal((rows, cols)).astype(np.float32)
    if wtype == "F32":
        return w.view(np.uint8), w
    qt = gguf.GGMLQuantizationType[wtype]
    if wtype in K_QUANTS:
        # gguf-py only dequantizes K-quants: random blocks with sane f16 scales stand in
        block, size = gguf.GGML_QUANT_SIZES[qt]
        raw = rng.integers(0, 256, (rows, cols // block, size), dtype=np.uint8)
        scales = rng.uniform(0.001, 0.05, (rows, cols // block, 2)).astype(np.float16)
        if wtype == "Q6_K":
            raw[..., -2:] = scales[..., :1].view(np.uint8)
        else:
            raw[..., :4] = scales.view(np.uint8).reshape(rows, cols // block, 4)
        raw = raw.reshape(rows, -1)
    else:
        raw = quantize(w, qt)
    return raw.reshape(-1).view(np.uint8), dequantize(raw, qt).reshape(rows, cols)


# -- push constants match the GLSL blocks --------------------------------------------------

_GLSL_TYPES = {"uint": "u32", "float": "f32"}


@pytest.mark.parametrize("name", sorted(KERNELS))
def test_push_constants_match_glsl(name):
    ks = KERNELS[name]
    src = (SHADERS / ks.source).read_text()
    block = re.search(r"push_constant\)\s*uniform\s+\w+\s*\{(.*?)\}", src, re.S)
    fields = []
    for line in block.group(1).split(";"):
        line = re.sub(r"//.*", "", line).strip()
        if not line:
            continue
        typ, *names = line.replace(",", " ").split()
        fields += [(n, _GLSL_TYPES[typ]) for n in names]
    assert tuple(fields) == ks.push
    n_bindings = len(set(re.findall(r"binding\s*=\s*(\d+)", src)))
    if "quant.glsl" in src:
        n_bindings += 1          # the weight buffer is declared in the include
    if "STEP_BUFFER" in src:
        n_bindings += 1
    assert n_bindings == ks.n_buffers


# -- matrix products -------------------------------------------------------------------------

@pytest.mark.parametrize("wtype", WEIGHT_TYPES)
@pytest.mark.parametrize("n_tokens,nt,rows,warps", [(1, 1, 1, 1), (1, 1, 4, 4), (7, 4, 2, 2),
                                                    (19, 8, 2, 4)])
def test_mul_mat(dev, kc, wtype, n_tokens, nt, rows, warps):
    rng = np.random.default_rng(1)
    n_out, n_in = 70, 512
    raw, w = quantized(wtype, n_out, n_in, rng)
    x = rng.standard_normal((n_tokens, n_in)).astype(np.float32)
    bw, bx, by = buf(dev, raw, kind="weights"), buf(dev, x), buf(dev, nbytes=4 * n_tokens * n_out)
    run_once(dev, kc, "mul_mat", [bw, bx, by],
             (-(-n_out // (rows * warps)), -(-n_tokens // nt), 1), wtype=wtype,
             spec=dict(WG=dev.subgroup_size * warps, ROWS=rows, NT=nt, ACC=0), n_in=n_in, n_out=n_out, n_tokens=n_tokens,
             x_offset=0, y_offset=0, row_offset=0, y_stride=n_out)
    got = read(dev, by)[: n_tokens * n_out].reshape(n_tokens, n_out)
    assert nmse(got, x @ w.T) < 1e-10


def test_mul_mat_accumulates_and_offsets(dev, kc):
    rng = np.random.default_rng(2)
    n_out, n_in = 33, 64
    raw, w = quantized("Q8_0", 2 * n_out, n_in, rng)
    x = rng.standard_normal((3, n_in)).astype(np.float32)
    y0 = rng.standard_normal(n_out).astype(np.float32)
    bw, bx, by = buf(dev, raw), buf(dev, x), buf(dev, y0)
    # last token only, second half of the weight rows, added into y
    run_once(dev, kc, "mul_mat", [bw, bx, by], (n_out, 1, 1), wtype="Q8_0",
             spec=dict(WG=dev.subgroup_size, ROWS=1, NT=1, ACC=1), n_in=n_in, n_out=n_out, n_tokens=1,
             x_offset=2 * n_in // 4, y_offset=0, row_offset=n_out, y_stride=n_out)
    assert nmse(read(dev, by)[:n_out], y0 + w[n_out:] @ x[2]) < 1e-10


@pytest.mark.parametrize("wtype", WEIGHT_TYPES)
def test_get_rows(dev, kc, wtype):
    rng = np.random.default_rng(3)
    cols = 512 if wtype in K_QUANTS else 96
    raw, w = quantized(wtype, 50, cols, rng)
    ids = np.array([3, 0, 49, 3, 17], np.uint32)
    bw, bi, bo = buf(dev, raw), buf(dev, ids), buf(dev, nbytes=4 * 5 * cols)
    run_once(dev, kc, "get_rows", [bw, bi, bo], (5, 1, 1), wtype=wtype,
             n_cols=cols, n_rows=5, scale=1.5, row_base=0, part_rows=50)
    assert nmse(read(dev, bo).reshape(5, cols), 1.5 * w[ids]) < 1e-12


def test_get_rows_from_table_parts(dev, kc):
    rng = np.random.default_rng(12)
    raw, w = quantized("Q8_0", 40, 64, rng)
    row_bytes = raw.nbytes // 40
    ids = np.array([39, 0, 25, 24], np.uint32)
    bi, bo = buf(dev, ids), buf(dev, np.zeros((4, 64), np.float32))
    for first, count in ((0, 25), (25, 15)):
        part = buf(dev, raw[first * row_bytes:(first + count) * row_bytes])
        run_once(dev, kc, "get_rows", [part, bi, bo], (4, 1, 1), wtype="Q8_0", n_cols=64,
                 n_rows=4, scale=1.0, row_base=first, part_rows=count)
    assert nmse(read(dev, bo).reshape(4, 64), w[ids]) < 1e-12


# -- elementwise and normalisation ------------------------------------------------------------

def test_rms_norm(dev, kc):
    rng = np.random.default_rng(4)
    x = rng.standard_normal((6, 576)).astype(np.float32) * 3
    w = rng.standard_normal(576).astype(np.float32)
    bx, bw, bo = buf(dev, x), buf(dev, w), buf(dev, nbytes=x.nbytes)
    run_once(dev, kc, "rms_norm", [bx, bw, bo], (5, 1, 1), n_cols=576, n_rows=5, eps=1e-5,
             x_offset=1)
    want = x / np.sqrt(np.mean(x * x, axis=1, keepdims=True) + 1e-5) * w
    assert nmse(read(dev, bo).reshape(6, 576)[1:], want[1:]) < 1e-12


@pytest.mark.parametrize("gelu", [0, 1])
def test_silu_mul(dev, kc, gelu):
    rng = np.random.default_rng(5)
    g, u = (rng.standard_normal(1000).astype(np.float32) * 4 for _ in range(2))
    bg, bu, bo = buf(dev, g), buf(dev, u), buf(dev, nbytes=g.nbytes)
    run_once(dev, kc, "silu_mul", [bg, bu, bo], (16, 1, 1), spec=dict(GELU=gelu), n=1000)
    if gelu:
        a = 0.5 * g * (1 + np.tanh(np.sqrt(2 / np.pi) * g * (1 + 0.044715 * g * g)))
    else:
        a = g / (1 + np.exp(-g))
    assert nmse(read(dev, bo), a * u) < 1e-12


def test_add(dev, kc):
    rng = np.random.default_rng(6)
    a, b = (rng.standard_normal(300).astype(np.float32) for _ in range(2))
    ba, bb, bo = buf(dev, a), buf(dev, b), buf(dev, nbytes=a.nbytes)
    run_once(dev, kc, "add", [ba, bb, bo], (5, 1, 1), n=300)
    assert np.array_equal(read(dev, bo), a + b)


def test_argmax_lowest_index_on_ties(dev, kc):
    x = np.random.default_rng(7).standard_normal(49152).astype(np.float32)
    x[[1234, 40000]] = 9.0
    bx, bo = buf(dev, x), buf(dev, nbytes=4)
    run_once(dev, kc, "argmax", [bx, bo], (1, 1, 1), n=49152, x_offset=0)
    assert read(dev, bo, np.uint32)[0] == 1234


# -- rope, KV cache, attention ---------------------------------------------------------------

def rope_ref(x: np.ndarray, pos0: int, n_dims: int, base: float, neox: bool) -> np.ndarray:
    n_tok, n_heads, hd = x.shape
    out = x.astype(np.float64).copy()
    half = n_dims // 2
    inv = base ** (-2.0 * np.arange(half) / n_dims)
    for t in range(n_tok):
        th = (pos0 + t) * inv
        c, s = np.cos(th), np.sin(th)
        a = np.arange(half) if neox else 2 * np.arange(half)
        b = a + half if neox else a + 1
        x0, x1 = x[t][:, a].astype(np.float64), x[t][:, b].astype(np.float64)
        out[t][:, a] = x0 * c - x1 * s
        out[t][:, b] = x0 * s + x1 * c
    return out


@pytest.mark.parametrize("neox", [0, 1])
def test_rope_in_place(dev, kc, neox):
    rng = np.random.default_rng(8)
    x = rng.standard_normal((5, 3, 64)).astype(np.float32)
    bx, st = buf(dev, x), step_buffer(dev, 37)
    run_once(dev, kc, "rope", [bx, bx, bx, st], (-(-5 * 3 * 32 // 64), 1, 1),
             spec=dict(NEOX=neox, OUT_F16=0), n_heads=3, head_dim=64, n_dims=64, n_tokens=5,
             freq_base=10000.0, freq_scale=1.0)
    assert nmse(read(dev, bx).reshape(x.shape), rope_ref(x, 37, 64, 10000.0, bool(neox))) < 1e-11


def test_rope_into_f16_cache(dev, kc):
    rng = np.random.default_rng(9)
    x = rng.standard_normal((4, 2, 64)).astype(np.float32)
    n_ctx = 16
    bx, st = buf(dev, x), step_buffer(dev, 5)
    cache = buf(dev, np.zeros((n_ctx, 2, 64), np.float16), kind="kv")
    run_once(dev, kc, "rope", [bx, bx, cache, st], (4, 1, 1), spec=dict(NEOX=0, OUT_F16=1),
             n_heads=2, head_dim=64, n_dims=64, n_tokens=4, freq_base=1e5, freq_scale=1.0)
    got = read(dev, cache, np.float16).reshape(n_ctx, 2, 64).astype(np.float32)
    assert nmse(got[5:9], rope_ref(x, 5, 64, 1e5, False)) < 1e-6
    assert not got[:5].any() and not got[9:].any()


def test_set_rows(dev, kc):
    x = np.random.default_rng(10).standard_normal((3, 192)).astype(np.float32)
    st = step_buffer(dev, 2)
    bx, cache = buf(dev, x), buf(dev, np.zeros((8, 192), np.float16))
    run_once(dev, kc, "set_rows", [bx, cache, st], (9, 1, 1), n_cols=192, n_rows=3)
    got = read(dev, cache, np.float16).reshape(8, 192)
    assert np.array_equal(got[2:5], x.astype(np.float16)) and not got[5:].any()


def attention_ref(q, k, v, pos0, window, scale):
    n_tok, n_head, hd = q.shape
    group = n_head // k.shape[1]
    out = np.zeros_like(q, dtype=np.float64)
    for t in range(n_tok):
        pos = pos0 + t
        lo = pos - window + 1 if window and pos >= window else 0
        for h in range(n_head):
            kk = k[lo:pos + 1, h // group].astype(np.float64)
            s = kk @ q[t, h].astype(np.float64) * scale
            p = np.exp(s - s.max())
            out[t, h] = (p / p.sum()) @ v[lo:pos + 1, h // group].astype(np.float64)
    return out


@pytest.mark.parametrize("hd,window", [(64, 0), (256, 0), (64, 5)])
def test_attention(dev, kc, hd, window):
    rng = np.random.default_rng(11)
    n_ctx, n_head, n_kv, n_tok, pos0 = 40, 6, 2, 4, 20
    k = rng.standard_normal((n_ctx, n_kv, hd)).astype(np.float16)
    v = rng.standard_normal((n_ctx, n_kv, hd)).astype(np.float16)
    q = rng.standard_normal((n_tok, n_head, hd)).astype(np.float32)
    bq, bk, bv = buf(dev, q), buf(dev, k), buf(dev, v)
    bo, st = buf(dev, nbytes=q.nbytes), step_buffer(dev, pos0)
    scale = hd ** -0.5
    run_once(dev, kc, "attention", [bq, bk, bv, bo, st], (n_head, n_tok, 1), spec=dict(HD=hd),
             n_head=n_head, n_head_kv=n_kv, n_tokens=n_tok, window=window, scale=scale)
    want = attention_ref(q, k, v, pos0, window, scale)
    assert nmse(read(dev, bo).reshape(q.shape), want) < 1e-10
