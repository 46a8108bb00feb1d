"""Mask time per token of llguidance, outlines-core and xgrammar over a model's vocabulary.

    python tests/tools/mask_bench.py [--model smollm2 --model gemma3] [--schema FILE] [--json]

Each library gets the same vocabulary (Hotseat's Tokenizer: token id -> bytes) and the same
JSON schema (tests/data/schemas/nested.json by default), then walks the tokens of one valid
instance, timing the computation of the allowed-token mask at every step (the mask written
into a preallocated 32-bit bitmask, as each library does for its fastest path). Compile time
(vocabulary and grammar) is reported apart.

xgrammar's package imports torch and transformers at its top (its matcher and tokenizer
helpers), though its core (a C++ extension over DLPack arrays) uses neither: here it is
imported with empty stand-ins for those two modules, to time the core alone.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from engine.formats.bundled import resolve                     # noqa: E402
from engine.formats.gguf_file import GGUFFile                  # noqa: E402
from engine.text.constrain import JSON_OPTIONS, SPECIAL_MARK, token_bytes  # noqa: E402
from engine.text.tokenizer import Tokenizer                    # noqa: E402

INSTANCE = {"id": 4711, "customer": {"name": "Ada Lovelace",
                                     "address": {"city": "London", "zip": "12345"}},
            "items": [{"sku": "AB-12", "qty": 2, "price": 19.5},
                      {"sku": "ZZ", "qty": 1, "price": 250}],
            "status": "paid"}


def _stats(times: list[float]) -> dict:
    """The first mask apart (a library may build its lexer then: Hotseat computes it while
    the prompt runs), the rest as mean, median, p99 and max."""
    ms = sorted(t * 1e3 for t in times[1:])
    return {"steps": len(times), "first_ms": times[0] * 1e3, "mean_ms": statistics.fmean(ms),
            "median_ms": ms[len(ms) // 2], "p99_ms": ms[min(len(ms) - 1, int(0.99 * len(ms)))],
            "max_ms": ms[-1], "mean_all_ms": statistics.fmean(t * 1e3 for t in times)}


def bench_llguidance(tok, vocab, schema, ids):
    import llguidance

    from engine.text.constrain import Grammar, vocabulary
    t0 = time.perf_counter()
    lt = vocabulary(tok, len(vocab))
    t1 = time.perf_counter()
    m = llguidance.LLMatcher(lt, Grammar.json_schema(schema).text, log_level=0)
    t2 = time.perf_counter()
    bits = np.zeros((len(vocab) + 31) // 32, dtype=np.int32)
    times = []
    for t in ids + [None]:
        s = time.perf_counter()
        m.unsafe_compute_mask_ptr(bits.ctypes.data, bits.nbytes)
        times.append(time.perf_counter() - s)
        if t is not None:
            assert bits[t // 32] >> (t % 32) & 1, f"llguidance refused token {t}"
            assert m.consume_token(t)
    assert m.is_accepting()
    return {"vocab_s": t1 - t0, "grammar_s": t2 - t1, **_stats(times)}


def bench_outlines(tok, vocab, schema, ids):
    import outlines_core
    from outlines_core.json_schema import build_regex_from_schema

    eos = min(tok.eog_ids)
    t0 = time.perf_counter()
    table: dict[bytes, list[int]] = {}
    for i, b in enumerate(vocab):
        if b and not b.startswith(SPECIAL_MARK) and i != eos:
            table.setdefault(b, []).append(i)
    v = outlines_core.Vocabulary(eos, table)
    t1 = time.perf_counter()
    index = outlines_core.Index(build_regex_from_schema(json.dumps(schema), r"[ ]?"), v)
    guide = outlines_core.Guide(index)
    t2 = time.perf_counter()
    bits = np.zeros((len(vocab) + 31) // 32, dtype=np.int32)
    times = []
    for t in ids + [None]:
        s = time.perf_counter()
        guide.write_mask_into(bits.ctypes.data, bits.size, 4)
        times.append(time.perf_counter() - s)
        if t is not None:
            assert bits[t // 32] >> (t % 32) & 1, f"outlines-core refused token {t}"
            guide.advance(t)
    assert guide.is_finished() or bits[eos // 32] >> (eos % 32) & 1
    return {"vocab_s": t1 - t0, "grammar_s": t2 - t1, **_stats(times)}


def _import_xgrammar():
    import types

    import tvm_ffi  # noqa: F401  (first: it looks for a real torch when it loads)

    class _Stub(types.ModuleType):
        def __getattr__(self, name):
            if name.startswith("__"):
                raise AttributeError(name)
            t = type(name, (), {})
            setattr(self, name, t)
            return t
    for n in ("torch", "transformers"):
        if n not in sys.modules:
            sys.modules[n] = _Stub(n)
    sys.modules["torch"].tensor = lambda *a, **k: None
    import xgrammar
    return xgrammar


def bench_xgrammar(tok, vocab, schema, ids):
    xgr = _import_xgrammar()
    t0 = time.perf_counter()
    encoded = [b"" if b.startswith(SPECIAL_MARK) else b for b in vocab]
    info = xgr.TokenizerInfo(encoded, xgr.VocabType.RAW, vocab_size=len(vocab),
                             stop_token_ids=sorted(tok.eog_ids))
    compiler = xgr.GrammarCompiler(info, max_threads=1)
    t1 = time.perf_counter()
    compiled = compiler.compile_json_schema(
        json.dumps(schema), any_whitespace=False,
        separators=(JSON_OPTIONS["item_separator"], JSON_OPTIONS["key_separator"]))
    m = xgr.GrammarMatcher(compiled)
    t2 = time.perf_counter()
    bits = np.zeros((1, (len(vocab) + 31) // 32), dtype=np.int32)
    times = []
    for t in ids + [None]:
        s = time.perf_counter()
        m.fill_next_token_bitmask(bits, 0)
        times.append(time.perf_counter() - s)
        if t is not None:
            assert bits[0, t // 32] >> (t % 32) & 1, f"xgrammar refused token {t}"
            assert m.accept_token(t)
    return {"vocab_s": t1 - t0, "grammar_s": t2 - t1, **_stats(times)}


LIBS = {"llguidance": bench_llguidance, "outlines-core": bench_outlines,
        "xgrammar": bench_xgrammar}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", action="append", help="bundled name or GGUF (repeatable)")
    ap.add_argument("--schema", default=os.path.join(ROOT, "tests/data/schemas/nested.json"))
    ap.add_argument("--lib", action="append", choices=sorted(LIBS))
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    with open(args.schema) as f:
        schema = json.load(f)
    text = json.dumps(INSTANCE, separators=(JSON_OPTIONS["item_separator"],
                                            JSON_OPTIONS["key_separator"]))
    rows = []
    for model in args.model or ["smollm2", "gemma3"]:
        with GGUFFile(resolve(model)) as g:
            tok = Tokenizer.from_gguf(g)
        vocab = token_bytes(tok, tok.n_vocab)
        ids = tok.encode(text, add_special=False)
        for lib in args.lib or list(LIBS):
            try:
                r = LIBS[lib](tok, vocab, schema, ids)
            except Exception as exc:         # a library that cannot run here is reported
                r = {"error": f"{type(exc).__name__}: {exc}"}
            rows.append({"model": model, "n_vocab": len(vocab), "lib": lib, **r})
            if not args.json:
                print(_line(rows[-1]), flush=True)
    if args.json:
        print(json.dumps(rows, indent=1))
    return 0


def _line(r: dict) -> str:
    if "error" in r:
        return f"{r['model']:8} {r['n_vocab']:7} {r['lib']:14} {r['error']}"
    return (f"{r['model']:8} {r['n_vocab']:7} {r['lib']:14} first mask {r['first_ms']:.3f} ms, "
            f"then mean {r['mean_ms']:.3f} median {r['median_ms']:.3f} p99 {r['p99_ms']:.3f} "
            f"max {r['max_ms']:.3f} (all {r['steps']} steps: mean {r['mean_all_ms']:.3f}); "
            f"vocab {r['vocab_s']:.2f} s, grammar {r['grammar_s']:.2f} s")


if __name__ == "__main__":
    sys.exit(main())
