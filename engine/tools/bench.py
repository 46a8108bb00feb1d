"""`hotseat bench`: prefill (ppN) and decode (tgN) tokens/s, llama-bench style.

Each repeat processes the same N-token prompt from an empty cache, then decodes tgN tokens
after it, one recorded-graph replay per token. Figures are medians over the repeats, after a
warm-up run that records the graphs. With --vs-llama-server the same prompt ids go through
llama.cpp's llama-server on the same model and device, and the table shows the ratio;
--vs-llama-cpp runs llama.cpp's CPU backend in process (llama-cpp-python) instead, where the
prebuilt server cannot run a model.
"""
from __future__ import annotations

import json
import os
import statistics
import sys
import time
from collections import defaultdict

SAMPLE_TEXT = ("The quick brown fox jumps over the lazy dog while the river runs past old "
               "stone bridges, and the town wakes slowly to the sound of bells. ")


def bench_prompt(tok, n: int) -> list[int]:
    ids: list[int] = []
    while len(ids) < n:
        ids += tok.encode(SAMPLE_TEXT, add_special=False)
    return ids[:n]


def measure(model, prompt: list[int], n_gen: int) -> tuple[float, float]:
    """(prefill tok/s, decode tok/s) of one run from an empty cache."""
    model.cache_tokens = []
    t0 = time.perf_counter()
    tok = model.eval(prompt, 0)
    t1 = time.perf_counter()
    pos = len(prompt)
    for _ in range(n_gen):
        tok = model.run([tok], pos, True)
        pos += 1
    t2 = time.perf_counter()
    return len(prompt) / (t1 - t0), n_gen / (t2 - t1) if n_gen else 0.0


def _profile_table(model, n_prompt: int, decode: bool) -> list[dict]:
    """Per-kernel times of the last replay of the prompt's widest pass and, where tokens were
    decoded (`decode`), of the one-token graph."""
    rows = []
    # the prompt's widest pass that ran (a prompt of n tokens can run n - 1 as prefill)
    ran = [key[0] for key, g in model._prefill.items() if g.replays and key[1:] == (True,
                                                                                    False, False)]
    passes = ([("decode", 1)] if decode else []) + ([(f"pp{n_prompt}", max(ran))] if ran else [])
    for label, n in passes:
        graph = model._graph(n, True)
        per = defaultdict(lambda: [0.0, 0])
        for name, ns in graph.profile():
            per[name][0] += ns
            per[name][1] += 1
        total = sum(v[0] for v in per.values()) or 1.0
        for name, (ns, count) in sorted(per.items(), key=lambda kv: -kv[1][0]):
            rows.append({"graph": label, "kernel": name, "calls": count, "ms": ns / 1e6,
                         "share": ns / total})
    return rows


def _replay_ms(model, n: int = 32) -> float:
    """Median milliseconds of one replay of the decode graph, submit to fence, at the last
    token's position: the device's time per token plus one submit's, without the host's
    work between tokens (the step values written, the result read, the sampler)."""
    graph = model._graph(1, True)
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        graph.replay()
        times.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(times)


def run_bench(args) -> int:
    from ..api import Engine
    from ..args import arena_enabled
    from ..formats.bundled import resolve

    if args.n_prompt < 1 or args.n_gen < 0 or args.repeats < 1:
        raise ValueError("need -p >= 1, -n >= 0 and -r >= 1")
    path = resolve(args.model)
    n_ctx = max(2048, args.n_prompt + args.n_gen + 8)
    results = []
    with Engine(n_ctx=n_ctx, flash_attn=args.flash_attn, arena=arena_enabled(args),
                arena_label=f"bench {os.path.basename(path)}", prompt_cache=False) as eng:
        name = eng.load(path, cpu_moe=args.cpu_moe)
        prompt = bench_prompt(eng.tokenizer(name), args.n_prompt)

        def run(model) -> tuple[list, list | None, int, dict]:   # one job: the arena cannot
            model.profile = bool(args.profile)                    # cut in
            for _ in range(2):         # warm-up: the pass sizes settle, their graphs recorded
                measure(model, prompt, min(args.n_gen, 4))
            samples = [measure(model, prompt, args.n_gen) for _ in range(args.repeats)]
            replay = _replay_ms(model) if args.n_gen else None
            profile = _profile_table(model, args.n_prompt, args.n_gen > 0) if args.profile else None
            size = sum(t.nbytes for t in model.gguf.tensors.values())
            return samples, profile, size, model.paths.as_dict(), replay
        samples, profile, size, paths, replay = eng.device_job(run, name=name, why="bench")
        ours = {"engine": "hotseat", "device": eng.device_name,
                "pp": [s[0] for s in samples], "tg": [s[1] for s in samples]}
        results.append(ours)
    # llama.cpp knows nothing of the arena: hold the token for it while it runs
    peer_turn = _peer_turn(args) if args.vs_llama_server is not None or args.vs_llama_cpp \
        else None
    try:
        _peers(args, path, prompt, results)
    finally:
        if peer_turn is not None:
            peer_turn.close()
    report = _report(os.path.basename(path), size, args, results)
    report["paths"] = paths
    if replay is not None:
        report["decode_replay_ms"] = replay
    tg = [r for r in report["rows"] if r["engine"] == "hotseat" and r["test"].startswith("tg")]
    if tg:       # every weight byte is read once per token (the KV cache adds a little)
        report["decode_weight_gb_per_s"] = size * tg[0]["tokens_per_s"] / 1e9
    if profile is not None:
        report["profile"] = profile
    if args.json:
        print(json.dumps(report))
    else:
        _print_table(report)
    return 0


