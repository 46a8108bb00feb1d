"""`hotseat precision`: this engine's logits against llama.cpp's stored ones, on a device.

    hotseat precision                              # both bundled models, default device
    hotseat precision -m smollm2 --vs-llama-server # and llama-server on the same device

Two checks per model, over the prompts llama.cpp's CPU build answered
(engine/tools/reference/llamacpp_<model>.json, made by
tests/tools/make_llamacpp_reference.py; shipped as package data):

- Teacher-forced greedy: the prompt, then llama.cpp's greedy ids one at a time through the KV
  cache, as decoding runs. A step agrees where our argmax is llama.cpp's id, or ties with it
  (our logit of its id within NEAR_TIE of our best).
- The distribution after the prompt: the log-probabilities of the CPU build's twenty best
  ids (`last_logprobs_top20`; older data with only the ten best logits gives each id's logit
  less the best one's, where the normaliser cancels) against the CPU's; the figure is the
  largest difference. With --vs-llama-server the same figure for llama-server on the same
  file and device, from its log-probabilities; ours, the largest over the prompts, should be
  no larger than its largest (within ALLOWANCE).

Exit status 0 when both checks hold for every model, 1 when one does not.
"""
from __future__ import annotations

import json
import os
import sys

import numpy as np

NEAR_TIE = 0.2        # logits: a different argmax this close to ours is a tie, not an error
ALLOWANCE = 0.02      # our gap distance may exceed llama-server's by this much (f32 noise)
PEER_PROBS = 50       # log-probabilities asked of llama-server, to cover the CPU's ten
DATA = os.path.join(os.path.dirname(__file__), "reference")   # package data


def add_parser(sub) -> None:
    p = sub.add_parser("precision", help="logits against llama.cpp's stored ones (greedy "
                                         "agreement, log-probability gaps)")
    p.add_argument("--model", "-m", action="append",
                   help="bundled model (smollm2, gemma3) or GGUF path; repeatable "
                        "(default: both bundled models)")
    p.add_argument("--data", action="append",
                   help="llama.cpp's stored answers for the --model of the same place "
                        "(default: the package's reference/llamacpp_<model>.json)")
    p.add_argument("--steps", type=int, default=0,
                   help="greedy steps per prompt (default: all stored)")
    p.add_argument("--prompts", type=int, default=0, help="prompts per model (default: all)")
    p.add_argument("--vs-llama-server", metavar="PATH", nargs="?", const="",
                   help="also llama.cpp's llama-server on the same file and device")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=run_precision)


def reference(case: dict) -> tuple[list[int], np.ndarray, bool]:
    """(ids, values, logprobs): the CPU build's top-20 log-probabilities where stored, else
    its top-10 logits."""
    pairs = case.get("last_logprobs_top20") or case["last_logits_top10"]
    return ([int(t) for t, _ in pairs], np.array([v for _, v in pairs], np.float64),
            "last_logprobs_top20" in case)


def distance(values: np.ndarray, want: np.ndarray, logprobs: bool) -> float:
    """Largest |values - want|; for logits, of each less the first (log-probability gaps)."""
    if not logprobs:
        values, want = values - values[0], want - want[0]
    return float(np.abs(values - want).max())


def log_softmax(logits: np.ndarray) -> np.ndarray:
    v = np.asarray(logits, np.float64)
    m = v.max()
    return v - m - np.log(np.exp(v - m).sum())


def step_verdict(logits: np.ndarray, want: int) -> tuple[str, float]:
    """('same' | 'tie' | 'differs', our best logit less our logit of `want`)."""
    best = int(np.argmax(logits))
    gap = float(logits[best] - logits[want])
    if best == want:
        return "same", 0.0
    return ("tie" if gap < NEAR_TIE else "differs"), gap


def check_case(run, case: dict, steps: int) -> dict:
    """One prompt: run(tokens, pos0) -> logits. Teacher-forced greedy and the gap distance."""
    prompt, greedy = case["prompt_ids"], case["greedy_ids"]
    if steps:
        greedy = greedy[:steps]
    ids, cpu, logprobs = reference(case)
    logits = run(prompt, 0)
    ours = (log_softmax(logits) if logprobs else np.asarray(logits, np.float64))[ids]
    dist = distance(ours, cpu, logprobs)
    verdicts = []
    for i, want in enumerate(greedy):
        if i:
            logits = run([greedy[i - 1]], len(prompt) + i - 1)
        verdicts.append(step_verdict(logits, int(want)))
    bad = [(i, round(g, 3)) for i, (v, g) in enumerate(verdicts) if v == "differs"]
    return {"name": case["name"], "steps": len(verdicts),
            "same": sum(v == "same" for v, _ in verdicts),
            "ties": sum(v == "tie" for v, _ in verdicts), "differs": bad,
            "gap_distance": dist}


