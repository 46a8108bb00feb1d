"""A fake of the engine facade (engine.facade.EngineAPI) for UI tests: every method of the
Protocol with the same signature (tests/engine/test_facade.py checks), the same status()
and vram() dicts, no device, deterministic.

    eng = FakeEngine()
    eng.load(path, progress=cb)    # cb(done, total) LOAD_STEPS times; ModelFileError for a
                                   # file named bad.gguf or one that is not GGUF
    eng.check(path)                # runs False, with problems, for an architecture not in
                                   # engine.arch or a tensor type the kernels lack
    eng.calls                      # [("load", path), ("pin", name), ...] in order
    eng.arena_state = {"state": "yielded", "until": t, "holder_pid": 12}   # arena_status()
    eng.evict_idle()               # what the real engine's idle thread does, when asked

Each model holds MODEL_BYTES by kind while warm; evict() keeps the KV (weights-only) or
nothing (full), as the real engine does. Device work (loads' uploads, pin, evict, warm,
generate...) takes one lock, as the real engine's thread runs one job at a time: a warm
waits for a generation; status() and vram() do not. write_gguf() makes small real GGUF
files.

Fake-only attributes, for white-box checks: `budget`, `full_release`, `pinned` (the
arbiter's settings and pins), `idle_s` (set_idle_evict's), `flash_attn`, `calls`, `waits`,
`load_options`, `closed`, `constraints`.
"""
from __future__ import annotations

import math
import os
import threading
import time
from typing import Callable

import numpy as np

from engine.facade import Embeddings, ModelExists, Request, TokenLogprob
from engine.formats.gguf_file import GGUFFile, ModelFileError
from engine.residency.arbiter import BudgetError, PinnedError

MiB = 1 << 20
MODEL_BYTES = {"weights": 96 * MiB, "kv": 6 * MiB, "recurrent": 2 * MiB, "compute": 8 * MiB,
               "scratch": 1 * MiB}
LOAD_STEPS = 4
FAKE_BUDGET = 1024 * MiB                 # default_budget(): the heap less a margin
HEAP_BYTES = 2048 * MiB
N_VOCAB = 32


class FakeCompletion:
    def __init__(self, prompt_tokens: list[int], text: str):
        self.prompt_tokens, self.tokens, self.text = prompt_tokens, [1] * len(text.split()), text
        self.finish_reason, self.timings = "length", {}
        self.logprobs = None


FAKE_EMBD = 8           # the fake's embedding size


def fake_logprob(k: int) -> TokenLogprob:
    """Each " ok" token's entry: id 1 at log(1/2), then ids 2.. at log(1/4), log(1/8)..."""
    return TokenLogprob(1, -math.log(2), [(i + 1, -(i + 1) * math.log(2)) for i in range(k)])


class FakeTokenizer:
    """One token per word: word i of the vocabulary is "w{i}"; other words are token 1."""
    n_vocab = N_VOCAB

    def encode(self, text: str, add_special: bool = True, parse_special: bool = False) -> list[int]:
        return [int(w[1:]) if w[:1] == "w" and w[1:].isdigit() and int(w[1:]) < N_VOCAB
                else 1 for w in text.split()] or [1]

    def decode(self, ids: list[int], special: bool = False) -> str:
        return " ".join(f"w{i}" for i in ids)

    def piece(self, token: int, special: bool = True) -> bytes:
        return f" w{token}".encode()


class FakeModel:
    def __init__(self, name: str, path: str, arch: str, n_ctx: int):
        self.name, self.path, self.arch, self.n_ctx = name, path, arch, n_ctx
        self.state = "warm"
        self.device_bytes = dict(MODEL_BYTES)
        self.last_used = 0                   # the LRU clock
        self.used_at = time.monotonic()      # for idle eviction
        self.busy = 0
        self.cached_tokens = 0
        self.cpu_moe = 0.0


