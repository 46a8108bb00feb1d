"""The engine facade: the one small API the CLI, the HTTP server and the tray app share.

    eng = Engine()                       # opens the Vulkan device
    name = eng.load(path)                # weights uploaded, graphs recorded on first use
    out = eng.generate(name, prompt="...", max_tokens=64, sampling=SamplingParams(0))
    eng.status()                         # models and their device bytes by kind
    eng.close()

`load(path, cpu_moe=N.F)` keeps the expert tensors of a mixture-of-experts model's first
layers in host memory that the GPU reads in place (engine/residency/model.py): the model then holds
that much less VRAM, which status() and vram() report as host_weight_bytes.

All work on the device runs on the engine's own thread, one job at a time (a load's upload,
a warm, an evict, a whole request), so callers on several threads are safe and a release
never races a decode: the arbiter and the arena only release between jobs. `status()` and
`vram()` read the bookkeeping without queueing, so they answer during a generation.

Residency: every model is warm (all device buffers resident) or cold (weights released;
with full eviction also KV and compute buffers, the KV kept as a host shadow). Making a
model warm acquires VRAM budget from the arbiter, which releases the least recently used
unpinned models first; a generate on a cold model restores it before reading its KV.

Across processes (opt-in, `Engine(arena=Arena())`, see engine/residency/arena.py): the engine takes
the arena's token before any upload and holds it while any model has device memory. When
another process rings the doorbell, the engine goes fully cold at its next safe point
(between jobs, on the engine thread) and hands the token over; pinned models go too,
since the arena outranks in-process pins. The next request takes the token back.
"""
from __future__ import annotations

import os
import queue
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

from .formats.gguf_file import ModelFileError
from .gpu import vk
from .gpu.kernels import KernelCache
from .gpu.ops import flash_attn_mode
from .residency.arbiter import Arbiter, BudgetError, PinnedError
from .residency.model import Model, Timings, default_flash_attn
from .text.chat import ChatTemplate
from .text.sampling import Sampler, SamplingParams
from .text.tokenizer import StreamDecoder, Tokenizer

if TYPE_CHECKING:
    from .residency.arena import Arena

DEFAULT_CTX = 2048
BUDGET_MARGIN = 0.10          # of the device heap, left for the desktop and other programs
MIN_MARGIN = 256 << 20


