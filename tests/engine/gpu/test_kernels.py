"""Every kernel against a numpy reference (gguf.quants for dequantization), by NMSE."""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from engine.gpu import vk
from engine.gpu.builder import VECQ_PLAIN
from engine.gpu.graph import run_once
from engine.gpu.rope import Rope
from shaders.registry import (CM2_TYPES, KERNELS, PREDECODE_TYPES, STEP_BYTES, STEP_FIELDS,
                              STEP_TOKENS, SUPER_BLOCKS, WEIGHT_TYPES, pack_step)

pytestmark = pytest.mark.gpu
SHADERS = Path(__file__).resolve().parents[3] / "shaders"


def nmse(got: np.ndarray, want: np.ndarray) -> float:
    want = np.asarray(want, np.float64)
    return float(np.sum((np.asarray(got, np.float64) - want) ** 2) / max(np.sum(want ** 2), 1e-30))


def buf(dev, data: np.ndarray | None = None, nbytes: int | None = None, kind="compute"):
    n = data.nbytes if data is not None else nbytes
    b = dev.allocator.alloc(n, "test", kind)
    if data is not None:
        vk.upload(dev, b, np.ascontiguousarray(data))
    return b


def read(dev, b, dtype=np.float32):
    return vk.download(dev, b).view(dtype)


def step_buffer(dev, pos0: int, n_past: int = 0):
    return buf(dev, np.frombuffer(pack_step(pos0, n_past), np.uint8))


# Byte offsets of the f16 scales in the blocks of the types gguf-py cannot quantize
RANDOM_BLOCKS = {"Q2_K": (80, 82), "Q3_K": (108,), "Q4_K": (0, 2), "Q5_K": (0, 2),
                 "Q6_K": (208,), "IQ4_NL": (0,), "IQ4_XS": (0,), "IQ3_XXS": (0,), "IQ3_S": (0,),
                 "IQ2_XXS": (0,), "IQ2_XS": (0,), "IQ2_S": (0,)}


