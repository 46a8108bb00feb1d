"""`hotseat bench --json-schema FILE`: free decode against decode constrained by a JSON schema.

Per repeat, from the same prompt and an empty cache:
- free: greedy on the device's argmax (what `hotseat bench` times as tgN);
- read: greedy on the logits read back to the host (the path a mask needs, without one);
- constrained: greedy through the schema's mask (text/constrain.py), until the JSON ends.
The table gives tokens/s of each, the constrained/free ratio, and the mask's own times: its
computation per token (on the worker thread, overlapped with the forward pass) and its
application (unpacking the bitmask and masking the logits, on the token's path).
"""
from __future__ import annotations

import json
import os
import statistics
import time

import numpy as np

from .bench import bench_prompt, measure


def _read_decode(model, prompt: list[int], n_gen: int) -> float:
    """Decode tok/s with the logits read back and argmaxed on the host."""
    model.cache_tokens = []
    logits = model.eval(prompt, 0, greedy=False)
    pos = len(prompt)
    t0 = time.perf_counter()
    for _ in range(n_gen):
        tok = int(np.argmax(logits))
        logits = model.run([tok], pos, False)
        pos += 1
    return n_gen / (time.perf_counter() - t0)


def _constrained(model, tok, grammar, prompt: list[int], max_new: int) -> dict:
    from ..residency import loop
    from ..text.constrain import Constraint

    model.cache_tokens = []
    c = Constraint(grammar, tok, model.config.n_vocab)
    applied: list[float] = []
    apply = c.apply

    def timed_apply(logits):
        t0 = time.perf_counter()
        out = apply(logits)
        applied.append(time.perf_counter() - t0)
        return out
    c.apply = timed_apply
    t = loop.Timings()
    out = list(loop.generate(model, prompt, max_new, None, tok.eog_ids, t, constraint=c))
    c.close()
    text = tok.decode([i for i in out if i not in tok.eog_ids])
    return {"tokens_per_s": t.as_dict()["decode_tokens_per_s"], "generated": t.generated,
            "mask_ms": [s * 1e3 for s in c.mask_s], "apply_ms": [s * 1e3 for s in applied],
            "text": text, "ended": bool(out) and out[-1] in tok.eog_ids}


def run_constrained_bench(args) -> int:
    from ..api import Engine
    from ..args import arena_enabled
    from ..formats.bundled import resolve
    from ..text.constrain import Grammar

    with open(args.json_schema) as f:
        grammar = Grammar.json_schema(json.load(f))
    path = resolve(args.model)
    n_gen = max(args.n_gen, 1)
    max_new = 8 * n_gen            # the JSON ends by itself: room for it to
    with Engine(n_ctx=max(2048, args.n_prompt + max_new + 8), flash_attn=args.flash_attn,
                arena=arena_enabled(args), arena_label=f"bench {os.path.basename(path)}",
                prompt_cache=False) as eng:
        name = eng.load(path, cpu_moe=args.cpu_moe)
        tok = eng.tokenizer(name)
        prompt = bench_prompt(tok, args.n_prompt)

        def run(model):
            measure(model, prompt, 4)                   # warm-up: both decode graphs
            _read_decode(model, prompt, 4)
            _constrained(model, tok, grammar, prompt, 8)
            rows = []
            for _ in range(args.repeats):
                rows.append({"free": measure(model, prompt, n_gen)[1],
                             "read": _read_decode(model, prompt, n_gen),
                             "constrained": _constrained(model, tok, grammar, prompt,
                                                         max_new)})
            return rows
        rows = eng.device_job(run, name=name, why="bench")
    med = statistics.median
    masks = [m for r in rows for m in r["constrained"]["mask_ms"]]
    applies = [m for r in rows for m in r["constrained"]["apply_ms"]]
    report = {
        "model": os.path.basename(path), "device": eng.device_name,
        "schema": os.path.basename(args.json_schema), "n_vocab": tok.n_vocab,
        "free_tokens_per_s": med(r["free"] for r in rows),
        "read_tokens_per_s": med(r["read"] for r in rows),
        "constrained_tokens_per_s": med(r["constrained"]["tokens_per_s"] for r in rows),
        "constrained_tokens": [r["constrained"]["generated"] for r in rows],
        "json_ended": all(r["constrained"]["ended"] for r in rows),
        "mask_ms_mean": statistics.fmean(masks), "mask_ms_median": med(masks),
        "mask_ms_max": max(masks), "apply_ms_mean": statistics.fmean(applies),
        "example": rows[-1]["constrained"]["text"],
    }
    report["constrained_over_free"] = report["constrained_tokens_per_s"] \
        / report["free_tokens_per_s"]
    if args.json:
        print(json.dumps(report))
    else:
        print(f"{report['model']} on {report['device']}, schema {report['schema']} "
              f"(medians of {args.repeats})")
        print(f"  free decode (device argmax)   {report['free_tokens_per_s']:8.2f} t/s")
        print(f"  free decode (logits read)     {report['read_tokens_per_s']:8.2f} t/s")
        print(f"  constrained decode            {report['constrained_tokens_per_s']:8.2f} t/s"
              f"  ({report['constrained_over_free']:.2f}x free)")
        print(f"  mask per token: computed {report['mask_ms_mean']:.3f} ms mean "
              f"({report['mask_ms_median']:.3f} median, {report['mask_ms_max']:.3f} max), "
              f"applied {report['apply_ms_mean']:.3f} ms mean")
        print(f"  constrained tokens per repeat {report['constrained_tokens']}, the JSON "
              f"{'ended' if report['json_ended'] else 'cut by the token limit'}; e.g. "
              f"{report['example']}")
    return 0
