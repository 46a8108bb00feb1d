"""`hotseat kernel-bench concat`: concat's two paths on the shapes lfm2 gives it.

lfm2 concatenates each layer's conv state [n_embd, d_conv] with B * x read transposed
([n, n_embd] stored token-major), along dim 0. Each path is recorded once as a one-op graph
and replayed `repeats` times; a replay's time is the op's GPU time from timestamps (wall
time around the submit where the device has none). Reported: medians in microseconds and
element-wise / tiled. Both paths' outputs are compared with numpy first.
"""
from __future__ import annotations

import json
import statistics
import time

import numpy as np

from ..gpu import vk

# (d_conv, tokens, n_embd): decode and a prefill chunk at LFM2-350M and -1.2B widths, and a
# long prefill
SHAPES = ((2, 1, 1024), (2, 256, 1024), (2, 1, 2048), (2, 256, 2048), (2, 1024, 2048))


def _time_path(dev, kernels, state, bx, out, d_conv, n, e, tiled, repeats) -> list[float]:
    from ..gpu.graph import Graph
    from ..gpu.ops import Builder, Tuning, View

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


def run_kernel_bench(args) -> int:
    from ..gpu.kernels import KernelCache

    if args.repeats < 1:
        raise ValueError("-r must be >= 1")
    with vk.Device() as dev:
        kernels = KernelCache(dev)
        try:
            rows = bench_concat(dev, kernels, args.repeats)
        finally:
            kernels.close()
        report = {"kernel": args.kernel, "device": dev.name, "repeats": args.repeats,
                  "timer": "gpu timestamps" if dev.timestamps_ok else "wall clock",
                  "rows": rows}
    if args.json:
        print(json.dumps(report))
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