def quantized(wtype: str, rows: int, cols: int, rng) -> tuple[np.ndarray, np.ndarray]:
    """(raw bytes as stored in GGUF, their dequantized float32 values)."""
    import gguf
    from gguf.quants import dequantize, quantize

    w = rng.standard_normal((rows, cols)).astype(np.float32)
    if wtype == "F32":
        return w.view(np.uint8), w
    qt = gguf.GGMLQuantizationType[wtype]
    if wtype in RANDOM_BLOCKS:
        # gguf-py only dequantizes these: random blocks (every quant code and packed scale)
        # with sane f16 scales stand in
        block, size = gguf.GGML_QUANT_SIZES[qt]
        raw = rng.integers(0, 256, (rows, cols // block, size), dtype=np.uint8)
        scales = rng.uniform(0.001, 0.05, (rows, cols // block, 2)).astype(np.float16)
        for i, off in enumerate(RANDOM_BLOCKS[wtype]):
            raw[..., off:off + 2] = scales[..., i:i + 1].view(np.uint8)
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
    if "quant.glsl" in src or "cm2_decode.glsl" in src:
        n_bindings += 1          # the weight buffer is declared in the include
    if "step.glsl" in src:
        n_bindings += 1          # and the step buffer in its own
    assert n_bindings == ks.n_buffers


# -- the step buffer: one layout (registry.STEP_FIELDS), one GLSL block (include/step.glsl) ----

def _glsl_block(src: str, name: str) -> list[tuple[str, str]]:
    block = re.search(rf"buffer\s+{name}\s*\{{(.*?)\}}", src, re.S)
    fields = []
    for line in block.group(1).split(";"):
        line = re.sub(r"//.*", "", line).strip()
        if line:
            typ, *names = line.replace(",", " ").split()
            fields += [(n, _GLSL_TYPES[typ]) for n in names]
    return fields


def test_step_block_matches_registry():
    """The fixed fields, then one u32 per token (STEP_TOKENS), the block's last member."""
    src = (SHADERS / "include" / "step.glsl").read_text()
    assert tuple(_glsl_block(src, "Step")) == STEP_FIELDS + ((STEP_TOKENS + "[]", "u32"),)
    assert "binding = STEP_BINDING" in src
    assert STEP_BYTES == 4 * len(STEP_FIELDS) == len(pack_step(3, 4))


@pytest.mark.parametrize("name", sorted(KERNELS))
def test_step_buffer_declared_once(name):
    """A kernel reads the step buffer only through include/step.glsl, at the binding its
    registry entry names, and none declares the block itself."""
    ks = KERNELS[name]
    src = (SHADERS / ks.source).read_text()
    reads = re.search(r"\bstep\.\w+", re.sub(r"//.*", "", src)) is not None
    assert reads == (ks.step is not None) == ('#include "step.glsl"' in src)
    assert not re.search(r"buffer\s+Step\b|STEP_BINDING", src)
    if ks.step is not None:
        assert 0 <= ks.step < ks.n_buffers
        assert not re.search(rf"binding\s*=\s*{ks.step}\b", src)    # the binding is free
        assert ks.step not in ks.writes


def test_no_other_step_block():
    for path in SHADERS.glob("**/*.*"):
        if path.suffix in (".comp", ".glsl") and path.name != "step.glsl":
            assert not re.search(r"buffer\s+Step\b", path.read_text()), path


def test_set_step_writes_the_registry_layout(dev):
    from engine.gpu.runstate import RunState

    rs = RunState(dev, "t", n_layer=1, n_embd=64, n_head=1, q_dim=64, kv_dim=64, n_ff=64,
                  n_vocab=64, n_ctx=64, max_tokens=8)
    rs.set_step([5, 6, 7], 30)
    assert vk.download(dev, rs.step)[:STEP_BYTES].tobytes() == pack_step(30, 33)
    rs.close()


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
@pytest.mark.parametrize("lanes,rows", [(1, 1), (2, 3), (4, 4)])
def test_mul_mat_vec(dev, kc, wtype, lanes, rows):
    rng = np.random.default_rng(21)
    n_out, n_in = 70, 1024
    raw, w = quantized(wtype, n_out, n_in, rng)
    x = rng.standard_normal((2, n_in)).astype(np.float32)
    y0 = rng.standard_normal(n_out + 3).astype(np.float32)
    bw, bx = buf(dev, raw, kind="weights"), buf(dev, x)
    for acc in (0, 1):
        by = buf(dev, y0)
        # the second token's row, into y from float 3 on
        run_once(dev, kc, "mul_mat_vec", [bw, bx, by, bx], (-(-n_out // rows), 1, 1),
                 wtype=wtype, spec=dict(WG=dev.subgroup_size * lanes, ROWS=rows, ACC=acc,
                                        ACT=0),
                 n_in=n_in, n_out=n_out, x_offset=n_in // 4, y_offset=3, eps=0.0)
        got = read(dev, by)
        assert np.array_equal(got[:3], y0[:3])
        assert nmse(got[3:], w @ x[1] + (y0[3:] if acc else 0)) < 1e-10


@pytest.mark.parametrize("wtype", ["Q4_K", "Q6_K"])
@pytest.mark.parametrize("lanes,rows", [(1, 1), (2, 3), (4, 8)])
@pytest.mark.parametrize("xform", [0, 1, 2])
def test_mul_mat_vec_fine_map(dev, kc, wtype, lanes, rows, xform):
    """MAP 1 (sixteen lanes a K-quant super-block) gives the chunked map's sums."""
    rng = np.random.default_rng(25)
    n_out, n_in = 45, 2048
    raw, _ = quantized(wtype, n_out, n_in, rng)
    x = (rng.standard_normal((2, n_in)) * 2).astype(np.float32)
    x2 = rng.standard_normal((2, n_in)).astype(np.float32)
    bw, bx, bx2 = buf(dev, raw, kind="weights"), buf(dev, x), buf(dev, x2)
    got = []
    for m in (0, 1):
        by = buf(dev, nbytes=4 * n_out)
        run_once(dev, kc, "mul_mat_vec", [bw, bx, by, bx2], (-(-n_out // rows), 1, 1),
                 wtype=wtype, spec=dict(WG=16 * lanes, ROWS=rows, ACC=0,
                                         ACT=0, XFORM=xform, MAP=m),
                 n_in=n_in, n_out=n_out, x_offset=n_in // 4, y_offset=0, eps=1e-6)
        got.append(read(dev, by))
    assert nmse(got[1], got[0]) < 1e-12


@pytest.mark.parametrize("wtype", ["Q4_0", "Q4_1", "Q8_0", "Q4_K", "Q6_K", "F16"])
@pytest.mark.parametrize("xform", [1, 2])
def test_mul_mat_vec_fused_input(dev, kc, wtype, xform):
    """XFORM 1: the product of rms_norm(x) * w_norm; 2: of silu(x) * x2 (the GLU); the second
    token's row of x, against numpy on the op and the product."""
    rng = np.random.default_rng(22)
    n_out, n_in, eps = 37, 1024, 1e-5
    raw, w = quantized(wtype, n_out, n_in, rng)
    x = (rng.standard_normal((2, n_in)) * 3).astype(np.float32)
    x2 = rng.standard_normal((2, n_in) if xform == 2 else n_in).astype(np.float32)
    y0 = rng.standard_normal(n_out).astype(np.float32)
    bw, bx, bx2, by = buf(dev, raw, kind="weights"), buf(dev, x), buf(dev, x2), buf(dev, y0)
    rows = 4
    run_once(dev, kc, "mul_mat_vec", [bw, bx, by, bx2], (-(-n_out // rows), 1, 1),
             wtype=wtype, spec=dict(WG=dev.subgroup_size * 2, ROWS=rows, ACC=1, ACT=0,
                                    XFORM=xform),
             n_in=n_in, n_out=n_out, x_offset=n_in // 4, y_offset=0, eps=eps)
    xr = x[1].astype(np.float64)
    if xform == 1:
        xin = xr / np.sqrt(np.mean(xr * xr) + eps) * x2
    else:
        xin = xr / (1 + np.exp(-xr)) * x2[1]
    assert nmse(read(dev, by), y0 + w @ xin) < 1e-10


@pytest.mark.parametrize("wtype", WEIGHT_TYPES)
@pytest.mark.parametrize("tile", [(128, 64), (64, 32), (128, 128)])
def test_mul_mat_cm(dev, kc, wtype, tile):
    """The cooperative-matrix product against numpy on f16 inputs; partial tiles on both
    axes, a token offset, a residual add. Runs where the device has matrix units."""
    from engine.gpu.paths import cm_shared_bytes

    if not dev.coopmat:
        pytest.skip(f"{dev.name} has no 16x16x16 f16 cooperative matrices")
    if cm_shared_bytes(*tile) > dev.max_shared:
        pytest.skip(f"{dev.name} gives {dev.max_shared} bytes of shared memory")
    rng = np.random.default_rng(23)
    n_out, n_in, n = 200, 512, 70
    raw, w = quantized(wtype, n_out, n_in, rng)
    x = rng.standard_normal((n + 1, n_in)).astype(np.float32)
    y0 = rng.standard_normal((n, n_out)).astype(np.float32)
    bw, bx, by = buf(dev, raw, kind="weights"), buf(dev, x), buf(dev, y0)
    spec = dict(ACC=1, BM=tile[0], BN=tile[1])
    run_once(dev, kc, "mul_mat_cm", [bw, bx, by], (-(-n_out // tile[0]), -(-n // tile[1]), 1),
             wtype=wtype, spec=spec, n_in=n_in, n_out=n_out, n_tokens=n,
             x_offset=n_in // 4, y_offset=0, y_stride=n_out)
    f16 = lambda a: a.astype(np.float16).astype(np.float64)      # noqa: E731
    want = y0 + f16(x[1:]) @ f16(w).T
    assert nmse(read(dev, by).reshape(n, n_out), want) < 1e-9


def f16_decoded(wtype: str, raw: np.ndarray, rows: int, cols: int) -> np.ndarray:
    """The weights as cm2_decode's F16DEC decoders give them: Q4_K f16(f16(d sc) q -
    f16(dmin m)), Q6_K f16(f16(d sc) (q - 32)); the pieces taken from gguf-py's dequantize
    of the blocks with some fields replaced (e.g. every quant 1 gives d sc)."""
    import gguf
    from gguf.quants import dequantize

    qt = gguf.GGMLQuantizationType[wtype]
    size = gguf.GGML_QUANT_SIZES[qt][1]
    blocks = raw.reshape(-1, size)

    def deq(**fields):
        b = blocks.copy()
        for (lo, hi), v in fields.values():
            b[:, lo:hi] = v
        return dequantize(b, qt).reshape(rows, cols).astype(np.float64)

    one_f16 = np.frombuffer(np.float16(1.0).tobytes(), np.uint8)
    f16 = lambda a: a.astype(np.float16).astype(np.float64)      # noqa: E731
    if wtype == "Q4_K":     # d, dmin, scales[12], qs[128]
        unit_scales = np.array([1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1, 1], np.uint8)
        q = deq(d=((0, 2), one_f16), dmin=((2, 4), 0), scales=((4, 16), unit_scales))
        dsc = deq(dmin=((2, 4), 0), qs=((16, 144), 0x11))
        dm = -deq(d=((0, 2), 0))
        return f16(f16(dsc) * q - f16(dm))
    assert wtype == "Q6_K"  # ql[128], qh[64], scales[16], d
    q = deq(scales=((192, 208), 1), d=((208, 210), one_f16))
    dsc = deq(ql=((0, 128), 0x11), qh=((128, 192), 0xAA))
    return f16(f16(dsc) * q)


def _workgroup_scope_product(dev, kc, kernel, wtype, tile, spec, x16=0, tol=1e-9):
    """A product of `kernel` (mul_mat_cm2 or mul_mat_cm2s) against numpy on f16 inputs: 3 x 2
    whole tiles and a partial one on each axis, a token offset, the binding's rows at an
    offset in wider rows of y, with and without the residual add; tol: the normalized mean
    squared error allowed. Returns y after each (without, with)."""
    split = dict(k_split=0, y_slice=0) if kernel == "mul_mat_cm2" else {}
    rng = np.random.default_rng(29)
    bm, bn, wg = tile
    n_out, n_in, n, y_offset, y_stride = 3 * bm + 40, 512, 2 * bn + 6, 5, 3 * bm + 53
    raw, w = quantized(wtype, n_out, n_in, rng)
    if spec.get("F16DEC"):
        w = f16_decoded(wtype, raw, n_out, n_in)
    x = rng.standard_normal((n + 1, n_in)).astype(np.float32)
    y0 = rng.standard_normal((n, y_stride)).astype(np.float32)
    bw, by = buf(dev, raw, kind="weights"), buf(dev, y0)
    bx = buf(dev, x.astype(np.float16) if x16 else x)
    out = []
    for acc in (0, 1):
        vk.upload(dev, by, y0)
        run_once(dev, kc, kernel, [bw, bx, by], (-(-n_out // bm), -(-n // bn), 1),
                 wtype=wtype, spec=dict(WG=wg, BM=bm, BN=bn, ACC=acc, **spec), n_in=n_in,
                 n_out=n_out, n_tokens=n, x_offset=n_in if x16 else n_in // 4,
                 y_offset=y_offset, y_stride=y_stride, **split)
        f16 = lambda a: a.astype(np.float16).astype(np.float64)      # noqa: E731
        want = y0.astype(np.float64).copy()
        want[:, y_offset:y_offset + n_out] = acc * want[:, y_offset:y_offset + n_out] \
            + f16(x[1:]) @ f16(w).T
        got = read(dev, by).reshape(n, y_stride)
        assert nmse(got, want) < tol, acc
        assert np.array_equal(got[:, :y_offset], y0[:, :y_offset])       # others' rows kept
        assert np.array_equal(got[:, y_offset + n_out:], y0[:, y_offset + n_out:])
        out.append(got)
    return out


@pytest.mark.parametrize("wtype,ahead", [(t, 0) for t in CM2_TYPES]
                         + [("Q4_K", 1), ("Q6_K", 1)])
@pytest.mark.parametrize("tile", [(128, 128, 256), (64, 64, 128), (128, 256, 256),
                                  (256, 128, 128), (128, 256, 512)])
@pytest.mark.parametrize("x16", [0, 1], ids=["x32", "x16"])
def test_mul_mat_cm2(dev, kc, wtype, ahead, tile, x16):
    """NVIDIA's workgroup-scope product, W through the tensor loads' decoders: x as f32 or as
    f16 (X16); the K-quants' scales fetched a super-block ahead (AHEAD) or not, with tiles
    of 64 to 256 rows over 128 to 512 lanes. Runs where the device has
    VK_NV_cooperative_matrix2 and the kernel is compiled (a glslang of 15 or later)."""
    from engine.gpu.kernels import compiled

    if not (dev.coopmat2 and compiled("mul_mat_cm2")):
        pytest.skip(f"{dev.name}: no VK_NV_cooperative_matrix2 (or mul_mat_cm2 not compiled)")
    _workgroup_scope_product(dev, kc, "mul_mat_cm2", wtype, tile, dict(X16=x16, AHEAD=ahead),
                             x16)


@pytest.mark.parametrize("wtype", ["Q4_0", "Q8_0"])
@pytest.mark.parametrize("ahead", [0, 1])
@pytest.mark.parametrize("tile", [(128, 128, 256), (64, 128, 128), (128, 256, 256)])
def test_mul_mat_cm2_groups(dev, kc, wtype, ahead, tile):
    """mul_mat_cm2 reading Q4_0's or Q8_0's blocks eight at a time (GROUP: one 256-weight
    group a decode call, the eight scales through shared memory, fetched at each group or a
    group ahead): numpy's product on f16 inputs, and the same bits as a block at a time,
    with f32 sums and with f16 ones."""
    from engine.gpu.kernels import compiled

    if not (dev.coopmat2 and compiled("mul_mat_cm2")):
        pytest.skip(f"{dev.name}: no VK_NV_cooperative_matrix2 (or mul_mat_cm2 not compiled)")
    for acc16, tol in ((0, 1e-9), (1, 1e-4)):
        blocks, groups = (_workgroup_scope_product(
            dev, kc, "mul_mat_cm2", wtype, tile,
            dict(X16=1, AHEAD=ahead * group, ACC16=acc16, GROUP=group), 1, tol=tol)
            for group in (0, 1))
        assert all(np.array_equal(a, b) for a, b in zip(blocks, groups)), acc16


@pytest.mark.parametrize("wtype,ahead", [("Q4_K", 0), ("Q4_K", 1), ("Q6_K", 0), ("Q6_K", 1)])
@pytest.mark.parametrize("tile", [(128, 128, 256), (64, 128, 128)])
def test_mul_mat_cm2_f16_decoders(dev, kc, wtype, ahead, tile):
    """mul_mat_cm2 with the K-quants decoded in f16 (F16DEC): the weights are the f16
    roundings f16_decoded models, x as f16."""
    from engine.gpu.kernels import compiled

    if not (dev.coopmat2 and compiled("mul_mat_cm2")):
        pytest.skip(f"{dev.name}: no VK_NV_cooperative_matrix2 (or mul_mat_cm2 not compiled)")
    _workgroup_scope_product(dev, kc, "mul_mat_cm2", wtype, tile,
                             dict(X16=1, AHEAD=ahead, F16DEC=1), 1)


@pytest.mark.parametrize("wtype", ["F16", "Q4_0", "Q4_K", "Q6_K"])
@pytest.mark.parametrize("tile", [(128, 128, 256), (128, 256, 256)])
def test_mul_mat_cm2_f16_sums(dev, kc, wtype, tile):
    """mul_mat_cm2 with its tiles' sums in f16 (ACC16), x as f16: sums of 512 products
    rounded to f16 at each matrix step stay within 1e-4 of the product's energy (a wrong
    tile is off by about 1), and the residual add is made in f32."""
    from engine.gpu.kernels import compiled

    if not (dev.coopmat2 and compiled("mul_mat_cm2")):
        pytest.skip(f"{dev.name}: no VK_NV_cooperative_matrix2 (or mul_mat_cm2 not compiled)")
    _workgroup_scope_product(dev, kc, "mul_mat_cm2", wtype, tile,
                             dict(X16=1, AHEAD=int(wtype in ("Q4_K", "Q6_K")), ACC16=1), 1,
                             tol=1e-4)


@pytest.mark.parametrize("wtype", ["Q4_K", "Q6_K"])
def test_f16_decoders_model(wtype):
    """f16_decoded (the F16DEC decoders' numpy model) differs from gguf-py's dequantize
    by the f16 roundings alone: within a few f16 steps of each weight's block scale."""
    rng = np.random.default_rng(3)
    raw, w = quantized(wtype, 8, 512, rng)
    got = f16_decoded(wtype, raw, 8, 512)
    assert not np.array_equal(got, w)
    assert np.abs(got - w).max() <= 4 * 2.0 ** -11 * np.abs(w).max()
    assert nmse(got, w) < 1e-6


@pytest.mark.parametrize("acc", [0, 1])
@pytest.mark.parametrize("n", [4096 * 37 + 77, 4096 * 37 + 16])
def test_split_sum_adds_the_slices_in_order(dev, kc, acc, n):
    """split_sum: y (+)= the slices of a split product, summed in slice order (the same bits
    as numpy's float32 left-to-right sum), four floats a lane (as vec4s where n is a
    multiple of 4), its workgroups in rows of 37."""
    from engine.gpu.kernels import SPLIT_SUM_WG

    rng = np.random.default_rng(33)
    slices = 3
    part = rng.standard_normal((slices, n)).astype(np.float32)
    y0 = rng.standard_normal(n + 5).astype(np.float32)
    bp, by = buf(dev, part), buf(dev, y0)
    groups = -(-n // SPLIT_SUM_WG)
    run_once(dev, kc, "split_sum", [bp, by], (37, -(-groups // 37), 1),
             spec=dict(ACC=acc), n=n, slices=slices)
    want = part[0] + part[1] + part[2]
    if acc:
        want = y0[:n] + want
    got = read(dev, by)
    assert np.array_equal(got[:n], want)
    assert np.array_equal(got[n:], y0[n:])


@pytest.mark.parametrize("wtype", ["Q4_K", "Q6_K", "Q4_0", "F16"])
@pytest.mark.parametrize("x16", [0, 1], ids=["x32", "x16"])
def test_mul_mat_cm2_split_k(dev, kc, wtype, x16):
    """mul_mat_cm2 with K in slices (k_split): each slice's sums into its own part of the
    partial buffer, then split_sum adds them into y, with and without the residual add:
    numpy's product on f16 inputs. Runs where the device has VK_NV_cooperative_matrix2."""
    from engine.gpu.kernels import compiled

    if not (dev.coopmat2 and compiled("mul_mat_cm2")):
        pytest.skip(f"{dev.name}: no VK_NV_cooperative_matrix2 (or mul_mat_cm2 not compiled)")
    rng = np.random.default_rng(34)
    bm, bn, wg = 128, 128, 256
    n_out, n_in, n, k_split = 2 * bm + 24, 1280, bn + 9, 512        # slices of 512, 512, 256
    slices = -(-n_in // k_split)
    raw, w = quantized(wtype, n_out, n_in, rng)
    x = rng.standard_normal((n, n_in)).astype(np.float32)
    y0 = rng.standard_normal((n, n_out)).astype(np.float32)
    bw, by = buf(dev, raw, kind="weights"), buf(dev, y0)
    bx = buf(dev, x.astype(np.float16) if x16 else x)
    bp = buf(dev, np.full(slices * n * n_out, np.nan, np.float32))
    f16 = lambda a: a.astype(np.float16).astype(np.float64)      # noqa: E731
    for acc in (0, 1):
        vk.upload(dev, by, y0)
        run_once(dev, kc, "mul_mat_cm2", [bw, bx, bp], (-(-n_out // bm), -(-n // bn), slices),
                 wtype=wtype, spec=dict(WG=wg, BM=bm, BN=bn, ACC=0, X16=x16, AHEAD=1),
                 n_in=n_in, n_out=n_out, n_tokens=n, x_offset=0, y_offset=0, y_stride=n_out,
                 k_split=k_split, y_slice=n * n_out)
        groups = -(-n * n_out // 256)
        run_once(dev, kc, "split_sum", [bp, by], (groups, 1, 1), spec=dict(ACC=acc),
                 n=n * n_out, slices=slices)
        want = acc * y0.astype(np.float64) + f16(x) @ f16(w).T
        assert nmse(read(dev, by).reshape(n, n_out), want) < 1e-9, acc


@pytest.mark.parametrize("wtype", ["Q4_K", "Q4_0"])
@pytest.mark.parametrize("x16", [0, 1], ids=["x32", "x16"])
def test_a_split_product_in_a_pass_gives_a_tokens_bits_whatever_the_pass(dev, kc, x16, wtype):
    """Builder.matmul on mul_mat_cm2 with K split (a GPU of 132 compute units, W of two
    tiles of rows in two bindings): numpy's product on f16 inputs, with and without the
    residual add; the split is the widest pass's, so a token's row is the same bits in a
    pass of 37 tokens as in one of 100."""
    from dataclasses import replace

    from engine.gpu.kernels import compiled
    from engine.gpu.paths import Tuning
    from engine.gpu.tensors import Tensor

    if not (dev.coopmat2 and compiled("mul_mat_cm2")):
        pytest.skip(f"{dev.name}: no VK_NV_cooperative_matrix2 (or mul_mat_cm2 not compiled)")
    rng = np.random.default_rng(35)
    n_in, n_out, T = 2048, 256, 128
    raw, w = quantized(wtype, n_out, n_in, rng)
    t = replace(Tuning.for_device(dev), coopmat2=True, cm2_x16=bool(x16), cm2_split=True,
                cm2_group=True, compute_units=132, ggml_numerics=False)
    assert t.paths(128).prefill_matmul == "mul_mat_cm2"
    assert t.cm2_k_split(2 * -(-T // t.cm2_tile[1]), n_in)[0] == 8
    half = raw.nbytes // 2
    arenas = [buf(dev, raw[:half], kind="weights"), buf(dev, raw[half:], kind="weights")]
    wt = Tensor(wtype, (n_in, n_out), [(0, 128, 0, 0, half), (128, 128, 1, 0, half)], arenas)
    # (to_f16,) two bindings' slices, split_sum
    _products_in_two_passes(dev, kc, rng, wt, w, t, T, ops=3 + x16)


def test_split_products_of_one_input_run_side_by_side(dev, kc):
    """Builder.norm_matmuls on mul_mat_cm2 with K split in each of three products of one
    input (q, k and v of a GPU of 132 compute units): the three products are recorded
    before their split_sums, each into partial sums of its own, and give the same bits as
    each product followed by its sum (Tuning.cm2_sums_after off), near numpy's."""
    from dataclasses import replace

    from engine.gpu.builder import Builder
    from engine.gpu.graph import Graph
    from engine.gpu.kernels import compiled
    from engine.gpu.paths import Tuning
    from engine.gpu.runstate import RunState
    from engine.gpu.tensors import Tensor

    if not (dev.coopmat2 and compiled("mul_mat_cm2")):
        pytest.skip(f"{dev.name}: no VK_NV_cooperative_matrix2 (or mul_mat_cm2 not compiled)")
    rng = np.random.default_rng(44)
    n_in, T, eps = 2048, 128, 1e-5
    shapes = (("Q4_K", 256), ("Q4_K", 128), ("Q6_K", 128))
    x = rng.standard_normal((T, n_in)).astype(np.float32)
    norm = (1 + 0.1 * rng.standard_normal(n_in)).astype(np.float32)
    ws, ts = [], []
    for wtype, n_out in shapes:
        raw, w = quantized(wtype, n_out, n_in, rng)
        ws.append(w)
        ts.append(Tensor(wtype, (n_in, n_out), [(0, n_out, 0, 0, raw.nbytes)],
                         [buf(dev, raw, kind="weights")]))
    normt = Tensor("F32", (n_in,), [(0, 1, 0, 0, norm.nbytes)],
                   [buf(dev, norm, kind="weights")])
    rs = RunState(dev, "t", n_layer=1, n_embd=n_in, n_head=1, q_dim=n_in, kv_dim=64,
                  n_ff=n_in, n_vocab=16, n_ctx=16, max_tokens=T)
    bx = buf(dev, x)
    ys = [buf(dev, nbytes=4 * T * n_out) for _, n_out in shapes]
    got = {}
    try:
        for after in (True, False):
            t = replace(Tuning.for_device(dev), coopmat2=True, cm2_x16=True, cm2_split=True,
                        cm2_sums_after=after, compute_units=132, ggml_numerics=False)
            for _, n in shapes:                 # each product's K is split
                bm, bn, _ = t.cm2_tile_for(n, T, n_in)
                assert t.cm2_k_split(-(-n // bm) * -(-T // bn), n_in)[0] > 1, n
            g = Graph(dev, kc, "t", profile=True)
            Builder(g, {}, rs, t).norm_matmuls(bx, normt, eps, rs.xn, T, list(zip(ts, ys)))
            g.replay()
            names = [name for name, _ in g.profile()]
            g.close()
            products = [i for i, n in enumerate(names) if n.startswith("mul_mat_cm2")]
            sums = [i for i, n in enumerate(names) if n.startswith("split_sum")]
            assert len(products) == len(sums) == 3, names
            assert (max(products) < min(sums)) == after, names
            got[after] = [read(dev, y).reshape(T, -1).copy() for y in ys]
            if after:       # each product wrote partial sums of its own
                assert len(rs.split_part) == 3
    finally:
        rs.close()
    f16 = lambda a: a.astype(np.float16).astype(np.float64)      # noqa: E731
    xn = x / np.sqrt(np.mean(x.astype(np.float64) ** 2, axis=1, keepdims=True) + eps) * norm
    for a, b, w in zip(got[True], got[False], ws):
        assert np.array_equal(a, b)
        assert nmse(a, f16(xn) @ f16(w).T) < 1e-4


def _products_in_two_passes(dev, kc, rng, wt, w, t, max_tokens: int, ops: int) -> None:
    """Builder.matmul of wt (values w) under tuning t in `ops` ops, in passes of 100 and 37
    tokens, with and without the residual add: numpy's product on f16 inputs (to 1e-4 where
    mul_mat_cm2 sums in f16), and a token's row the same bits in either pass."""
    from engine.gpu.builder import Builder
    from engine.gpu.graph import Graph
    from engine.gpu.runstate import RunState

    n_out, n_in = w.shape
    rs = RunState(dev, "t", n_layer=1, n_embd=n_in, n_head=1, q_dim=n_in, kv_dim=64,
                  n_ff=n_in, n_vocab=16, n_ctx=16, max_tokens=max_tokens)
    x = rng.standard_normal((100, n_in)).astype(np.float32)
    y0 = rng.standard_normal((100, n_out)).astype(np.float32)
    bx, by = buf(dev, x), buf(dev, y0)
    f16 = lambda a: a.astype(np.float16).astype(np.float64)      # noqa: E731
    try:
        for acc in (False, True):
            rows = {}
            for n in (100, 37):
                vk.upload(dev, by, y0)
                g = Graph(dev, kc, "t")
                Builder(g, {}, rs, t).matmul(wt, bx, by, n, accumulate=acc)
                assert g.n_ops == ops
                g.replay()
                g.close()
                rows[n] = read(dev, by).reshape(100, n_out)[:n].copy()
            want = acc * y0[:100].astype(np.float64) + f16(x) @ f16(w).T
            tol = 1e-4 if t.coopmat2 and t.cm2_acc16 else 1e-9
            assert nmse(rows[100], want) < tol, acc
            assert np.array_equal(rows[37], rows[100][:37]), acc
    finally:
        rs.close()


@pytest.mark.parametrize("cm2", [0, 1], ids=["khr", "cm2"])
@pytest.mark.parametrize("wtype", ["Q4_K", "IQ4_XS"])
def test_predecoded_products_give_a_tokens_bits_whatever_the_pass(dev, kc, wtype, cm2):
    """Builder.matmul with Tuning.predecode on the matrix units (mul_mat_cm2, or mul_mat_cm
    where the device takes KHR's): W (two bindings, 384 and 256 rows) as f16 rows in slices
    of 256, numpy's product on f16 inputs, with and without the residual add; a token's row
    is the same bits in a pass of 37 tokens as in one of 100. A type without a tile decoder
    (IQ4_XS) takes the same path."""
    from dataclasses import replace

    from engine.gpu.kernels import compiled
    from engine.gpu.paths import Tuning
    from engine.gpu.tensors import Tensor

    kernel = "mul_mat_cm2" if cm2 else "mul_mat_cm"
    if not ((dev.coopmat2 if cm2 else dev.coopmat) and compiled(kernel)):
        pytest.skip(f"{dev.name}: no {kernel} (no matrix units of that kind, or not compiled)")
    rng = np.random.default_rng(43)
    n_in, n_out, T = 2048, 640, 128
    raw, w = quantized(wtype, n_out, n_in, rng)
    cut = raw.nbytes * 384 // n_out
    arenas = [buf(dev, raw[:cut], kind="weights"), buf(dev, raw[cut:], kind="weights")]
    wt = Tensor(wtype, (n_in, n_out), [(0, 384, 0, 0, cut), (384, 256, 1, 0, raw.nbytes - cut)],
                arenas)
    t = replace(Tuning.for_device(dev), coopmat=True, coopmat2=bool(cm2), predecode=True,
                predecode_mib=1, ggml_numerics=False, compute_units=132)
    assert t.paths(128).prefill_matmul == kernel
    assert t.paths(128).prefill_weights == "dequant_f16"
    # (to_f16,) three slices: a dequant_f16 and a product each
    _products_in_two_passes(dev, kc, rng, wt, w, t, T, ops=6 + cm2)


@pytest.mark.parametrize("wtype", WEIGHT_TYPES)
@pytest.mark.parametrize("tile", [(128, 128, 256), (64, 64, 128), (128, 64, 256)])
def test_mul_mat_cm2s(dev, kc, wtype, tile):
    """The workgroup-scope product with W dequantized by the lanes into shared memory
    (mul_mat_cm2s), every weight type. Runs where the device has VK_NV_cooperative_matrix2
    and the kernel is compiled."""
    from engine.gpu.kernels import compiled

    if not (dev.coopmat2 and compiled("mul_mat_cm2s")):
        pytest.skip(f"{dev.name}: no VK_NV_cooperative_matrix2 (or mul_mat_cm2s not compiled)")
    _workgroup_scope_product(dev, kc, "mul_mat_cm2s", wtype, tile, {})


def _one_token_product(dev, kc, wtype, raw, x, n_out, tuning, x_row=0):
    from engine.gpu.graph import Graph
    from engine.gpu.builder import Builder
    from engine.gpu.runstate import RunState
    from engine.gpu.tensors import Tensor

    n_in = x.shape[1]
    rs = RunState(dev, "t", n_layer=1, n_embd=n_in, n_head=1, q_dim=n_in, kv_dim=64,
                  n_ff=n_in, n_vocab=n_out, n_ctx=16, max_tokens=8)
    bw, bx, by = buf(dev, raw), buf(dev, x), buf(dev, nbytes=4 * n_out)
    t = Tensor(wtype, (n_in, n_out), [(0, n_out, 0, 0, raw.nbytes)], [bw])
    g = Graph(dev, kc, "t")
    Builder(g, {}, rs, tuning).matmul(t, bx, by, 1, x_row=x_row)
    g.replay()
    out = read(dev, by)[:n_out].copy()
    g.close()
    rs.close()
    return out


@pytest.mark.parametrize("wtype,n_in", [("F16", 128), ("Q8_0", 64), ("Q4_K", 256)])
@pytest.mark.parametrize("n", [1, 5])
def test_matmul_of_row_slices(dev, kc, wtype, n_in, n):
    """Tensor.row_slice: a product with rows [a, b) of a weight writes those rows alone, into
    a [n, b - a] output, whether the slice starts on a bindable offset (F16 rows of 256
    bytes) or inside one (Q8_0 rows of 68 bytes, Q4_K of 144: mul_mat's row offset), and
    across the parts of a weight split in two (the second part at an aligned offset of its
    own, as the weight arenas place it)."""
    from dataclasses import replace

    from engine.gpu.builder import Builder
    from engine.gpu.graph import Graph
    from engine.gpu.paths import Tuning
    from engine.gpu.runstate import RunState
    from engine.gpu.tensors import BIND_ALIGN, Tensor

    rng = np.random.default_rng(29)
    n_out, split = 96, 40
    raw, w = quantized(wtype, n_out, n_in, rng)
    row_bytes = raw.nbytes // n_out
    x = rng.standard_normal((n, n_in)).astype(np.float32)
    second = -(-split * row_bytes // BIND_ALIGN) * BIND_ALIGN + BIND_ALIGN
    arena = np.zeros(second + (n_out - split) * row_bytes, np.uint8)
    arena[:split * row_bytes] = raw[:split * row_bytes]
    arena[second:] = raw[split * row_bytes:]
    bw, bp, bx = buf(dev, raw, kind="weights"), buf(dev, arena, kind="weights"), buf(dev, x)
    whole = Tensor(wtype, (n_in, n_out), [(0, n_out, 0, 0, raw.nbytes)], [bw])
    parted = Tensor(wtype, (n_in, n_out), [(0, split, 0, 0, split * row_bytes),
                                            (split, n_out - split, 0, second,
                                             (n_out - split) * row_bytes)], [bp])
    rs = RunState(dev, "t", n_layer=1, n_embd=n_in, n_head=1, q_dim=n_in, kv_dim=64,
                  n_ff=n_in, n_vocab=n_out, n_ctx=16, max_tokens=8)
    for matvec, dot4 in ((False, False), (True, False), (True, True)):
        tuning = replace(Tuning.for_device(dev), matvec=matvec, ggml_numerics=False,
                         coopmat=False, dot4=dot4 and dev.dot4)
        # one token on mul_mat_vecq (a slice that binds where it starts): x rounded to int8
        # blocks first
        vecq = n == 1 and tuning.matvecq and tuning.matvecq_fits(wtype, n_in)
        for t, (a, b) in [(whole, (0, 32)), (whole, (32, 48)), (whole, (5, 77)),
                          (parted, (20, 70)), (parted, (45, 96)), (parted, (3, 9))]:
            sl = t.row_slice(a, b)
            assert sl.rows == b - a
            if t is whole and a % 4:
                assert any(sl.skip) == (a * row_bytes % BIND_ALIGN != 0)
            by = buf(dev, np.full(n * (b - a) + 3, 7.0, np.float32))
            g = Graph(dev, kc, "t")
            Builder(g, {}, rs, tuning).matmul(sl, bx, by, n)
            g.replay()
            got = read(dev, by)
            xr = q8_blocks(x) if vecq and not any(sl.skips()) else x
            assert nmse(got[:n * (b - a)].reshape(n, b - a), xr @ w[a:b].T) < 1e-10, (a, b)
            assert np.all(got[n * (b - a):] == 7.0)
            g.close()
    # a slice of a slice
    sl = parted.row_slice(10, 80).row_slice(25, 60)
    by = buf(dev, nbytes=4 * n * 35)
    g = Graph(dev, kc, "t")
    Builder(g, {}, rs, tuning).matmul(sl, bx, by, n)
    g.replay()
    assert nmse(read(dev, by)[:n * 35].reshape(n, 35), x @ w[35:70].T) < 1e-10
    g.close()
    rs.close()


@pytest.mark.parametrize("wtype", WEIGHT_TYPES)
def test_mul_mat_vec_rounds_like_the_plain_path(dev, kc, wtype):
    """With ggml's rounding, the decode kernel rounds x inside itself as quantize_act and
    mul_mat round it in their passes (Q8_0, Q8_1 with its block sums, Q8_K, f16)."""
    from dataclasses import replace

    from engine.gpu.paths import Tuning

    rng = np.random.default_rng(22)
    n_out, n_in = 45, 768
    raw, _ = quantized(wtype, n_out, n_in, rng)
    x = (rng.standard_normal((3, n_in)) * 4).astype(np.float32)
    x[2, 300], x[2, 301] = 9.5, -9.5       # equal magnitudes, opposite signs: Q8_K takes the first
    base = replace(Tuning.for_device(dev), ggml_numerics=True)
    plain = _one_token_product(dev, kc, wtype, raw, x, n_out, replace(base, matvec=False), 2)
    fast = _one_token_product(dev, kc, wtype, raw, x, n_out, replace(base, matvec=True), 2)
    exact = _one_token_product(dev, kc, wtype, raw, x, n_out,
                               replace(base, matvec=True, ggml_numerics=False), 2)
    assert np.abs(fast - plain).max() <= 2e-6 * np.abs(plain).max()
    # the rounding shows: fast follows plain, not exact. Not for F16: x's f16 rounding moves
    # the sums by about as much as the order of summation does (and NVIDIA's driver rounds
    # f32 to f16 its own way, so the two paths differ by that much there)
    if wtype not in ("F32", "F16"):
        assert np.abs(exact - plain).max() > 10 * np.abs(fast - plain).max()


# -- mixture of experts ----------------------------------------------------------------------

def router_ref(logits: np.ndarray, k: int, norm: bool) -> tuple[np.ndarray, np.ndarray]:
    e = np.exp(logits - logits.max(-1, keepdims=True))
    p = e / e.sum(-1, keepdims=True)
    ids = np.argsort(-p, axis=-1, kind="stable")[:, :k]       # largest, lowest index on ties
    w = np.take_along_axis(p, ids, -1)
    return ids, w / w.sum(-1, keepdims=True) if norm else w


@pytest.mark.parametrize("n_expert,k,norm", [(8, 2, 1), (60, 4, 1), (128, 8, 0), (5, 5, 1)])
def test_moe_router(dev, kc, n_expert, k, norm):
    rng = np.random.default_rng(20)
    T = 6
    logits = (rng.standard_normal((T, n_expert)) * 3).astype(np.float32)
    logits[0, [1, 3, 6 % n_expert]] = 9.0                 # a tie: the lower indices win
    bl, bi, bw = buf(dev, logits), buf(dev, nbytes=4 * T * k), buf(dev, nbytes=4 * T * k)
    run_once(dev, kc, "moe_router", [bl, bi, bw], (T, 1, 1), spec=dict(NORM=norm),
             n_expert=n_expert, n_used=k)
    ids, w = router_ref(logits.astype(np.float64), k, bool(norm))
    assert np.array_equal(read(dev, bi, np.uint32).reshape(T, k), ids)
    assert nmse(read(dev, bw).reshape(T, k), w) < 1e-12


@pytest.mark.parametrize("wtype", WEIGHT_TYPES)
@pytest.mark.parametrize("per_slot", [0, 1])
def test_mul_mat_id(dev, kc, wtype, per_slot):
    """Each token's routed experts, from an ids buffer; x shared by a token's slots (gate,
    up) or one row per slot (down)."""
    rng = np.random.default_rng(21)
    n_expert, n_out, n_in, T, k, rows, warps = 5, 40, 256, 3, 2, 2, 2
    raw, w = quantized(wtype, n_expert * n_out, n_in, rng)
    w = w.reshape(n_expert, n_out, n_in)
    ids = np.array([[4, 0], [2, 4], [1, 3]], np.uint32)
    x = rng.standard_normal((T, k, n_in) if per_slot else (T, n_in)).astype(np.float32)
    bw, bx, bi = buf(dev, raw, kind="weights"), buf(dev, x), buf(dev, ids)
    by = buf(dev, nbytes=4 * T * k * n_out)
    run_once(dev, kc, "mul_mat_id", [bw, bx, bi, by], (-(-n_out // (rows * warps)), k, T),
             wtype=wtype, spec=dict(WG=dev.subgroup_size * warps, ROWS=rows, X_SLOT=per_slot),
             n_in=n_in, n_out=n_out, n_used=k, expert_base=0, n_experts=n_expert)
    want = np.stack([np.stack([w[ids[t, j]] @ (x[t, j] if per_slot else x[t])
                               for j in range(k)]) for t in range(T)])
    assert nmse(read(dev, by).reshape(T, k, n_out), want) < 1e-10


def test_mul_mat_id_from_expert_parts(dev, kc):
    """W bound as two parts of whole experts: each dispatch writes only the slots whose
    expert its part holds."""
    rng = np.random.default_rng(22)
    n_expert, n_out, n_in, T, k = 4, 24, 64, 4, 2
    raw, w = quantized("Q8_0", n_expert * n_out, n_in, rng)
    w = w.reshape(n_expert, n_out, n_in)
    ids = np.array([[3, 0], [1, 2], [2, 3], [0, 1]], np.uint32)
    x = rng.standard_normal((T, n_in)).astype(np.float32)
    bx, bi, by = buf(dev, x), buf(dev, ids), buf(dev, np.zeros((T, k, n_out), np.float32))
    per_expert = raw.nbytes // n_expert
    for first, count in ((0, 1), (1, 3)):
        part = buf(dev, raw[first * per_expert:(first + count) * per_expert])
        run_once(dev, kc, "mul_mat_id", [part, bx, bi, by], (n_out, k, T), wtype="Q8_0",
                 spec=dict(WG=dev.subgroup_size, ROWS=1), n_in=n_in, n_out=n_out, n_used=k,
                 expert_base=first, n_experts=count)
    want = np.stack([np.stack([w[e] @ x[t] for e in ids[t]]) for t in range(T)])
    assert nmse(read(dev, by).reshape(T, k, n_out), want) < 1e-10


def test_mul_mat_id_rounds_like_ggml(dev, kc):
    """ACT = 2 (Q4_1 against Q8_1 activations), as in mul_mat."""
    rng = np.random.default_rng(23)
    n_expert, n_out, n_in, T, k = 3, 32, 128, 2, 2
    raw, _ = quantized("Q4_1", n_expert * n_out, n_in, rng)
    ids = np.array([[2, 0], [1, 2]], np.uint32)
    x = (rng.standard_normal((T, n_in)) * 3).astype(np.float32)
    bw, bx, bi = buf(dev, raw), buf(dev, x), buf(dev, ids)
    by = buf(dev, nbytes=4 * T * k * n_out)
    run_once(dev, kc, "mul_mat_id", [bw, bx, bi, by], (n_out // 4, k, T), wtype="Q4_1",
             spec=dict(WG=dev.subgroup_size * 2, ROWS=2, ACT=2), n_in=n_in, n_out=n_out,
             n_used=k, expert_base=0, n_experts=n_expert)
    per_expert = raw.nbytes // n_expert
    want = np.stack([np.stack([
        ggml_dot_q4_1_q8_1(raw[e * per_expert:(e + 1) * per_expert], x[t:t + 1], n_out,
                           n_in)[0] for e in ids[t]]) for t in range(T)])
    got = read(dev, by).reshape(T, k, n_out)
    assert np.abs(got - want).max() < 1e-5 * np.abs(want).max()


def routed_ids(rng, T: int, k: int, n_expert: int, hot: int = 0) -> np.ndarray:
    """[T, k] distinct experts per token, as a router picks them; the first `hot` tokens all
    take expert 1 in their last slot, and expert 0 is never taken (when others are left)."""
    pool = np.arange(1 if n_expert > k else 0, n_expert)
    ids = np.stack([rng.choice(pool, k, replace=False) for _ in range(T)]).astype(np.uint32)
    for t in range(min(hot, T)):
        if 1 not in ids[t]:
            ids[t, -1] = 1
    return ids


def moe_groups_ref(ids: np.ndarray, n_expert: int) -> tuple[np.ndarray, np.ndarray]:
    """(offset, count) per expert, and each expert's slots in slot order."""
    flat = ids.reshape(-1)
    counts = np.bincount(flat, minlength=n_expert)
    offsets = np.concatenate([[0], np.cumsum(counts)[:-1]])
    return np.stack([offsets, counts], -1).astype(np.uint32), \
        np.argsort(flat, kind="stable").astype(np.uint32)


def run_moe_group(dev, kc, bi, T: int, k: int, n_expert: int):
    from engine.gpu.runstate import moe_groups_words

    groups = buf(dev, nbytes=4 * moe_groups_words(n_expert, T * k))
    perm = buf(dev, nbytes=4 * T * k)
    run_once(dev, kc, "moe_group", [bi, groups, perm], (n_expert, 1, 1), n_slots=T * k)
    return groups, perm


def moe_tiles_ref(counts: np.ndarray, bn: int) -> tuple[np.ndarray, np.ndarray]:
    """(the tiles of the experts below each, and all: n_expert + 1 starts; the list, each
    tile e | (its tile in e << 16), in expert order) for tiles of bn slots."""
    per = -(-counts.astype(np.int64) // bn)
    starts = np.concatenate([[0], np.cumsum(per)]).astype(np.uint32)
    tiles = [e | (j << 16) for e in range(len(counts)) for j in range(per[e])]
    return starts, np.array(tiles, np.uint32)


def run_grouped(dev, kc, kernel, wtype, parts, bufs, T, k, n_expert, n_in, n_out, bm, bn, spec,
                tiles=None):
    """moe_tiles for tiles of bn slots, then the grouped product `kernel` over each part of
    W ((buffer, first expert, experts)); bufs: x, groups, perm, y. tiles: workgroups along
    y (each part's most, moe_tiles_most, where None)."""
    from engine.gpu.builder import moe_tiles_most

    run_once(dev, kc, "moe_tiles", [bufs[1]], (1, 1, 1), n_expert=n_expert, bn=bn)
    for bw, first, count in parts:
        run_once(dev, kc, kernel, [bw, *bufs],
                 (-(-n_out // bm), tiles or moe_tiles_most(T, k, count, bn), 1), wtype=wtype,
                 spec=spec, n_in=n_in, n_out=n_out, n_used=k, expert_base=first,
                 n_experts=count, n_expert=n_expert)


@pytest.mark.parametrize("T,k,n_expert,hot,bn", [(1, 1, 3, 0, 4), (9, 2, 8, 9, 4),
                                                 (37, 8, 128, 30, 32), (64, 4, 60, 64, 8),
                                                 (5, 1, 512, 2, 1), (300, 8, 300, 300, 16)])
def test_moe_tiles(dev, kc, T, k, n_expert, hot, bn):
    """Every expert's tiles of bn slots listed in expert order, each expert's first tile and
    the count of all: experts with no token, one that every token takes, more experts than
    one round of the scan (256), a tile a slot. No more tiles than moe_tiles_most."""
    from engine.gpu.builder import moe_tiles_most

    rng = np.random.default_rng(30)
    ids = routed_ids(rng, T, k, n_expert, hot)
    bg, _ = run_moe_group(dev, kc, buf(dev, ids), T, k, n_expert)
    run_once(dev, kc, "moe_tiles", [bg], (1, 1, 1), n_expert=n_expert, bn=bn)
    got = read(dev, bg, np.uint32)
    counts = np.bincount(ids.reshape(-1), minlength=n_expert)
    starts, tiles = moe_tiles_ref(counts, bn)
    assert np.array_equal(got[2 * n_expert:3 * n_expert + 1], starts)
    assert np.array_equal(got[3 * n_expert + 1:][:len(tiles)], tiles)
    assert len(tiles) <= moe_tiles_most(T, k, n_expert, bn)


@pytest.mark.parametrize("T,k,n_expert,hot", [(1, 1, 3, 0), (9, 2, 8, 9), (37, 8, 128, 30),
                                              (6, 5, 5, 0), (64, 4, 60, 64), (5, 1, 512, 2)])
def test_moe_group(dev, kc, T, k, n_expert, hot):
    """Every expert's slots, in slot order, with offsets and counts: experts that get no
    token, one expert shared by many tokens, every expert taken by every token."""
    rng = np.random.default_rng(25)
    ids = routed_ids(rng, T, k, n_expert, hot)
    bi = buf(dev, ids)
    bg, bp = run_moe_group(dev, kc, bi, T, k, n_expert)
    want_groups, want_perm = moe_groups_ref(ids, n_expert)
    got_groups = read(dev, bg, np.uint32)[:2 * n_expert].reshape(n_expert, 2)
    assert np.array_equal(got_groups, want_groups)
    assert np.array_equal(read(dev, bp, np.uint32)[:T * k], want_perm)
    if n_expert > k:
        assert got_groups[0, 1] == 0 and got_groups[1, 1] >= min(hot, T)


def moe_product_ref(w: np.ndarray, x: np.ndarray, ids: np.ndarray, per_slot: bool):
    T, k = ids.shape
    return np.stack([np.stack([w[ids[t, j]] @ (x[t, j] if per_slot else x[t])
                               for j in range(k)]) for t in range(T)])


def run_mul_mat_moe(dev, kc, wtype, w_parts, bufs, n_in, n_out, k, T, n_expert, tiles=None,
                    rows=2, warps=2, nt=4, act=0, per_slot=0):
    """w_parts: (buffer, first expert, experts) per part of W; bufs: x, groups, perm, y."""
    run_grouped(dev, kc, "mul_mat_moe", wtype, w_parts, bufs, T, k, n_expert, n_in, n_out,
                rows * warps, nt, dict(WG=dev.subgroup_size * warps, ROWS=rows, NT=nt, ACT=act,
                                       X_SLOT=per_slot), tiles)


@pytest.mark.parametrize("wtype", WEIGHT_TYPES)
@pytest.mark.parametrize("per_slot", [0, 1])
def test_mul_mat_moe(dev, kc, wtype, per_slot):
    """Each expert's slots as one product: against numpy, with an expert that gets no token
    and one that most tokens share (3 tiles of 4 slots), the dispatch at the most tiles the
    routing can make and at exactly those it made (past them workgroups exit)."""
    rng = np.random.default_rng(26)
    n_expert, n_out, n_in, T, k = 6, 40, 256, 11, 3
    raw, w = quantized(wtype, n_expert * n_out, n_in, rng)
    w = w.reshape(n_expert, n_out, n_in)
    ids = routed_ids(rng, T, k, n_expert, hot=9)
    x = rng.standard_normal((T, k, n_in) if per_slot else (T, n_in)).astype(np.float32)
    bw, bx, bi = buf(dev, raw, kind="weights"), buf(dev, x), buf(dev, ids)
    bg, bp = run_moe_group(dev, kc, bi, T, k, n_expert)
    want = moe_product_ref(w, x, ids, per_slot)
    made = int((-(-np.bincount(ids.reshape(-1), minlength=n_expert) // 4)).sum())
    for tiles in (None, made):
        by = buf(dev, np.full((T, k, n_out), np.nan, np.float32))
        run_mul_mat_moe(dev, kc, wtype, [(bw, 0, n_expert)], [bx, bg, bp, by], n_in, n_out, k,
                        T, n_expert, tiles, per_slot=per_slot)
        assert nmse(read(dev, by).reshape(T, k, n_out), want) < 1e-10, tiles


def grouped_case(dev, kc, wtype, per_slot, n_out, seed, x16=False):
    """Six experts' weights of n_out rows in two parts, 70 tokens routed to 3 of them (expert
    0 by none, expert 1 by all), grouped by moe_group; the f16 reference of their products.
    Gives (parts, x (as f16 where x16), groups, perm, want, (tokens, used, n_out, n_in))."""
    rng = np.random.default_rng(seed)
    n_expert, n_in, T, k = 6, 256, 70, 3
    raw, w = quantized(wtype, n_expert * n_out, n_in, rng)
    raw = raw.reshape(-1)                          # F32's comes as rows: cut it in bytes
    ids = routed_ids(rng, T, k, n_expert, hot=T)
    x = rng.standard_normal((T, k, n_in) if per_slot else (T, n_in)).astype(np.float32)
    per_expert = raw.nbytes // n_expert
    parts = [(buf(dev, raw[:2 * per_expert], kind="weights"), 0, 2),
             (buf(dev, raw[2 * per_expert:], kind="weights"), 2, n_expert - 2)]
    bx, bi = buf(dev, x.astype(np.float16) if x16 else x), buf(dev, ids)
    bg, bp = run_moe_group(dev, kc, bi, T, k, n_expert)
    f16 = lambda a: a.astype(np.float16).astype(np.float64)      # noqa: E731
    want = moe_product_ref(f16(w).reshape(n_expert, n_out, n_in), f16(x), ids, per_slot)
    assert (ids == 1).any(axis=1).all() and not (ids == 0).any()
    return parts, bx, bg, bp, want, (T, k, n_out, n_in)


@pytest.mark.parametrize("wtype,prefetch,x16", [(t, 0, 0) for t in WEIGHT_TYPES]
                         + [("Q4_K", 1, 0), ("Q4_0", 1, 0), ("Q4_K", 0, 1), ("Q6_K", 0, 1),
                            ("Q4_0", 1, 1)])
@pytest.mark.parametrize("per_slot", [0, 1])
@pytest.mark.parametrize("tile", [(64, 32), (128, 64)])
def test_mul_mat_moe_cm(dev, kc, wtype, prefetch, x16, per_slot, tile):
    """Each expert's slots as one product on the matrix units, against numpy on f16 inputs:
    W in two parts, an expert that gets no token, one that every token takes (3 tiles of 32
    slots, 2 of 64), partial tiles of rows and of slots; the next step's loads ahead in
    registers or not (PREFETCH); x given as f16 (X16). Runs where the device has matrix
    units."""
    if not dev.coopmat:
        pytest.skip(f"{dev.name} has no 16x16x16 f16 cooperative matrices")
    bm, bn = tile
    parts, bx, bg, bp, want, (T, k, n_out, n_in) = grouped_case(dev, kc, wtype, per_slot, 80, 29,
                                                               x16=bool(x16))
    by = buf(dev, np.full((T, k, n_out), np.nan, np.float32))
    run_grouped(dev, kc, "mul_mat_moe_cm", wtype, parts, [bx, bg, bp, by], T, k, 6, n_in,
                n_out, bm, bn, dict(BM=bm, BN=bn, X_SLOT=per_slot, PREFETCH=prefetch,
                                    X16=x16))
    assert nmse(read(dev, by).reshape(T, k, n_out), want) < 1e-9


@pytest.mark.parametrize("wtype", CM2_TYPES)
@pytest.mark.parametrize("per_slot", [0, 1])
@pytest.mark.parametrize("tile", [(128, 32, 256), (64, 64, 128)])
@pytest.mark.parametrize("x16,acc16", [(0, 0), (1, 0), (1, 1)],
                         ids=["x32", "x16", "x16-f16sums"])
def test_mul_mat_moe_cm2(dev, kc, wtype, per_slot, tile, x16, acc16):
    """Each expert's slots as one product on NVIDIA's workgroup-scope matrices, x's rows
    (f32, or f16: X16) gathered inside the tile load, the sums in f32 or in f16 (ACC16:
    within 1e-4, as test_mul_mat_cm2_f16_sums), against numpy on f16 inputs: W in two
    parts, an expert that gets no token, one that every token takes (several tiles of
    slots), experts whose rows are no multiple of the tile (a tile reads into the next
    expert's), partial tiles of slots. Runs where the device has VK_NV_cooperative_matrix2
    and the kernel is compiled."""
    from engine.gpu.kernels import compiled

    if not (dev.coopmat2 and compiled("mul_mat_moe_cm2")):
        pytest.skip(f"{dev.name}: no VK_NV_cooperative_matrix2 (or mul_mat_moe_cm2 not compiled)")
    bm, bn, wg = tile
    parts, bx, bg, bp, want, (T, k, n_out, n_in) = grouped_case(dev, kc, wtype, per_slot, 200,
                                                               31, x16=bool(x16))
    by = buf(dev, np.full((T, k, n_out), np.nan, np.float32))
    run_grouped(dev, kc, "mul_mat_moe_cm2", wtype, parts, [bx, bg, bp, by], T, k, 6, n_in,
                n_out, bm, bn, dict(WG=wg, BM=bm, BN=bn, X_SLOT=per_slot, X16=x16,
                                    ACC16=acc16))
    assert nmse(read(dev, by).reshape(T, k, n_out), want) < (1e-4 if acc16 else 1e-9)


def builder_moe(dev, kc, tuning, wtype, raw, x, ids, n_expert, n_out, per_slot, parts=(1.0,)):
    """Builder.matmul_id over W [n_in, n_out, n_expert] bound in parts (fractions of the
    experts), as a model records it."""
    from engine.gpu.graph import Graph
    from engine.gpu.builder import Builder
    from engine.gpu.runstate import RunState
    from engine.gpu.tensors import Tensor

    T, k = ids.shape
    n_in, raw = x.shape[-1], raw.reshape(-1)
    rs = RunState(dev, "t", n_layer=1, n_embd=n_in, n_head=1, q_dim=n_in, kv_dim=64,
                  n_ff=n_in, n_vocab=n_out, n_ctx=16, max_tokens=T, n_expert=n_expert,
                  n_expert_used=k)
    per_expert = raw.nbytes // n_expert
    bounds = [round(f * n_expert) for f in (0.0, *parts)]
    arenas = [buf(dev, raw[a * per_expert:b * per_expert], kind="weights")
              for a, b in zip(bounds, bounds[1:])]
    t = Tensor(wtype, (n_in, n_out, n_expert),
               [(a * n_out, (b - a) * n_out, i, 0, (b - a) * per_expert)
                for i, (a, b) in enumerate(zip(bounds, bounds[1:]))], arenas)
    bx, bi = buf(dev, x), buf(dev, ids)
    by = buf(dev, np.full((T, k, n_out), np.nan, np.float32))
    g = Graph(dev, kc, "t")
    Builder(g, {}, rs, tuning).matmul_id(t, bx, bi, by, T, k, per_slot=bool(per_slot))
    g.replay()
    out = read(dev, by).reshape(T, k, n_out).copy()
    g.close()
    rs.close()
    return out


@pytest.mark.parametrize("wtype", WEIGHT_TYPES)
def test_grouped_experts_round_like_mul_mat_id(dev, kc, wtype):
    """With ggml's rounding, the grouped product rounds activations as the per-token one
    does (inline Q8_0 / Q8_1, or a quantize_act pass first), from W in two parts."""
    from dataclasses import replace

    from engine.gpu.paths import Tuning

    rng = np.random.default_rng(27)
    n_expert, n_out, n_in, T, k = 8, 24, 512, 7, 2
    raw, w = quantized(wtype, n_expert * n_out, n_in, rng)
    ids = routed_ids(rng, T, k, n_expert, hot=5)
    x = (rng.standard_normal((T, n_in)) * 4).astype(np.float32)
    base = replace(Tuning.for_device(dev), warps=2, mm_rows=2, mm_tokens=4,  # small tiles
                   ggml_numerics=True)
    per_token = builder_moe(dev, kc, replace(base, moe_grouped=False), wtype, raw, x, ids,
                            n_expert, n_out, 0)
    grouped = builder_moe(dev, kc, replace(base, moe_grouped=True), wtype, raw, x, ids,
                          n_expert, n_out, 0, parts=(0.25, 1.0))
    exact = builder_moe(dev, kc, replace(base, moe_grouped=True, ggml_numerics=False), wtype,
                        raw, x, ids, n_expert, n_out, 0)
    assert np.abs(grouped - per_token).max() <= 1e-6 * np.abs(per_token).max()
    assert nmse(exact, moe_product_ref(w.reshape(n_expert, n_out, n_in), x, ids, 0)) < 1e-10
    if wtype != "F32":                  # the rounding shows: grouped follows per_token
        assert np.abs(exact - per_token).max() > 10 * np.abs(grouped - per_token).max()


@pytest.mark.parametrize("wtype,n_in", [("Q4_K", 512), ("Q8_0", 512), ("Q8_0", 96)])
@pytest.mark.parametrize("cm2", [False, True])
def test_grouped_experts_on_the_matrix_units(dev, kc, wtype, n_in, cm2):
    """Tuning.moe_cm: a model's routed prefill products (W in two parts, a row per token and
    a row per slot) take mul_mat_moe_cm (with Tuning.coopmat2 and moe_cm2, mul_mat_moe_cm2
    for the types it decodes), x made f16 by a pass before or not (Tuning.cm2_x16), and give
    numpy's on f16 inputs; rows that are no multiple of 64 keep mul_mat_moe, exact in f32.
    Runs where prefill takes the matrix units (and for cm2, where the device has
    VK_NV_cooperative_matrix2)."""
    from dataclasses import replace

    from engine.gpu.kernels import compiled
    from engine.gpu.paths import Tuning

    base = Tuning.for_device(dev)
    if not base.fast_prefill:
        pytest.skip(f"{dev.name}: prefill is not on the matrix units")
    if cm2 and not (dev.coopmat2 and compiled("mul_mat_moe_cm2")):
        pytest.skip(f"{dev.name}: no VK_NV_cooperative_matrix2 (or its kernels not compiled)")
    rng = np.random.default_rng(30)
    n_expert, n_out, T, k = 8, 72, 40, 2
    raw, w = quantized(wtype, n_expert * n_out, n_in, rng)
    w = w.reshape(n_expert, n_out, n_in)
    ids = routed_ids(rng, T, k, n_expert, hot=T)
    f16 = (lambda a: a.astype(np.float16).astype(np.float64)) if n_in % 64 == 0 \
        else (lambda a: a.astype(np.float64))
    for x16 in (False, True):                           # x made f16 by to_f16 or not
        t = replace(base, moe_cm=True, coopmat2=cm2, moe_cm2=cm2, cm2_x16=x16)
        assert t.paths(128).moe_prefill == ("mul_mat_moe_cm2" if cm2 else "mul_mat_moe_cm")
        for per_slot in (0, 1):
            x = rng.standard_normal((T, k, n_in) if per_slot else (T, n_in)).astype(np.float32)
            got = builder_moe(dev, kc, t, wtype, raw, x, ids, n_expert, n_out, per_slot,
                              parts=(0.5, 1.0))
            want = moe_product_ref(f16(w), f16(x), ids, per_slot)
            assert nmse(got, want) < (1e-9 if n_in % 64 == 0 else 1e-10), (x16, per_slot)


def test_grouped_experts_round_like_ggml(dev, kc):
    """ACT = 2 (Q4_1 against Q8_1 activations, with the block-sum correction), per slot."""
    rng = np.random.default_rng(28)
    n_expert, n_out, n_in, T, k = 4, 32, 128, 6, 2
    raw, _ = quantized("Q4_1", n_expert * n_out, n_in, rng)
    ids = routed_ids(rng, T, k, n_expert, hot=6)
    x = (rng.standard_normal((T, k, n_in)) * 3).astype(np.float32)
    bx, bi = buf(dev, x), buf(dev, ids)
    bg, bp = run_moe_group(dev, kc, bi, T, k, n_expert)
    by = buf(dev, nbytes=4 * T * k * n_out)
    run_mul_mat_moe(dev, kc, "Q4_1", [(buf(dev, raw), 0, n_expert)], [bx, bg, bp, by], n_in,
                    n_out, k, T, n_expert, act=2, per_slot=1)
    per_expert = raw.nbytes // n_expert
    want = np.stack([np.stack([
        ggml_dot_q4_1_q8_1(raw[e * per_expert:(e + 1) * per_expert], x[t, j:j + 1], n_out,
                           n_in)[0] for j, e in enumerate(ids[t])]) for t in range(T)])
    got = read(dev, by).reshape(T, k, n_out)
    assert np.abs(got - want).max() < 1e-5 * np.abs(want).max()


def test_moe_combine(dev, kc):
    rng = np.random.default_rng(24)
    T, k, n_embd = 5, 3, 96
    y = rng.standard_normal((T, k, n_embd)).astype(np.float32)
    w = rng.uniform(0, 1, (T, k)).astype(np.float32)
    x = rng.standard_normal((T, n_embd)).astype(np.float32)
    by, bw, bx = buf(dev, y), buf(dev, w), buf(dev, x)
    run_once(dev, kc, "moe_combine", [by, bw, bx], (-(-T * n_embd // 64), 1, 1), n_embd=n_embd,
             n_used=k, n=T * n_embd)
    acc = y[:, 0] * w[:, :1]
    for j in range(1, k):
        acc = acc + y[:, j] * w[:, j:j + 1]
    assert nmse(read(dev, bx).reshape(T, n_embd), acc + x) < 1e-13


def test_moe_limits_match_glsl():
    from shaders.registry import MOE_MAX_EXPERT, MOE_MAX_USED

    assert f"MAX_EXPERT = {MOE_MAX_EXPERT};" in (SHADERS / "moe_router.comp").read_text()
    route = (SHADERS / "include" / "route.glsl").read_text()
    assert f"ROUTE_MAX_USED = {MOE_MAX_USED};" in route


@pytest.mark.parametrize("wtype", WEIGHT_TYPES)
def test_get_rows(dev, kc, wtype):
    rng = np.random.default_rng(3)
    cols = 512 if wtype in SUPER_BLOCKS else 96
    raw, w = quantized(wtype, 50, cols, rng)
    ids = np.array([3, 0, 49, 3, 17], np.uint32)
    bw, bi, bo = buf(dev, raw), buf(dev, ids), buf(dev, nbytes=4 * 5 * cols)
    run_once(dev, kc, "get_rows", [bw, bi, bo], (5, 1, 1), wtype=wtype,
             n_cols=cols, n_rows=5, scale=1.5, row_base=0, part_rows=50)
    assert nmse(read(dev, bo).reshape(5, cols), 1.5 * w[ids]) < 1e-12


def _f16_ulps(got: np.ndarray, want: np.ndarray) -> int:
    """The most f16 units in the last place between two f16 arrays (as ordered integers)."""
    def ordered(a):
        i = a.astype(np.float16).view(np.int16).astype(np.int32)
        return np.where(i < 0, -32768 - i, i)
    return int(np.abs(ordered(got) - ordered(want)).max())


@pytest.mark.parametrize("wtype", PREDECODE_TYPES)
def test_dequant_f16(dev, kc, wtype):
    """Rows row0.. of a quantized weight as f16: gguf-py's dequantized values rounded to
    f16 once (a unit in the last place at most, where its float32 arithmetic and the
    kernel's round a tie apart)."""
    rng = np.random.default_rng(41)
    cols = 512 if wtype in SUPER_BLOCKS else 96
    raw, w = quantized(wtype, 40, cols, rng)
    bw, bo = buf(dev, raw), buf(dev, nbytes=2 * 21 * cols)
    run_once(dev, kc, "dequant_f16", [bw, bo], (-(-21 * cols // 8 // 64), 1, 1), wtype=wtype,
             n_in=cols, n_rows=21, row0=7)
    got = read(dev, bo, np.float16).reshape(21, cols)
    assert _f16_ulps(got, w[7:28]) <= 1


def test_predecoded_slices_take_turns(dev, kc):
    """Builder._predecoded: a weight in two bindings of 300 rows, slices of 256 rows (1 MiB
    of f16 rows 2048 long): each binding's rows in slices, the two buffers in turn, one
    dequant_f16 each; after the pass the buffers hold the last two slices' rows."""
    from dataclasses import replace

    from engine.gpu.builder import Builder
    from engine.gpu.graph import Graph
    from engine.gpu.paths import Tuning
    from engine.gpu.runstate import RunState
    from engine.gpu.tensors import Tensor

    rng = np.random.default_rng(42)
    n_in, n_out = 2048, 600
    raw, w = quantized("Q8_0", n_out, n_in, rng)
    half = raw.nbytes // 2
    arenas = [buf(dev, raw[:half], kind="weights"), buf(dev, raw[half:], kind="weights")]
    wt = Tensor("Q8_0", (n_in, n_out), [(0, 300, 0, 0, half), (300, 300, 1, 0, half)], arenas)
    rs = RunState(dev, "t", n_layer=1, n_embd=n_in, n_head=1, q_dim=n_in, kv_dim=64,
                  n_ff=n_in, n_vocab=16, n_ctx=16, max_tokens=8)
    try:
        g = Graph(dev, kc, "t")
        slices = list(Builder(g, {}, rs, replace(Tuning.for_device(dev), predecode_mib=1))
                      ._predecoded(wt))
        a, b = rs.predecoded_a, rs.predecoded_b
        assert [(id(s), first, m) for s, first, m in slices] == \
            [(id(a), 0, 256), (id(b), 256, 44), (id(a), 300, 256), (id(b), 556, 44)]
        assert g.n_ops == 4
        g.replay()
        g.close()
        for s, first, m in slices[2:]:
            got = read(dev, s, np.float16)[:m * n_in].reshape(m, n_in)
            assert _f16_ulps(got, w[first:first + m]) <= 1
    finally:
        rs.close()


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

@pytest.mark.parametrize("lanes", [8, 32, 256])
@pytest.mark.parametrize("add", [0, 1])
@pytest.mark.parametrize("out16", [0, 1])
def test_rms_norm(dev, kc, lanes, add, out16):
    """Rows from x_offset on; ADD puts the normed rows onto out (a post-norm onto x); OUT16
    writes out's rows as f16 too, from the f16 buffer's start (the bits to_f16 gives)."""
    rng = np.random.default_rng(4)
    x = rng.standard_normal((6, 576)).astype(np.float32) * 3
    w = rng.standard_normal(576).astype(np.float32)
    o = rng.standard_normal((6, 576)).astype(np.float32)
    bx, bw, bo = buf(dev, x), buf(dev, w), buf(dev, o)
    bh = buf(dev, np.full(6 * 576, 7, np.float16))
    run_once(dev, kc, "rms_norm", [bx, bw, bo, bh], (5, 1, 1),
             spec=dict(WG=lanes, ADD=add, OUT16=out16), n_cols=576, n_rows=5, eps=1e-5,
             x_offset=1)
    want = x / np.sqrt(np.mean(x * x, axis=1, keepdims=True) + 1e-5) * w + (o if add else 0)
    got = read(dev, bo).reshape(6, 576)
    assert nmse(got[1:], want[1:]) < 1e-12 and np.array_equal(got[0], o[0])
    half = read(dev, bh, np.float16)
    if out16:
        assert np.array_equal(half[:5 * 576], got[1:].reshape(-1).astype(np.float16))
        assert np.all(half[5 * 576:] == 7)
    else:
        assert np.all(half == 7)


@pytest.mark.parametrize("gelu", [0, 1])
@pytest.mark.parametrize("out16", [0, 1, 2])
@pytest.mark.parametrize("v4", [0, 1])
def test_silu_mul(dev, kc, gelu, out16, v4):
    """act(gate) * up; OUT16: as f16 too (the bits to_f16 gives), or (2) as f16 alone, the
    f32 output untouched; V4: four values a lane, the same bits."""
    rng = np.random.default_rng(5)
    g, u = (rng.standard_normal(1000).astype(np.float32) * 4 for _ in range(2))
    bg, bu = buf(dev, g), buf(dev, u)
    bo = buf(dev, np.full(1000, 3, np.float32))
    bh = buf(dev, np.full(1008, 7, np.float16))
    run_once(dev, kc, "silu_mul", [bg, bu, bo, bh], (16 // (1 + 3 * v4), 1, 1),
             spec=dict(GELU=gelu, OUT16=out16, V4=v4), n=1000 // (1 + 3 * v4))
    if gelu:
        a = 0.5 * g * (1 + np.tanh(np.sqrt(2 / np.pi) * g * (1 + 0.044715 * g * g)))
    else:
        a = g / (1 + np.exp(-g))
    got, half = read(dev, bo), read(dev, bh, np.float16)
    if out16 == 2:
        assert np.all(got == 3)
        assert nmse(half[:1000].astype(np.float32), a * u) < 1e-6
    else:
        assert nmse(got, a * u) < 1e-12
        assert np.array_equal(half[:1000], got.astype(np.float16)) if out16 \
            else np.all(half[:1000] == 7)
    assert np.all(half[1000:] == 7)


def test_silu_mul_gives_the_same_bits_four_values_a_lane(dev, kc):
    """V4's 16-byte loads change no bit of any mode's output (SwiGLU, GeGLU, gpt-oss's)."""
    rng = np.random.default_rng(15)
    g, u = (rng.standard_normal(4096).astype(np.float32) * 6 for _ in range(2))
    bg, bu = buf(dev, g), buf(dev, u)
    for spec in (dict(), dict(GELU=1), dict(CLAMPED=1), dict(GATED=0, GELU=1)):
        outs = []
        for v4 in (0, 1):
            bo, bh = buf(dev, nbytes=g.nbytes), buf(dev, nbytes=g.nbytes // 2)
            run_once(dev, kc, "silu_mul", [bg, bu, bo, bh], (64 // (1 + 3 * v4), 1, 1),
                     spec=dict(spec, OUT16=1, V4=v4), n=4096 // (1 + 3 * v4))
            outs.append((read(dev, bo), read(dev, bh, np.float16)))
        assert np.array_equal(outs[0][0], outs[1][0]), spec
        assert np.array_equal(outs[0][1], outs[1][1]), spec


def test_add(dev, kc):
    rng = np.random.default_rng(6)
    a, b = (rng.standard_normal(300).astype(np.float32) for _ in range(2))
    ba, bb, bo = buf(dev, a), buf(dev, b), buf(dev, nbytes=a.nbytes)
    run_once(dev, kc, "add", [ba, bb, bo], (5, 1, 1), n=300, b_len=300, scale=1.0)
    assert np.array_equal(read(dev, bo), a + b)


def test_scaled_add_and_scale_round_as_ggml(dev, kc):
    """out = a + fl(s * b), the product rounded before the sum (ggml_scale, then ggml_add:
    no fused multiply-add); x *= s in place."""
    rng = np.random.default_rng(11)
    a, b = (rng.standard_normal(4096).astype(np.float32) for _ in range(2))
    s = np.float32(0.22)
    ba, bb, bo = buf(dev, a), buf(dev, b), buf(dev, nbytes=a.nbytes)
    run_once(dev, kc, "add", [ba, bb, bo], (64, 1, 1), n=4096, b_len=4096, scale=float(s))
    assert np.array_equal(read(dev, bo), a + s * b)
    run_once(dev, kc, "scale", [bb], (64, 1, 1), n=4096, scale=float(s))
    assert np.array_equal(read(dev, bb), b * s)


def test_add_bias_to_every_row(dev, kc):
    rng = np.random.default_rng(7)
    x = rng.standard_normal((5, 60)).astype(np.float32)
    bias = rng.standard_normal(60).astype(np.float32)
    bx, bb = buf(dev, x), buf(dev, bias)
    run_once(dev, kc, "add", [bx, bb, bx], (5, 1, 1), n=300, b_len=60, scale=1.0)
    assert np.array_equal(read(dev, bx).reshape(5, 60), x + bias)


@pytest.mark.parametrize("lanes", [1, 4, 32])
@pytest.mark.parametrize("ties", [(1234, 40000), (40001, 1235)])
def test_argmax_lowest_index_on_ties(dev, kc, lanes, ties):
    x = np.random.default_rng(7).standard_normal(49152).astype(np.float32)
    x[list(ties)] = 9.0
    bx, bo = buf(dev, x), buf(dev, nbytes=4)
    run_once(dev, kc, "argmax", [bx, bo], (1, 1, 1), spec=dict(WG=dev.subgroup_size * lanes),
             n=49152, x_offset=0)
    assert read(dev, bo, np.uint32)[0] == min(ties)


@pytest.mark.parametrize("lanes", [1, 32])
@pytest.mark.parametrize("poison", ["nan", "inf", "nan_at_end", "all_minus_inf", "minus_inf"])
def test_argmax_says_when_logits_are_not_finite(dev, kc, lanes, poison):
    """NaN or +inf anywhere, or nothing above -inf, gives 0xFFFFFFFF (the host stops the
    request); a -inf among finite logits is an ordinary low logit."""
    x = np.random.default_rng(8).standard_normal(49152).astype(np.float32)
    x[777] = 9.0
    if poison == "nan":
        x[123] = np.nan
    elif poison == "inf":
        x[40000] = np.inf
    elif poison == "nan_at_end":
        x[-1] = np.nan
    elif poison == "all_minus_inf":
        x[:] = -np.inf
    else:
        x[5:900:7] = -np.inf
    bx, bo = buf(dev, x), buf(dev, nbytes=4)
    run_once(dev, kc, "argmax", [bx, bo], (1, 1, 1), spec=dict(WG=dev.subgroup_size * lanes),
             n=49152, x_offset=0)
    want = 777 if poison == "minus_inf" else 0xFFFFFFFF
    assert read(dev, bo, np.uint32)[0] == want


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
    run_once(dev, kc, "attention", [bq, bk, bv, bo, st, bq], (n_head, n_tok, 1),
             spec=dict(HD=hd), n_head=n_head, n_head_kv=n_kv, n_tokens=n_tok, window=window,
             scale=scale, softcap=0.0)
    want = attention_ref(q, k, v, pos0, window, scale)
    assert nmse(read(dev, bo).reshape(q.shape), want) < 1e-10


@pytest.mark.parametrize("hd", [64, 128, 256])
@pytest.mark.parametrize("n_tok,pos0,window", [(70, 0, 0), (100, 37, 0), (130, 20, 48),
                                               (5, 90, 0)])
def test_flash_attention_on_matrix_units(dev, kc, hd, n_tok, pos0, window):
    """flash_attn_cm against the float64 reference on the same f16 K and V, with q rounded to
    f16 as the kernel takes it; P goes through f16 too, hence 1e-5 rather than 1e-10. Heads
    of 256 where the device's shared memory holds their K and V blocks."""
    from engine.gpu.paths import fa_cm_shared_bytes

    if not dev.coopmat:
        pytest.skip(f"{dev.name} has no 16x16x16 f16 cooperative matrices")
    if fa_cm_shared_bytes(hd) > dev.max_shared:
        pytest.skip(f"{dev.name}: {dev.max_shared} bytes of shared memory, heads of {hd} "
                    f"take {fa_cm_shared_bytes(hd)}")
    rng = np.random.default_rng(24)
    n_ctx, n_head, n_kv = pos0 + n_tok + 3, 8, 2
    k = rng.standard_normal((n_ctx, n_kv, hd)).astype(np.float16)
    v = rng.standard_normal((n_ctx, n_kv, hd)).astype(np.float16)
    q = rng.standard_normal((n_tok, n_head, hd)).astype(np.float32)
    bq, bk, bv = buf(dev, q), buf(dev, k), buf(dev, v)
    bo = buf(dev, nbytes=q.nbytes)
    st = step_buffer(dev, pos0, pos0 + n_tok)
    scale = hd ** -0.5
    run_once(dev, kc, "flash_attn_cm", [bq, bk, bv, bo, st, bq], (-(-n_tok // 64), n_head, 1),
             spec=dict(HD=hd), n_head=n_head, n_head_kv=n_kv, n_tokens=n_tok, window=window,
             scale=scale, softcap=0.0)
    want = attention_ref(q.astype(np.float16).astype(np.float32), k, v, pos0, window, scale)
    assert nmse(read(dev, bo).reshape(q.shape), want) < 1e-5


def attention_ref_full(q, k, v, pos0, window, scale, softcap=0.0, sinks=None, bidir=False):
    """attention_ref with flash_attn_cm's options: scores capped at softcap * tanh(s /
    softcap), a sink logit per head in the softmax's sum, every key seen (bidir)."""
    n_tok, n_head, hd = q.shape
    group = n_head // k.shape[1]
    out = np.zeros_like(q, dtype=np.float64)
    for t in range(n_tok):
        pos = pos0 + t
        hi = k.shape[0] - 1 if bidir else pos
        lo = pos - window + 1 if window and pos >= window and not bidir else 0
        for h in range(n_head):
            s = k[lo:hi + 1, h // group].astype(np.float64) @ q[t, h].astype(np.float64) * scale
            if softcap:
                s = softcap * np.tanh(s / softcap)
            top = max(s.max(), sinks[h]) if sinks is not None else s.max()
            e = np.exp(s - top)
            total = e.sum() + (np.exp(sinks[h] - top) if sinks is not None else 0.0)
            out[t, h] = (e / total) @ v[lo:hi + 1, h // group].astype(np.float64)
    return out


@pytest.mark.parametrize("hd", [64, 128])
@pytest.mark.parametrize("n_tok,pos0,window,opts", [
    (70, 0, 0, ""), (100, 37, 0, ""), (130, 20, 48, ""), (5, 90, 0, ""), (200, 64, 0, ""),
    (90, 10, 0, "softcap"), (80, 30, 0, "sinks"), (70, 0, 0, "bidir")])
@pytest.mark.parametrize("tile", [(64, 64, 128), (64, 32, 128), (128, 64, 256)])
def test_flash_attention_on_workgroup_scope_matrices(dev, kc, hd, n_tok, pos0, window, opts,
                                                     tile):
    """flash_attn_cm2 against the float64 reference on the same f16 K and V with q rounded to
    f16 as the kernel takes it (P through f16 too: 1e-5): partial tiles of rows and keys,
    blocks wholly seen (the scale alone) and blocks on the diagonal or the window's edge
    (masked element by element), soft-capped scores, a sink per head, keys seen both ways.
    Runs where the device has VK_NV_cooperative_matrix2."""
    from engine.gpu.kernels import compiled

    if not (dev.coopmat2 and compiled("flash_attn_cm2")):
        pytest.skip(f"{dev.name}: no VK_NV_cooperative_matrix2 (or flash_attn_cm2 not compiled)")
    rng = np.random.default_rng(25)
    n_ctx, n_head, n_kv = pos0 + n_tok + 3, 8, 2
    k = rng.standard_normal((n_ctx, n_kv, hd)).astype(np.float16)
    v = rng.standard_normal((n_ctx, n_kv, hd)).astype(np.float16)
    q = (rng.standard_normal((n_tok, n_head, hd)) * 2).astype(np.float32)
    sinks = rng.standard_normal(n_head).astype(np.float32) * 3
    softcap = 5.0 if opts == "softcap" else 0.0
    bidir = opts == "bidir"
    bq, bk, bv, bs = buf(dev, q), buf(dev, k), buf(dev, v), buf(dev, sinks)
    bo = buf(dev, nbytes=q.nbytes)
    st = buf(dev, np.frombuffer(pack_step(pos0, pos0 + n_tok, bidir), np.uint8))
    scale = hd ** -0.5
    br, bc, wg = tile
    run_once(dev, kc, "flash_attn_cm2", [bq, bk, bv, bo, st, bs], (-(-n_tok // br), n_head, 1),
             spec=dict(WG=wg, HD=hd, BR=br, BC=bc, SINKS=int(opts == "sinks")),
             n_head=n_head, n_head_kv=n_kv, n_tokens=n_tok, window=window, scale=scale,
             softcap=softcap)
    want = attention_ref_full(q.astype(np.float16).astype(np.float32),
                              k[:pos0 + n_tok], v[:pos0 + n_tok], pos0, window, scale,
                              softcap, sinks if opts == "sinks" else None, bidir)
    assert nmse(read(dev, bo).reshape(q.shape), want) < 1e-5


# -- llama.cpp CPU numerics -------------------------------------------------------------------

def ggml_dot_q4_1_q8_1(raw: np.ndarray, x: np.ndarray, n_out: int, n_in: int) -> np.ndarray:
    """ggml's Q4_1 x Q8_1 dot: integer sums per block, scaled by the f16 d's, plus m * s."""
    xb = x.reshape(len(x), -1, 32)
    amax = np.abs(xb).max(-1, keepdims=True)
    d = amax / np.float32(127)
    q = np.rint(xb * (np.float32(127) / amax))
    dh = d.astype(np.float16).astype(np.float32)[..., 0]
    s = (d[..., 0] * q.sum(-1)).astype(np.float16).astype(np.float32)
    blk = raw.reshape(n_out, n_in // 32, 20)
    dw = blk[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float32)
    mw = blk[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float32)
    qw = np.concatenate([blk[..., 4:] & 15, blk[..., 4:] >> 4], -1).astype(np.float32)
    sumi = np.einsum("obj,tbj->tob", qw, q)
    return (dw[None] * dh[:, None, :] * sumi).sum(-1) + (mw[None] * s[:, None, :]).sum(-1)


def test_quantized_activations_match_ggml_dot(dev, kc):
    from dataclasses import replace

    from engine.gpu.graph import Graph
    from engine.gpu.builder import Builder
    from engine.gpu.paths import Tuning
    from engine.gpu.runstate import RunState
    from engine.gpu.tensors import Tensor

    rng = np.random.default_rng(13)
    n_in, n_out, T = 576, 96, 3
    raw, _ = quantized("Q4_1", n_out, n_in, rng)
    x = (rng.standard_normal((T, n_in)) * 3).astype(np.float32)
    want = ggml_dot_q4_1_q8_1(raw, x, n_out, n_in)
    rs = RunState(dev, "t", n_layer=1, n_embd=n_in, n_head=1, q_dim=n_in, kv_dim=64,
                  n_ff=n_in, n_vocab=n_out, n_ctx=16, max_tokens=8)
    bw, bx, by = buf(dev, raw), buf(dev, x), buf(dev, nbytes=4 * T * n_out)
    w = Tensor("Q4_1", (n_in, n_out), [(0, n_out, 0, 0, raw.nbytes)], [bw])
    for n, x_row, rows in ((T, 0, slice(None)), (1, T - 1, slice(T - 1, T))):
        g = Graph(dev, kc, "t")
        tuning = replace(Tuning.for_device(dev), ggml_numerics=True, coopmat=False)
        Builder(g, {}, rs, tuning).matmul(w, bx, by, n, x_row=x_row)
        g.replay()
        got = read(dev, by)[: n * n_out].reshape(n, n_out)
        g.close()
        assert np.abs(got - want[rows]).max() < 1e-5 * np.abs(want).max()
    rs.close()


def test_activation_tables_follow_ggml_vec_dot_types():
    """Each weight type's rounding in every path (mul_mat inline or through quantize_act,
    mul_mat_vec) is its vec_dot_type in ggml-cpu (reference.VEC_DOT); K-blocked types take
    256-weight rows in quarters."""
    from tests.helpers.reference import VEC_DOT
    from engine.gpu.kernels import ACT_FORMAT, ACT_INLINE, MATVEC_ACT, MATVEC_CHUNK

    inline, fmt = {1: "Q8_0", 2: "Q8_1"}, {0: "Q8_0", 2: "Q8_K", 3: "F16", 4: "BF16", None: "F32"}
    matvec = {0: "F32", 1: "Q8_0", 2: "Q8_1", 3: "Q8_K", 4: "F16", 5: "BF16"}
    for t in WEIGHT_TYPES:
        plain = inline[ACT_INLINE[t]] if t in ACT_INLINE else fmt[ACT_FORMAT[t]]
        assert plain == matvec[MATVEC_ACT[t]] == VEC_DOT[t], t
        assert MATVEC_CHUNK[t] == (64 if t in SUPER_BLOCKS else 32)


def test_iq_grids_are_gguf_pys():
    """include/iq_grids.glsl is what shaders/iq_grids.py writes from gguf-py's tables."""
    from shaders import iq_grids

    assert (SHADERS / "include" / "iq_grids.glsl").read_text() == iq_grids.render()
    # ggml's iq2xxs_grid[0..1] = 0x0808080808080808, 0x080808080808082b: 2-bit codes 0, then
    # a 2 first; iq3s_grid[1] = 0x01010103
    assert iq_grids.grid_words("IQ2_XXS")[0] == 2 << 16
    assert iq_grids.grid_words("IQ3_S")[1] == 0x01010103


def ggml_cpu_product(wtype: str, raw: np.ndarray, w: np.ndarray, x: np.ndarray) -> np.ndarray:
    """x @ w.T as ggml's CPU backend computes it: x rounded to the weight type's vec_dot_type
    (tests/helpers/reference.py's table and formats), Q8_1's block sums s = fp16(d * sum q)
    multiplying the Q4_1 / Q5_1 block minimums."""
    from tests.helpers import reference as ref

    act = ref.VEC_DOT[wtype]
    if act != "Q8_1":
        rounded = {"F32": lambda a: a, "F16": ref._f16, "BF16": ref._bf16, "Q8_0": ref._q8_0,
                   "Q8_K": ref._q8_k}[act](x)
        return rounded.astype(np.float64) @ w.T.astype(np.float64)
    xq, s = ref._q8_1(x)
    blk = raw.reshape(w.shape[0], w.shape[1] // 32, -1)
    mins = blk[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float64)
    exact = xq.reshape(*s.shape, 32).sum(-1)
    return xq.astype(np.float64) @ w.T.astype(np.float64) + (s - exact) @ mins.T


def act_step(x: np.ndarray, fmt: int) -> np.ndarray:
    """[T, n] one rounding step of each activation in mul_mat_vec's ACT format (1 Q8_0, 2
    Q8_1: blocks of 32; 3 Q8_K: of 256; 4 F16; 5 BF16, integer arithmetic: exact; 0 F32)."""
    if fmt in (1, 2, 3):
        block = 256 if fmt == 3 else 32
        xb = np.abs(x).reshape(x.shape[0], -1, block).max(axis=-1, keepdims=True) / 127
        return np.broadcast_to(xb, (x.shape[0], x.shape[1] // block, block)).reshape(x.shape)
    if fmt == 4:
        return np.abs(x) * 2.0 ** -10
    return np.zeros_like(x)


@pytest.mark.parametrize("wtype", WEIGHT_TYPES)
def test_products_round_like_ggml_cpu(dev, kc, wtype):
    """With ggml_numerics, every product path (prefill mul_mat, one-token mul_mat_vec and
    mul_mat, the routed experts per token and grouped) against numpy's ggml CPU product."""
    from dataclasses import replace

    from engine.gpu.graph import Graph
    from engine.gpu.builder import Builder
    from engine.gpu.kernels import MATVEC_ACT
    from engine.gpu.paths import Tuning
    from engine.gpu.runstate import RunState
    from engine.gpu.tensors import Tensor

    rng = np.random.default_rng(31)
    n_in, n_out, T = 512, 40, 3
    raw, w = quantized(wtype, n_out, n_in, rng)
    x = (rng.standard_normal((T, n_in)) * 3).astype(np.float32)
    want = ggml_cpu_product(wtype, raw, w, x)
    base = replace(Tuning.for_device(dev), ggml_numerics=True, coopmat=False)
    rs = RunState(dev, "t", n_layer=1, n_embd=n_in, n_head=1, q_dim=n_in, kv_dim=64,
                  n_ff=n_in, n_vocab=n_out, n_ctx=16, max_tokens=8)
    bw, bx, by = buf(dev, raw), buf(dev, x), buf(dev, nbytes=4 * T * n_out)
    t = Tensor(wtype, (n_in, n_out), [(0, n_out, 0, 0, raw.nbytes)], [bw])
    # lavapipe divides and converts as IEEE says: ggml's bits. Vulkan lets '/' be 2.5 ulp
    # off and drivers convert to f16 their own way (NVIDIA's does): an activation may land
    # one rounding step away, which moves a product by at most |w| times that step
    def bound(w_, x_, want_) -> float:
        exact = 1e-5 * np.abs(want_).max()
        if dev.info.kind == "cpu":
            return exact
        return (np.abs(w_).astype(np.float64) @ act_step(x_, MATVEC_ACT[wtype]).T).max() + exact

    for matvec, n, x_row in ((False, T, 0), (True, 1, T - 1), (False, 1, T - 1)):
        g = Graph(dev, kc, "t")
        Builder(g, {}, rs, replace(base, matvec=matvec)).matmul(t, bx, by, n, x_row=x_row)
        g.replay()
        got = read(dev, by)[: n * n_out].reshape(n, n_out)
        g.close()
        err = np.abs(got - want[x_row:x_row + n]).max()
        assert err < bound(w, x, want), (matvec, n, err)
    rs.close()
    if wtype not in ("F32", "F16"):      # the rounding shows against the unrounded product
        assert np.abs(x @ w.T - want).max() > 10 * err
    # routed experts: expert e's rows are w[e * n_out / 4 ...]
    n_expert, k = 4, 2
    ids = routed_ids(rng, T, k, n_expert, hot=2)
    we = w.reshape(n_expert, n_out // n_expert, n_in)
    re = raw.reshape(n_expert, -1)
    xs = (rng.standard_normal((T, k, n_in)) * 3).astype(np.float32)       # a row per slot
    for per_slot, xx in ((0, x), (1, xs)):
        want = np.stack([np.stack([
            ggml_cpu_product(wtype, re[e], we[e], (xx[t, j] if per_slot else xx[t])[None])[0]
            for j, e in enumerate(ids[t])]) for t in range(T)])
        most = max(bound(we[e], (xx[t, j] if per_slot else xx[t])[None], want)
                   for t in range(T) for j, e in enumerate(ids[t]))
        for grouped in (False, True):
            got = builder_moe(dev, kc, replace(base, moe_grouped=grouped), wtype, raw, xx, ids,
                              n_expert, n_out // n_expert, per_slot)
            assert np.abs(got - want).max() < most, (per_slot, grouped)


def test_to_f16_rounds_to_nearest_even_from_a_row_offset(dev, kc):
    """to_f16 (mul_mat_cm2's x as f16 tiles): x's rows from x_offset on, each value the f16
    numpy rounds it to, the halves after them untouched."""
    rng = np.random.default_rng(31)
    x = (rng.standard_normal((5, 384)) * np.logspace(-6, 4, 384)).astype(np.float32)
    bx, bo = buf(dev, x), buf(dev, np.full(4 * 384 + 8, 7, np.float16))
    run_once(dev, kc, "to_f16", [bx, bo], (-(-4 * 384 // 256), 1, 1), n=4 * 384,
             x_offset=384 // 4)
    got = read(dev, bo, np.float16)
    assert np.array_equal(got[:4 * 384].view(np.uint16),
                          x[1:].astype(np.float16).reshape(-1).view(np.uint16))
    assert np.all(got[4 * 384:] == 7)


def test_f16_input_is_made_once_for_the_products_of_one_x(dev, kc):
    """Builder._f16_input: the products reading the same rows of x share one to_f16 pass (q,
    k and v; gate and up); other rows, or x written since, take a new one, whose values
    follow x's."""
    from engine.gpu.builder import Builder
    from engine.gpu.graph import Graph
    from engine.gpu.paths import Tuning
    from engine.gpu.runstate import RunState

    rng = np.random.default_rng(32)
    x = rng.standard_normal((6, 256)).astype(np.float32)
    rs = RunState(dev, "t", n_layer=1, n_embd=256, n_head=1, q_dim=256, kv_dim=64, n_ff=256,
                  n_vocab=16, n_ctx=16, max_tokens=8)
    bx = buf(dev, x)
    g = Graph(dev, kc, "t")
    b = Builder(g, {}, rs, Tuning.for_device(dev))
    assert b._f16_input(bx, 1, 4, 256) is rs.xq
    b._f16_input(bx, 1, 4, 256)
    assert g.n_ops == 1                                  # the same rows: the same pass
    b._f16_input(bx, 0, 4, 256)
    assert g.n_ops == 2                                  # other rows: a pass of their own
    g.op("scale", [bx], (-(-x.size // 64), 1, 1), n=x.size, scale=2.0)
    b._f16_input(bx, 0, 4, 256)
    assert g.n_ops == 4                                  # x written since: again
    g.replay()
    got = read(dev, rs.xq, np.float16)[:4 * 256].reshape(4, 256)
    assert np.array_equal(got, (2 * x[:4]).astype(np.float16))
    g.close()
    rs.close()


def test_a_norm_and_a_glu_give_their_products_f16_inputs_in_the_same_pass(dev, kc):
    """Where the products load x as f16 tiles (mul_mat_cm2's X16), rms_norm and the GLU
    before the down product write their output as f16 too: the products' _f16_input then
    records no to_f16 pass, and rs.xq holds what to_f16 would have made (the GLU's f16
    alone where asked, its f32 output left as it was). A one-token step,
    a norm at a row offset or onto x, and a pass of another path do not."""
    from dataclasses import replace

    from engine.gpu.builder import Builder
    from engine.gpu.graph import Graph
    from engine.gpu.paths import Tuning
    from engine.gpu.runstate import RunState
    from engine.gpu.tensors import Tensor

    rng = np.random.default_rng(36)
    n, d = 6, 256
    x = rng.standard_normal((n, d)).astype(np.float32)
    u = rng.standard_normal((n, d)).astype(np.float32)
    w = rng.standard_normal(d).astype(np.float32)
    rs = RunState(dev, "t", n_layer=1, n_embd=d, n_head=1, q_dim=d, kv_dim=64, n_ff=d,
                  n_vocab=16, n_ctx=16, max_tokens=8)
    bx, bu, bout = buf(dev, x), buf(dev, u), buf(dev, nbytes=x.nbytes)
    norm = Tensor("F32", (d,), [(0, d, 0, 0, 4 * d)], [buf(dev, w, kind="weights")])
    base = replace(Tuning.for_device(dev), coopmat=True, coopmat2=True, cm2_x16=True,
                   ggml_numerics=False)
    assert base.paths(64).prefill_matmul == "mul_mat_cm2"
    try:
        for t, fused in ((base, True), (replace(base, cm2_x16=False), False),
                         (replace(base, coopmat2=False), False)):
            g = Graph(dev, kc, "t")
            b = Builder(g, {}, rs, t)
            b.rms_norm(bx, norm, bout, n, 1e-5)
            ops = g.n_ops
            b._f16_input(bout, 0, n, d)
            assert (g.n_ops == ops) == fused
            g.replay()
            normed = read(dev, bout)[:n * d]
            assert np.array_equal(read(dev, rs.xq, np.float16)[:n * d],
                                  normed.astype(np.float16))
            b.silu_mul(bx, bu, bout, n * d, rows=n)
            ops = g.n_ops
            b._f16_input(bout, 0, n, d)
            assert (g.n_ops == ops) == fused
            g.replay()
            glu = read(dev, bout)[:n * d]
            assert np.array_equal(read(dev, rs.xq, np.float16)[:n * d],
                                  glu.astype(np.float16))
            if fused:       # f16 alone: the same f16, out's f32 values as they were
                b.rms_norm(bx, norm, bout, n, 1e-5)
                b.silu_mul(bx, bu, bout, n * d, rows=n, f16_only=True)
                ops = g.n_ops
                b._f16_input(bout, 0, n, d)
                assert g.n_ops == ops
                g.replay()
                assert np.array_equal(read(dev, rs.xq, np.float16)[:n * d],
                                      glu.astype(np.float16))
                assert np.array_equal(read(dev, bout)[:n * d], normed)
            for step in (lambda: b.rms_norm(bx, norm, bout, 1, 1e-5),
                         lambda: b.rms_norm(bx, norm, bout, 1, 1e-5, row_offset=2),
                         lambda: b.rms_norm(bx, norm, bout, n, 1e-5, add=True),
                         lambda: b.silu_mul(bx, bu, bout, n * d)):
                step()
                ops = g.n_ops
                b._f16_input(bout, 0, 1, d)
                assert g.n_ops == ops + 1                # a to_f16 pass of its own
            g.close()
    finally:
        rs.close()


@pytest.mark.parametrize("fmt", [0, 2, 3, 4])
def test_quantize_act_formats(dev, kc, fmt):
    rng = np.random.default_rng(14)
    x = (rng.standard_normal((2, 512)) * 5).astype(np.float32)
    bx, bo = buf(dev, x), buf(dev, nbytes=x.nbytes)
    run_once(dev, kc, "quantize_act", [bx, bo], (1 if fmt == 2 else 8, 1, 1),
             spec=dict(FMT=fmt), n_cols=512, n_rows=2, x_offset=0)
    if fmt == 0:
        b = x.reshape(2, -1, 32)
        amax = np.abs(b).max(-1, keepdims=True)
        want = np.rint(b * (np.float32(127) / amax)) * (amax / 127).astype(np.float16)
    elif fmt == 2:
        b = x.reshape(2, -1, 256)
        mx = np.take_along_axis(b, np.abs(b).argmax(-1)[..., None], -1)
        iscale = np.float32(-127) / mx
        want = np.minimum(np.rint(iscale * b), 127) * (np.float32(1) / iscale)
    elif fmt == 3:
        want = x.astype(np.float16)
    else:                            # bf16: round to nearest even on the top 16 bits
        u = x.view(np.uint32).astype(np.uint64)
        want = ((u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000).astype(np.uint32).view(np.float32)
    got, want = read(dev, bo).reshape(2, 512), want.reshape(2, 512).astype(np.float32)
    # ggml's bits exactly, on every device: the kernel divides and converts to f16 by
    # explicit rounding (round.glsl), not by the driver's '/' and conversions
    assert np.array_equal(got, want)


def attention_ggml_ref(q, k, v, pos0, window, scale):
    """ggml's CPU attention: q rounded to f16, softmax in f32, probabilities rounded to f16."""
    n_tok, n_head, hd = q.shape
    group = n_head // k.shape[1]
    qh = q.astype(np.float16).astype(np.float32)
    out = np.zeros_like(q)
    for t in range(n_tok):
        pos = pos0 + t
        lo = pos - window + 1 if window and pos >= window else 0
        for h in range(n_head):
            s = (k[lo:pos + 1, h // group].astype(np.float32) @ qh[t, h]) * np.float32(scale)
            p = np.exp(s - s.max())
            p = (p / p.sum()).astype(np.float16).astype(np.float32)
            out[t, h] = p @ v[lo:pos + 1, h // group].astype(np.float32)
    return out


def test_attention_ggml_rounding(dev, kc):
    rng = np.random.default_rng(16)
    n_ctx, n_head, n_kv, n_tok, pos0, hd = 40, 6, 2, 4, 20, 64
    k = rng.standard_normal((n_ctx, n_kv, hd)).astype(np.float16)
    v = rng.standard_normal((n_ctx, n_kv, hd)).astype(np.float16)
    q = rng.standard_normal((n_tok, n_head, hd)).astype(np.float32)
    bq, bk, bv = buf(dev, q), buf(dev, k), buf(dev, v)
    bo, st = buf(dev, nbytes=q.nbytes), step_buffer(dev, pos0)
    scale = hd ** -0.5
    run_once(dev, kc, "attention", [bq, bk, bv, bo, st, bq], (n_head, n_tok, 1),
             spec=dict(HD=hd, GGML=1), n_head=n_head, n_head_kv=n_kv, n_tokens=n_tok,
             window=0, scale=scale, softcap=0.0)
    want = attention_ggml_ref(q, k, v, pos0, 0, scale)
    err = np.abs(read(dev, bo).reshape(q.shape) - want).max()
    if dev.info.kind == "cpu":      # IEEE exp: ggml's rounding to the last bits
        assert err < 1e-5
    else:
        # a GPU's exp may be an ulp or two off (Vulkan allows it), which can round a
        # probability to the f16 next to ggml's: at most 2^-10 of p each, so the output
        # moves by at most 2^-10 * sum(p * |v|) <= 2^-10 * max|v|
        assert err <= 2.0 ** -10 * np.abs(v).max()


@pytest.mark.parametrize("neox", [0, 1])
@pytest.mark.parametrize("table", [0, 1])
def test_rope_qkv_fused(dev, kc, neox, table):
    from engine.gpu.runstate import RunState

    rng = np.random.default_rng(17)
    n_tok, n_head, n_kv, hd, pos0, n_ctx = 3, 6, 2, 64, 7, 16
    q = rng.standard_normal((n_tok, n_head, hd)).astype(np.float32)
    k = rng.standard_normal((n_tok, n_kv, hd)).astype(np.float32)
    v = rng.standard_normal((n_tok, n_kv, hd)).astype(np.float32)
    rs = RunState(dev, "t", n_layer=1, n_embd=64, n_head=1, q_dim=64, kv_dim=64, n_ff=64,
                  n_vocab=64, n_ctx=n_ctx, max_tokens=8, rope=(Rope(1e4, hd),))
    rs.set_step([0] * n_tok, pos0)
    bq, bk, bv = buf(dev, q), buf(dev, k), buf(dev, v)
    kc_, vc_ = (buf(dev, np.zeros((n_ctx, n_kv, hd), np.float16)) for _ in range(2))
    count = n_tok * ((n_head + n_kv) * hd // 2 + n_kv * hd)
    run_once(dev, kc, "rope_qkv", [bq, bk, bv, kc_, vc_, rs.step,
                                    rs.rope_table(Rope(1e4, hd)), bq, bq],
             (-(-count // 64), 1, 1), spec=dict(NEOX=neox, TABLE=table), n_head=n_head,
             n_head_kv=n_kv, head_dim=hd, n_dims=hd, n_tokens=n_tok, freq_base=1e4,
             freq_scale=1.0, temp_scale=0.0, temp_floor=1, eps=0.0)
    assert nmse(read(dev, bq).reshape(q.shape), rope_ref(q, pos0, hd, 1e4, bool(neox))) < 1e-11
    kk = read(dev, kc_, np.float16).reshape(n_ctx, n_kv, hd).astype(np.float32)
    assert nmse(kk[pos0:pos0 + n_tok], rope_ref(k, pos0, hd, 1e4, bool(neox))) < 1e-6
    vv = read(dev, vc_, np.float16).reshape(n_ctx, n_kv, hd)
    assert np.array_equal(vv[pos0:pos0 + n_tok], v.astype(np.float16))
    assert not kk[:pos0].any() and not vv[pos0 + n_tok:].any()
    rs.close()


@pytest.mark.parametrize("n_dims", [64, 32])
def test_rope_qkv_attention_temperature(dev, kc, n_dims):
    """TEMP: q times 1 + s ln(1 + floor(pos / floor_scale)) after its rotation, every dim of
    it (the unrotated ones too); k and v as without it. Positions 5..12 over a floor scale of
    4 cross three steps of the factor."""
    from engine.gpu.builder import Builder
    from engine.gpu.graph import Graph
    from engine.gpu.paths import Tuning
    from engine.gpu.rope import rope_table
    from engine.gpu.runstate import RunState

    rng = np.random.default_rng(19)
    n_tok, n_head, n_kv, hd, pos0, n_ctx, s, floor = 8, 4, 2, 64, 5, 16, 0.5, 4
    q = rng.standard_normal((n_tok, n_head, hd)).astype(np.float32)
    k = rng.standard_normal((n_tok, n_kv, hd)).astype(np.float32)
    v = rng.standard_normal((n_tok, n_kv, hd)).astype(np.float32)
    rope = Rope(1e4, n_dims, freq_scale=0.5)
    rs = RunState(dev, "t", n_layer=1, n_embd=64, n_head=n_head, q_dim=n_head * hd,
                  kv_dim=n_kv * hd, n_ff=64, n_vocab=64, n_ctx=n_ctx, max_tokens=n_tok,
                  rope=(rope,))
    rs.set_step([0] * n_tok, pos0)
    bq, bk, bv = buf(dev, q), buf(dev, k), buf(dev, v)
    kc_, vc_ = (buf(dev, np.zeros((n_ctx, n_kv, hd), np.float16)) for _ in range(2))
    g = Graph(dev, kc, "t")
    Builder(g, {}, rs, Tuning.for_device(dev)).rope_qkv(
        bq, bk, bv, kc_, vc_, n_head, n_kv, hd, n_tok, rope, neox=False, temp_scale=s,
        temp_floor=floor)
    g.replay()
    pos = np.arange(pos0, pos0 + n_tok)
    temp = 1 + s * np.log(1 + np.floor(pos / floor))
    assert len(set(temp)) == 3
    cs = rope_table(n_ctx, rope)[pos]                                    # [n_tok, n_dims/2, 2]

    def rotated(x):
        out = x.astype(np.float64).copy()
        a, b = x[..., 0:n_dims:2], x[..., 1:n_dims:2]
        c, sn = cs[:, None, :, 0], cs[:, None, :, 1]
        out[..., 0:n_dims:2], out[..., 1:n_dims:2] = a * c - b * sn, a * sn + b * c
        return out

    assert nmse(read(dev, bq).reshape(q.shape), rotated(q) * temp[:, None, None]) < 1e-11
    kk = read(dev, kc_, np.float16).reshape(n_ctx, n_kv, hd).astype(np.float32)
    assert nmse(kk[pos0:pos0 + n_tok], rotated(k)) < 1e-6
    vv = read(dev, vc_, np.float16).reshape(n_ctx, n_kv, hd)
    assert np.array_equal(vv[pos0:pos0 + n_tok], v.astype(np.float16))
    g.close()
    rs.close()


HEAD_NORM_EPS, HEAD_NORM_CTX = 1e-6, 16


def _rope_head_norm(dev, kc, seed: int, n_tok: int, n_head: int, n_kv: int, hd: int,
                    n_dims: int, pos0: int, neox: bool, two_passes: bool = False):
    """rope_qkv with head_norm on random q, k, v and norm weights (drawn from seed), or
    (two_passes) rms_norm over the heads of q and k, then rope_qkv without it. Returns the
    inputs (q, k, v, wq, wk) and the outputs (q, the K cache, the V cache)."""
    from engine.gpu.builder import Builder
    from engine.gpu.graph import Graph
    from engine.gpu.paths import Tuning
    from engine.gpu.runstate import RunState
    from engine.gpu.tensors import Tensor

    rng = np.random.default_rng(seed)
    q = (rng.standard_normal((n_tok, n_head, hd)) * 3).astype(np.float32)
    k = (rng.standard_normal((n_tok, n_kv, hd)) * 0.2).astype(np.float32)
    v = rng.standard_normal((n_tok, n_kv, hd)).astype(np.float32)
    wq, wk = (rng.uniform(0.5, 1.5, hd).astype(np.float32) for _ in range(2))
    rope, eps, n_ctx = Rope(1e4, n_dims), HEAD_NORM_EPS, HEAD_NORM_CTX
    rs = RunState(dev, "t", n_layer=1, n_embd=64, n_head=n_head, q_dim=n_head * hd,
                  kv_dim=n_kv * hd, n_ff=64, n_vocab=64, n_ctx=n_ctx, max_tokens=n_tok,
                  rope=(rope,))
    rs.set_step([0] * n_tok, pos0)
    bq, bk, bv, bwq, bwk = buf(dev, q), buf(dev, k), buf(dev, v), buf(dev, wq), buf(dev, wk)
    kc_, vc_ = (buf(dev, np.zeros((n_ctx, n_kv, hd), np.float16)) for _ in range(2))
    norms = [Tensor("F32", (hd,), [(0, 1, 0, 0, hd * 4)], [b]) for b in (bwq, bwk)]
    g = Graph(dev, kc, "t")
    b = Builder(g, {}, rs, Tuning.for_device(dev))
    if two_passes:
        b.rms_norm(bq, norms[0], bq, n_tok * n_head, eps)
        b.rms_norm(bk, norms[1], bk, n_tok * n_kv, eps)
    b.rope_qkv(bq, bk, bv, kc_, vc_, n_head, n_kv, hd, n_tok, rope, neox=neox,
               head_norm=None if two_passes else (norms[0], norms[1], eps))
    g.replay()
    out = (read(dev, bq).reshape(q.shape),
           read(dev, kc_, np.float16).reshape(n_ctx, n_kv, hd),
           read(dev, vc_, np.float16).reshape(n_ctx, n_kv, hd))
    g.close()
    rs.close()
    return (q, k, v, wq, wk), out


@pytest.mark.parametrize("hd,n_dims", [(64, 64), (64, 32), (128, 128), (256, 256)])
@pytest.mark.parametrize("neox", [0, 1])
def test_rope_qkv_head_norm(dev, kc, hd, n_dims, neox):
    """head_norm: each head of q and k RMS-normed over head_dim with its weights (qwen3's
    attn_q_norm and attn_k_norm), then rotated, in rope_qkv's one pass; the unrotated dims
    normed too; v as without it."""
    n_tok, pos0 = 3, 6
    (q, k, v, wq, wk), (got_q, kk, vv) = _rope_head_norm(dev, kc, 23, n_tok, 4, 2, hd, n_dims,
                                                         pos0, bool(neox))

    def normed(x, w):
        x = x.astype(np.float64)
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + HEAD_NORM_EPS) * w

    want_q = rope_ref(normed(q, wq), pos0, n_dims, 1e4, bool(neox))
    want_k = rope_ref(normed(k, wk), pos0, n_dims, 1e4, bool(neox))
    assert nmse(got_q, want_q) < 1e-11
    kk = kk.astype(np.float32)
    assert nmse(kk[pos0:pos0 + n_tok], want_k) < 1e-6
    assert np.array_equal(vv[pos0:pos0 + n_tok], v.astype(np.float16))
    assert not kk[:pos0].any() and not vv[pos0 + n_tok:].any()


@pytest.mark.parametrize("n_dims", [256, 128])
def test_rope_qkv_head_norm_is_the_two_passes(dev, kc, n_dims):
    """head_norm in rope_qkv's pass gathers each head's squares as rms_norm does (its lanes,
    its order): the same q, K and V as rms_norm over the heads then rope_qkv, bit for bit
    where the compiler keeps the operations as written (lavapipe); within rounding elsewhere.
    Every dim rotated, or half (the rest normed only)."""
    runs = [_rope_head_norm(dev, kc, 29, 5, 4, 1, 256, n_dims, 3, True, two_passes=two)[1]
            for two in (False, True)]
    for got, want in zip(*runs):
        if dev.info.kind == "cpu":
            assert np.array_equal(got, want)
        else:
            assert nmse(got.astype(np.float32), want.astype(np.float32)) < 1e-12


# -- short convolution: concat, ssm_conv, row-view mul and cpy ---------------------------------

def _concat_op(dev, kc, a: np.ndarray, a_view, b: np.ndarray, b_view, tiled):
    """Run concat through Builder on numpy-backed Views; returns the device result."""
    from engine.gpu.graph import Graph
    from engine.gpu.builder import Builder
    from engine.gpu.paths import Tuning
    from engine.gpu.tensors import View

    (ne_a, nb_a, off_a), (ne_b, nb_b, off_b) = a_view, b_view
    ba, bb = buf(dev, a), buf(dev, b)
    ne0, ne1, ne2 = ne_a[0] + ne_b[0], ne_a[1], ne_a[2]
    bo = buf(dev, nbytes=4 * ne0 * ne1 * ne2)
    g = Graph(dev, kc, "t")
    Builder(g, {}, None, Tuning.for_device(dev)).concat(
        View(ba, ne_a, nb_a, off_a), View(bb, ne_b, nb_b, off_b), bo, tiled=tiled)
    g.replay()
    g.close()
    return read(dev, bo)[: ne0 * ne1 * ne2].reshape(ne2, ne1, ne0)


def _ggml_view(data: np.ndarray, ne, nb, off) -> np.ndarray:
    """numpy [ne2, ne1, ne0] of the ggml view (ne, nb in floats, offset) of flat data."""
    i2, i1, i0 = np.meshgrid(*(np.arange(n) for n in reversed(ne)), indexing="ij")
    return data.reshape(-1)[off + i0 * nb[0] + i1 * nb[1] + i2 * nb[2]]


@pytest.mark.parametrize("tiled", [True, False])
@pytest.mark.parametrize("d_conv,n,e,ne2", [(2, 1, 64, 1), (2, 37, 100, 1), (3, 256, 1024, 1),
                                            (31, 33, 65, 2)])
def test_concat_state_and_transposed_inputs(dev, kc, tiled, d_conv, n, e, ne2):
    """lfm2's concat(conv_state, transpose(bx), 0): a contiguous [e, d_conv] and a [n, e]
    token-major block read transposed -> [e, d_conv + n]; sizes off the 32-wide tile too."""
    rng = np.random.default_rng(18)
    state = rng.standard_normal((ne2, e, d_conv)).astype(np.float32)
    bx = rng.standard_normal((ne2, n, e)).astype(np.float32)
    got = _concat_op(dev, kc, state, ((d_conv, e, ne2), None, 0),
                     bx, ((n, e, ne2), (e, 1, n * e), 0), tiled)
    want = np.concatenate([state, bx.transpose(0, 2, 1)], axis=-1)
    assert np.array_equal(got, want)


@pytest.mark.parametrize("tiled", [True, False])
def test_concat_transposed_first_source_and_offsets(dev, kc, tiled):
    """The transposed source first, the other one a strided view with an offset."""
    rng = np.random.default_rng(19)
    a = rng.standard_normal((45, 70)).astype(np.float32)        # stored [ne0=45][ne1=70]
    b = rng.standard_normal((70, 3 * 19)).astype(np.float32)    # rows of 57, take cols 19..37
    va = ((45, 70, 1), (70, 1, 45 * 70), 0)                      # transposed: [70, 45]
    vb = ((19, 70, 1), (1, 57, 57 * 70), 19)
    got = _concat_op(dev, kc, a, va, b, vb, tiled)
    want = np.concatenate([_ggml_view(a, *va), _ggml_view(b, *vb)], axis=-1)
    assert np.array_equal(got, want)


def test_concat_generic_strides(dev, kc):
    """Neither source transposed: plain row views, and a dim-2 stride that skips rows."""
    rng = np.random.default_rng(20)
    a = rng.standard_normal(4 * 9 * 10).astype(np.float32)
    b = rng.standard_normal(3 * 9 * 3).astype(np.float32)
    va = ((5, 9, 3), (1, 10, 120), 2)
    vb = ((3, 9, 3), (1, 3, 27), 0)
    got = _concat_op(dev, kc, a, va, b, vb, None)
    want = np.concatenate([_ggml_view(a, *va), _ggml_view(b, *vb)], axis=-1)
    assert np.array_equal(got, want)


@pytest.mark.parametrize("width,n", [(3, 1), (3, 21), (4, 64)])
def test_ssm_conv(dev, kc, width, n):
    rng = np.random.default_rng(21)
    e = 200
    x = rng.standard_normal((e, width - 1 + n)).astype(np.float32)
    w = rng.standard_normal((e, width)).astype(np.float32)
    bx, bw, bo = buf(dev, x), buf(dev, w), buf(dev, nbytes=4 * n * e)
    run_once(dev, kc, "ssm_conv", [bx, bw, bo], (-(-e // 64), n, 1), n_channels=e,
             n_tokens=n, width=width)
    want = np.zeros((n, e), np.float32)
    for k in range(width):
        want += x[:, k:k + n].T * w[:, k]
    assert nmse(read(dev, bo).reshape(n, e), want) < 1e-13


def test_mul_row_views_and_cpy(dev, kc):
    rng = np.random.default_rng(22)
    n, e = 5, 96
    bcx = rng.standard_normal((n, 3 * e)).astype(np.float32)
    bb, bo = buf(dev, bcx), buf(dev, nbytes=4 * n * e)
    run_once(dev, kc, "mul", [bb, bb, bo], (2, n, 1), n_cols=e, n_rows=n, a_offset=0,
             a_stride=3 * e, b_offset=2 * e, b_stride=3 * e)
    assert np.array_equal(read(dev, bo).reshape(n, e), bcx[:, :e] * bcx[:, 2 * e:])
    # the last 2 of 2 + n columns of each of e rows into a [e, 2] state
    x = rng.standard_normal((e, 2 + n)).astype(np.float32)
    bx, bs = buf(dev, x), buf(dev, np.zeros((e, 2), np.float32))
    run_once(dev, kc, "cpy", [bx, bs], (-(-2 * e // 64), 1, 1), n_cols=2, n_rows=e,
             src_offset=n, src_stride=2 + n, dst_offset=0, dst_stride=2)
    assert np.array_equal(read(dev, bs).reshape(e, 2), x[:, n:])


def test_mul_sigmoid_gate_and_row_broadcast(dev, kc):
    """out = a * sigmoid(b) from a strided row view (qwen3next's attention gate: the second
    half of each head of attn_q's output), in place; and a row scaled by one gate value
    (the shared expert's)."""
    rng = np.random.default_rng(23)
    rows, hd = 7, 40
    qg = rng.standard_normal((rows, 2 * hd)).astype(np.float32) * 4
    att = rng.standard_normal((rows, hd)).astype(np.float32)
    bq, ba = buf(dev, qg), buf(dev, att)
    run_once(dev, kc, "mul", [ba, bq, ba], (1, rows, 1), spec=dict(SIGMOID=1), n_cols=hd,
             n_rows=rows, a_offset=0, a_stride=hd, b_offset=hd, b_stride=2 * hd)
    want = att * (1 / (1 + np.exp(-qg[:, hd:].astype(np.float64))))
    assert nmse(read(dev, ba).reshape(rows, hd), want) < 1e-12
    s = rng.standard_normal(rows).astype(np.float32)
    bs, bo = buf(dev, s), buf(dev, nbytes=4 * rows * hd)
    run_once(dev, kc, "mul", [bq, bs, bo], (1, rows, 1), spec=dict(SIGMOID=1, BCAST=1),
             n_cols=hd, n_rows=rows, a_offset=0, a_stride=2 * hd, b_offset=0, b_stride=1)
    want = qg[:, :hd] / (1 + np.exp(-s.astype(np.float64)))[:, None]
    assert nmse(read(dev, bo).reshape(rows, hd), want) < 1e-12


# -- flash attention (prefill) and split-KV decode attention ---------------------------------

def attn_inputs(seed: int, n_ctx: int, n_head: int, n_kv: int, hd: int, n_tok: int):
    rng = np.random.default_rng(seed)
    k = rng.standard_normal((n_ctx, n_kv, hd)).astype(np.float16)
    v = rng.standard_normal((n_ctx, n_kv, hd)).astype(np.float16)
    q = (rng.standard_normal((n_tok, n_head, hd)) * 2).astype(np.float32)
    return q, k, v


def builder_attention(dev, kc, tuning, q, k, v, pos0: int, window: int,
                      replays: int = 1, before=None) -> np.ndarray:
    """Builder.attention as a model records it (on a RunState of its own), its graph replayed
    `replays` times (before(rs) first): [n, n_head, hd]."""
    from engine.gpu.graph import Graph
    from engine.gpu.builder import Builder
    from engine.gpu.runstate import RunState

    n, n_head, hd = q.shape
    n_ctx, n_kv = k.shape[:2]
    rs = RunState(dev, "t", n_layer=1, n_embd=64, n_head=n_head, q_dim=n_head * hd,
                  kv_dim=n_kv * hd, n_ff=64, n_vocab=64, n_ctx=n_ctx, max_tokens=n,
                  windows=(window,), flash_block=tuning.flash_block(hd))
    bq, bk, bv, bo = buf(dev, q), buf(dev, k), buf(dev, v), buf(dev, nbytes=q.nbytes)
    g = Graph(dev, kc, "t")
    try:
        Builder(g, {}, rs, tuning).attention(bq, bk, bv, bo, n_head, n_kv, hd, n, hd ** -0.5,
                                             window)
        rs.set_step([0] * n, pos0)
        if before is not None:
            before(rs)
        for _ in range(replays):
            g.replay()
        return read(dev, bo).reshape(q.shape)
    finally:
        g.close()
        rs.close()
        for b in (bq, bk, bv, bo):
            dev.allocator.free(b)


def old_attention(dev, kc, q, k, v, pos0: int, window: int, ggml: int) -> np.ndarray:
    """attention.comp, the per-token kernel, on the same inputs."""
    n, n_head, hd = q.shape
    bq, bk, bv = buf(dev, q), buf(dev, k), buf(dev, v)
    bo, st = buf(dev, nbytes=q.nbytes), step_buffer(dev, pos0)
    run_once(dev, kc, "attention", [bq, bk, bv, bo, st, bq], (n_head, n, 1),
             spec=dict(HD=hd, GGML=ggml), n_head=n_head, n_head_kv=k.shape[1], n_tokens=n,
             window=window, scale=hd ** -0.5, softcap=0.0)
    out = read(dev, bo).reshape(q.shape)
    for b in (bq, bk, bv, bo, st):
        dev.allocator.free(b)
    return out


@pytest.mark.parametrize("n,pos0,window", [(7, 0, 0), (1, 30, 0), (37, 50, 0), (40, 0, 0),
                                           (37, 50, 20), (20, 130, 7), (40, 100, 60)])
def test_attention_mask_and_tile_classes(dev, kc, n, pos0, window):
    from engine.gpu.graph import Graph
    from engine.gpu.builder import Builder
    from engine.gpu.paths import Tuning
    from engine.gpu.runstate import RunState

    n_ctx = 160
    tuning = Tuning.for_device(dev)
    rows, cols = block = tuning.flash_block(64)
    rs = RunState(dev, "t", n_layer=1, n_embd=64, n_head=1, q_dim=64, kv_dim=64, n_ff=64,
                  n_vocab=64, n_ctx=n_ctx, max_tokens=40, windows=(window,), flash_block=block)
    g = Graph(dev, kc, "t")
    try:
        mask_buf, tiles_buf = Builder(g, {}, rs, tuning).attention_mask(n, window)
        rs.set_step([0] * n, pos0)
        g.replay()
        stride = -(-n_ctx // cols) * cols
        mask = read(dev, mask_buf, np.float16).reshape(-1, stride)
        tiles = read(dev, tiles_buf, np.uint32).reshape(-1, stride // cols)
    finally:
        g.close()
        rs.close()
    n_past = pos0 + n
    pos = pos0 + np.arange(n)[:, None]
    col = np.arange(stride)[None, :]
    lo = np.where((window > 0) & (pos >= window), pos - window + 1, 0)
    visible = (col >= lo) & (col <= pos) & (col < n_past)
    written = -(-n_past // cols) * cols
    assert np.array_equal(mask[:n, :written] == 0, visible[:, :written])
    assert np.all(np.isneginf(mask[:n, :written][~visible[:, :written]]))
    n_tiles = -(-n // rows)
    assert not mask[n:n_tiles * rows, :written].any()        # padding rows read as visible
    for ti in range(n_tiles):
        for j in range(stride // cols):
            vis = visible[ti * rows:(ti + 1) * rows, j * cols:(j + 1) * cols]
            want = 2 if vis.all() else 1 if not vis.any() else 0
            assert tiles[ti, j] == want, (ti, j)
    if window >= rows + cols:                    # a band wide enough for all three classes
        assert set(tiles[:n_tiles].ravel()) == {0, 1, 2}


FLASH_CASES = [(64, 37, 50, 0), (64, 37, 50, 20), (256, 37, 50, 0), (256, 37, 50, 20),
               (64, 16, 0, 0), (256, 3, 0, 0), (64, 40, 100, 33)]


@pytest.mark.parametrize("hd,n,pos0,window", FLASH_CASES)
def test_flash_attention(dev, kc, hd, n, pos0, window):
    """Tiled prefill attention against numpy and against attention.comp, with grouped heads;
    tile skipping on and off give the same bits."""
    from engine.gpu.paths import Tuning

    q, k, v = attn_inputs(20, 160, 6, 2, hd, n)
    scale = hd ** -0.5
    t = Tuning.for_device(dev, "on")
    t.ggml_numerics = False
    t.coopmat = False               # the f32 tiles; the matrix units' have a test of their own
    got = builder_attention(dev, kc, t, q, k, v, pos0, window)
    assert nmse(got, attention_ref(q, k, v, pos0, window, scale)) < 1e-10
    assert nmse(got, old_attention(dev, kc, q, k, v, pos0, window, 0)) < 1e-10
    t.flash_skip = False
    assert np.array_equal(builder_attention(dev, kc, t, q, k, v, pos0, window), got)
    # llama.cpp's CPU numerics: q and the probabilities rounded to f16 (see the decode test)
    t.ggml_numerics = True
    got16 = builder_attention(dev, kc, t, q, k, v, pos0, window)
    t.flash_skip = True
    assert np.array_equal(builder_attention(dev, kc, t, q, k, v, pos0, window), got16)
    for want16 in (attention_ggml_ref(q, k, v, pos0, window, scale),
                   old_attention(dev, kc, q, k, v, pos0, window, 1)):
        assert np.abs(got16 - want16).max() < 2e-3 and nmse(got16, want16) < 1e-8


@pytest.mark.parametrize("splits", ["device", "gpu"])
@pytest.mark.parametrize("hd", [64, 256])
@pytest.mark.parametrize("n_kv_len,window", [(1, 0), (7, 0), (7, 4), (300, 0), (300, 256),
                                             (2000, 0), (2000, 256)])
def test_split_decode_attention(dev, kc, n_kv_len, window, hd, splits):
    """One query token over n_kv_len cached positions, the KV range split across workgroups
    (this device's split counts, and a GPU's: 16 splits of at least 32 positions)."""
    from engine.gpu.paths import Tuning

    q, k, v = attn_inputs(21, 2048, 6, 2, hd, 1)
    pos0, scale = n_kv_len - 1, hd ** -0.5
    t = Tuning.for_device(dev)
    if splits == "gpu":
        t.split_max, t.split_chunk = 16, 32
    t.ggml_numerics = False
    got = builder_attention(dev, kc, t, q, k, v, pos0, window)
    assert nmse(got, attention_ref(q, k, v, pos0, window, scale)) < 1e-10
    assert nmse(got, old_attention(dev, kc, q, k, v, pos0, window, 0)) < 1e-10
    # with ggml's rounding decode takes the prefill's per-token kernel: the same bits as a
    # prompt's pass gives that token
    t.ggml_numerics = True
    got16 = builder_attention(dev, kc, t, q, k, v, pos0, window)
    want16 = attention_ggml_ref(q, k, v, pos0, window, scale)
    assert np.array_equal(got16, old_attention(dev, kc, q, k, v, pos0, window, 1))
    # p rounded to f16 on both sides: a last-bit difference in a score can move one p by an
    # f16 step, nothing more. Where exp and '/' are not correctly rounded (NVIDIA's driver:
    # Vulkan allows them a few ulp) more p land across an f16 boundary: the H200 gave an
    # NMSE of up to 3.5e-7 at the same 1.4e-3 largest error, so 1e-6 there.
    mse = 1e-8 if dev.info.kind == "cpu" else 1e-6
    assert np.abs(got16 - want16).max() < 2e-3 and nmse(got16, want16) < mse
    # the fast decode path (mul_mat_vec, no ggml rounding): one pass per split, the last
    # split of each head joining them; its counters are back at 0 for every replay
    t.matvec, t.ggml_numerics = True, False
    one_pass = builder_attention(dev, kc, t, q, k, v, pos0, window)
    assert nmse(one_pass, attention_ref(q, k, v, pos0, window, scale)) < 1e-10
    assert np.array_equal(builder_attention(dev, kc, t, q, k, v, pos0, window, replays=3),
                          one_pass)
    # counters left anywhere (a replay cut short) do not carry into the next one

    def garbage(rs):
        vk.upload(dev, rs.split_done, np.full(rs.split_done.nbytes // 4, 7, np.uint32))
    assert np.array_equal(builder_attention(dev, kc, t, q, k, v, pos0, window, before=garbage),
                          one_pass)


def q8_blocks(x: np.ndarray) -> np.ndarray:
    """x rounded as mul_mat_vecq stages it: ggml's Q8_0 blocks with f32 scales."""
    from tests.helpers import reference as ref

    return ref._q8_0(x.astype(np.float32), f16_scale=False)


@pytest.mark.parametrize("wtype", ["Q4_K", "Q6_K", "Q4_0", "Q8_0", "MXFP4"])
@pytest.mark.parametrize("xform", [0, 1, 2])
@pytest.mark.parametrize("subgroups,rows,unroll,groups", [(1, 1, 1, 70), (2, 3, 2, 2),
                                                          (4, 2, 4, 1)])
def test_mul_mat_vecq(dev, kc, wtype, xform, subgroups, rows, unroll, groups):
    """The int8-activation decode product: the op before (XFORM), x rounded in blocks of 32,
    then the dot products, against numpy doing the same; workgroups looping over row tiles
    (fewer groups than tiles), reading `unroll` super-blocks ahead; the second token's row,
    added into y from float 3 on. An odd count of 256-weight super-blocks per row puts Q6_K's
    blocks on 2-byte boundaries; MXFP4's 17-byte blocks start at every byte parity."""
    if not dev.dot4:
        pytest.skip("no VK_KHR_shader_integer_dot_product")
    rng = np.random.default_rng(31)
    n_out, n_in, eps = 70, 2304, 1e-5
    raw, w = quantized(wtype, n_out, n_in, rng)
    x = (rng.standard_normal((2, n_in)) * 3).astype(np.float32)
    x2 = rng.standard_normal((2, n_in) if xform == 2 else n_in).astype(np.float32)
    y0 = rng.standard_normal(n_out + 3).astype(np.float32)
    bw, bx, bx2 = buf(dev, raw, kind="weights"), buf(dev, x), buf(dev, x2)
    xr = x[1].astype(np.float64)
    if xform == 1:
        norm = 1 / np.sqrt(np.mean(xr * xr) + eps)
        xin = q8_blocks((x[1] * x2).astype(np.float32)) * norm
    elif xform == 2:
        xin = q8_blocks((xr / (1 + np.exp(-xr)) * x2[1]).astype(np.float32))
    else:
        xin = q8_blocks(x[1])
    for acc in (0, 1):
        by = buf(dev, y0)
        run_once(dev, kc, "mul_mat_vecq", [bw, bx, by, bx2, bw] + [bx] * 6, (groups, 1, 1),
                 wtype=wtype, spec=dict(WG=dev.subgroup_size * subgroups, ROWS=rows, ACC=acc,
                                        XFORM=xform, KMAX=n_in, UNROLL=unroll),
                 n_in=n_in, n_out=n_out, x_offset=n_in // 4, y_offset=3, eps=eps,
                 **VECQ_PLAIN)
        got = read(dev, by)
        assert np.array_equal(got[:3], y0[:3])
        want = w.astype(np.float64) @ xin + (y0[3:] if acc else 0)
        assert nmse(got[3:], want) < 1e-10


@pytest.mark.parametrize("wtype", ["Q4_K", "Q6_K", "Q4_0", "Q8_0", "MXFP4"])
@pytest.mark.parametrize("same", [False, True])
@pytest.mark.parametrize("pair,biased", [(1, False), (2, False), (3, True), (1, True)])
def test_mul_mat_vecq_pair(dev, kc, wtype, same, pair, biased):
    """PAIR: a GLU's gate and up in one pass, act(gate x) * (up x) with the norm before
    them, act silu (1) or gelu's tanh form (2), or gpt-oss's clamped SwiGLU (3: min(g, 7) *
    sigmoid(1.702 min(g, 7)) * (clamp(u, -7, 7) + 1)); each sum plus its row's bias (BIAS);
    up in its own buffer, or rows of the gate's (a fused gate | up weight, phi3)."""
    if not dev.dot4:
        pytest.skip("no VK_KHR_shader_integer_dot_product")
    rng = np.random.default_rng(32)
    n_out, n_in, eps = 37, 1024, 1e-5
    raw, w = quantized(wtype, 2 * n_out, n_in, rng)
    x = (rng.standard_normal(n_in) * 3).astype(np.float32)
    x2 = rng.standard_normal(n_in).astype(np.float32) * 0.03   # gate sums of a few units
    norm = 1 / np.sqrt(np.mean(x.astype(np.float64) ** 2) + eps)
    xin = q8_blocks((x * x2).astype(np.float32)) * norm
    g, u = w[:n_out].astype(np.float64) @ xin, w[n_out:].astype(np.float64) @ xin
    bias = (rng.standard_normal((2, n_out)) * 6).astype(np.float32)   # past the clamp's 7
    if biased:
        g, u = g + bias[0], u + bias[1]
    bw, bx, bx2, by = buf(dev, raw, kind="weights"), buf(dev, x), buf(dev, x2), \
        buf(dev, nbytes=4 * n_out)
    bb = [buf(dev, bias[0]), buf(dev, bias[1])] if biased else [bx, bx]
    if same:
        bu, row2 = bw, n_out
    else:
        half = raw.size // 2
        bw, bu, row2 = buf(dev, raw[:half], kind="weights"), \
            buf(dev, raw[half:], kind="weights"), 0
    run_once(dev, kc, "mul_mat_vecq", [bw, bx, by, bx2, bu, bx, bx, bx, bx] + bb, (3, 1, 1),
             wtype=wtype, spec=dict(WG=dev.subgroup_size * 2, ROWS=2, ACC=0, XFORM=1,
                                    KMAX=n_in, UNROLL=2, PAIR=pair, BIAS=int(biased)),
             n_in=n_in, n_out=n_out, x_offset=0, y_offset=0, eps=eps,
             **{**VECQ_PLAIN, "row2": row2})
    if pair == 3:
        gc = np.minimum(g, 7.0)
        want = gc / (1 + np.exp(-1.702 * gc)) * (np.clip(u, -7.0, 7.0) + 1)
        assert (g > 7).any() and (np.abs(u) > 7).any()        # the clamps are exercised
    elif pair == 2:
        want = 0.5 * g * (1 + np.tanh(np.sqrt(2 / np.pi) * g * (1 + 0.044715 * g * g))) * u
    else:
        want = g / (1 + np.exp(-g)) * u
    assert nmse(read(dev, by)[:n_out], want) < 1e-10
    # GATED: the same pass times sigmoid(binding 8's first value), a shared expert's gate
    gate = np.array([-0.7], np.float32)
    run_once(dev, kc, "mul_mat_vecq", [bw, bx, by, bx2, bu, bx, bx, bx, buf(dev, gate)] + bb,
             (3, 1, 1), wtype=wtype,
             spec=dict(WG=dev.subgroup_size * 2, ROWS=2, ACC=0, XFORM=1, KMAX=n_in, UNROLL=2,
                       PAIR=pair, BIAS=int(biased), GATED=1),
             n_in=n_in, n_out=n_out, x_offset=0, y_offset=0, eps=eps,
             **{**VECQ_PLAIN, "row2": row2})
    assert nmse(read(dev, by)[:n_out], want / (1 + np.exp(0.7))) < 1e-10


def qkv_case(dev, rng, wtype, n_in, n_out, hd, pos0, n_ctx, eps):
    """A projection's case for mul_mat_vecq's rope modes: a run state at step pos0 (its
    rope table for heads of hd), the weight's raw bytes, x, the norm's weight, and numpy's
    product of the int8-rounded normed x (float64)."""
    from engine.gpu.runstate import RunState

    raw, w = quantized(wtype, n_out, n_in, rng)
    x = (rng.standard_normal(n_in) * 2).astype(np.float32)
    norm_w = rng.standard_normal(n_in).astype(np.float32)
    rs = RunState(dev, "t", n_layer=1, n_embd=64, n_head=1, q_dim=64, kv_dim=64, n_ff=64,
                  n_vocab=64, n_ctx=n_ctx, max_tokens=8, rope=(Rope(1e4, hd),))
    rs.set_step([0], pos0)
    norm = 1 / np.sqrt(np.mean(x.astype(np.float64) ** 2) + eps)
    return rs, raw, x, norm_w, w.astype(np.float64) @ (q8_blocks(x * norm_w) * norm)


@pytest.mark.parametrize("wtype", ["Q4_K", "Q4_0"])
@pytest.mark.parametrize("rope,table,biased", [(1, 0, False), (2, 0, False), (1, 1, False),
                                               (2, 1, True)])
def test_mul_mat_vecq_rope(dev, kc, wtype, rope, table, biased):
    """ROPE: a projection's rows rotated as they come out (1 adjacent pairs, 2 NeoX halves;
    the angles computed or read from the rope table), into f32 y at y_offset, or (OUT16) as
    f16 into a KV cache's row for step.pos0; each row's bias added before the turn (BIAS:
    qwen2's, gpt-oss's q, k and v); against numpy's product of the int8-rounded normed x,
    then rope_ref."""
    if not dev.dot4:
        pytest.skip("no VK_KHR_shader_integer_dot_product")
    rng = np.random.default_rng(33)
    n_in, n_heads, hd, pos0, n_ctx, eps = 512, 3, 64, 9, 16, 1e-5
    n_out = n_heads * hd
    rs, raw, x, norm_w, y = qkv_case(dev, rng, wtype, n_in, n_out, hd, pos0, n_ctx, eps)
    bias = rng.standard_normal(n_out).astype(np.float32) * 2 * biased
    want = rope_ref((y + bias).reshape(1, n_heads, hd), pos0, hd, 1e4, rope == 2).reshape(-1)
    bw, bx, bn = buf(dev, raw, kind="weights"), buf(dev, x), buf(dev, norm_w)
    # bias is read at y's index (y_offset + row: a part's rows): where y starts 5 floats in,
    # so does it
    bb5 = [buf(dev, np.concatenate([np.full(5, 1e4, np.float32), bias]))] * 2 if biased \
        else [bx, bx]
    bb = [buf(dev, bias)] * 2 if biased else [bx, bx]
    cs = rs.rope_table(Rope(1e4, hd)) if table else bx
    spec = dict(WG=dev.subgroup_size * 2, ROWS=2, ACC=0, XFORM=1, KMAX=n_in, UNROLL=2,
                ROPE=rope, TABLE=table, BIAS=int(biased))
    push = dict(VECQ_PLAIN, n_in=n_in, n_out=n_out, x_offset=0, eps=eps, head_dim=hd,
                freq_base=1e4, freq_scale=1.0)
    del push["kv_row"]
    by = buf(dev, np.full(n_out + 5, 3.0, np.float32))
    run_once(dev, kc, "mul_mat_vecq", [bw, bx, by, bn, bw, rs.step, cs, bx, bx] + bb5, (2, 1, 1),
             wtype=wtype, spec=dict(spec, OUT16=0), y_offset=5, kv_row=0, **push)
    got = read(dev, by)
    assert np.all(got[:5] == 3.0) and nmse(got[5:], want) < 1e-10
    cache = buf(dev, np.zeros((n_ctx, n_out), np.float16))
    run_once(dev, kc, "mul_mat_vecq", [bw, bx, cache, bn, bw, rs.step, cs, bx, bx] + bb,
             (2, 1, 1), wtype=wtype, spec=dict(spec, OUT16=1), y_offset=0, kv_row=n_out, **push)
    kv = read(dev, cache, np.float16).reshape(n_ctx, n_out).astype(np.float32)
    assert nmse(kv[pos0], want) < 1e-6
    assert not np.delete(kv, pos0, axis=0).any()
    rs.close()


@pytest.mark.parametrize("wtype,rows", [("Q4_K", 1), ("Q6_K", 2), ("Q8_0", 4)])
@pytest.mark.parametrize("rope,table", [(1, 0), (2, 0), (2, 1)])
def test_mul_mat_vecq_head_norm(dev, kc, wtype, rows, rope, table):
    """HNORM: each head of the rows RMS-normed over itself times its weights (qwen3's and
    gemma3's q and k norms), then rotated (1 adjacent pairs, 2 NeoX halves), by the subgroup
    that completes the head: into y in place, or (OUT16) as f16 into a KV cache's row for
    step.pos0. Few workgroups looping over many heads, so heads finish in any order; run
    twice, so the per-head counters are back at 0 after each pass; against numpy."""
    if not dev.dot4:
        pytest.skip("no VK_KHR_shader_integer_dot_product")
    rng = np.random.default_rng(36)
    n_in, n_heads, hd, pos0, n_ctx, eps = 512, 6, 64, 9, 16, 1e-6
    n_out = n_heads * hd
    rs, raw, x, norm_w, y = qkv_case(dev, rng, wtype, n_in, n_out, hd, pos0, n_ctx, eps)
    head_w = (rng.standard_normal(hd) + 1).astype(np.float32)
    raw_y = y.reshape(1, n_heads, hd)
    normed = raw_y / np.sqrt(np.mean(raw_y ** 2, axis=-1, keepdims=True) + eps) * head_w
    want = rope_ref(normed, pos0, hd, 1e4, rope == 2).reshape(-1)
    bw, bx, bn, bh = (buf(dev, raw, kind="weights"), buf(dev, x), buf(dev, norm_w),
                      buf(dev, head_w))
    done = buf(dev, np.zeros(n_heads, np.uint32))
    cs = rs.rope_table(Rope(1e4, hd)) if table else bx
    spec = dict(WG=dev.subgroup_size * 2, ROWS=rows, ACC=0, XFORM=1, KMAX=n_in, UNROLL=2,
                HNORM=rope, TABLE=table)
    push = dict(VECQ_PLAIN, n_in=n_in, n_out=n_out, x_offset=0, eps=eps, head_dim=hd,
                freq_base=1e4, freq_scale=1.0)
    del push["kv_row"]
    for _ in range(2):
        by = buf(dev, np.full(n_out, np.nan, np.float32))
        run_once(dev, kc, "mul_mat_vecq", [bw, bx, by, bn, bw, rs.step, cs, done, bh, bx, bx],
                 (2, 1, 1), wtype=wtype, spec=dict(spec, OUT16=0), y_offset=0, kv_row=0,
                 **push)
        assert nmse(read(dev, by), want) < 1e-9
        assert not read(dev, done, np.uint32).any()
    cache = buf(dev, np.zeros((n_ctx, n_out), np.float16))
    scratch = buf(dev, np.full(n_out, np.nan, np.float32))
    run_once(dev, kc, "mul_mat_vecq", [bw, bx, scratch, bn, bw, rs.step, cs, done, bh, cache,
                                       bx],
             (2, 1, 1), wtype=wtype, spec=dict(spec, OUT16=1), y_offset=0, kv_row=n_out,
             **push)
    kv = read(dev, cache, np.float16).reshape(n_ctx, n_out).astype(np.float32)
    assert nmse(kv[pos0], want) < 1e-6
    assert not np.delete(kv, pos0, axis=0).any() and not read(dev, done, np.uint32).any()
    rs.close()


@pytest.mark.parametrize("wtype", ["Q4_K", "Q6_K", "Q4_0", "Q8_0", "MXFP4"])
@pytest.mark.parametrize("parts,oss", [(1, False), (2, False), (1, True)])
def test_mul_mat_vecq_experts(dev, kc, wtype, parts, oss):
    """EXPERTS: the router's k experts of one token. Gate and up paired per slot (y[slot] =
    silu(gate_e x) * (up_e x)), then down summed over the slots with the router's weights
    into y (SUM, added to it); W bound whole or in two parts of whole experts (each
    dispatch doing the slots whose expert it holds); gpt-oss's form (oss): each expert's
    rows with their biases, the clamped SwiGLU. Against numpy on the int8-rounded x."""
    if not dev.dot4:
        pytest.skip("no VK_KHR_shader_integer_dot_product")
    rng = np.random.default_rng(34)
    n_expert, k, n_in, n_ff = 6, 3, 512, 256
    ids = np.array([4, 1, 3], np.uint32)
    ew = np.array([0.5, -1.25, 2.0], np.float32)
    raw_g, wg = quantized(wtype, n_expert * n_ff, n_in, rng)
    raw_u, wu = quantized(wtype, n_expert * n_ff, n_in, rng)
    raw_d, wd = quantized(wtype, n_expert * n_in, n_ff, rng)
    x = (rng.standard_normal(n_in) * 0.05).astype(np.float32)   # gate sums of a few units
    xin = q8_blocks(x).astype(np.float64)
    g = np.stack([wg[e * n_ff:(e + 1) * n_ff].astype(np.float64) @ xin for e in ids])
    u = np.stack([wu[e * n_ff:(e + 1) * n_ff].astype(np.float64) @ xin for e in ids])
    biases = (rng.standard_normal((3, n_expert, max(n_ff, n_in))) * 6).astype(np.float32)
    gb, ub, db = biases[0, :, :n_ff], biases[1, :, :n_ff], biases[2, :, :n_in]
    if oss:
        g, u = g + gb[ids], u + ub[ids]
        gc = np.minimum(g, 7.0)
        glu = gc / (1 + np.exp(-1.702 * gc)) * (np.clip(u, -7.0, 7.0) + 1)
        assert (g > 7).any() and (np.abs(u) > 7).any()        # the clamps are exercised
    else:
        glu = g / (1 + np.exp(-g)) * u                                # [k, n_ff]
    bi, bw, bx = buf(dev, ids), buf(dev, ew), buf(dev, x)
    spec = dict(BIAS=int(oss))
    bgb, bub, bdb = (buf(dev, np.ascontiguousarray(b)) for b in (gb, ub, db)) if oss \
        else (bx, bx, bx)
    split = n_expert // parts

    def bound(raw):
        per = raw.nbytes // n_expert
        return [(buf(dev, raw[p * split * per:(p + 1) * split * per], kind="weights"), p * split)
                for p in range(parts)]
    by = buf(dev, np.full(k * n_ff, np.nan, np.float32))
    for (gpart, base), (upart, _) in zip(bound(raw_g), bound(raw_u)):
        run_once(dev, kc, "mul_mat_vecq", [gpart, bx, by, bx, upart, bx, bx, bi, bx, bgb, bub],
                 (4, k, 1), wtype=wtype,
                 spec=dict(WG=dev.subgroup_size * 2, ROWS=2, ACC=0, KMAX=n_in, UNROLL=2,
                           PAIR=3 if oss else 1, EXPERTS=k, **spec),
                 **{**VECQ_PLAIN, "n_in": n_in, "n_out": n_ff, "x_offset": 0, "y_offset": 0,
                    "eps": 0.0, "expert_base": base, "n_experts": split})
    got = read(dev, by).reshape(k, n_ff)
    assert nmse(got, glu) < 1e-10
    # down: each slot's own input (here the GLU numpy made, so the check stands alone)
    xd = glu.astype(np.float32)
    y0 = rng.standard_normal(n_in).astype(np.float32)
    want = y0 + sum(ew[j] * (wd[e * n_in:(e + 1) * n_in].astype(np.float64)
                             @ q8_blocks(xd[j]).astype(np.float64) + oss * db[e])
                    for j, e in enumerate(ids))
    bxd, by = buf(dev, xd), buf(dev, y0)
    for dpart, base in bound(raw_d):
        run_once(dev, kc, "mul_mat_vecq", [dpart, bxd, by, bxd, dpart, bxd, bxd, bi, bw, bdb,
                                           bdb], (3, 1, 1), wtype=wtype,
                 spec=dict(WG=dev.subgroup_size * 2, ROWS=1, ACC=1, KMAX=k * n_ff, UNROLL=2,
                           EXPERTS=k, SUM=1, **spec),
                 **{**VECQ_PLAIN, "n_in": n_ff, "n_out": n_in, "x_offset": 0, "y_offset": 0,
                    "eps": 0.0, "expert_base": base, "n_experts": split})
    assert nmse(read(dev, by), want) < 1e-10


@pytest.mark.parametrize("wtype", ["Q4_K", "MXFP4"])
@pytest.mark.parametrize("n_expert,k,route", [(128, 8, 1), (60, 4, 2), (32, 4, 3), (5, 5, 1)])
def test_mul_mat_vecq_routes_as_moe_router(dev, kc, wtype, n_expert, k, route):
    """ROUTE: gate and up's pass makes the router's choice itself from the logits, each
    workgroup alike, so no moe_router pass comes before it (1: softmax, the weights
    normalised; 2: not; 3: gpt-oss's softmax over the chosen). The ids and weights it
    writes for the down products are moe_router's bit for bit (a tie in the logits
    included), and its output is EXPERTS' on those ids."""
    if not dev.dot4:
        pytest.skip("no VK_KHR_shader_integer_dot_product")
    rng = np.random.default_rng(35)
    n_in, n_ff = 256, 64
    logits = (rng.standard_normal(n_expert) * 3).astype(np.float32)
    logits[[1, 3]] = logits.max() + 1.0                  # a tie: the lower index first
    raw_g, _ = quantized(wtype, n_expert * n_ff, n_in, rng)
    raw_u, _ = quantized(wtype, n_expert * n_ff, n_in, rng)
    x = (rng.standard_normal(n_in) * 0.05).astype(np.float32)
    bl, bx = buf(dev, logits), buf(dev, x)
    bg, bu = buf(dev, raw_g, kind="weights"), buf(dev, raw_u, kind="weights")
    ids, ws = buf(dev, nbytes=4 * k), buf(dev, nbytes=4 * k)
    run_once(dev, kc, "moe_router", [bl, ids, ws], (1, 1, 1),
             spec=dict(NORM=int(route == 1), SOFTMAX_K=int(route == 3)),
             n_expert=n_expert, n_used=k)
    want_ids, want_w = read(dev, ids, np.uint32), read(dev, ws)
    assert list(want_ids[:2]) == [1, 3]
    spec = dict(WG=dev.subgroup_size * 2, ROWS=2, ACC=0, KMAX=n_in, UNROLL=2,
                PAIR=3 if route == 3 else 1, EXPERTS=k)
    push = {**VECQ_PLAIN, "n_in": n_in, "n_out": n_ff, "x_offset": 0, "y_offset": 0,
            "eps": 0.0, "n_experts": n_expert}
    plain = buf(dev, np.full(k * n_ff, np.nan, np.float32))
    run_once(dev, kc, "mul_mat_vecq", [bg, bx, plain, bx, bu, bx, bx, ids, bx, bx, bx],
             (3, k, 1), wtype=wtype, spec=spec, **push)
    routed = buf(dev, np.full(k * n_ff, np.nan, np.float32))
    got_ids = buf(dev, np.full(k, 0xFFFFFFFF, np.uint32))
    got_w = buf(dev, np.full(k, np.nan, np.float32))
    run_once(dev, kc, "mul_mat_vecq", [bg, bx, routed, bx, bu, bx, bl, got_ids, got_w, bx,
                                       bx],
             (3, k, 1), wtype=wtype, spec=dict(spec, ROUTE=route, ROUTE_N=n_expert), **push)
    assert np.array_equal(read(dev, got_ids, np.uint32), want_ids)
    assert np.array_equal(read(dev, got_w).view(np.uint32), want_w.view(np.uint32))
    assert np.array_equal(read(dev, routed).view(np.uint32), read(dev, plain).view(np.uint32))