class FakeEngine:
    device_name = "Fake GPU"

    def __init__(self, device: str | None = None, n_ctx: int = 2048,
                 budget_bytes: int | None = None, full_release: bool = True,
                 load_delay_s: float = 0.0, flash_attn: str | None = None,
                 token_delay_s: float = 0.0, host_budget_bytes: int | None = None):
        self.n_ctx = n_ctx
        self.flash_attn = flash_attn or "auto"
        self.budget = int(budget_bytes or FAKE_BUDGET)
        self.full_release = full_release
        self.host_budget = HEAP_BYTES if host_budget_bytes is None else host_budget_bytes
        self.pinned: set[str] = set()
        self.idle_s = 0.0
        self.idle_by_name: dict[str, float] = {}
        self.models: dict[str, FakeModel] = {}
        self.calls: list[tuple] = []
        self.waits: list[float | None] = []  # generate()'s wait, per call
        self.constraints: list = []          # generate()'s constraint, per call
        self.load_delay_s = load_delay_s     # per progress step: lets a test see a load run
        self.token_delay_s = token_delay_s   # per generated token
        self.load_options: dict[str, dict] = {}   # name -> {"n_ctx", "cpu_moe"} as loaded
        self.arena_state: dict | None = None
        self.health_state = {"status": "ok", "faults": 0, "last_fault": None}
        self.arena_label = ""
        self.closed = False
        self._yield_until = 0.0
        self._listeners: list[Callable[[str, dict], None]] = []
        self._lock = threading.RLock()       # bookkeeping
        self._device = threading.RLock()     # the engine thread: one job at a time
        self._clock = 0
        self._file_types: dict[str, int | None] = {}

    # -- models -----------------------------------------------------------------------------
    def load(self, path: str, name: str | None = None, n_ctx: int | None = None,
             progress: Callable[[int, int], None] | None = None,
             cpu_moe: float = 0.0, mmproj: str | None = None,
             image_max_tokens: int | None = None) -> str:
        """Parse on the caller's thread (the real checks of GGUFFile), then "upload" holding
        the device lock, LOAD_STEPS progress calls load_delay_s apart."""
        path = os.fspath(path)
        name = name or os.path.splitext(os.path.basename(path))[0]
        with self._lock:
            self.calls.append(("load", path))
            if name in self.models:
                raise ModelExists(f"a model named {name!r} is already loaded")
        if os.path.basename(path) == "bad.gguf":
            raise ModelFileError(path, "not a GGUF file (it does not start with the GGUF "
                                       "magic)", "not_gguf")
        g = GGUFFile(path)                    # the real checks: missing, foreign, truncated
        try:
            arch = g.arch
            file_type = g.get("general.file_type")
        finally:
            g.close()
        with self._device:
            with self._lock:
                self._make_room(sum(MODEL_BYTES.values()), keep=None)
            total = MODEL_BYTES["weights"]
            for i in range(1, LOAD_STEPS + 1):
                if self.load_delay_s:
                    time.sleep(self.load_delay_s)
                if progress is not None:
                    progress(total * i // LOAD_STEPS, total)
            with self._lock:
                m = FakeModel(name, path, arch, n_ctx or self.n_ctx)
                m.cpu_moe = float(cpu_moe)
                self.load_options[name] = {"n_ctx": m.n_ctx, "cpu_moe": float(cpu_moe)}
                self._file_types[path] = file_type
                self._touch(m)
                self.models[name] = m
        return name

    def check(self, path: str, n_ctx: int | None = None, mmproj: str | None = None) -> dict:
        """The real file checks (GGUFFile; bad.gguf refused as load() refuses it), then what
        a fake can judge: the architecture against the registry, every tensor's type against
        the kernels' types. Sizes are MODEL_BYTES'. The keys Engine.check() gives."""
        from collections import Counter

        from engine.arch import ARCHITECTURES
        from shaders.registry import WEIGHT_TYPES

        path = os.fspath(path)                # not in `calls`: no device work
        if os.path.basename(path) == "bad.gguf":
            raise ModelFileError(path, "not a GGUF file (it does not start with the GGUF "
                                       "magic)", "not_gguf")
        with GGUFFile(path) as g:
            arch = g.get("general.architecture")
            types = Counter(t.type_name for t in g.tensors.values())
            trained = g.get(f"{arch}.context_length")
        problems = [] if arch in ARCHITECTURES else \
            [f"architecture {arch} is not supported (supported: {', '.join(ARCHITECTURES)})"]
        bad = {t: n for t, n in types.items() if t not in WEIGHT_TYPES}
        problems += [f"tensor type {t} in {n} tensor{'s' if n > 1 else ''}"
                     for t, n in bad.items()]
        weights, kv, total = MODEL_BYTES["weights"], MODEL_BYTES["kv"], sum(MODEL_BYTES.values())
        sized = not problems
        return {"path": path, "architecture": arch, "runs": not problems,
                "problems": problems, "notes": [], "weight_types": dict(types),
                "unsupported_types": bad,
                "context": {"trained": trained, "n_ctx": n_ctx or self.n_ctx},
                "vram": {"weights_bytes": weights, "kv_bytes": kv,
                         "compute_bytes": total - weights - kv, "total_bytes": total}
                if sized else None,
                "ram": {"weights_bytes": weights, "kv_full_context_bytes": kv,
                        "recurrent_bytes": 0, "upper_bound_bytes": weights + kv}
                if sized else None,
                "device": {"name": self.device_name, "measured": True,
                           "budget_bytes": self.budget}}

    def unload(self, name: str) -> None:
        with self._device, self._lock:
            self.calls.append(("unload", name))
            self._get(name)
            self.pinned.discard(name)
            self.idle_by_name.pop(name, None)
            del self.models[name]

    def warm(self, name: str, wait: float | None = None) -> dict:
        with self._device, self._lock:
            self.calls.append(("warm", name))
            m = self._get(name)
            was = m.state
            self._warm(m)
            return {"op": None if was == "warm" else "restore", "seconds": 0.0, "bytes": 0}

    def evict(self, name: str, full: bool | None = None) -> dict:
        with self._device, self._lock:
            self.calls.append(("evict", name))
            m = self._get(name)
            if name in self.pinned:
                raise PinnedError(f"{name} is pinned; unpin it before evicting it")
            self._release(m, self.full_release if full is None else full)
            return {"op": "evict", "seconds": 0.0, "bytes": 0}

    def pin(self, name: str) -> None:
        with self._device, self._lock:
            self.calls.append(("pin", name))
            m = self._get(name)
            pinned = sum(self._warm_bytes(self.models[n]) for n in self.pinned if n != name)
            if pinned + self._warm_bytes(m) > self.budget:
                raise BudgetError(f"VRAM budget exceeded pinning {name}")
            self.pinned.add(name)
            self._warm(m)

    def unpin(self, name: str) -> None:
        with self._device, self._lock:
            self.calls.append(("unpin", name))
            self._get(name)
            self.pinned.discard(name)

    def _get(self, name: str | None) -> FakeModel:
        if name is None and len(self.models) == 1:
            return next(iter(self.models.values()))
        try:
            return self.models[name]
        except KeyError:
            raise KeyError(f"no model named {name!r} is loaded") from None

    # -- settings -----------------------------------------------------------------------------
    def set_flash_attn(self, mode: str) -> None:
        with self._device, self._lock:
            self.calls.append(("set_flash_attn", mode))
            if mode not in ("auto", "on", "off"):
                raise ValueError(f"flash attention must be one of auto, on, off, got {mode!r}")
            self.flash_attn = mode

    def set_budget(self, budget_bytes: int | None) -> int:
        budget = self.default_budget() if budget_bytes is None else int(budget_bytes)
        if budget <= 0:
            raise ValueError(f"VRAM budget must be positive, got {budget}")
        with self._lock:
            self.calls.append(("set_budget", budget_bytes))
            self.budget = budget
        return budget

    def set_host_budget(self, budget_bytes: int | None) -> int:
        budget = HEAP_BYTES if budget_bytes is None else int(budget_bytes)
        if budget < 0:
            raise ValueError(f"host budget must not be negative, got {budget}")
        with self._lock:
            self.host_budget = budget
            self.calls.append(("set_host_budget", budget_bytes))
        return budget

    def default_budget(self) -> int:
        return FAKE_BUDGET

    def set_full_release(self, full: bool) -> None:
        with self._lock:
            self.calls.append(("set_full_release", bool(full)))
            self.full_release = bool(full)

    def set_idle_evict(self, seconds: float, name: str | None = None) -> None:
        """Only stored: the fake has no idle thread; evict_idle() does its work when asked."""
        seconds = float(seconds)
        if not seconds >= 0:
            raise ValueError(f"idle eviction takes seconds >= 0, got {seconds}")
        if name is None:
            self.idle_s = seconds
        else:
            self._get(name)
            self.idle_by_name[name] = seconds

    def evict_idle(self, now: float | None = None) -> list[str]:
        """As Engine.evict_idle: evict the warm, unpinned, not busy models idle for their
        idle time (idle_by_name's, else idle_s); subscribers hear "idle_evicted"."""
        limits = {n: self.idle_by_name.get(n, self.idle_s) for n in list(self.models)}
        if not any(limits.values()):
            return []
        now = time.monotonic() if now is None else now
        done = []
        with self._device, self._lock:
            for m in list(self.models.values()):
                idle = now - m.used_at
                limit = limits.get(m.name, 0.0)
                if limit and m.state == "warm" and not m.busy and idle >= limit \
                        and m.name not in self.pinned:
                    self._release(m, self.full_release)
                    done.append((m.name, idle))
        for name, idle in done:
            self._emit("idle_evicted", {"name": name, "idle_s": idle})
        return [n for n, _ in done]

    def subscribe(self, fn: Callable[[str, dict], None]) -> None:
        self._listeners.append(fn)

    def _emit(self, event: str, info: dict) -> None:
        for fn in list(self._listeners):
            fn(event, info)

    # -- residency ----------------------------------------------------------------------------
    @staticmethod
    def _warm_bytes(m: FakeModel) -> int:
        return sum(MODEL_BYTES.values())

    def _touch(self, m: FakeModel) -> None:
        self._clock += 1
        m.last_used = self._clock
        m.used_at = time.monotonic()

    def _used(self) -> int:
        return sum(sum(m.device_bytes.values()) for m in self.models.values())

    def _release(self, m: FakeModel, full: bool) -> None:
        m.state = "cold"
        m.device_bytes = {} if full else {"kv": MODEL_BYTES["kv"]}

    def _make_room(self, nbytes: int, keep: str | None) -> None:
        """Release least recently used unpinned models until nbytes fit, as the arbiter does."""
        order = sorted((m for m in self.models.values()
                        if m.name != keep and m.name not in self.pinned
                        and m.state == "warm"), key=lambda m: m.last_used)
        for m in order:
            if self._used() + nbytes <= self.budget:
                return
            self._release(m, self.full_release)
        if self._used() + nbytes > self.budget:
            raise BudgetError(f"VRAM budget exceeded making warm ({nbytes // MiB} MiB)")

    def _warm(self, m: FakeModel) -> None:
        if m.state != "warm":
            self._make_room(self._warm_bytes(m) - sum(m.device_bytes.values()), keep=m.name)
            m.state = "warm"
            m.device_bytes = dict(MODEL_BYTES)
        self._touch(m)

    # -- text and generation ------------------------------------------------------------------
    def tokenizer(self, name: str | None = None) -> FakeTokenizer:
        self._get(name)
        return FakeTokenizer()

    def prompt_tokens(self, name: str | None, prompt: str | None = None,
                      messages: list[dict] | None = None, images=(),
                      template_args: dict | None = None) -> list[int]:
        """One token per word (at least one), as the endpoint needs for its checks."""
        self._get(name)
        text = prompt if messages is None else " ".join(m.get("content", "") for m in messages)
        return [1] * max(1, len((text or "").split()))

    def chat_template(self, name: str | None = None):
        from engine.text.chat import ChatTemplate

        self._get(name)
        return ChatTemplate(builtin="chatml")

    def generate(self, request: Request, on_text: Callable[[str], None] | None = None,
                 cancel: threading.Event | None = None) -> FakeCompletion:
        """Make the model warm and answer " ok" max_tokens times, one piece per token
        (token_delay_s apart), stopping early when cancel is set; `waits` records each
        call's wait. With logprobs, each token's entry is fake_logprob(logprobs)."""
        name, logprobs = request.name, request.logprobs
        with self._lock:
            m = self._get(name)
            m.busy += 1
        try:
            with self._device:
                with self._lock:
                    self.calls.append(("generate", name))
                    self.waits.append(request.wait)
                    self.constraints.append(request.constraint)
                    self._warm(m)
                pieces = []
                finish = "length"
                for _ in range(request.max_tokens):
                    if cancel is not None and cancel.is_set():
                        finish = "cancelled"
                        break
                    if self.token_delay_s:
                        time.sleep(self.token_delay_s)
                    pieces.append(" ok")
                    if on_text is not None:
                        if logprobs is None:
                            on_text(" ok")
                        else:
                            on_text(" ok", [fake_logprob(logprobs)])
                with self._lock:
                    m.cached_tokens = len(pieces) + 1
                    self._touch(m)
        finally:
            m.busy -= 1
        out = FakeCompletion(list(request.tokens or [1]), "".join(pieces))
        out.finish_reason = finish
        if logprobs is not None:
            out.logprobs = [fake_logprob(logprobs) for _ in pieces]
        return out

    def embed(self, name: str | None, inputs: list, pooling: str | None = None,
              cancel: threading.Event | None = None,
              wait: float | None = None) -> Embeddings:
        """Unit vectors of FAKE_EMBD drawn from each input's text (the same input, the same
        vector); one token per word, or the ids given."""
        with self._lock:
            m = self._get(name)
        with self._device:
            with self._lock:
                self.calls.append(("embed", name))
                self.waits.append(wait)
                self._warm(m)
                self._touch(m)
        vectors, n = [], 0
        for x in inputs:
            ids = FakeTokenizer().encode(x) if isinstance(x, str) else list(x)
            n += len(ids)
            seed = sum((i + 1) * (t + 7) for i, t in enumerate(ids)) + len(str(x))
            v = np.random.default_rng(seed).standard_normal(FAKE_EMBD)
            vectors.append((v / np.linalg.norm(v)).tolist())
        return Embeddings(vectors, n, pooling or "mean", FAKE_EMBD)

    # -- status -----------------------------------------------------------------------------
    def status(self) -> list[dict]:
        with self._lock:
            return [{"name": m.name, "path": m.path, "arch": m.arch, "n_ctx": m.n_ctx,
                     "state": m.state, "pinned": m.name in self.pinned,
                     "device_bytes": dict(m.device_bytes),
                     "host_shadow_bytes": MODEL_BYTES["weights"] if m.state == "cold" else 0,
                     "ram_bytes": 0, "disk_bytes": 0,
                     "warm_bytes": self._warm_bytes(m), "cpu_moe": m.cpu_moe,
                     "host_weight_bytes": 0, "cached_tokens": m.cached_tokens,
                     "file_type": self._file_types.get(m.path),
                     "idle_s": time.monotonic() - m.used_at,
                     "idle_evict_s": self.idle_by_name.get(m.name, self.idle_s)}
                    for m in self.models.values()]

    def vram(self) -> dict:
        with self._lock:
            used = self._used()
            return {"budget_bytes": self.budget, "granted_bytes": used,
                    "allocated_bytes": used, "spare_bytes": 0, "device": self.device_name,
                    "heap_bytes": HEAP_BYTES, "host_weight_bytes": 0,
                    "host_budget_bytes": self.host_budget, "host_used_bytes": 0,
                    "host_disk_bytes": 0}

    def arena_status(self) -> dict | None:
        """What Engine.arena_status() returns: None where the engine has no arena."""
        with self._lock:
            return None if self.arena_state is None else dict(self.arena_state)

    def health(self) -> dict:
        """What Engine.health() returns; `fake.health_state` sets it."""
        with self._lock:
            return dict(self.health_state)

    def yielded_until(self) -> float | None:
        with self._lock:
            if self.arena_state is not None:
                return self.arena_state.get("until") \
                    if self.arena_state.get("state") == "yielded" else None
            return self._yield_until if self._yield_until > time.time() else None

    def yield_gpu(self, seconds: float) -> float:
        """As the real engine without an arena: its warm, unpinned models go cold now (no
        other process is rung); subscribers hear "yielded"."""
        until = time.time() + float(seconds)
        with self._device, self._lock:
            self.calls.append(("yield_gpu", float(seconds)))
            self._yield_until = until
            for m in self.models.values():
                if m.state == "warm" and m.name not in self.pinned:
                    self._release(m, self.full_release)
        self._emit("yielded", {"until": until})
        return until

    def set_arena_label(self, label: str) -> None:
        self.arena_label = label[:200]

    # -- tools ------------------------------------------------------------------------------
    def device_job(self, fn: Callable[..., object], name: str | None = None,
                   why: str = "device work"):
        """fn(the FakeModel, made warm) or fn(None) without a name, holding the device lock."""
        with self._device:
            with self._lock:
                self.calls.append(("device_job", why))
                m = None if name is None else self._get(name)
                if m is not None:
                    self._warm(m)
            return fn(m)

    def trim(self) -> int:
        return 0

    def close(self) -> None:
        with self._device, self._lock:
            self.calls.append(("close",))
            self.models.clear()
            self.closed = True


def write_gguf(path, arch: str = "llama", file_type: int | None = 7,
               tensor_type: str = "Q8_0") -> str:
    """A small real GGUF file (one 32x8 tensor): enough for GGUFFile and the app's quant
    reading. file_type 7 is MOSTLY_Q8_0; None leaves the key out."""
    import gguf

    path = os.fspath(path)
    w = gguf.GGUFWriter(path, arch)
    w.add_name(os.path.splitext(os.path.basename(path))[0])
    if file_type is not None:
        w.add_file_type(file_type)
    data = np.linspace(-1, 1, 256, dtype=np.float32).reshape(8, 32)
    qtype = gguf.GGMLQuantizationType[tensor_type]
    if qtype == gguf.GGMLQuantizationType.F32:
        w.add_tensor("token_embd.weight", data)
    else:
        w.add_tensor("token_embd.weight", gguf.quants.quantize(data, qtype), raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def fake_status(name: str, state: str = "warm", pinned: bool = False, **over) -> dict:
    """One model as the bridge's models_changed carries it, for feeding a window directly."""
    d = {"name": name, "path": f"/models/{name}.gguf", "arch": "llama", "n_ctx": 2048,
         "state": state, "pinned": pinned,
         "device_bytes": dict(MODEL_BYTES) if state == "warm" else {},
         "host_shadow_bytes": 0 if state == "warm" else MODEL_BYTES["weights"],
         "ram_bytes": 0, "disk_bytes": 0,
         "warm_bytes": sum(MODEL_BYTES.values()), "cached_tokens": 0,
         "quant": "Q4_K_M", "file_bytes": 100 * MiB}
    d.update(over)
    return d
