"""`hotseat kernel-bench concat|mul_mat_vec|mul_mat_cm|mul_mat_moe|attn_decode`: a kernel's paths
against each other.

concat: its two paths on the shapes lfm2 gives it. mul_mat_moe: a prefill chunk's expert
products, one per token and slot against grouped by expert, on the shader cores and, where
prefill takes the matrix units, on them (mul_mat_moe_cm, marked cm). mul_mat_cm: the prefill
products' tiles on the matrix units, KHR subgroup-scope (cm) and, where the device has
VK_NV_cooperative_matrix2, workgroup-scope (cm2), against the register-tiled mul_mat.

lfm2 concatenates each layer's conv state [n_embd, d_conv] with B * x read transposed
([n, n_embd] stored token-major), along dim 0. Each path is recorded once as a one-op graph
and replayed `repeats` times; a replay's time is the op's GPU time from timestamps (wall
time around the submit where the device has none). Reported: medians in microseconds and
element-wise / tiled. Both paths' outputs are compared with numpy first.

Why this module is long: one bench per kernel family, each short, all built on the same
timing (`_time_records`), cold weight copies, random weights and checks, and reported by
one command; split by kernel, each part would import all of that back.
"""
from __future__ import annotations

import dataclasses
import itertools
import json
import statistics
import sys
import time

import numpy as np

from ..gpu import vk
from shaders.registry import CM2_GROUPS, CM2_TYPES, PREDECODE_TYPES

# (d_conv, tokens, n_embd): decode and a prefill chunk at LFM2-350M and -1.2B widths, and a
# long prefill
SHAPES = ((2, 1, 1024), (2, 256, 1024), (2, 1, 2048), (2, 256, 2048), (2, 1024, 2048))


def _time_path(dev, kernels, state, bx, out, d_conv, n, e, tiled, repeats) -> list[float]:
    from ..gpu.graph import Graph
    from ..gpu.builder import Builder
    from ..gpu.paths import Tuning
    from ..gpu.tensors import View

    g = Graph(dev, kernels, f"concat-{'tiled' if tiled else 'generic'}",
              profile=dev.timestamps_ok)
    try:
        Builder(g, {}, None, Tuning.for_device(dev)).concat(
            View(state, (d_conv, e, 1)), View(bx, (e, n, 1)).T, out, tiled=tiled)
        g.finish()
        g.replay()                                           # warm-up
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            g.replay()
            wall = time.perf_counter() - t0
            times.append(g.profile()[0][1] / 1e3 if dev.timestamps_ok else wall * 1e6)
        return times
    finally:
        g.close()


def bench_concat(dev, kernels, repeats: int = 50, shapes=SHAPES) -> list[dict]:
    rng = np.random.default_rng(0)
    rows = []
    for d_conv, n, e in shapes:
        state_np = rng.standard_normal((e, d_conv)).astype(np.float32)
        bx_np = rng.standard_normal((n, e)).astype(np.float32)
        want = np.concatenate([state_np, bx_np.T], axis=1)          # [e, d_conv + n]
        alloc = dev.allocator.alloc
        state = alloc(state_np.nbytes, "bench/state", "scratch")
        bx = alloc(bx_np.nbytes, "bench/bx", "scratch")
        out = alloc(want.nbytes, "bench/out", "scratch")
        try:
            vk.upload(dev, state, state_np)
            vk.upload(dev, bx, bx_np)
            row = {"d_conv": d_conv, "tokens": n, "n_embd": e, "bytes": want.nbytes}
            for tiled, key in ((True, "tiled_us"), (False, "generic_us")):
                times = _time_path(dev, kernels, state, bx, out, d_conv, n, e, tiled, repeats)
                got = vk.download(dev, out).view(np.float32).reshape(want.shape)
                if not np.array_equal(got, want):
                    raise RuntimeError(f"concat {'tiled' if tiled else 'generic'} path is wrong "
                                       f"for {d_conv}+{n} x {e}")
                row[key] = statistics.median(times)
            row["generic_over_tiled"] = row["generic_us"] / row["tiled_us"]
            rows.append(row)
        finally:
            for b in (state, bx, out):
                dev.allocator.free(b)
    return rows


# (weight type, n_in, n_out): the decode products of Llama-shaped 1B Q4_0 and 8B Q4_K_M, and
# an 8B-sized feed-forward product of each type added since
MATVEC_SHAPES = (("Q4_0", 2048, 512), ("Q4_0", 2048, 2048), ("Q4_0", 2048, 8192),
                 ("Q4_0", 8192, 2048), ("Q4_K", 4096, 1024), ("Q4_K", 4096, 4096),
                 ("Q4_K", 4096, 14336), ("Q4_K", 14336, 4096), ("Q6_K", 4096, 1024),
                 ("Q6_K", 14336, 4096), ("Q6_K", 4096, 32768),
                 ("Q5_1", 4096, 14336), ("BF16", 4096, 14336), ("Q3_K", 4096, 14336),
                 ("Q2_K", 4096, 14336), ("IQ4_NL", 4096, 14336), ("IQ4_XS", 4096, 14336),
                 ("MXFP4", 2880, 14336), ("IQ3_XXS", 4096, 14336), ("IQ3_S", 4096, 14336),
                 ("IQ2_XXS", 4096, 14336), ("IQ2_XS", 4096, 14336), ("IQ2_S", 4096, 14336),
                 # gpt-oss-20b's: an expert's gate, q and the output projection (Q8_0)
                 ("MXFP4", 2880, 2880), ("Q8_0", 2880, 4096), ("Q8_0", 4096, 2880))
# mul_mat_vecq's (lanes, rows, read-ahead, workgroups; 0: one per row tile) timed per shape
MATVECQ_GRID = tuple((lanes, rows, ahead, groups) for lanes in (128, 256)
                     for rows in (1, 2, 4) for ahead in (1, 2, 4) for groups in (0, 512))
COLD_BYTES = 192 << 20   # weights a timed graph reads: past the caches of the GPUs measured
MAX_COPIES = 256
OPS_PER_GRAPH = 8
WARM_UP_S = 0.2         # replays before the timed ones, for the clocks to come up
# Byte offsets of the f16 scales in a block of each quantized type (other bytes: any bits)
_F16_SCALES = {"Q4_1": (0, 2), "Q5_1": (0, 2), "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,),
               "Q2_K": (80, 82), "Q3_K": (108,)}