def _peer_turn(args):
    """The arena's token, held (by an Arena of our own) while llama.cpp runs; None without
    the arena."""
    from ..args import arena_enabled
    from ..residency.arena import Arena

    if not arena_enabled(args):
        return None
    arena = Arena(watch=False)
    try:
        arena.acquire("bench: llama.cpp")
    except BaseException:
        arena.close()
        raise
    return arena


def _peers(args, path: str, prompt: list[int], results: list[dict]) -> None:
    if args.vs_llama_server is not None:
        from .peer import bench_llama_server, find_llama_server

        server = find_llama_server(args.vs_llama_server or None)
        peer = bench_llama_server(server, path, args.n_prompt, args.n_gen, args.repeats,
                                  prompt)
        results.append({"engine": "llama.cpp llama-server", "device": peer.get("device", "?"),
                        "pp": peer["prefill_samples"], "tg": peer["decode_samples"]})
    if args.vs_llama_cpp:
        from .peer_llamacpp import bench_llama_cpp

        peer = bench_llama_cpp(path, prompt, args.n_gen, args.repeats)
        results.append({"engine": "llama.cpp CPU", "device": peer["device"],
                        "pp": peer["prefill_samples"], "tg": peer["decode_samples"]})


def _report(model: str, size: int, args, results: list[dict]) -> dict:
    rows = []
    for r in results:
        for test, key, n in (("pp", "pp", args.n_prompt), ("tg", "tg", args.n_gen)):
            if test == "tg" and n == 0:
                continue
            vals = r[key]
            rows.append({"engine": r["engine"], "device": r["device"], "test": f"{test}{n}",
                         "tokens_per_s": statistics.median(vals),
                         "stdev": statistics.pstdev(vals) if len(vals) > 1 else 0.0,
                         "samples": vals})
    out = {"model": model, "size_bytes": size, "repeats": args.repeats, "rows": rows}
    ours = {r["test"]: r["tokens_per_s"] for r in rows if r["engine"] == "hotseat"}
    for engine, key in (("llama.cpp llama-server", "ratio_vs_llama_server"),
                        ("llama.cpp CPU", "ratio_vs_llama_cpp_cpu")):
        peer = {r["test"]: r["tokens_per_s"] for r in rows if r["engine"] == engine}
        if peer:
            out[key] = {t: ours[t] / peer[t] for t in ours if peer.get(t)}
    return out


def _print_table(rep: dict) -> None:
    print(f"model: {rep['model']} ({rep['size_bytes'] / 2**20:.1f} MiB), "
          f"median of {rep['repeats']} runs")
    head = f"| {'engine':<24} | {'device':<34} | {'test':>6} | {'t/s':>16} |"
    print(head)
    print("|" + "|".join("-" * (len(c)) for c in head.split("|")[1:-1]) + "|")
    for r in rep["rows"]:
        ts = f"{r['tokens_per_s']:.2f} ± {r['stdev']:.2f}"
        print(f"| {r['engine']:<24} | {r['device'][:34]:<34} | {r['test']:>6} | {ts:>16} |")
    print("paths: " + ", ".join(f"{k} {v}" for k, v in rep.get("paths", {}).items()))
    if "decode_weight_gb_per_s" in rep:
        print(f"decode reads the weights at {rep['decode_weight_gb_per_s']:.0f} GB/s")
    if "decode_replay_ms" in rep:
        tg = [r for r in rep["rows"] if r["engine"] == "hotseat" and r["test"].startswith("tg")]
        loop = f", a token of the loop {1e3 / tg[0]['tokens_per_s']:.3f} ms" if tg else ""
        print(f"decode graph: {rep['decode_replay_ms']:.3f} ms a replay (submit to fence"
              f"{', with per-op timestamps' if rep.get('profile') else ''}){loop}")
    for key, who in (("ratio_vs_llama_server", "llama-server"),
                     ("ratio_vs_llama_cpp_cpu", "llama.cpp CPU")):
        for test, ratio in rep.get(key, {}).items():
            print(f"{test}: hotseat / {who} = {ratio:.2f}x")
    if "profile" in rep:
        print(f"\n| {'graph':<8} | {'kernel':<22} | {'calls':>5} | {'ms':>9} | {'share':>6} |")
        for p in rep["profile"]:
            print(f"| {p['graph']:<8} | {p['kernel']:<22} | {p['calls']:>5} | {p['ms']:>9.3f} "
                  f"| {100 * p['share']:>5.1f}% |")
    sys.stdout.flush()