def default_budget(dev: vk.Device) -> int:
    heap = dev.device_heap_bytes
    return max(heap - max(int(heap * BUDGET_MARGIN), MIN_MARGIN), heap // 2)


@dataclass
class Completion:
    prompt_tokens: list[int]
    tokens: list[int]
    text: str
    finish_reason: str                   # "stop" (end of generation or stop string) | "length"
    timings: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        return {"prompt_tokens": self.prompt_tokens, "tokens": self.tokens, "text": self.text,
                "finish_reason": self.finish_reason, "timings": self.timings}


@dataclass
class Loaded:
    name: str
    model: Model
    tokenizer: Tokenizer
    chat: ChatTemplate


class EngineThread:
    """The thread that does all device work, one job at a time, in order of arrival.

    `run(fn)` queues fn and waits for its result (its exception is raised in the caller);
    called from the engine thread itself it runs fn at once. `after_each` runs after every
    job: the safe point where releases asked for by other threads happen.
    """

    def __init__(self, name: str = "hotseat-engine"):
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self.after_each: Callable[[], None] | None = None
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    def on_thread(self) -> bool:
        return threading.current_thread() is self._thread

    def run(self, fn: Callable, *args, **kwargs):
        if self.on_thread():
            return fn(*args, **kwargs)
        if not self._thread.is_alive():
            raise RuntimeError("the engine is closed")
        fut: Future = Future()
        self._jobs.put((fut, fn, args, kwargs))
        return fut.result()

    def _loop(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            fut, fn, args, kwargs = job
            if not fut.set_running_or_notify_cancel():
                continue
            try:
                fut.set_result(fn(*args, **kwargs))
            except BaseException as exc:      # handed to the caller
                fut.set_exception(exc)
            if self.after_each is not None:
                try:
                    self.after_each()
                except Exception:             # a failed release must not stop the engine
                    import logging
                    logging.getLogger(__name__).exception("release at a safe point failed")

    def stop(self) -> None:
        if self._thread.is_alive() and not self.on_thread():
            self._jobs.put(None)
            self._thread.join()


class Engine:
    def __init__(self, device: str | None = None, n_ctx: int = DEFAULT_CTX,
                 budget_bytes: int | None = None, full_release: bool = True,
                 arena: Arena | None = None, flash_attn: str | None = None):
        """flash_attn: prefill attention, "auto" (tiled where it pays: AMD GCN, heads of 256
        and more), "on" or "off"; None: $HOTSEAT_FLASH_ATTN, else "auto"."""
        self.flash_attn = flash_attn_mode(flash_attn) if flash_attn else default_flash_attn()
        self.dev = vk.Device(device)
        self.kernels = KernelCache(self.dev)
        self.n_ctx = n_ctx
        self.models: dict[str, Loaded] = {}
        self.arbiter = Arbiter(default_budget(self.dev) if budget_bytes is None else budget_bytes,
                               full_release)
        # freed device blocks are kept for the next model while within the budget: a switch
        # then needs no new device allocation (the arena and close() trim them)
        self.dev.allocator.spare_limit = self.arbiter.budget
        self._names_lock = threading.Lock()
        self._loading: set[str] = set()
        self.thread = EngineThread()
        self.thread.after_each = self._safe_point
        self.arena = arena
        self._arena_claims = 0               # queued jobs holding the token, not yet running
        self._yield_wanted = False
        self._claims_lock = threading.Lock()
        if arena is not None:
            arena.attach(self._arena_yield)

    @property
    def device_name(self) -> str:
        return self.dev.name

    def _job(self, why: str, fn: Callable, *args):
        """fn on the engine thread; with an arena, the token is taken first (waiting here,
        not on the engine thread, so that other work goes on meanwhile)."""
        claimed = self._arena_claim(why)

        def job():
            if claimed:
                self._arena_unclaim()
            return fn(*args)
        try:
            return self.thread.run(job)
        except BaseException:
            if claimed and not self.thread.on_thread():
                self.thread.run(self._arena_drop_if_idle)
            raise

    # -- models -----------------------------------------------------------------------------
    def load(self, path: str, name: str | None = None, n_ctx: int | None = None,
             progress: Callable[[int, int], None] | None = None, cpu_moe: float = 0.0) -> str:
        """Parse the file here, then upload on the engine thread (budget acquired first)."""
        path = os.fspath(path)
        name = name or os.path.splitext(os.path.basename(path))[0]
        with self._names_lock:
            if name in self.models or name in self._loading:
                raise ValueError(f"a model named {name!r} is already loaded")
            self._loading.add(name)
        try:
            model = Model(self.dev, self.kernels, path, n_ctx or self.n_ctx, name=name,
                          warm=False, cpu_moe=cpu_moe, flash_attn=self.flash_attn)
            try:
                tok = Tokenizer.from_gguf(model.gguf)
                chat = ChatTemplate.from_gguf(model.gguf)
            except ModelFileError:
                model.close()
                raise
            except Exception as exc:
                model.close()
                raise ModelFileError(path, f"unusable tokenizer metadata ({exc})") from None

            def upload():
                self.arbiter.register(name, self._releaser(model))
                try:
                    self.arbiter.acquire(name, model.warm_bytes())   # budget before upload
                    model.restore(progress)
                except BaseException:
                    self.arbiter.unregister(name)
                    model.close()
                    self._arena_drop_if_idle()
                    raise
                self.models[name] = Loaded(name, model, tok, chat)
            self._job(f"load {name}", upload)
            return name
        finally:
            with self._names_lock:
                self._loading.discard(name)

    def _releaser(self, model: Model):
        def release(full: bool) -> int:
            model.release(full=full)
            return sum(model.device_bytes().values())
        return release

    def _warm(self, m: Loaded) -> None:
        """Make m warm: acquire budget (evicting others), then restore from host shadows."""
        if self.arena is not None:
            self.arena.acquire(f"warm {m.name}")          # at once: the job claimed it
        self.arbiter.acquire(m.name, m.model.warm_bytes())
        if m.model.state != "warm":
            m.model.restore()

    def unload(self, name: str) -> None:
        def job():
            self._get(name).model.close()
            self.arbiter.unregister(name)
            del self.models[name]
            self._arena_drop_if_idle()
        self.thread.run(job)

    def warm(self, name: str) -> dict:
        """Make a model warm now; what was restored ({"op": None} if it already was warm)."""
        def job():
            m = self._get(name)
            if m.model.state == "warm":
                self._warm(m)                    # still refreshes its place in the LRU order
                return {"op": None, "seconds": 0.0, "bytes": 0}
            self._warm(m)
            return m.model.last_transfer
        self._get(name)
        return self._job(f"warm {name}", job)

    def evict(self, name: str, full: bool | None = None) -> dict:
        """Make a model cold now (weights-only or full; default: the engine's mode)."""
        def job():
            m = self._get(name)
            if name in self.arbiter.pinned:
                raise PinnedError(f"{name} is pinned; unpin it before evicting it")
            info = m.model.release(full=self.arbiter.full_release if full is None else full)
            self.arbiter.update(name, sum(m.model.device_bytes().values()))
            self._arena_drop_if_idle()
            return info
        return self.thread.run(job)

    def set_flash_attn(self, mode: str) -> None:
        """Prefill attention for the loaded models and later loads: "auto", "on" or "off". A
        model whose kernels change goes cold (KV kept on the host) and restores with them at
        its next use."""
        mode = flash_attn_mode(mode)

        def job():
            self.flash_attn = mode
            for m in self.models.values():
                if m.model.set_flash_attn(mode):
                    self.arbiter.update(m.name, sum(m.model.device_bytes().values()))
            self._arena_drop_if_idle()
        self.thread.run(job)

    def pin(self, name: str) -> None:
        """Keep a model warm: it is made warm now and never released by the arbiter."""
        def job():
            m = self._get(name)
            self.arbiter.pin(name, m.model.warm_bytes())
            try:
                self._warm(m)
            except BaseException:
                self.arbiter.unpin(name)
                raise
        self._get(name)
        self._job(f"pin {name}", job)

    def unpin(self, name: str) -> None:
        def job():
            self._get(name)
            self.arbiter.unpin(name)
        self.thread.run(job)

    def _get(self, name: str | None) -> Loaded:
        models = dict(self.models)
        if name is None and len(models) == 1:
            return next(iter(models.values()))
        try:
            return models[name]
        except KeyError:
            raise KeyError(f"no model named {name!r} is loaded") from None

    def tokenizer(self, name: str | None = None) -> Tokenizer:
        return self._get(name).tokenizer

    def status(self) -> list[dict]:
        """Per model: state, pin, device bytes by kind (released buffers skipped) and host
        shadow bytes, weights placed in host memory (cpu_moe), the file's quantization id. Reads
        bookkeeping only, so it answers while a request runs."""
        pinned = set(self.arbiter.pinned)
        return [{"name": m.name, "path": m.model.path, "arch": m.model.gguf.arch,
                 "n_ctx": m.model.n_ctx, "state": m.model.state,
                 "pinned": m.name in pinned,
                 "device_bytes": m.model.device_bytes(),
                 "host_shadow_bytes": m.model.host_shadow_bytes(),
                 "pinned_host_bytes": m.model.pinned_bytes(),
                 "cpu_moe": m.model.cpu_moe,
                 # llama.cpp's quantization id (LlamaFileType), None where the file has none
                 "file_type": m.model.gguf.get("general.file_type"),
                 "host_weight_bytes": m.model.host_weight_bytes,
                 "warm_bytes": m.model.warm_bytes(),
                 "cached_tokens": len(m.model.cache_tokens)}
                for m in list(self.models.values())]

    def vram(self) -> dict:
        """The budget and what is in use, cross-checked with VK_EXT_memory_budget if present.

        allocated_bytes is what this process holds on the device: the models' buffers plus
        spare_bytes, freed blocks kept for the next model."""
        alloc = self.dev.allocator
        out = {"budget_bytes": self.arbiter.budget, "granted_bytes": self.arbiter.used,
               "allocated_bytes": alloc.reserved_bytes(), "spare_bytes": alloc.spare_bytes(),
               "device": self.dev.name, "heap_bytes": self.dev.device_heap_bytes,
               # weights the GPU reads from host memory: outside the budget
               "host_weight_bytes": sum(m.model.host_weight_bytes
                                        for m in list(self.models.values()))}
        driver = self.dev.memory_budget()
        if driver is not None:
            out["driver_budget_bytes"], out["driver_usage_bytes"] = driver
        if self.arena is not None:
            out["arena"] = self.arena.describe()
        return out

    def trim(self) -> int:
        """Give spare device blocks back to the driver; the bytes freed."""
        return self.thread.run(self.dev.allocator.trim)

    # -- generation ---------------------------------------------------------------------------
    def prompt_tokens(self, name: str | None, prompt: str | None = None,
                      messages: list[dict] | None = None) -> list[int]:
        m = self._get(name)
        if messages is not None:
            return m.chat.tokenize(m.tokenizer, messages)
        return m.tokenizer.encode(prompt or "", add_special=True, parse_special=False)

    def generate(self, name: str | None = None, prompt: str | None = None,
                 messages: list[dict] | None = None, tokens: list[int] | None = None,
                 max_tokens: int = 128, sampling: SamplingParams | None = None,
                 stop: list[str] = (), on_text: Callable[[str], None] | None = None,
                 cancel: threading.Event | None = None) -> Completion:
        """One request, run on the engine thread as one job; on_text is called there."""
        m = self._get(name)
        prompt_ids = tokens if tokens is not None else self.prompt_tokens(name, prompt, messages)
        if not prompt_ids:
            raise ValueError("the prompt is empty")
        if len(prompt_ids) >= m.model.n_ctx:
            raise ValueError(f"the prompt has {len(prompt_ids)} tokens; the context holds "
                             f"{m.model.n_ctx}")
        max_tokens = max(0, min(int(max_tokens), m.model.n_ctx - len(prompt_ids)))
        params = sampling or SamplingParams()
        sampler = None if params.temperature <= 0 and params.repeat_penalty == 1.0 \
            else Sampler(params)
        cancel = cancel if cancel is not None else threading.Event()
        t0 = time.perf_counter()

        def job():
            if m.name not in self.models:
                raise KeyError(f"no model named {m.name!r} is loaded")
            self._warm(m)
            return _decode(m, prompt_ids, max_tokens, sampler, stop, on_text, cancel)
        try:
            out, text, finish, timings = self._job(f"generate {m.name}", job)
        except KeyboardInterrupt:
            cancel.set()                 # the job stops at its next token
            raise
        t = timings.as_dict()
        t["total_s"] = time.perf_counter() - t0
        return Completion(list(prompt_ids), out, text, finish, t)

    # -- the cross-process arena --------------------------------------------------------------
    def resident_bytes(self) -> int:
        """Device bytes held by all models now."""
        return sum(sum(m.model.device_bytes().values()) for m in list(self.models.values()))

    def _arena_claim(self, why: str) -> bool:
        """Wait for the token before queueing a job, so that status and other models' work
        go on meanwhile; the safe point leaves a claimed token to its job. A new request
        hands the token over first when another process has asked for it, so that
        back-to-back requests of one process do not starve the others."""
        if self.arena is None or self.thread.on_thread():
            return False
        if self.arena.wanted():
            self._arena_yield()        # someone is waiting: hand over first, then queue up
        with self._claims_lock:
            self._arena_claims += 1
        try:
            self.arena.acquire(why)
        except BaseException:
            self._arena_unclaim()
            raise
        return True

    def _arena_unclaim(self) -> None:
        with self._claims_lock:
            self._arena_claims -= 1

    def _arena_yield(self) -> None:
        """The doorbell rang (on the arena's watcher thread, or a new request saw the ring):
        at the next safe point, evict every model fully, pinned ones too, and hand the token
        over. Returns once the token is handed over (or was not held)."""
        self._yield_wanted = True
        while self.arena is not None and self.arena.held and self._yield_wanted:
            try:
                self.thread.run(self._safe_point)
            except RuntimeError:       # closed meanwhile
                return
            if self._yield_wanted and self.arena.held:
                time.sleep(0.005)      # a queued job holds the token: it runs first

    def _safe_point(self) -> None:
        """Between jobs, on the engine thread: act on a ring of the doorbell."""
        if not self._yield_wanted:
            return
        if self.arena is None or not self.arena.held:
            self._yield_wanted = False
            return
        if self._arena_claims:
            return                     # a queued job holds the token; after it
        for m in list(self.models.values()):
            if m.model.device_bytes():
                m.model.release(full=True)
                self.arbiter.update(m.name, sum(m.model.device_bytes().values()))
        self.dev.allocator.trim()      # the other process gets the memory, not our spares
        self.arena.release()
        self._yield_wanted = False

    def _arena_drop_if_idle(self) -> None:
        if self.arena is not None and self.arena.held and not self._arena_claims \
                and not any(m.model.device_bytes() for m in self.models.values()):
            self.dev.allocator.trim()
            self.arena.release()

    def close(self) -> None:
        def job():
            for name in list(self.models):
                self.unload(name)
            if self.arena is not None:
                self.arena.detach(self._arena_yield)
                self.arena.release()
            self.kernels.close()
            self.dev.close()
        self.thread.run(job)
        self.thread.stop()

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _decode(m: Loaded, prompt_ids: list[int], max_tokens: int, sampler, stop, on_text,
            cancel: threading.Event):
    """The token loop of one request: (tokens, text, finish reason, timings)."""
    timings = Timings()
    out: list[int] = []
    decoder = StreamDecoder(m.tokenizer)
    text, finish = "", "length"
    hold = max((len(s) for s in stop), default=0)    # text held back to catch stop strings
    emitted = 0
    if max_tokens > 0:
        gen = m.model.generate(prompt_ids, max_tokens,
                               None if sampler is None else sampler.sample,
                               m.tokenizer.eog_ids, timings)
        for tok in gen:
            if tok in m.tokenizer.eog_ids:
                finish = "stop"
                break
            out.append(tok)
            text += decoder.push(tok)
            cut = _find_stop(text, stop)
            if cut is not None:
                text, finish = text[:cut], "stop"
                break
            if on_text and len(text) - hold > emitted:
                on_text(text[emitted:len(text) - hold])
                emitted = len(text) - hold
            if cancel.is_set():
                finish = "cancelled"
                break
        gen.close()
    if finish == "length":
        text += decoder.flush()
    if on_text and len(text) > emitted:
        on_text(text[emitted:])
    return out, text, finish, timings


def _find_stop(text: str, stop) -> int | None:
    cuts = [text.find(s) for s in stop if s and s in text]
    return min(cuts) if cuts else None