def _random_weights(rng, wtype: str, n_in: int, n_out: int) -> np.ndarray:
    """Random blocks with small finite scales (speed depends on the bytes read, but NaNs
    would make the outputs useless for the check); float types from random normals."""
    import gguf

    if wtype in ("F32", "F16", "BF16"):
        w = rng.standard_normal(n_out * n_in).astype(np.float32)
        if wtype == "BF16":
            return (w.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8)
        return w.astype(np.float16 if wtype == "F16" else np.float32).view(np.uint8)
    qt = gguf.GGMLQuantizationType[wtype]
    block, size = gguf.GGML_QUANT_SIZES[qt]
    raw = rng.integers(0, 256, (n_out * n_in // block, size), dtype=np.uint8)
    if wtype == "MXFP4":
        raw[:, 0] = 121                     # e8m0 scale byte: 2^-7
        return raw.reshape(-1)
    scale = np.full(raw.shape[0], 0.01, np.float16).view(np.uint8).reshape(-1, 2)
    for off in _F16_SCALES.get(wtype, (0,)):
        raw[:, off:off + 2] = scale
    return raw.reshape(-1)


def _time_records(dev, kernels, record, repeats: int, ops: int = OPS_PER_GRAPH) -> float:
    """Median GPU time of one record(g, i) (its ops summed: W in parts is an op per part):
    `ops` records in a row (i = 0 .. ops - 1), replayed."""
    from ..gpu.graph import Graph

    g = Graph(dev, kernels, "bench", profile=dev.timestamps_ok)
    try:
        for i in range(ops):
            record(g, i)
        g.finish()
        # a GPU idles at low clocks between short runs: replay until it has run for a while
        t_end = time.perf_counter() + WARM_UP_S
        while time.perf_counter() < t_end:
            g.replay()
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            g.replay()
            wall = time.perf_counter() - t0
            if dev.timestamps_ok:
                times.append(sum(ns for _, ns in g.profile()) / 1e3 / ops)
            else:
                times.append(wall * 1e6 / ops)
        return statistics.median(times)
    finally:
        g.close()


def _cold_copies(dev, raw: np.ndarray, label: str):
    """(buffer, windows): raw written back to back COLD_BYTES over, so the ops of a timed
    graph each read their own copy, from DRAM as a decode step reads its layers' weights,
    not from the cache the previous op filled."""
    stride = -(-raw.nbytes // dev.storage_align) * dev.storage_align
    copies = max(2, min(MAX_COPIES, -(-COLD_BYTES // stride)))
    b = dev.allocator.alloc(stride * copies, label, "scratch")
    whole = np.zeros(stride * copies, np.uint8)
    for c in range(copies):
        whole[c * stride:c * stride + raw.nbytes] = raw
    vk.upload(dev, b, whole)
    return b, [(b, c * stride, raw.nbytes) for c in range(copies)]


def bench_mul_mat_vec(dev, kernels, repeats: int = 20, shapes=MATVEC_SHAPES,
                      types: set[str] | None = None) -> list[dict]:
    """The decode products, weights read cold (each op its own copy): mul_mat_vec at the
    shape the device's tuning picks, and mul_mat_vecq (int8 activations) at every (lanes,
    rows, read-ahead, workgroups) of MATVECQ_GRID where the device has it; outputs checked
    against the one-token mul_mat first."""
    from ..gpu.builder import VECQ_PLAIN
    from ..gpu.kernels import MATVEC_CHUNK
    from ..gpu.paths import Tuning

    rng = np.random.default_rng(0)
    t = Tuning.for_device(dev)
    out = []
    for wtype, n_in, n_out in shapes:
        if types and wtype not in types:
            continue
        raw = _random_weights(rng, wtype, n_in, n_out)
        x = rng.standard_normal(n_in).astype(np.float32)
        alloc = dev.allocator.alloc
        bw, windows = _cold_copies(dev, raw, "bench/w")
        bx = alloc(x.nbytes, "bench/x", "scratch")
        by = alloc(4 * n_out, "bench/y", "scratch")
        ops = len(windows)
        try:
            vk.upload(dev, bx, x)

            def plain(g, i=0):
                g.op("mul_mat", [windows[i], bx, by],
                     (-(-n_out // (t.mv_rows * t.warps)), 1, 1),
                     wtype=wtype, spec=dict(WG=t.subgroup * t.warps, ROWS=t.mv_rows, NT=1,
                                            ACC=0, ACT=0),
                     n_in=n_in, n_out=n_out, n_tokens=1, x_offset=0, y_offset=0, row_offset=0,
                     y_stride=n_out)
            row = {"type": wtype, "n_in": n_in, "n_out": n_out, "bytes": raw.nbytes,
                   "copies": ops, "mul_mat_us": _time_records(dev, kernels, plain, repeats, ops)}
            want = vk.download(dev, by).view(np.float32).copy()
            rows, lanes, mode = t.matvec_shape(wtype, n_out, n_in // MATVEC_CHUNK[wtype])

            def vec(g, i=0):
                g.op("mul_mat_vec", [windows[i], bx, by, bx], (-(-n_out // rows), 1, 1),
                     wtype=wtype, spec=dict(WG=lanes, ROWS=rows, ACC=0, ACT=0, MAP=mode),
                     n_in=n_in, n_out=n_out, x_offset=0, y_offset=0, eps=0.0)
            us = _time_records(dev, kernels, vec, repeats, ops)
            _check(dev, by, want, 1e-3, f"mul_mat_vec {wtype} {n_in}x{n_out}")
            row["mul_mat_vec"] = {"rows": rows, "lanes": lanes, "map": mode, "us": us,
                                  "gb_per_s": raw.nbytes / us / 1e3}
            variants = []
            if t.dot4 and t.matvecq_fits(wtype, n_in):
                for lanes_q, rows_q, ahead, groups in MATVECQ_GRID:
                    if lanes_q % t.subgroup:
                        continue
                    tiles = -(-n_out // (rows_q * lanes_q // t.subgroup))
                    if groups and groups >= tiles:
                        continue

                    def vecq(g, i=0, lanes_q=lanes_q, rows_q=rows_q, ahead=ahead,
                             groups=groups, tiles=tiles):
                        g.op("mul_mat_vecq", [windows[i], bx, by, bx, windows[i]] + [bx] * 6,
                             (groups or tiles, 1, 1), wtype=wtype,
                             spec=dict(WG=lanes_q, ROWS=rows_q, ACC=0, XFORM=0, KMAX=n_in,
                                       UNROLL=ahead),
                             n_in=n_in, n_out=n_out, x_offset=0, y_offset=0, eps=0.0,
                             **VECQ_PLAIN)
                    us = _time_records(dev, kernels, vecq, repeats, ops)
                    _check(dev, by, want, 3e-2, f"mul_mat_vecq {wtype} {n_in}x{n_out} "
                           f"{lanes_q}x{rows_q}x{ahead}x{groups}")
                    variants.append({"lanes": lanes_q, "rows": rows_q, "ahead": ahead,
                                     "groups": groups, "us": us,
                                     "gb_per_s": raw.nbytes / us / 1e3})
            row["variants"] = variants
            row["best"] = min(variants, key=lambda v: v["us"]) if variants else None
            out.append(row)
        finally:
            for b in (bw, bx, by):
                dev.allocator.free(b)
    return out


def _rel_err(got: np.ndarray, want: np.ndarray) -> float:
    """The largest difference, relative to want's largest magnitude."""
    return float(np.abs(got - want).max() / max(np.abs(want).max(), 1e-30))


def _check(dev, by, want: np.ndarray, tol: float, what: str) -> None:
    err = _rel_err(vk.download(dev, by).view(np.float32)[:want.size], want)
    if not err <= tol:
        raise RuntimeError(f"{what} disagrees with mul_mat (max error {err:.2e} of the largest)")


# (weight type, n_in, n_out, tokens): prefill products of the 1B Q4_0 and 8B Q4_K_M shapes
MATMUL_SHAPES = (("Q4_0", 2048, 2048, 512), ("Q4_0", 2048, 8192, 512),
                 ("Q4_0", 8192, 2048, 512), ("Q4_K", 4096, 4096, 512),
                 ("Q4_K", 4096, 14336, 512), ("Q6_K", 14336, 4096, 512),
                 ("Q4_K", 4096, 14336, 256), ("Q4_K", 4096, 14336, 2048))
# mul_mat_cm2's (rows, tokens, lanes), where the device has VK_NV_cooperative_matrix2
MATMUL_CM2_TILES = ((128, 128, 256), (128, 256, 256), (256, 128, 256), (128, 64, 256),
                    (64, 64, 128), (64, 128, 128), (128, 256, 512))
MATMUL_VARIANTS = (("mul_mat_cm", 128, 64), ("mul_mat_cm", 64, 64), ("mul_mat_cm", 128, 32),
                   ("mul_mat_cm", 64, 32), ("mul_mat_cm", 128, 128), ("mul_mat_cm", 64, 128))


def parse_shapes(text: str) -> list[tuple[str, int, int, int]]:
    """"Q4_K:4096x14336x512,..." (type: inputs x outputs x tokens) as MATMUL_SHAPES' rows."""
    import gguf

    out = []
    for item in text.split(","):
        try:
            wtype, dims = item.strip().split(":")
            n_in, n_out, n = (int(v) for v in dims.split("x"))
        except ValueError:
            raise ValueError(f"a shape is TYPE:INxOUTxTOKENS, not {item!r}") from None
        if wtype not in gguf.GGMLQuantizationType.__members__:
            raise ValueError(f"{wtype!r} is not a weight type")
        out.append((wtype, n_in, n_out, n))
    return out


def parse_tiles(text: str) -> list[tuple[int, int, int]]:
    """"128x128x256,..." (rows x tokens x lanes) as MATMUL_CM2_TILES' rows."""
    try:
        tiles = [tuple(int(v) for v in item.strip().split("x")) for item in text.split(",")]
    except ValueError:
        tiles = []
    if not tiles or any(len(t) != 3 for t in tiles):
        raise ValueError(f"tiles are ROWSxTOKENSxLANES, comma-separated, not {text!r}")
    return tiles


def _compile_s(kernels, name: str, wtype: str, spec: dict) -> float:
    """Seconds the driver takes to make a variant's pipeline (0 where it was made before)."""
    t0 = time.perf_counter()
    kernels.get(name, wtype, **spec)
    return time.perf_counter() - t0


def _said(row: dict, v: dict) -> None:
    """One variant's time as it comes, on stderr (a long sweep cut short still tells)."""
    tile = "x".join(map(str, v["tile"])) + (" ahead" if v.get("ahead") else "") + \
        (f" split {v['split']}" if v.get("split", 1) > 1 else "") + \
        (f" unroll {v['unroll']}" if v.get("unroll") else "")
    what = f"{v['us']:.1f} us {v['tflops']:.1f} TFLOP/s" if "us" in v else v["error"]
    if v.get("compile_s"):
        what += f" (pipeline made in {v['compile_s']:.1f} s)"
    routing = f" {row['routing']}" if "routing" in row else ""
    print(f"{row['type']} {row['n_in']}x{row['n_out']}x{row.get('tokens', '')}{routing} "
          f"{v['kernel']} {tile}: {what}", file=sys.stderr, flush=True)


def bench_mul_mat_cm(dev, kernels, repeats: int = 10, shapes=MATMUL_SHAPES,
                     types: set[str] | None = None,
                     variants: set[str] | None = None,
                     cm2_tiles=MATMUL_CM2_TILES) -> list[dict]:
    """The cooperative-matrix prefill products, tile by tile, against the register-tiled
    mul_mat; outputs checked against mul_mat first (f16 inputs: 1e-2 relative). types and
    variants (mul_mat_cm, mul_mat_cm2, mul_mat_cm2h: x as f16, mul_mat_cm2f: x as f16 and
    the sums in f16, mul_mat_cm2g: ... and Q8_0's or Q4_0's blocks eight at a time,
    mul_mat_cm2s: W staged by the lanes, mul_mat_cm2p: W predecoded to f16
    rows by dequant_f16, then the f16 product, mul_mat_cm2pf: the same with f16 sums)
    narrow the sweep; shapes and cm2_tiles replace its products and its
    workgroup-scope tiles."""
    from ..gpu.builder import _groups_1d
    from ..gpu.kernels import SPLIT_SUM_WG
    from ..gpu.paths import Tuning, cm2s_shared_bytes, cm_shared_bytes

    if not dev.coopmat:
        raise ValueError(f"{dev.name} has no cooperative matrices: nothing to compare")
    from ..gpu.kernels import compiled

    rng = np.random.default_rng(0)
    t = Tuning.for_device(dev)
    splits = dataclasses.replace(t, cm2_split=True)    # the split variants, on or not
    cm2 = dev.coopmat2 and compiled("mul_mat_cm2")
    f16dec = int(t.cm2_f16dec)                          # $HOTSEAT_CM2_F16DEC's decoders
    cm2s = dev.coopmat2 and compiled("mul_mat_cm2s")
    out = []
    for wtype, n_in, n_out, n in shapes:
        if types and wtype not in types:
            continue
        raw = _random_weights(rng, wtype, n_in, n_out)
        x = rng.standard_normal((n, n_in)).astype(np.float32)
        alloc = dev.allocator.alloc
        bw = alloc(raw.nbytes, "bench/w", "scratch")
        bx = alloc(x.nbytes, "bench/x", "scratch")
        bh = alloc(x.nbytes // 2, "bench/x16", "scratch")
        by = alloc(4 * n * n_out, "bench/y", "scratch")
        bp = None                      # split K's partial sums, where a variant splits
        flop = 2.0 * n * n_in * n_out
        try:
            vk.upload(dev, bw, raw)
            vk.upload(dev, bx, x)
            vk.upload(dev, bh, x.astype(np.float16))

            def plain(g, i=0):
                per = t.mm_rows * t.warps
                g.op("mul_mat", [bw, bx, by], (-(-n_out // per), -(-n // t.mm_tokens), 1),
                     wtype=wtype, spec=dict(WG=t.subgroup * t.warps, ROWS=t.mm_rows,
                                            NT=t.mm_tokens, ACC=0, ACT=0),
                     n_in=n_in, n_out=n_out, n_tokens=n, x_offset=0, y_offset=0, row_offset=0,
                     y_stride=n_out)
            us = _time_records(dev, kernels, plain, repeats)
            want = vk.download(dev, by).view(np.float32).copy()
            row = {"type": wtype, "n_in": n_in, "n_out": n_out, "tokens": n,
                   "mul_mat_us": us, "mul_mat_tflops": flop / us / 1e6, "variants": []}
            for kernel, bm, bn in MATMUL_VARIANTS:
                if cm_shared_bytes(bm, bn) > dev.max_shared or (variants and kernel not in
                                                                  variants):
                    continue
                spec = dict(ACC=0, BM=bm, BN=bn)

                def cm(g, i=0, kernel=kernel, bm=bm, bn=bn, spec=spec):
                    g.op(kernel, [bw, bx, by], (-(-n_out // bm), -(-n // bn), 1), wtype=wtype,
                         spec=spec, n_in=n_in, n_out=n_out, n_tokens=n, x_offset=0,
                         y_offset=0, y_stride=n_out)
                us = _time_records(dev, kernels, cm, repeats)
                got = vk.download(dev, by).view(np.float32)
                err = _rel_err(got, want)
                row["variants"].append({"kernel": kernel, "tile": [bm, bn], "us": us,
                                        "tflops": flop / us / 1e6, "max_rel_err": err})
                _said(row, row["variants"][-1])
            # x16: x given as f16 (a pass before); ahead: the K-quants' scales fetched a
            # super-block ahead
            aheads = (0, 1) if wtype in ("Q4_K", "Q6_K") else (0,)
            # the workgroup-scope products: (variant, kernel, spec, x's buffer, push) each
            whole = dict(k_split=0, y_slice=0)
            cm2_runs = [({"kernel": "mul_mat_cm2h" if x16 else "mul_mat_cm2",
                          "tile": [bm, bn, wg], "ahead": ahead}, "mul_mat_cm2",
                         dict(WG=wg, BM=bm, BN=bn, ACC=0, X16=x16, AHEAD=ahead,
                              F16DEC=f16dec),
                         bh if x16 else bx, whole)
                        for bm, bn, wg in cm2_tiles for x16 in (0, 1) for ahead in aheads
                        if cm2 and wtype in CM2_TYPES]
            # ... x as f16 and the sums in f16 (Tuning.cm2_acc16)
            cm2_runs += [({"kernel": "mul_mat_cm2f", "tile": [bm, bn, wg], "ahead": aheads[-1]},
                          "mul_mat_cm2", dict(WG=wg, BM=bm, BN=bn, ACC=0, X16=1,
                                              AHEAD=aheads[-1], F16DEC=f16dec, ACC16=1),
                          bh, whole)
                         for bm, bn, wg in cm2_tiles if cm2 and wtype in CM2_TYPES]
            # ... and Q8_0's and Q4_0's blocks eight at a time (Tuning.cm2_group), their
            # scales fetched at each group or a group ahead
            cm2_runs += [({"kernel": "mul_mat_cm2g", "tile": [bm, bn, wg], "ahead": ahead},
                          "mul_mat_cm2", dict(WG=wg, BM=bm, BN=bn, ACC=0, X16=1, AHEAD=ahead,
                                              F16DEC=f16dec, ACC16=1, GROUP=1), bh, whole)
                         for bm, bn, wg in cm2_tiles for ahead in (0, 1)
                         if cm2 and wtype in CM2_GROUPS and n_in % 256 == 0]
            # ... and the types without super-blocks eight steps along K an iteration, not 4
            cm2_runs += [({"kernel": "mul_mat_cm2h", "tile": [bm, bn, wg], "unroll": 8},
                          "mul_mat_cm2", dict(WG=wg, BM=bm, BN=bn, ACC=0, X16=1, AHEAD=0,
                                              F16DEC=f16dec, UNROLL=8), bh, whole)
                         for bm, bn, wg in cm2_tiles
                         if cm2 and wtype in CM2_TYPES and wtype not in ("Q4_K", "Q6_K")]
            # ... x as f16 with K split where the tiles are too few (Tuning.cm2_k_split)
            for bm, bn, wg in cm2_tiles if cm2 and wtype in CM2_TYPES else ():
                slices, k_split = splits.cm2_k_split(-(-n_out // bm) * -(-n // bn), n_in)
                if slices > 1:
                    cm2_runs.append(({"kernel": "mul_mat_cm2h", "tile": [bm, bn, wg],
                                      "ahead": 1, "split": slices}, "mul_mat_cm2",
                                     dict(WG=wg, BM=bm, BN=bn, ACC=0, X16=1, AHEAD=1,
                                          F16DEC=f16dec), bh,
                                     dict(k_split=k_split, y_slice=n * n_out)))
            # ... and W staged by the lanes (every type), at the tiles whose shared memory fits
            cm2_runs += [({"kernel": "mul_mat_cm2s", "tile": [bm, bn, wg]}, "mul_mat_cm2s",
                          dict(WG=wg, BM=bm, BN=bn, ACC=0), bx, {})
                         for bm, bn, wg in cm2_tiles
                         if cm2s and cm2s_shared_bytes(bm, bn) <= dev.max_shared]

            def timed(v, record, made=None):
                """`record` timed into row as variant v, its output checked against
                mul_mat's; made: (kernel, type, spec) whose pipeline's making is timed
                first. A tile the driver refuses is said, not fatal."""
                vk.upload(dev, by, np.zeros(n * n_out, np.float32))
                try:
                    if made:
                        v["compile_s"] = _compile_s(kernels, *made)
                    us = _time_records(dev, kernels, record, repeats)
                except Exception as exc:
                    row["variants"].append(dict(v, error=f"{type(exc).__name__}: {exc}"))
                else:
                    err = _rel_err(vk.download(dev, by).view(np.float32), want)
                    row["variants"].append(dict(v, us=us, tflops=flop / us / 1e6,
                                                max_rel_err=err))
                _said(row, row["variants"][-1])

            most = max((r[0].get("split", 1) for r in cm2_runs), default=1)
            if most > 1:                       # the most slices' partial sums
                bp = alloc(4 * most * n * n_out, "bench/part", "scratch")
            for v, kernel, spec, xb, push in cm2_runs:
                if variants and v["kernel"] not in variants:
                    continue
                bm, bn = v["tile"][:2]
                slices = v.get("split", 1)

                def cm2_op(g, i=0, kernel=kernel, spec=spec, xb=xb, bm=bm, bn=bn,
                           slices=slices, push=push):
                    g.op(kernel, [bw, xb, bp if slices > 1 else by],
                         (-(-n_out // bm), -(-n // bn), slices), wtype=wtype,
                         spec=spec, n_in=n_in, n_out=n_out, n_tokens=n, x_offset=0,
                         y_offset=0, y_stride=n_out, **push)
                    if slices > 1:
                        g.op("split_sum", [bp, by], _groups_1d(n * n_out, SPLIT_SUM_WG),
                             spec=dict(ACC=0), n=n * n_out, slices=slices)
                timed(v, cm2_op, (kernel, wtype, spec))
            # ... and W predecoded: dequant_f16 turns it to f16 rows, which the f16 product
            # reads (Tuning.predecode; here the whole of W in one pass, x as f16)
            # (mul_mat_cm2pf: with the sums in f16)
            predecoded_runs = [(name, acc16) for name, acc16 in (("mul_mat_cm2p", 0),
                                                                 ("mul_mat_cm2pf", 1))
                               if not variants or name in variants]
            if cm2 and wtype in PREDECODE_TYPES and predecoded_runs:
                bd = alloc(2 * n_in * n_out, "bench/w16", "scratch")
                try:
                    for (name, acc16), (bm, bn, wg) in itertools.product(predecoded_runs,
                                                                         cm2_tiles):
                        spec = dict(WG=wg, BM=bm, BN=bn, ACC=0, X16=1, AHEAD=0, F16DEC=0,
                                    ACC16=acc16)

                        def predecoded(g, i=0, bm=bm, bn=bn, spec=spec):
                            g.op("dequant_f16", [bw, bd], _groups_1d(n_out * n_in // 8),
                                 wtype=wtype, n_in=n_in, n_rows=n_out, row0=0)
                            g.op("mul_mat_cm2", [bd, bh, by], (-(-n_out // bm), -(-n // bn), 1),
                                 wtype="F16", spec=spec, n_in=n_in, n_out=n_out, n_tokens=n,
                                 x_offset=0, y_offset=0, y_stride=n_out, **whole)
                        timed({"kernel": name, "tile": [bm, bn, wg]}, predecoded)
                finally:
                    dev.allocator.free(bd)
            row["best"] = min((v for v in row["variants"] if "us" in v), key=lambda v: v["us"],
                              default={"kernel": "mul_mat", "tile": [], "us": row["mul_mat_us"],
                                       "tflops": row["mul_mat_tflops"]})
            out.append(row)
        finally:
            for b in (bw, bx, bh, by, bp):
                if b is not None:
                    dev.allocator.free(b)
    return out


# (weight type, n_in, n_out, per slot): the expert products of a Qwen3-30B-A3B-shaped model
# (128 experts, 8 used, n_embd 2048, expert ff 768): gate/up from the token's row, down from
# the slot's own row; Q4_K_M keeps down in Q6_K
MOE_SHAPES = (("Q4_K", 2048, 768, False), ("Q6_K", 768, 2048, True),
              ("Q4_0", 2048, 768, False), ("Q4_0", 768, 2048, True))
MOE_EXPERTS, MOE_USED, MOE_TOKENS = 128, 8, 256
MOE_TILES = ((None, None), (2, 8), (4, 8), (4, 16), (8, 8))    # rows x slots; None: Builder's
MOE_CM_TILES = ((64, 32), (128, 32), (64, 64), (128, 64))     # mul_mat_moe_cm's, where it runs
MOE_CM2_TILES = ((128, 32, 256), (128, 64, 256), (64, 32, 128), (64, 64, 128),
                 (256, 32, 256))                                  # mul_mat_moe_cm2's


def moe_routing(rng, n: int, n_expert: int, k: int, skew: float) -> np.ndarray:
    """[n, k] distinct experts per token, drawn with probabilities exp(skew * z): 0 is an
    even routing, 1 about as uneven as trained routers (a few experts take several times
    their share, some none), 3 one where an expert or two take most tokens (as a prompt of
    one sentence repeated routes in a model of random weights)."""
    p = np.exp(skew * rng.standard_normal(n_expert))
    p /= p.sum()
    return np.stack([rng.choice(n_expert, k, replace=False, p=p) for _ in range(n)]) \
        .astype(np.uint32)


def bench_mul_mat_moe(dev, kernels, repeats: int = 10, shapes=MOE_SHAPES,
                      n_expert: int = MOE_EXPERTS, k: int = MOE_USED, n: int = MOE_TOKENS,
                      tiles=MOE_TILES, types: set[str] | None = None,
                      variants: set[str] | None = None) -> list[dict]:
    """A prefill chunk's routed products: per token and slot (mul_mat_id) against grouped by
    expert (moe_group and moe_tiles, then mul_mat_moe and the matrix units' kernels at
    several tiles), for an even, an uneven and a hot routing; outputs checked against
    mul_mat_id first. Activations rounded inside the products as ggml_numerics has them
    (Q8_0 for Q4_0; the K-quants' quantize_act pass is the same for both paths and not
    timed)."""
    from ..gpu.graph import run_once
    from ..gpu.kernels import ACT_INLINE, CM_K
    from ..gpu.builder import moe_tile_slots, moe_tiles_most
    from ..gpu.runstate import moe_groups_words
    from ..gpu.paths import Tuning

    from ..gpu.kernels import compiled

    rng = np.random.default_rng(0)
    t = Tuning.for_device(dev)
    cm2 = dev.coopmat2 and compiled("mul_mat_moe_cm2")
    f16dec = int(t.cm2_f16dec)                          # $HOTSEAT_CM2_F16DEC's decoders
    alloc = dev.allocator.alloc
    out = []
    for wtype, n_in, n_out, per_slot in shapes:
        if types and wtype not in types:
            continue
        raw = _random_weights(rng, wtype, n_in, n_out * n_expert)
        x = rng.standard_normal((n * k if per_slot else n, n_in)).astype(np.float32)
        act = ACT_INLINE.get(wtype, 0)
        flop = 2.0 * n * k * n_in * n_out
        # W in parts of whole experts where it exceeds the device's buffer range, as a
        # model binds it
        per_expert = raw.nbytes // n_expert
        step = max(1, min(n_expert, dev.max_storage_range // per_expert))
        parts = [(alloc(per_expert * min(step, n_expert - e), f"bench/w.{e}", "scratch"), e,
                  min(step, n_expert - e)) for e in range(0, n_expert, step)]
        bx = alloc(x.nbytes, "bench/x", "scratch")
        bh = alloc(x.nbytes // 2, "bench/x16", "scratch")        # x as f16
        bi = alloc(4 * n * k, "bench/ids", "scratch")
        bg = alloc(4 * moe_groups_words(n_expert, n * k), "bench/groups", "scratch")
        bp = alloc(4 * n * k, "bench/perm", "scratch")
        by = alloc(4 * n * k * n_out, "bench/y", "scratch")
        try:
            for bw, e, count in parts:
                vk.upload(dev, bw, raw[e * per_expert:(e + count) * per_expert])
            vk.upload(dev, bx, x)
            vk.upload(dev, bh, x.astype(np.float16))
            for routing, skew in (("even", 0.0), ("uneven", 1.0), ("hot", 3.0)):
                ids = moe_routing(rng, n, n_expert, k, skew)
                vk.upload(dev, bi, ids)
                per_group = t.mv_rows * t.warps

                def per_token(g, i=0):
                    for bw, e, count in parts:
                        g.op("mul_mat_id", [bw, bx, bi, by], (-(-n_out // per_group), k, n),
                             wtype=wtype, spec=dict(WG=t.subgroup * t.warps, ROWS=t.mv_rows,
                                                    ACT=act, X_SLOT=int(per_slot)),
                             n_in=n_in, n_out=n_out, n_used=k, expert_base=e, n_experts=count)

                def group(g, i=0):
                    g.op("moe_group", [bi, bg, bp], (n_expert, 1, 1), n_slots=n * k)
                us = _time_records(dev, kernels, per_token, repeats)
                want = vk.download(dev, by).view(np.float32).copy()
                counts = np.bincount(ids.reshape(-1), minlength=n_expert)
                row = {"type": wtype, "n_in": n_in, "n_out": n_out, "tokens": n,
                       "experts": n_expert, "used": k, "per_slot": per_slot,
                       "routing": routing, "max_expert_tokens": int(counts.max()),
                       "idle_experts": int((counts == 0).sum()), "mul_mat_id_us": us,
                       "mul_mat_id_tflops": flop / us / 1e6,
                       "moe_group_us": _time_records(dev, kernels, group, repeats),
                       "parts": len(parts), "variants": []}
                run_once(dev, kernels, "moe_group", [bi, bg, bp], (n_expert, 1, 1),
                         n_slots=n * k)

                def grouped_op(kernel, bm, bn, spec, x):
                    """The model's grouped product: moe_tiles, then kernel over each part."""
                    def record(g, i=0):
                        g.op("moe_tiles", [bg], (1, 1, 1), n_expert=n_expert, bn=bn)
                        for bw, e, count in parts:
                            g.op(kernel, [bw, x, bg, bp, by],
                                 (-(-n_out // bm), moe_tiles_most(n, k, count, bn), 1),
                                 wtype=wtype, spec=spec, n_in=n_in, n_out=n_out, n_used=k,
                                 expert_base=e, n_experts=count, n_expert=n_expert)
                    return record
                for rows, nt in tiles if not variants or "mul_mat_moe" in variants else ():
                    rows, nt = rows or t.mm_rows, nt or moe_tile_slots(n, k, n_expert,
                                                                       t.mm_tokens)
                    lanes = moe_tiles_most(n, k, n_expert, nt)
                    grouped = grouped_op("mul_mat_moe", rows * t.warps, nt,
                                         dict(WG=t.subgroup * t.warps, ROWS=rows, NT=nt,
                                              ACT=act, X_SLOT=int(per_slot)), bx)
                    vk.upload(dev, by, np.full(n * k * n_out, np.nan, np.float32))
                    us = _time_records(dev, kernels, grouped, repeats)
                    got = vk.download(dev, by).view(np.float32)
                    err = _rel_err(got, want)
                    if not err <= 1e-4:
                        raise RuntimeError(f"mul_mat_moe {wtype} {n_in}x{n_out} {rows}x{nt} "
                                           f"disagrees with mul_mat_id")
                    row["variants"].append({"kernel": "mul_mat_moe", "tile": [rows, nt],
                                            "token_tiles": lanes,
                                            "us": us, "tflops": flop / us / 1e6,
                                            "max_rel_err": err})
                # (mul_mat_moe_cmp: the next step's loads ahead in registers; _cmh: x as
                # f16, as a model gives it)
                on_cm = t.fast_prefill and n_in % CM_K == 0
                cm_names = [(name, ahead, x16) for name, ahead, x16 in (
                                ("mul_mat_moe_cm", 0, 0), ("mul_mat_moe_cmp", 1, 0),
                                ("mul_mat_moe_cmh", 0, 1))
                            if on_cm and (not variants or name in variants)]
                for (name, ahead, x16), (bm, bn) in itertools.product(cm_names, MOE_CM_TILES):
                    lanes = moe_tiles_most(n, k, n_expert, bn)
                    on_cm = grouped_op("mul_mat_moe_cm", bm, bn,
                                       dict(BM=bm, BN=bn, X_SLOT=int(per_slot),
                                            PREFETCH=ahead, X16=x16), bh if x16 else bx)
                    vk.upload(dev, by, np.full(n * k * n_out, np.nan, np.float32))
                    us = _time_records(dev, kernels, on_cm, repeats)
                    err = _rel_err(vk.download(dev, by).view(np.float32), want)
                    if not err <= 2e-2:              # f16 inputs
                        raise RuntimeError(f"{name} {wtype} {n_in}x{n_out} "
                                           f"{bm}x{bn} disagrees with mul_mat_id")
                    row["variants"].append({"kernel": name, "tile": [bm, bn],
                                            "token_tiles": lanes, "us": us,
                                            "tflops": flop / us / 1e6,
                                            "max_rel_err": err})
                # workgroup-scope tiles, the sums in f32 and (mul_mat_moe_cm2f) in f16
                on_units = t.fast_prefill and n_in % CM_K == 0 and cm2 and wtype in CM2_TYPES
                cm2_names = [(name, acc16) for name, acc16 in (("mul_mat_moe_cm2", 0),
                                                               ("mul_mat_moe_cm2f", 1))
                             if on_units and (not variants or name in variants)]
                for (name, acc16), (bm, bn, wg) in itertools.product(cm2_names, MOE_CM2_TILES):
                    lanes = moe_tiles_most(n, k, n_expert, bn)
                    spec = dict(WG=wg, BM=bm, BN=bn, X_SLOT=int(per_slot), F16DEC=f16dec,
                                ACC16=acc16)
                    on_cm2 = grouped_op("mul_mat_moe_cm2", bm, bn, spec, bx)
                    vk.upload(dev, by, np.full(n * k * n_out, np.nan, np.float32))
                    v = {"kernel": name, "tile": [bm, bn, wg], "token_tiles": lanes}
                    try:
                        v["compile_s"] = _compile_s(kernels, "mul_mat_moe_cm2", wtype, spec)
                        us = _time_records(dev, kernels, on_cm2, repeats)
                    except Exception as exc:   # a tile the driver refuses: said
                        row["variants"].append(dict(v, error=f"{type(exc).__name__}: "
                                                             f"{exc}"))
                        continue
                    err = _rel_err(vk.download(dev, by).view(np.float32), want)
                    if not err <= 2e-2:              # said, not timed
                        row["variants"].append(dict(v, error=f"disagrees with "
                                                             f"mul_mat_id ({err:.1e})"))
                        continue
                    row["variants"].append(dict(v, us=us, tflops=flop / us / 1e6,
                                                max_rel_err=err))
                for v in row["variants"]:
                    _said(dict(row, tokens=n), v)
                best = min((v for v in row["variants"] if "us" in v), key=lambda v: v["us"],
                           default={"kernel": "mul_mat_id", "tile": [], "token_tiles": 0,
                                    "us": row["mul_mat_id_us"],
                                    "tflops": row["mul_mat_id_tflops"]})
                row["best"] = best
                row["speedup"] = row["mul_mat_id_us"] / (best["us"] + row["moe_group_us"] / 3)
                out.append(row)
        finally:
            for b in [p[0] for p in parts] + [bx, bh, bi, bg, bp, by]:
                dev.allocator.free(b)
    return out


# (n_head, n_head_kv, head_dim, positions): one token's attention in the 1B and 8B Llama
# shapes after a 512-token prompt and after 4096
ATTN_SHAPES = ((32, 8, 64, 640), (32, 8, 128, 640), (32, 8, 64, 4160), (32, 8, 128, 4160))
# attn_decode's (lanes, query heads a workgroup, splits, fewest positions a split takes, the
# next K and V rows loaded a step ahead)
ATTN_GRID = tuple((lanes, heads, splits, chunk, ahead) for lanes in (64, 256) for heads in (1, 2)
                  for splits in (8, 16, 32) for chunk in (32, 64) for ahead in (False, True))
ATTN_COPIES = 64         # K and V copies at most, one an op, so each op reads its own


def bench_attn_decode(dev, kernels, repeats: int = 20, shapes=None, grid=None) -> list[dict]:
    """Decode attention (attn_decode, one pass with its splits joined by the last workgroup)
    at every (lanes, heads, splits, chunk, ahead) of the grid, K and V read cold (each op
    its own copy, COLD_BYTES over), each variant's output checked against numpy first."""
    from ..gpu.builder import Builder
    from ..gpu.rope import Rope
    from ..gpu.runstate import RunState
    from ..gpu.paths import Tuning

    rng = np.random.default_rng(0)
    base = Tuning.for_device(dev)
    shapes, grid = shapes or ATTN_SHAPES, grid or ATTN_GRID
    out = []
    for n_head, n_kv, hd, positions in shapes:
        n_ctx = max(positions, 128 * max(v[2] for v in grid))
        q = rng.standard_normal((n_head, hd)).astype(np.float32)
        k = rng.standard_normal((positions, n_kv, hd)).astype(np.float16)
        v = rng.standard_normal((positions, n_kv, hd)).astype(np.float16)
        scale = hd ** -0.5
        group = n_head // n_kv                   # query head h reads KV head h // group
        scores = np.einsum("hd,phd->hp", q, np.repeat(k.astype(np.float32), group, 1)) * scale
        p = np.exp(scores - scores.max(1, keepdims=True))
        want = np.einsum("hp,phd->hd", p / p.sum(1, keepdims=True),
                         np.repeat(v.astype(np.float32), group, 1))
        kv_bytes = 2 * n_ctx * n_kv * hd * 2
        copies = max(2, min(ATTN_COPIES, -(-COLD_BYTES // kv_bytes)))
        rs = RunState(dev, "bench", n_layer=1, n_embd=n_head * hd, n_head=n_head,
                      q_dim=n_head * hd, kv_dim=n_kv * hd, n_ff=64, n_vocab=64, n_ctx=n_ctx,
                      max_tokens=1, rope=(Rope(1e4, hd),))
        alloc = dev.allocator.alloc
        caches = [(alloc(kv_bytes // 2, "bench/k", "scratch"),
                   alloc(kv_bytes // 2, "bench/v", "scratch")) for _ in range(copies)]
        bq = alloc(q.nbytes, "bench/q", "scratch")
        bo = alloc(q.nbytes, "bench/o", "scratch")
        try:
            rs.set_step([0], positions - 1)
            vk.upload(dev, bq, q)
            full = np.zeros((2, n_ctx, n_kv, hd), np.float16)
            full[0, :positions], full[1, :positions] = k, v
            for bk, bv in caches:
                vk.upload(dev, bk, full[0])
                vk.upload(dev, bv, full[1])
            variants = []
            for lanes, heads, splits, chunk, ahead in grid:
                if lanes % base.subgroup or (n_head // n_kv) % heads:
                    continue
                t = dataclasses.replace(base, decode_wg=lanes, decode_heads=heads,
                                        split_max=splits, split_chunk=chunk, matvec=True,
                                        decode_ahead=ahead, compute_units=0,  # splits
                                        ggml_numerics=False)      # as given; attn_decode
                builder: dict = {}                  # the graph's, made with its first op

                def record(g, i, t=t, builder=builder):
                    if i == 0:
                        builder["b"] = Builder(g, {}, rs, t)
                    builder["b"].attention(bq, *caches[i], bo, n_head, n_kv, hd, 1, scale=scale)
                us = _time_records(dev, kernels, record, repeats, copies)
                err = _rel_err(vk.download(dev, bo).view(np.float32).reshape(want.shape), want)
                if not err <= 1e-2:
                    raise RuntimeError(f"attn_decode {lanes}x{heads}x{splits}x{chunk}"
                                       f"{'a' if ahead else ''} disagrees with numpy (max "
                                       f"error {err:.2e} of the largest)")
                variants.append({"lanes": t.decode_lanes(hd),
                                 "heads": t.decode_group(hd, n_head, n_kv),
                                 "splits": t.decode_splits(n_ctx), "chunk": chunk,
                                 "ahead": ahead, "us": us,
                                 "gb_per_s": kv_bytes * positions / n_ctx / us / 1e3})
            out.append({"n_head": n_head, "n_head_kv": n_kv, "head_dim": hd,
                        "positions": positions, "copies": copies, "variants": variants,
                        "best": min(variants, key=lambda v: v["us"]) if variants else None})
        finally:
            for b in [bq, bo] + [x for pair in caches for x in pair]:
                dev.allocator.free(b)
            rs.close()
    return out


def run_kernel_bench(args) -> int:
    from ..gpu.kernels import KernelCache

    if args.repeats < 1:
        raise ValueError("-r must be >= 1")
    with vk.Device() as dev:
        kernels = KernelCache(dev)
        try:
            bench = {"mul_mat_vec": bench_mul_mat_vec, "mul_mat_cm": bench_mul_mat_cm,
                     "mul_mat_moe": bench_mul_mat_moe, "concat": bench_concat,
                     "attn_decode": bench_attn_decode}[args.kernel]
            types = getattr(args, "types", None)
            kw = {"types": set(types.split(","))} if types else {}
            variants = getattr(args, "variants", None)
            if variants:
                if args.kernel not in ("mul_mat_cm", "mul_mat_moe"):
                    raise ValueError("--variants narrows mul_mat_cm and mul_mat_moe only")
                kw["variants"] = set(variants.split(","))
            if getattr(args, "shapes", None) or getattr(args, "tiles", None):
                if args.kernel != "mul_mat_cm":
                    raise ValueError("--shapes and --tiles are mul_mat_cm's")
                if args.shapes:
                    kw["shapes"] = parse_shapes(args.shapes)
                if args.tiles:
                    kw["cm2_tiles"] = parse_tiles(args.tiles)
            rows = bench(dev, kernels, args.repeats, **kw)
        finally:
            kernels.close()
        report = {"kernel": args.kernel, "device": dev.name, "repeats": args.repeats,
                  "timer": "gpu timestamps" if dev.timestamps_ok else "wall clock",
                  "rows": rows}
    if args.json:
        print(json.dumps(report))
        return 0
    if args.kernel == "mul_mat_moe":
        print(f"prefill expert products on {report['device']}, {MOE_TOKENS} tokens, "
              f"{MOE_USED} of {MOE_EXPERTS} experts, median op time ({report['timer']}); "
              "speedup counts a third of moe_group (one grouping serves gate, up and down)")
        print("| type | n_in | n_out | routing | most tokens | mul_mat_id us | moe_group us | "
              "best rows x tokens / tiles (cm: matrix units) | us | TFLOP/s | speedup | all |")
        print("|---|---:|---:|---|---:|---:|---:|---|---:|---:|---:|---|")

        def tile(v: dict) -> str:     # cm: mul_mat_moe_cm's weight rows x slots (cm2's x lanes)
            cm = {"mul_mat_moe_cm": "cm ", "mul_mat_moe_cmp": "cmp ", "mul_mat_moe_cmh": "cmh ",
                  "mul_mat_moe_cm2": "cm2 ", "mul_mat_moe_cm2f": "cm2f "}.get(v["kernel"], "")
            return f"{cm}{'x'.join(map(str, v['tile']))}/{v['token_tiles']}"

        for r in rows:
            b = r["best"]
            rest = " ".join(f"{tile(v)}:{v['us']:.0f}" if "us" in v else f"{tile(v)}:refused"
                            for v in r["variants"])
            print(f"| {r['type']} | {r['n_in']} | {r['n_out']} | {r['routing']} | "
                  f"{r['max_expert_tokens']} | {r['mul_mat_id_us']:.1f} | "
                  f"{r['moe_group_us']:.1f} | {tile(b)} | {b['us']:.1f} | {b['tflops']:.2f} | "
                  f"{r['speedup']:.1f}x | {rest} |")
        return 0
    if args.kernel == "attn_decode":
        def name(v: dict) -> str:
            return f"{v['lanes']}x{v['heads']}x{v['splits']}x{v['chunk']}" \
                f"{'a' if v['ahead'] else ''}"

        print(f"decode attention on {report['device']}, K and V read cold (each op its own "
              f"copy), median op time of {args.repeats} replays ({report['timer']})")
        print("| heads / kv | head_dim | positions | best (lanes x heads x splits x chunk, a: "
              "ahead) | us | GB/s | all (l x h x s x c: us) |")
        print("|---|---:|---:|---|---:|---:|---|")
        for r in rows:
            b = r["best"]
            rest = " ".join(f"{name(v)}:{v['us']:.1f}" for v in r["variants"])
            print(f"| {r['n_head']} / {r['n_head_kv']} | {r['head_dim']} | {r['positions']} | "
                  f"{name(b)} | {b['us']:.1f} | "
                  f"{b['gb_per_s']:.0f} | {rest} |")
        return 0
    if args.kernel == "mul_mat_cm":
        print(f"prefill products on {report['device']}, median op time ({report['timer']})")
        print("| type | n_in | n_out | tokens | mul_mat TFLOP/s | best | TFLOP/s | all |")
        print("|---|---:|---:|---:|---:|---|---:|---|")
        for r in rows:
            b = r["best"]
            def one(v: dict) -> str:      # cm2 tiles: rows x tokens x lanes (a: ahead)
                name = f"{v['kernel'][8:]}{'x'.join(map(str, v['tile']))}" \
                    f"{'a' if v.get('ahead') else ''}"
                if "error" in v:
                    return f"{name}:refused"
                return f"{name}:{v['tflops']:.0f}(e{v['max_rel_err']:.0e})"
            rest = " ".join(one(v) for v in r["variants"])
            print(f"| {r['type']} | {r['n_in']} | {r['n_out']} | {r['tokens']} | "
                  f"{r['mul_mat_tflops']:.1f} | {b['kernel']} {b['tile']} | {b['tflops']:.1f} | "
                  f"{rest} |")
        return 0
    if args.kernel == "mul_mat_vec":
        print(f"decode products on {report['device']}, weights read cold (each op its own "
              f"copy), median op time of {args.repeats} replays ({report['timer']})")
        print("| type | n_in | n_out | mul_mat us | mul_mat_vec (rows x lanes) us | GB/s | "
              "mul_mat_vecq best (lanes x rows x ahead x groups) us | GB/s | "
              "all (l x r x a x g: us) |")
        print("|---|---:|---:|---:|---|---:|---|---:|---|")
        for r in rows:
            v, b = r["mul_mat_vec"], r["best"]
            rest = " ".join(f"{q['lanes']}x{q['rows']}x{q['ahead']}x{q['groups']}:"
                            f"{q['us']:.1f}" for q in r["variants"])
            best = f"{b['lanes']}x{b['rows']}x{b['ahead']}x{b['groups']} {b['us']:.1f} | " \
                f"{b['gb_per_s']:.0f}" if b else "- | -"
            print(f"| {r['type']} | {r['n_in']} | {r['n_out']} | {r['mul_mat_us']:.1f} | "
                  f"{v['rows']} x {v['lanes']}{' m1' if v['map'] else ''} {v['us']:.1f} | "
                  f"{v['gb_per_s']:.0f} | {best} | {rest} |")
        return 0
    print(f"concat(conv_state, transpose(bx), 0) on {report['device']}, median of "
          f"{args.repeats} replays ({report['timer']})")
    head = f"| {'d_conv + tokens':>15} | {'n_embd':>6} | {'tiled us':>9} | {'generic us':>10} " \
           f"| {'generic/tiled':>13} |"
    print(head)
    print("|" + "|".join("-" * len(c) for c in head.split("|")[1:-1]) + "|")
    for r in rows:
        shape = f"{r['d_conv']} + {r['tokens']}"
        print(f"| {shape:>15} | {r['n_embd']:>6} | {r['tiled_us']:>9.1f} | "
              f"{r['generic_us']:>10.1f} | {r['generic_over_tiled']:>12.2f}x |")
    return 0
