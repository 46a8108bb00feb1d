"""`hotseat check FILE`: whether a GGUF file will run, before loading it.

    hotseat check model.gguf                 # what it is, what it takes, or why it won't run
    hotseat check model.gguf --ctx 8192 --json
    hotseat check model.gguf --mmproj mmproj.gguf   # with its vision projector

Exit status 0 when it will run, 2 when it won't (every problem listed) and 2 with one line on
stderr for a file that is not a readable GGUF. The figures are for the Vulkan device a load
would pick (only its properties are read: nothing is allocated), or with --no-device for a
typical GPU. The check itself is engine/residency/check.py.
"""
from __future__ import annotations

import json
import sys

from ..args import add_flash_attn_argument
from ..residency.check import Target, check_file

EXIT_WONT_RUN = 2


def add_parser(sub) -> None:
    c = sub.add_parser("check", help="say whether a GGUF file will run, and what it takes")
    c.add_argument("file", metavar="FILE",
                   help="GGUF file, or a bundled model (smollm2, gemma3)")
    c.add_argument("--mmproj", metavar="FILE",
                   help="a vision projector (mmproj GGUF) to load with it: checked, and its "
                        "bytes counted")
    c.add_argument("--ctx", type=int, default=None,
                   help="context size to size the KV cache for (default: the engine's, 2048)")
    c.add_argument("--no-device", action="store_true",
                   help="do not read the Vulkan device's limits: assume a typical GPU")
    c.add_argument("--json", action="store_true")
    add_flash_attn_argument(c)
    c.set_defaults(func=cmd_check)


def device_target(flash_attn: str) -> tuple[Target, str]:
    """The device a load would pick, its properties read (no allocation) with the budget
    the engine would take on it; a typical GPU where Vulkan has none. (target, note)."""
    from ..api import default_budget
    from ..gpu import vk

    try:
        dev = vk.Device()
    except vk.VulkanError as exc:
        return Target.typical(flash_attn), f"no Vulkan device ({exc}): a typical GPU assumed"
    try:
        return Target.of_device(dev, flash_attn, default_budget(dev)), ""
    finally:
        dev.close()


def cmd_check(args) -> int:
    from ..api import DEFAULT_CTX
    from ..formats.bundled import resolve
    from ..formats.gguf_file import ModelFileError
    from ..residency.model import default_flash_attn

    flash = args.flash_attn or default_flash_attn()
    path = resolve(args.file)
    target, note = (Target.typical(flash), "") if args.no_device else device_target(flash)
    try:
        report = check_file(path, DEFAULT_CTX if args.ctx is None else args.ctx, target,
                            mmproj=args.mmproj)
    except ModelFileError as exc:
        if args.json:
            _emit({"path": exc.path, "runs": False, "problems": [exc.problem],
                   "error": {"reason": exc.reason, "message": str(exc)}})
        print(f"hotseat: error: {exc}", file=sys.stderr)
        return EXIT_WONT_RUN
    if note:
        report["notes"].append(note)
    if args.json:
        _emit(report)
    else:
        sys.stdout.write(describe(report))
    return 0 if report["runs"] else EXIT_WONT_RUN


def _emit(obj: dict) -> None:
    sys.stdout.write(json.dumps(obj, ensure_ascii=False) + "\n")
    sys.stdout.flush()


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return ""


def describe(r: dict) -> str:
    """The report for people, a line per fact."""
    types = ", ".join(f"{t} in {n}" for t, n in r["weight_types"].items())
    ctx = r["context"]
    trained = f"{ctx['trained']} trained" if ctx["trained"] else "trained length unknown"
    lines = [f"file          {r['path']} ({_size(r['file_bytes'])})",
             f"name          {r['name'] or '-'}",
             f"architecture  {r['architecture']}",
             f"weight types  {types or '-'} (tensors)",
             f"context       {trained}; {ctx['n_ctx']} here (--ctx)"]
    v, ram, dev = r["vram"], r["ram"], r["device"]
    if v is not None:
        recurrent = f", recurrent states {_size(v['recurrent_bytes'])}" \
            if v["recurrent_bytes"] else ""
        vision = f", vision {_size(v['vision_bytes'])}" if "vision_bytes" in v else ""
        lines.append(f"VRAM warm     {_size(v['total_bytes'])}: weights {_size(v['weights_bytes'])}"
                     f", KV cache {_size(v['kv_bytes'])}{recurrent}, compute "
                     f"{_size(v['compute_bytes'])}{vision}"
                     f"   (on {dev['name']})")
        lines.append(f"RAM cold      {_size(ram['weights_bytes'])} host shadow of the weights; "
                     f"at most {_size(ram['upper_bound_bytes'])} with a full context's KV")
    vision = r.get("vision")
    if vision and "projector" in vision:
        lines.append(f"vision        {vision['path']}: {vision['projector']}, "
                     f"{vision['tokens_per_image']} tokens an image, RAM cold "
                     f"{_size(vision['ram_bytes'])} beside the file")
    for n in r["notes"]:
        lines.append(f"note          {n}")
    if r["runs"]:
        lines.append("runs          yes")
    else:
        lines.append("runs          no:")
        lines += [f"  - {p}" for p in r["problems"]]
    return "\n".join(lines) + "\n"
