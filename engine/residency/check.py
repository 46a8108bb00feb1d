"""Whether a GGUF file will run here, said before any load: `check_file(path, n_ctx)`.

It reads the file (bounds-checked, engine/formats/gguf_file.py), picks the architecture from
the registry as it stands (engine/arch), builds and validates its Config, and checks every
tensor the architecture reads: present, of the shape it expects, of a type the kernels take.
Every problem is listed, not only the first. For a file that will run it adds what the model
takes: its weights packed as a load packs them plus the run state a warm model allocates
(model.py's `weight_layout` and `run_state_sizes`, the same functions Model calls), and the
host memory its shadow takes when cold.

No device work: the figures are for a `Target`, a device's limits and kernel choices, read
from an open Vulkan device (`Target.of_device`) or assumed (`Target.typical`).

A file that is not a GGUF, or is cut short, raises the ModelFileError a load raises.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from shaders.registry import WEIGHT_TYPES

from .. import arch as architectures
from ..formats.gguf_file import GGUFFile, ModelFileError
from ..gpu.limits import MAX_CTX
from ..gpu.paths import Tuning, flash_attn_mode
from ..gpu.runstate import RunState
from ..vision.config import VisionConfig
from ..vision.encoder import sizes as encoder_sizes
from .model import run_state_sizes, weight_layout

TYPICAL_ALIGN = 256            # minStorageBufferOffsetAlignment of common GPUs, or less
TYPICAL_RANGE = 4 << 30        # maxStorageBufferRange of most discrete GPUs
MIN_CTX = 16                    # what Model accepts (up to the device's Tuning.max_ctx)
NAMES_SHOWN = 8                # tensor names in one problem line; the JSON lists them all


@dataclass(frozen=True)
class Target:
    """The device the figures are for: its storage-buffer limits, its kernel choices (the
    prefill chunk and flash attention size the run state) and its VRAM budget."""
    name: str
    storage_align: int
    max_storage_range: int
    tuning: Tuning
    budget_bytes: int | None = None    # None: not known, not checked
    measured: bool = False             # read from a Vulkan device (else assumed)

    @classmethod
    def typical(cls, flash_attn: str = "auto") -> "Target":
        """A GPU without matrix units and the usual limits, assumed (no device opened)."""
        return cls("a typical GPU (assumed)", TYPICAL_ALIGN, TYPICAL_RANGE,
                   Tuning(flash_attn=flash_attn_mode(flash_attn)))

    @classmethod
    def of_device(cls, dev, flash_attn: str = "auto",
                  budget_bytes: int | None = None) -> "Target":
        """An open vk.Device's limits and tuning, as a load on it takes them."""
        return cls(dev.name, dev.storage_align, dev.max_storage_range,
                   Tuning.for_device(dev, flash_attn), budget_bytes, True)

    def as_dict(self) -> dict:
        return {"name": self.name, "measured": self.measured,
                "storage_align": self.storage_align,
                "max_storage_range": self.max_storage_range,
                "budget_bytes": self.budget_bytes}


def check_file(path: str, n_ctx: int, target: Target | None = None,
               mmproj: str | None = None) -> dict:
    """What `hotseat check` reports (see the README's "Using it"): "runs", "problems" (one
    line each), "notes", the architecture, weight types with tensor counts, the contexts,
    "vram" and "ram" (None where the file cannot be sized); with mmproj, its projector in
    "vision" and its bytes in both. Raises ModelFileError for a file that is not a readable
    GGUF."""
    target = target or Target.typical()
    with GGUFFile(path) as g:
        out, cfg = _check(g, int(n_ctx), target)
    if mmproj is not None:
        _check_vision(out, cfg, mmproj, target)
    return out