def peer_distance(peer, case: dict) -> float | None:
    """llama-server's distance after the prompt, or None where its log-probabilities miss one
    of the CPU's ids."""
    reply = peer._post("/completion", {
        "prompt": case["prompt_ids"], "n_predict": 1, "n_probs": PEER_PROBS,
        "temperature": 0.0, "cache_prompt": False, "post_sampling_probs": False}, 300)
    got = {int(t["id"]): float(t["logprob"])
           for t in reply["completion_probabilities"][0]["top_logprobs"]}
    ids, cpu, logprobs = reference(case)
    if any(t not in got for t in ids):
        return None
    return distance(np.array([got[t] for t in ids]), cpu, logprobs)


def context_for(cases: list[dict]) -> int:
    """The context a check of these prompts runs in: the longest prompt and its greedy ids."""
    return max(256, max(len(c["prompt_ids"]) + len(c["greedy_ids"]) for c in cases) + 8)


def check_model(dev, kernels, path: str, data: dict, steps: int, prompts: int,
                server: str | None) -> dict:
    from ..residency.model import Model

    cases = data["cases"][:prompts] if prompts else data["cases"]
    n_ctx = context_for(cases)
    m = Model(dev, kernels, path, n_ctx=n_ctx)
    try:
        rows = [check_case(lambda ids, pos: m.eval(ids, pos, greedy=False), c, steps)
                for c in cases]
    finally:
        m.close()
    if server is not None:
        from .peer import LlamaServer, find_llama_server

        with LlamaServer(find_llama_server(server or None), path, n_ctx=n_ctx) as p:
            for row, case in zip(rows, cases):
                row["peer_gap_distance"] = peer_distance(p, case)
    ours = max(r["gap_distance"] for r in rows)
    peers = [r.get("peer_gap_distance") for r in rows]
    theirs = max((d for d in peers if d is not None), default=None)
    ok = not any(r["differs"] for r in rows) and (theirs is None or ours <= theirs + ALLOWANCE)
    return {"model": data.get("model", os.path.basename(path)), "file": path,
            "device": dev.name, "cases": rows, "gap_distance": ours,
            "peer_gap_distance": theirs, "ok": ok}


def _data_for(model: str, given: str | None) -> dict:
    if given is None:
        name = model if model in ("smollm2", "gemma3") else None
        if name is None:
            raise ValueError(f"{model}: pass --data, llama.cpp's stored answers for it")
        given = os.path.join(DATA, f"llamacpp_{name}.json")
    with open(given) as f:
        return json.load(f)


def run_precision(args) -> int:
    from ..formats.bundled import resolve
    from ..gpu import vk
    from ..gpu.kernels import KernelCache

    models = args.model or ["smollm2", "gemma3"]
    datas = (args.data or []) + [None] * (len(models) - len(args.data or []))
    reports = []
    with vk.Device() as dev:
        kernels = KernelCache(dev)
        try:
            for model, given in zip(models, datas):
                reports.append(check_model(dev, kernels, resolve(model), _data_for(model, given),
                                           args.steps, args.prompts, args.vs_llama_server))
        finally:
            kernels.close()
    ok = all(r["ok"] for r in reports)
    if args.json:
        print(json.dumps({"models": reports, "ok": ok}))
        return 0 if ok else 1
    for r in reports:
        print(f"{r['model']} on {r['device']}: teacher-forced greedy (ties under {NEAR_TIE} "
              f"logits) and the largest difference from llama.cpp CPU's top log-probabilities "
              f"after the prompt")
        print("| prompt | steps | same | ties | differs | distance | llama-server's |")
        print("|---|---:|---:|---:|---|---:|---:|")
        for c in r["cases"]:
            peer = c.get("peer_gap_distance")
            peer_s = "" if "peer_gap_distance" not in c else \
                ("(ids missing)" if peer is None else f"{peer:.3f}")
            print(f"| {c['name']} | {c['steps']} | {c['same']} | {c['ties']} | "
                  f"{c['differs'] or ''} | {c['gap_distance']:.3f} | {peer_s} |")
        peer = r["peer_gap_distance"]
        print(f"{r['model']}: largest distance {r['gap_distance']:.3f}"
              + (f" (llama-server's {peer:.3f})" if peer is not None else "")
              + f": {'holds' if r['ok'] else 'FAILS'}")
    print("precision holds" if ok else "precision check fails", file=sys.stderr)
    return 0 if ok else 1
