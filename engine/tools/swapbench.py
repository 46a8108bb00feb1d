"""`hotseat swap-bench`: models taking turns on the GPU, measured.

For each cycle and each model in turn: make it warm (a restore from host shadows: the
GGUF memmap for weights, the KV host copy after full eviction), answer a repeated prompt
(its shared prefix comes from the surviving prompt cache: `cached_tokens`), then release it
and read its residual device bytes. Reported per model: median restore time, bytes moved,
achieved host-to-device bandwidth against the device's measured copy bandwidth, cold
residual, cached tokens, how long a reload from disk (parse + upload) takes instead, and
a restore's time and rate from each tier of the host shadows (restore_tiers: KV in RAM or
on disk, the GGUF's pages in the page cache or not).

With `--processes N` the models take turns between N `hotseat serve` processes on one
private arena instead (run_process_swap_bench): the time to the first token after a swap.
"""
from __future__ import annotations

import json
import os
import statistics
import time

import numpy as np

from ..facade import Request
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
    from ..text.sampling import SamplingParams

    if getattr(args, "processes", 1) > 1:
        return run_process_swap_bench(args)
    paths = [resolve(m) for m in (args.model or [None, None])]
    if args.cycles < 1:
        raise ValueError("--cycles must be >= 1")
    full = bool(args.evict_kv)
    greedy = SamplingParams(temperature=0.0)
    with Engine(n_ctx=args.ctx, full_release=full, flash_attn=args.flash_attn,
                arena=arena_enabled(args), arena_label="swap-bench", prompt_cache=False) as eng:
        names = []
        for i, p in enumerate(paths):
            base = os.path.splitext(os.path.basename(p))[0]
            names.append(eng.load(p, name=base if base not in names else f"{base}#{i + 1}",
                                  cpu_moe=args.cpu_moe))
        bandwidth = eng.device_job(copy_bandwidth, why="copy bandwidth")
        per = {n: {"restore_s": [], "bytes": [], "residual": [], "cached": [], "release_s": [],
                   "alloc_s": [], "wait_s": [], "record_s": [], "state_s": [], "trim_s": [],
                   "ttft_swap": [], "ttft_warm": []}
               for n in names}
        answers: dict[str, list] = {n: [] for n in names}
        def ask(n: str, t0: float):
            first: list[float] = []
            out = eng.generate(Request(n, messages=[{"role": "user", "content": PROMPT}],
                                       max_tokens=args.n, sampling=greedy),
                               on_text=lambda _: first or first.append(time.perf_counter()))
            return out, (first[0] if first else time.perf_counter()) - t0

        for cycle in range(args.cycles):
            for n in names:
                t_swap = time.perf_counter()
                info = eng.warm(n)
                if info["op"] == "restore" and info["bytes"]:
                    per[n]["restore_s"].append(info["seconds"])
                    per[n]["bytes"].append(info["bytes"])
                    per[n]["state_s"].append(info.get("state_s", 0.0))
                    for k in ("alloc_s", "wait_s", "record_s"):
                        if k in info:
                            per[n][k].append(info[k])
                out, ttft = ask(n, t_swap)
                answers[n].append(out.tokens)
                if cycle:                 # the first cycle's graphs are recorded afresh
                    per[n]["ttft_swap"].append(ttft)
                    again, ttft_warm = ask(n, time.perf_counter())
                    per[n]["ttft_warm"].append(ttft_warm)
                    answers[n].append(again.tokens)
                per[n]["cached"].append(out.timings["cached_tokens"])
                rel = eng.evict(n, full=full)
                if args.trim:             # what a hand-over to another process frees too
                    t0 = time.perf_counter()
                    eng.device_job(lambda dev: dev.allocator.trim(), why="trim")
                    per[n]["trim_s"].append(time.perf_counter() - t0)
                per[n]["release_s"].append(rel["seconds"])
                per[n]["residual"].append(next(sum(s["device_bytes"].values())
                                               for s in eng.status() if s["name"] == n))
        tiers = {n: restore_tiers(eng, n, p) for n, p in zip(names, paths)}
        # reload from disk for comparison: parse the file and upload again
        reload_s = {}
        for n, p in zip(names, paths):
            eng.unload(n)

            t0 = time.perf_counter()      # what a server that drops the model does again
            eng.load(p, name=n + "-reload", n_ctx=args.ctx, cpu_moe=args.cpu_moe)
            reload_s[n] = time.perf_counter() - t0
            eng.unload(n + "-reload")
        device = eng.device_name
    report = {"device": device, "mode": ("full" if full else "weights-only")
              + (", spares freed" if args.trim else ""),
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
            "trim_s_median": statistics.median(r["trim_s"]) if r["trim_s"] else None,
            "weights_alloc_s_median": statistics.median(r["alloc_s"]) if r["alloc_s"] else None,
            "copy_wait_s_median": statistics.median(r["wait_s"]) if r["wait_s"] else None,
            "record_s_median": statistics.median(r["record_s"]) if r["record_s"] else None,
            "state_restore_s_median": statistics.median(r["state_s"]) if r["state_s"] else None,
            "cold_residual_bytes": max(r["residual"]),
            # the first token after a swap (restore, prefill, one token) against the ideal:
            # the copy at the device's bandwidth plus the same request warm
            "ttft_after_swap_s_median": statistics.median(r["ttft_swap"])
            if r["ttft_swap"] else None,
            "ttft_warm_s_median": statistics.median(r["ttft_warm"]) if r["ttft_warm"] else None,
            "ttft_after_swap_vs_ideal": statistics.median(r["ttft_swap"])
            / (moved / bandwidth + statistics.median(r["ttft_warm"]))
            if r["ttft_swap"] else None,
            "cached_tokens": r["cached"],
            "outputs_identical_across_cycles": all(a == answers[n][0] for a in answers[n]),
            "reload_from_disk_s": reload_s[n],
            "tiers": tiers[n],
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
                  f"{1e3 * (m['weights_alloc_s_median'] or 0):.1f} ms, graphs "
                  f"{1e3 * (m['record_s_median'] or 0):.1f} ms, copy tail "
                  f"{1e3 * (m['copy_wait_s_median'] or 0):.1f} ms, KV and compute "
                  f"{1e3 * (m['state_restore_s_median'] or 0):.1f} ms), cold residual "
                  f"{m['cold_residual_bytes']} B, cached tokens {m['cached_tokens']}, "
                  f"TTFT after a swap {1e3 * (m['ttft_after_swap_s_median'] or 0):.1f} ms "
                  f"(warm {1e3 * (m['ttft_warm_s_median'] or 0):.1f} ms, "
                  f"{m['ttft_after_swap_vs_ideal'] or 0:.2f}x the ideal), "
                  f"identical outputs {m['outputs_identical_across_cycles']}, reload from "
                  f"disk {1e3 * m['reload_from_disk_s']:.0f} ms")
            print("  restore by tier: " + ", ".join(
                f"{tier} {1e3 * t['restore_s_median']:.1f} ms ({t['GBps']:.2f} GB/s)"
                for tier, t in m["tiers"].items()))
    return 0


