"""`hotseat swap-bench`: models taking turns on the GPU, measured.

For each cycle and each model in turn: make it warm (a restore from host shadows: the
GGUF memmap for weights, the KV host copy after full eviction), answer a repeated prompt
(its shared prefix comes from the surviving prompt cache: `cached_tokens`), then release it
and read its residual device bytes. Reported per model: median restore time, bytes moved,
achieved host-to-device bandwidth against the device's measured copy bandwidth, cold
residual, cached tokens, and how long a reload from disk (parse + upload) takes instead.
"""
from __future__ import annotations

import json
import os
import statistics
import time

import numpy as np

from ..gpu import vk

PROMPT = "Name three rivers of Europe and the seas they flow into."


def copy_bandwidth(dev: vk.Device, nbytes: int = 256 << 20, repeats: int = 3) -> float:
    """Bytes/s of one host-visible to device-local buffer copy (the upper bound a restore
    can reach); on unified memory, a host memcpy into mapped device memory."""
    src_host = np.random.default_rng(0).integers(0, 255, nbytes, dtype=np.uint8)
    dst = dev.allocator.alloc(nbytes, "bandwidth-probe", "scratch")
    try:
        times = []
        if dst.view is not None:
            for _ in range(repeats):
                t0 = time.perf_counter()
                dst.view[:] = src_host
                times.append(time.perf_counter() - t0)
        else:
            staging = dev.allocator.alloc(nbytes, "bandwidth-probe-src", "staging", host=True)
            try:
                staging.view[:] = src_host
                for _ in range(repeats):
                    t0 = time.perf_counter()
                    with dev.one_shot() as cmd:
                        vk.copy_buffer(cmd, staging, 0, dst, 0, nbytes)
                    times.append(time.perf_counter() - t0)
            finally:
                dev.allocator.free(staging)
        return nbytes / statistics.median(times)
    finally:
        dev.allocator.free(dst)


def run_swap_bench(args) -> int:
    from ..api import Engine
    from ..args import arena_enabled
    from ..formats.bundled import resolve
    from ..residency.model import Model
    from ..text.sampling import SamplingParams

    paths = [resolve(m) for m in (args.model or [None, None])]
    if args.cycles < 1:
        raise ValueError("--cycles must be >= 1")
    full = bool(args.evict_kv)
    greedy = SamplingParams(temperature=0.0)
    with Engine(n_ctx=args.ctx, full_release=full, flash_attn=args.flash_attn,
                arena=arena_enabled(args), arena_label="swap-bench") as eng:
        names = []
        for i, p in enumerate(paths):
            base = os.path.splitext(os.path.basename(p))[0]
            names.append(eng.load(p, name=base if base not in eng.models else f"{base}#{i + 1}",
                                  cpu_moe=args.cpu_moe))
        bandwidth = eng.device_job(lambda: copy_bandwidth(eng.dev), why="copy bandwidth")
        per = {n: {"restore_s": [], "bytes": [], "residual": [], "cached": [], "release_s": [],
                   "alloc_s": [], "copy_s": [], "state_s": []} for n in names}
        answers: dict[str, list] = {n: [] for n in names}
        for _ in range(args.cycles):
            for n in names:
                m = eng.models[n].model
                info = eng.warm(n)
                if info["op"] == "restore" and info["bytes"]:
                    per[n]["restore_s"].append(info["seconds"])
                    per[n]["bytes"].append(info["bytes"])
                    per[n]["state_s"].append(info.get("state_s", 0.0))
                    for k in ("alloc_s", "copy_s"):
                        if k in getattr(m, "upload_timing", {}):
                            per[n][k].append(m.upload_timing[k])
                out = eng.generate(n, messages=[{"role": "user", "content": PROMPT}],
                                   max_tokens=args.n, sampling=greedy)
                answers[n].append(out.tokens)
                per[n]["cached"].append(out.timings["cached_tokens"])
                rel = eng.evict(n, full=full)
                per[n]["release_s"].append(rel["seconds"])
                per[n]["residual"].append(sum(m.device_bytes().values()))
        # reload from disk for comparison: parse the file and upload again
        reload_s = {}
        for n, p in zip(names, paths):
            eng.unload(n)

            def reload(n: str = n, p: str = p) -> float:
                t0 = time.perf_counter()
                fresh = Model(eng.dev, eng.kernels, p, n_ctx=args.ctx, name=n + "-reload",
                              cpu_moe=args.cpu_moe)
                took = time.perf_counter() - t0
                fresh.close()
                return took
            reload_s[n] = eng.device_job(reload, why="reload from disk")
    report = {"device": eng.dev.name, "mode": "full" if full else "weights-only",
              "cycles": args.cycles, "copy_bandwidth_GBps": bandwidth / 1e9, "models": []}
    for n in names:
        r = per[n]
        restore = statistics.median(r["restore_s"]) if r["restore_s"] else 0.0
        moved = statistics.median(r["bytes"]) if r["bytes"] else 0
        report["models"].append({
            "name": n,
            "restore_s_median": restore,
            "bytes_moved": int(moved),
            "achieved_GBps": moved / restore / 1e9 if restore else 0.0,
            "vs_copy_bandwidth": (moved / restore) / bandwidth if restore else 0.0,
            "ideal_restore_s": moved / bandwidth,
            "release_s_median": statistics.median(r["release_s"]),
            "weights_alloc_s_median": statistics.median(r["alloc_s"]) if r["alloc_s"] else None,
            "weights_copy_s_median": statistics.median(r["copy_s"]) if r["copy_s"] else None,
            "state_restore_s_median": statistics.median(r["state_s"]) if r["state_s"] else None,
            "cold_residual_bytes": max(r["residual"]),
            "cached_tokens": r["cached"],
            "outputs_identical_across_cycles": all(a == answers[n][0] for a in answers[n]),
            "reload_from_disk_s": reload_s[n],
        })
    if args.json:
        print(json.dumps(report))
    else:
        print(f"device: {report['device']}  mode: {report['mode']}  cycles: {args.cycles}  "
              f"copy bandwidth: {report['copy_bandwidth_GBps']:.2f} GB/s")
        for m in report["models"]:
            print(f"{m['name']}: restore {1e3 * m['restore_s_median']:.1f} ms for "
                  f"{m['bytes_moved'] / 2**20:.1f} MiB ({m['achieved_GBps']:.2f} GB/s, "
                  f"{100 * m['vs_copy_bandwidth']:.0f}% of copy bandwidth; weight alloc "
                  f"{1e3 * (m['weights_alloc_s_median'] or 0):.1f} ms, weight copy "
                  f"{1e3 * (m['weights_copy_s_median'] or 0):.1f} ms, KV and compute "
                  f"{1e3 * (m['state_restore_s_median'] or 0):.1f} ms), cold residual "
                  f"{m['cold_residual_bytes']} B, cached tokens {m['cached_tokens']}, "
                  f"identical outputs {m['outputs_identical_across_cycles']}, reload from "
                  f"disk {1e3 * m['reload_from_disk_s']:.0f} ms")
    return 0
