"""`hotseat`: the command line over the engine facade.

Problems with input (a bad model file, a bad argument) print one line on stderr and exit
with status 2; a missing Vulkan driver exits with 1. Never a traceback.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

from .facade import Request
from .args import (
    add_arena_arguments,
    add_cpu_moe_argument,
    add_flash_attn_argument,
    arena_enabled,
)

EXIT_BAD_INPUT = 2


class UsageError(Exception):
    pass


def _emit_json(obj) -> None:
    sys.stdout.write(json.dumps(obj, ensure_ascii=False) + "\n")
    sys.stdout.flush()


def _progress_bar(label: str):
    """A one-line progress bar on stderr when it is a terminal; silent otherwise."""
    if not sys.stderr.isatty():
        return None

    def show(done: int, total: int) -> None:
        frac = done / total if total else 1.0
        bar = "#" * int(30 * frac)
        sys.stderr.write(f"\r{label} [{bar:<30}] {done >> 20}/{total >> 20} MiB")
        if done >= total:
            sys.stderr.write("\n")
        sys.stderr.flush()
    return show


def _open(args, n_ctx: int | None = None):
    from .api import Engine
    from .formats.bundled import resolve

    path = resolve(args.model)
    eng = Engine(n_ctx=n_ctx or getattr(args, "ctx", None) or 2048,
                 flash_attn=getattr(args, "flash_attn", None), arena=arena_enabled(args),
                 arena_label=f"{args.cmd} {os.path.basename(path)}")
    try:
        name = eng.load(path, progress=_progress_bar("loading " + os.path.basename(path)),
                        cpu_moe=getattr(args, "cpu_moe", 0.0))
    except BaseException:
        eng.close()
        raise
    return eng, name


# -- tokenize ------------------------------------------------------------------------------

def cmd_tokenize(args) -> int:
    from .formats.bundled import resolve
    from .formats.gguf_file import GGUFFile
    from .text.tokenizer import Tokenizer

    with GGUFFile(resolve(args.model)) as g:
        tok = Tokenizer.from_gguf(g)
    ids = tok.encode(args.text, add_special=not args.no_special,
                     parse_special=args.parse_special)
    if args.json:
        _emit_json({"tokens": ids})
    else:
        for i in ids:
            print(f"{i:6d} {tok.piece(i)!r}")
    return 0


# -- generate ------------------------------------------------------------------------------

def _sampling(args):
    from .text.sampling import SamplingParams

    return SamplingParams(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                          min_p=args.min_p, repeat_penalty=args.repeat_penalty, seed=args.seed)


def cmd_generate(args) -> int:
    if args.n < 0:
        raise UsageError(f"-n must be >= 0, got {args.n}")
    eng, name = _open(args)
    try:
        messages = [{"role": "user", "content": args.prompt}] if args.chat else None
        stream = None if args.json else (lambda s: (sys.stdout.write(s), sys.stdout.flush()))
        out = eng.generate(Request(name, prompt=None if args.chat else args.prompt,
                                   messages=messages, max_tokens=args.n, sampling=_sampling(args),
                                   stop=args.stop or ()), on_text=stream)
    finally:
        eng.close()
    if args.json:
        _emit_json(out.as_dict())
    else:
        t = out.timings
        sys.stdout.write("\n")
        sys.stderr.write(f"prompt {len(out.prompt_tokens)} tokens, "
                         f"{t['prefill_tokens_per_s']:.1f} tok/s; generated {len(out.tokens)}, "
                         f"{t['decode_tokens_per_s']:.1f} tok/s\n")
    return 0


# -- bench ---------------------------------------------------------------------------------

def cmd_bench(args) -> int:
    from .tools.bench import run_bench
    if args.image:
        from .tools.imagebench import run_image_bench
        if not args.mmproj:
            raise ValueError("--image needs the model's --mmproj")
        return run_image_bench(args)
    if args.json_schema:
        from .tools.constrainbench import run_constrained_bench
        return run_constrained_bench(args)

    return run_bench(args)


def cmd_swap_bench(args) -> int:
    from .tools.swapbench import run_swap_bench

    return run_swap_bench(args)


def cmd_serve(args) -> int:
    from .api import Engine
    from .server.serve import cmd_serve as serve

    return serve(args, Engine)


def cmd_kernel_bench(args) -> int:
    from .tools.kernelbench import run_kernel_bench

    return run_kernel_bench(args)


# -- parser --------------------------------------------------------------------------------

def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="hotseat", description="Local LLMs taking turns on one GPU.")
    sub = p.add_subparsers(dest="cmd", required=True)
    model_help = "GGUF file, or a bundled model (smollm2, gemma3); default: smollm2"

    t = sub.add_parser("tokenize", help="print the token ids of a text")
    t.add_argument("--model", "-m", help=model_help)
    t.add_argument("text")
    t.add_argument("--no-special", action="store_true", help="do not add BOS/EOS")
    t.add_argument("--parse-special", action="store_true",
                   help="turn special-token texts like <|im_start|> into their ids")
    t.add_argument("--json", action="store_true")
    t.set_defaults(func=cmd_tokenize)

    g = sub.add_parser("generate", help="complete a prompt")
    g.add_argument("--model", "-m", help=model_help)
    g.add_argument("--prompt", "-p", required=True)
    g.add_argument("--chat", action="store_true", help="apply the model's chat template")
    g.add_argument("-n", type=int, default=128, help="tokens to generate (default 128)")
    g.add_argument("--temperature", "--temp", type=float, default=0.8)
    g.add_argument("--top-k", type=int, default=40)
    g.add_argument("--top-p", type=float, default=0.95)
    g.add_argument("--min-p", type=float, default=0.05)
    g.add_argument("--repeat-penalty", type=float, default=1.0)
    g.add_argument("--seed", type=int, default=None)
    g.add_argument("--stop", action="append", help="stop string (repeatable)")
    g.add_argument("--ctx", type=int, default=2048, help="context size (default 2048)")
    g.add_argument("--json", action="store_true")
    add_cpu_moe_argument(g)
    add_flash_attn_argument(g)
    add_arena_arguments(g)
    g.set_defaults(func=cmd_generate)

    b = sub.add_parser("bench", help="prefill and decode tokens/s, optionally beside llama.cpp")
    b.add_argument("--model", "-m", help=model_help)
    b.add_argument("-p", "--n-prompt", type=int, default=128)
    b.add_argument("-n", "--n-gen", type=int, default=64)
    b.add_argument("-r", "--repeats", type=int, default=3)
    b.add_argument("--vs-llama-server", metavar="PATH", nargs="?", const="",
                   help="also run llama.cpp's llama-server (PATH, or found on PATH)")
    b.add_argument("--vs-llama-cpp", action="store_true",
                   help="also run llama.cpp's CPU backend through llama-cpp-python")
    b.add_argument("--profile", action="store_true", help="per-kernel GPU times")
    b.add_argument("--json-schema", metavar="FILE",
                   help="free decode against decode constrained by this JSON schema")
    b.add_argument("--image", metavar="FILE",
                   help="time the first token of a one-image prompt instead (with --mmproj)")
    b.add_argument("--mmproj", metavar="FILE", help="the model's vision projector (--image)")
    b.add_argument("--ctx", type=int, default=2048, help="context size for --image")
    b.add_argument("--json", action="store_true")
    add_cpu_moe_argument(b)
    add_flash_attn_argument(b)
    add_arena_arguments(b)
    b.set_defaults(func=cmd_bench)

    sb = sub.add_parser("swap-bench", help="cycle models warm/cold and time the restores")
    sb.add_argument("--model", "-m", action="append",
                    help=model_help + " (give two or more; default: smollm2 twice)")
    sb.add_argument("--evict-kv", action="store_true",
                    help="full eviction (KV to host too) instead of weights-only")
    sb.add_argument("--trim", action="store_true",
                    help="free the spare device blocks at each release, as a hand-over to "
                         "another process does: each restore allocates afresh")
    sb.add_argument("--cycles", type=int, default=3)
    sb.add_argument("-n", type=int, default=8, help="tokens generated per turn")
    sb.add_argument("--ctx", type=int, default=2048)
    sb.add_argument("--processes", type=int, default=1, metavar="N",
                    help="N > 1: N hotseat serve processes on one private arena, asked in "
                         "turn over HTTP: the TTFT after a swap between processes (each "
                         "serves one --model, in turn)")
    sb.add_argument("--json", action="store_true")
    add_cpu_moe_argument(sb)
    add_flash_attn_argument(sb)
    add_arena_arguments(sb)
    sb.set_defaults(func=cmd_swap_bench)

    kb = sub.add_parser("kernel-bench", help="time one kernel's paths against each other")
    kb.add_argument("kernel", choices=["concat", "mul_mat_vec", "mul_mat_cm", "mul_mat_moe",
                                       "attn_decode"],
                    help="concat: the tiled (transposed source) path against the element-wise "
                         "one; mul_mat_vec: the decode product's rows x lanes against mul_mat; "
                         "mul_mat_cm: the cooperative-matrix tiles against mul_mat; "
                         "mul_mat_moe: prefill expert products grouped by expert against "
                         "mul_mat_id's one per token and slot; attn_decode: decode attention's "
                         "lanes, heads a workgroup, splits and split sizes")
    kb.add_argument("-r", "--repeats", type=int, default=50, help="replays per path (default 50)")
    kb.add_argument("--types", metavar="T,T",
                    help="mul_mat_vec, mul_mat_cm, mul_mat_moe: only these weight types "
                         "(e.g. Q4_K,Q6_K)")
    kb.add_argument("--variants", metavar="K,K",
                    help="mul_mat_cm, mul_mat_moe: only these kernels beside the baseline "
                         "(mul_mat_cm, mul_mat_cm2, mul_mat_cm2h: x as f16, mul_mat_cm2f: and "
                         "f16 sums, mul_mat_cm2g: and Q8_0's or Q4_0's blocks eight at a "
                         "time, mul_mat_cm2s: W staged by the lanes, mul_mat_cm2p: W "
                         "predecoded to f16, mul_mat_cm2pf: and f16 sums; mul_mat_moe, "
                         "mul_mat_moe_cm, mul_mat_moe_cmp: its loads a step ahead, "
                         "mul_mat_moe_cmh: x as f16, mul_mat_moe_cm2)")
    kb.add_argument("--shapes", metavar="T:KxMxN,...",
                    help="mul_mat_cm: these products instead (weight type: inputs x outputs "
                         "x tokens, e.g. Q4_K:4096x14336x512)")
    kb.add_argument("--tiles", metavar="BMxBNxWG,...",
                    help="mul_mat_cm: these workgroup-scope tiles (rows x tokens x lanes) "
                         "instead")
    kb.add_argument("--json", action="store_true")
    kb.set_defaults(func=cmd_kernel_bench)

    from .server import serve as _serve
    serve = _serve.add_parser(sub, model_help)
    add_flash_attn_argument(serve)
    serve.set_defaults(func=cmd_serve)
    from .tools import yield_gpu
    yield_gpu.add_parser(sub)
    from .tools import check as _check
    _check.add_parser(sub)
    from .tools import precision as _precision
    _precision.add_parser(sub)
    from .tools import client as _client
    _client.add_parsers(sub)
    from .tools import cache as _cache
    _cache.add_parser(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    from .formats.gguf_file import ModelFileError
    from .gpu.vk import VulkanError
    from .residency.arbiter import BudgetError
    from .residency.arena import ArenaError

    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except (ModelFileError, UsageError, ValueError, KeyError, BudgetError) as exc:
        msg = exc.args[0] if isinstance(exc, KeyError) and exc.args else exc
        print(f"hotseat: error: {msg}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except ArenaError as exc:
        print(f"hotseat: error: {exc} (or run without the arena: --no-arena)", file=sys.stderr)
        return EXIT_BAD_INPUT
    except VulkanError as exc:
        print(f"hotseat: Vulkan error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