def _check_vision(out: dict, cfg, path: str, target: Target) -> None:
    """The projector's part of the report: its problems, and its bytes joined to the
    model's (the encoder is warm and cold with it)."""
    with GGUFFile(path) as g:
        try:
            c = VisionConfig.from_gguf(g)
        except ModelFileError as exc:
            out["problems"].append(f"mmproj: {exc.problem}")
            out["vision"] = {"path": path}
            out["runs"] = False
            return
        sz = encoder_sizes(g, c)
    width = cfg.n_embd if cfg is not None else None
    out["vision"] = {"path": path, "projector": c.projector, "image_size": c.image_size,
                     "tokens_per_image": c.max_image_tokens, "width": c.n_embd_text,
                     "vram_bytes": sz["weights"] + sz["activations"], "ram_bytes": sz["host"]}
    if width is not None and width != c.n_embd_text:
        out["problems"].append(f"mmproj: the projector gives rows of {c.n_embd_text}; the "
                               f"model takes {width}")
    vram, ram = out["vram"], out["ram"]
    if vram is not None:                    # the encoder, and a pass's image rows
        pass_tokens = run_state_sizes(cfg, out["context"]["n_ctx"], target.tuning)["max_tokens"]
        vram["vision_bytes"] = out["vision"]["vram_bytes"] + 4 * pass_tokens * width
        vram["total_bytes"] += vram["vision_bytes"]
        ram["vision_bytes"] = sz["host"]
        ram["upper_bound_bytes"] += sz["host"]
        if target.budget_bytes is not None and vram["total_bytes"] > target.budget_bytes \
                >= vram["total_bytes"] - vram["vision_bytes"]:
            out["problems"].append(f"needs {_mib(vram['total_bytes'])} of VRAM warm with its "
                                   f"projector, more than the budget of "
                                   f"{_mib(target.budget_bytes)} on {target.name}")
    out["runs"] = not out["problems"]


def _names(names: list[str]) -> str:
    shown = ", ".join(names[:NAMES_SHOWN])
    more = len(names) - NAMES_SHOWN
    return shown + (f" and {more} more" if more > 0 else "")


def _tensors(n: int) -> str:
    return f"{n} tensor" if n == 1 else f"{n} tensors"