TIER_REPEATS = 3


def restore_tiers(eng, name: str, path: str) -> dict:
    """A full eviction then a restore, REPEATS times from each tier, with the prompt cache
    the cycles left: "ram" (the KV shadow in RAM, the weights from the page cache), "disk"
    (the KV shadow moved to disk under a host budget of 0), "file" (the GGUF's pages
    dropped from the page cache first, posix_fadvise DONTNEED: the weights from the disk,
    as far as the kernel drops them). Per tier: the median restore time, the bytes it moved
    (weights and KV) and their rate."""
    out = {}
    for tier in ("ram", "disk", "file"):
        times, moved = [], []
        for _ in range(TIER_REPEATS):
            eng.set_host_budget(0 if tier == "disk" else None)
            eng.evict(name, full=True)
            if tier == "file":
                drop_page_cache(path)
            info = eng.warm(name)
            times.append(info["seconds"])
            moved.append(info["bytes"])
        restore, nbytes = statistics.median(times), int(statistics.median(moved))
        out[tier] = {"restore_s_median": restore, "bytes": nbytes,
                     "GBps": nbytes / restore / 1e9 if restore else 0.0}
    eng.set_host_budget(None)
    return out


def drop_page_cache(path: str) -> None:
    """Ask the kernel to drop a file's clean pages from the page cache."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


# -- several processes on one arena ----------------------------------------------------------

def run_process_swap_bench(args) -> int:
    """`hotseat swap-bench --processes N`: N `hotseat serve` processes on one private arena,
    each serving one of the models (in turn), asked in turn over HTTP. Every request after
    the first of a cycle finds its server cold, because the one before took the GPU: its
    time to the first streamed token is the TTFT after a swap (the ring, the other server's
    full eviction at its safe point, the restore, the prefill of what the prompt cache does
    not hold, one token). A second request right after it, warm, gives the TTFT without the
    swap. Reported per process: medians of both, the restore's time and bytes against the
    host-to-device copy bandwidth, the handover wait (ring to token), and whether the other
    servers held no device memory while each answered."""
    import shutil
    import tempfile

    from ..formats.bundled import resolve
    from .serveproc import ServeProcess

    if args.cycles < 1 or args.processes < 2:
        raise ValueError("--cycles must be >= 1 and --processes >= 2")
    paths = [resolve(m) for m in (args.model or [None])]
    dev = vk.Device()                    # the copy bandwidth, before any server holds memory
    try:
        device, bandwidth = dev.name, copy_bandwidth(dev)
    finally:
        dev.close()
    arena_dir = tempfile.mkdtemp(prefix="hotseat-swap-bench-")
    extra: list[str] = []
    if args.cpu_moe:
        extra += ["--cpu-moe", str(args.cpu_moe)]
    if args.flash_attn:
        extra += ["--flash-attn", args.flash_attn]
    ledger = os.path.join(arena_dir, "ledger.jsonl")
    # the servers keep no prompt cache across runs: each run's first prompt starts cold
    env = {**os.environ, "HOTSEAT_CACHE_MIB": "0"}
    procs = [ServeProcess([paths[i % len(paths)]], ctx=args.ctx,
                          arena_dir=os.path.join(arena_dir, "arena"), ledger=ledger,
                          extra=extra, env=env)
             for i in range(args.processes)]
    body = {"messages": [{"role": "user", "content": PROMPT}], "max_tokens": args.n,
            "temperature": 0}
    per = [{"ttft_swap": [], "ttft_warm": [], "restore_s": [], "bytes": [], "weights_s": [],
            "wait_s": [], "total_swap": [], "answers": [], "exclusive": True}
           for _ in procs]
    try:
        for p in procs:
            p.wait_ready()
        for p in procs:                  # first use: pipelines and graphs are built here
            p.stream("/v1/chat/completions", body)
        for _ in range(args.cycles):
            for i, p in enumerate(procs):
                ttft, total, text = p.stream("/v1/chat/completions", body)
                r = per[i]
                r["ttft_swap"].append(ttft)
                r["total_swap"].append(total)
                r["answers"].append(text)
                _, _, models = p.request("GET", "/api/models")
                restore = models["models"][0].get("last_restore") or {}
                arena = models.get("arena") or {}
                r["restore_s"].append(restore.get("seconds", 0.0))
                r["bytes"].append(restore.get("bytes", 0))
                r["weights_s"].append(restore.get("weights_s", 0.0))
                r["wait_s"].append(arena.get("last_wait_s") or 0.0)
                r["pool"] = arena.get("pool")
                for j, q in enumerate(procs):
                    if j != i and q.request("GET", "/api/arena")[2]["device_bytes"]:
                        r["exclusive"] = False
                ttft_warm, _, text2 = p.stream("/v1/chat/completions", body)
                r["ttft_warm"].append(ttft_warm)
                r["answers"].append(text2)
        phases = handover_phases(_read_ledger(ledger))
    finally:
        for p in procs:
            p.stop()
        shutil.rmtree(arena_dir, ignore_errors=True)
    med = statistics.median
    rows = []
    for i, (p, r) in enumerate(zip(procs, per)):
        moved = med(r["bytes"])
        restore = med(r["restore_s"])
        ideal = moved / bandwidth
        rows.append({
            "process": i, "model": p.names[0] if p.names else os.path.basename(paths[0]),
            "ttft_after_swap_s_median": med(r["ttft_swap"]),
            "ttft_warm_s_median": med(r["ttft_warm"]),
            "swap_cost_s_median": med(a - b for a, b in zip(r["ttft_swap"], r["ttft_warm"])),
            "handover_wait_s_median": med(r["wait_s"]),
            "restore_s_median": restore,
            "restore_weights_s_median": med(r["weights_s"]),
            "bytes_restored": int(moved),
            "ideal_restore_s": ideal,
            "restore_vs_copy_bandwidth": ideal / restore if restore else 0.0,
            # the target: a TTFT after a swap within 1.2x of the copy plus the warm TTFT
            "ttft_after_swap_vs_ideal": med(r["ttft_swap"]) / (ideal + med(r["ttft_warm"])),
            "handover": phases.get(p.pid, {}),
            "pool": r.get("pool"),
            "samples": {k: r[k] for k in ("ttft_swap", "ttft_warm", "restore_s", "wait_s")},
            "outputs_identical": all(a == r["answers"][0] for a in r["answers"]),
            "others_held_no_device_memory": r["exclusive"],
        })
    report = {"device": procs[0].device or device, "mode": "processes",
              "processes": args.processes, "cycles": args.cycles, "tokens": args.n,
              "copy_bandwidth_GBps": bandwidth / 1e9, "rows": rows}
    if args.json:
        print(json.dumps(report))
    else:
        print(f"device: {report['device']}  {args.processes} processes on one arena, "
              f"cycles: {args.cycles}  copy bandwidth: {report['copy_bandwidth_GBps']:.2f} "
              f"GB/s")
        for r in rows:
            print(f"process {r['process']} ({r['model']}): TTFT after a swap "
                  f"{1e3 * r['ttft_after_swap_s_median']:.1f} ms, warm "
                  f"{1e3 * r['ttft_warm_s_median']:.1f} ms (handover wait "
                  f"{1e3 * r['handover_wait_s_median']:.1f} ms); restore "
                  f"{1e3 * r['restore_s_median']:.1f} ms for {r['bytes_restored'] / 2**20:.1f}"
                  f" MiB ({100 * r['restore_vs_copy_bandwidth']:.0f}% of copy bandwidth, "
                  f"ideal {1e3 * r['ideal_restore_s']:.1f} ms); TTFT after a swap / (ideal "
                  f"copy + warm TTFT) = {r['ttft_after_swap_vs_ideal']:.2f}; identical "
                  f"outputs {r['outputs_identical']}, others cold while it answered "
                  f"{r['others_held_no_device_memory']}")
    return 0


def _read_ledger(path: str) -> list[dict]:
    out = []
    try:
        with open(path) as f:
            for line in f:
                try:
                    out.append(json.loads(line))
                except ValueError:
                    continue
    except FileNotFoundError:
        pass
    return out


def handover_phases(records: list[dict]) -> dict[int, dict]:
    """Where each wait for the token went, from the arena ledger of all processes (their
    $HOTSEAT_ARENA_LOG lines, monotonic clock): per waiting pid, medians in seconds of the
    doorbell (ring written to the holder seeing it), the holder's way to its safe point,
    its release (every model cold, spares freed), the lock's passage (released to
    acquired) and the whole wait."""
    records = sorted(records, key=lambda r: r["t"])
    out: dict[int, dict[str, list]] = {}
    for i, w in enumerate(records):
        if w["event"] != "waiting":
            continue
        acq = next((r for r in records[i + 1:] if r["pid"] == w["pid"]
                    and r["event"] == "acquired"), None)
        if acq is None:
            continue
        between = [r for r in records[i + 1:] if r["t"] <= acq["t"] and r["pid"] != w["pid"]]
        rung = next((r for r in between if r["event"] == "rung" and r.get("by") == w["pid"]),
                    None)
        handed = next((r for r in between if r["event"] == "handed"), None)
        released = next((r for r in between if r["event"] == "released"), None)
        row = out.setdefault(w["pid"], {k: [] for k in (
            "doorbell_s", "to_safe_point_s", "release_s", "lock_passage_s", "wait_s")})
        row["wait_s"].append(acq["t"] - w["t"])
        if rung is not None and rung.get("ring_wall") is not None:
            row["doorbell_s"].append(rung["wall"] - rung["ring_wall"])
        if rung is not None and handed is not None:
            row["to_safe_point_s"].append(handed["t0"] - rung["t"])
        if handed is not None:
            row["release_s"].append(handed["release_s"])
        if released is not None:
            row["lock_passage_s"].append(acq["t"] - released["t"])
    return {pid: {k: statistics.median(v) if v else None for k, v in row.items()}
            for pid, row in out.items()}