def _check(g: GGUFFile, n_ctx: int, target: Target) -> tuple[dict, object]:
    """The report, and the model's config (None where it cannot be read)."""
    registry = architectures.ARCHITECTURES           # as registered now
    problems: list[str] = []
    notes: list[str] = []
    arch = g.get("general.architecture")
    types = Counter(t.type_name for t in g.tensors.values())
    out = {"path": g.path, "file_bytes": g.file_size, "name": g.get("general.name"),
           "architecture": arch, "runs": False, "problems": problems, "notes": notes,
           "weight_types": dict(types.most_common()), "unsupported_types": {},
           "supported_architectures": list(registry), "supported_types": list(WEIGHT_TYPES),
           "missing_tensors": [], "wrong_shapes": {},
           "context": {"trained": None, "n_ctx": n_ctx}, "vram": None, "ram": None,
           "device": target.as_dict()}

    module = registry.get(arch) if isinstance(arch, str) else None
    if arch is None:
        problems.append("no general.architecture key: not a model Hotseat can read")
    elif module is None:
        problems.append(f"architecture {arch} is not supported (supported: "
                        f"{', '.join(registry)})")
    trained = g.get(f"{arch}.context_length")
    out["context"]["trained"] = trained if isinstance(trained, int) else None
    cfg = None
    if module is not None:
        try:
            cfg = module.Config.from_gguf(g)
            cfg.validate(g.path)
        except ModelFileError as exc:
            problems.append(exc.problem)
            cfg = None
        except Exception as exc:      # a key of the wrong kind: a load fails on it as well
            problems.append(f"hyperparameters cannot be read ({type(exc).__name__}: {exc})")
            cfg = None

    # Tensor types: those the model reads must be supported; elsewhere they are only noted.
    # Without a config nothing says which are read, so every one counts.
    read = cfg.tensor_shapes() if cfg is not None else None
    read_types = Counter(g.tensors[n].type_name for n in read if n in g.tensors) \
        if read is not None else types
    bad = {t: n for t, n in read_types.items() if t not in WEIGHT_TYPES}
    out["unsupported_types"] = bad
    for t, n in bad.items():
        problems.append(f"tensor type {t} in {_tensors(n)}")
    for t, n in types.items():
        if t not in WEIGHT_TYPES and t not in bad:
            notes.append(f"tensor type {t} in {_tensors(n)} the model does not read")

    sized = False
    if cfg is not None:
        out["context"]["trained"] = cfg.n_ctx_train
        missing = [n for n in read if n not in g.tensors]
        wrong = {n: (list(g.tensors[n].shape), list(s)) for n, s in read.items()
                 if n in g.tensors and g.tensors[n].shape != s}
        out["missing_tensors"] = missing
        out["wrong_shapes"] = {n: {"shape": a, "expected": b} for n, (a, b) in wrong.items()}
        if missing:
            problems.append(f"missing {_tensors(len(missing))}: {_names(missing)}")
        if wrong:
            problems.append(f"{_tensors(len(wrong))} of the wrong shape: " + _names(
                [f"{n} {a} (expected {b})" for n, (a, b) in wrong.items()]))
        only = cfg.tensor_types()
        for n, allowed in only.items():
            t = g.tensors.get(n)
            if t is not None and t.type_name in WEIGHT_TYPES and t.type_name not in allowed:
                problems.append(f"tensor {n} has type {t.type_name}, expected "
                                f"{' or '.join(allowed)}")
        sized = not missing and not wrong

    max_ctx = target.tuning.max_ctx
    if not MIN_CTX <= n_ctx <= max_ctx:
        problems.append(f"context size {n_ctx} out of range ({MIN_CTX} to {max_ctx}"
                        f"{' on ' + target.name if max_ctx < MAX_CTX else ''})")
        sized = False
    trained = out["context"]["trained"]
    if isinstance(trained, int) and n_ctx > trained:
        notes.append(f"the context {n_ctx} is longer than the {trained} it was trained on")

    _check_tokenizer(g, problems)

    if sized:
        try:
            out["vram"], out["ram"] = _sizes(g, cfg, n_ctx, target)
        except ModelFileError as exc:        # a tensor no storage buffer of the device holds
            problems.append(exc.problem)
    vram = out["vram"]
    if vram is not None and target.budget_bytes is not None \
            and vram["total_bytes"] > target.budget_bytes:
        problems.append(f"needs {_mib(vram['total_bytes'])} of VRAM warm, more than the "
                        f"budget of {_mib(target.budget_bytes)} on {target.name}")
    out["runs"] = not problems
    return out, cfg


def _check_tokenizer(g: GGUFFile, problems: list[str]) -> None:
    """What a load reads next: the tokenizer and the chat template."""
    from ..text.chat import ChatTemplate
    from ..text.tokenizer import Tokenizer

    try:
        Tokenizer.from_gguf(g)
        ChatTemplate.from_gguf(g)
    except ModelFileError as exc:
        problems.append(exc.problem)
    except Exception as exc:
        problems.append(f"unusable tokenizer metadata ({exc})")


def _sizes(g: GGUFFile, cfg, n_ctx: int, target: Target) -> tuple[dict, dict]:
    """(VRAM warm, host RAM) as a loaded Model's warm_bytes() and host_shadow_bytes() say."""
    layout = weight_layout(g, cfg, frozenset(), target.storage_align, target.max_storage_range)
    weights = sum(layout.device_arenas)
    args = run_state_sizes(cfg, n_ctx, target.tuning)
    state = RunState.bytes_for(**args)
    layers = args["n_layer"] if args["kv_layers"] is None else len(args["kv_layers"])
    kv = 2 * (2 * n_ctx * args["kv_dim"]) * layers          # K and V, f16
    recurrent = RunState.recurrent_bytes(**args)
    vram = {"weights_bytes": weights, "kv_bytes": kv, "recurrent_bytes": recurrent,
            "compute_bytes": state - kv - recurrent, "total_bytes": weights + state}
    # cold: the weights' host copy; a full eviction adds the used KV (at most a full
    # context's) and the recurrent states
    ram = {"weights_bytes": weights, "kv_full_context_bytes": kv,
           "recurrent_bytes": recurrent, "upper_bound_bytes": weights + kv + recurrent}
    return vram, ram


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB" if n < 1 << 30 else f"{n / (1 << 30):.2f} GiB"
