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

Across processes (`Engine(arena=True)` joins the user's arena, `Engine(arena=Arena(dir))` a
given one; see engine/residency/arena.py): the engine takes the arena's token before any
upload and holds it while any model has device memory. When another process rings the
doorbell, the engine goes fully cold at its next safe point and hands the token over;
pinned models go too, since the arena outranks in-process pins. Safe points are between
jobs, and inside a request between prefill chunks and between decoded tokens: there the
request hands over at once for a yield (`hotseat yield`), and for another process's ring
once it has held the token ARENA_SLICE_S (so that two busy processes take turns instead
of swapping at every token), then waits for the token and restores its model. The next
request takes the token back; with `wake_on_free` the engine also takes a free token back
by itself and restores the models the arena took, so that its next request finds them
warm. `arena_status()` says where the engine stands. With $HOTSEAT_ARENA_LOG set to a
file, every arena event is appended there as a JSON line with this process's device bytes
(a diagnostic the cross-process tests read).
"""
from __future__ import annotations

import json
import os
import queue
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Callable

from .formats.gguf_file import ModelFileError
from .gpu import vk
from .gpu.kernels import KernelCache
from .gpu.ops import flash_attn_mode
from .residency.arbiter import Arbiter, BudgetError, PinnedError
from .residency.arena import Arena, ArenaBusy
from .residency.model import Model, Timings, default_flash_attn
from .text.chat import ChatTemplate
from .text.sampling import Sampler, SamplingParams
from .text.tokenizer import StreamDecoder, Tokenizer

DEFAULT_CTX = 2048
ARENA_SLICE_S = 1.0           # a request holds the token this long before handing it over
BUDGET_MARGIN = 0.10          # of the device heap, left for the desktop and other programs
MIN_MARGIN = 256 << 20


def default_budget(dev: vk.Device) -> int:
    heap = dev.device_heap_bytes
    return max(heap - max(int(heap * BUDGET_MARGIN), MIN_MARGIN), heap // 2)


class ModelExists(ValueError):
    """A load under a name the engine already holds."""


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
    last_restore: dict | None = None     # the last restore's transfer (Model.last_transfer)


class _Cancelled(Exception):
    """A request given up mid-way: while it waited for the arena's token, or during its
    prompt."""


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
                 arena: Arena | bool | None = None, flash_attn: str | None = None,
                 wake_on_free: bool = False, arena_label: str = ""):
        """flash_attn: prefill attention, "auto" (tiled where it pays: AMD GCN, heads of 256
        and more), "on" or "off"; None: $HOTSEAT_FLASH_ATTN, else "auto". arena: True joins
        the user's arena (closed with the engine), an Arena joins that one (the caller
        closes it), None or False none; arena_label says what this process is in `hotseat
        ps` ("serve http://...", "tray"). wake_on_free: take a free token back by itself
        after the arena took the GPU (see the module's docstring)."""
        self.flash_attn = flash_attn_mode(flash_attn) if flash_attn else default_flash_attn()
        self._own_arena = arena is True
        arena = Arena() if arena is True else arena or None
        try:
            self.dev = vk.Device(device)
        except BaseException:
            if self._own_arena:
                arena.close()
            raise
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
        self.wake_on_free = bool(wake_on_free)
        self._arena_claims = 0               # queued jobs holding the token, not yet running
        self._arena_waiting = 0              # callers waiting for the token
        self._arena_evicted: list[str] = []  # warm when the arena took the GPU: woken first
        self._arena_last_wait_s: float | None = None
        self._running = 0                    # generations on the engine thread now
        self._yield_wanted = False
        self._claims_lock = threading.Lock()
        self._ledger_fd = -1
        if arena is not None:
            log_path = os.environ.get("HOTSEAT_ARENA_LOG")
            if log_path and arena.on_event is None:
                arena.on_event = self._arena_ledger(log_path)
            arena.attach(self._arena_yield, self._arena_wake, arena_label)

    @property
    def device_name(self) -> str:
        return self.dev.name

    def _job(self, why: str, fn: Callable, *args, wait: float | None = None):
        """fn on the engine thread; with an arena, the token is taken first (waiting here,
        not on the engine thread, so that other work goes on meanwhile; at most `wait`
        seconds when given, else ArenaBusy)."""
        claimed = self._arena_claim(why, wait)

        def job():
            if claimed:
                self._arena_unclaim()
                if not self.arena.held:      # a request before it handed over mid-way
                    self._arena_wait(why)
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
                raise ModelExists(f"a model named {name!r} is already loaded")
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
            m.last_restore = dict(m.model.restore())

    def unload(self, name: str) -> None:
        def job():
            self._get(name).model.close()
            self.arbiter.unregister(name)
            del self.models[name]
            self._arena_drop_if_idle()
        self.thread.run(job)

    def warm(self, name: str, wait: float | None = None) -> dict:
        """Make a model warm now; what was restored ({"op": None} if it already was warm).
        wait: as in generate()."""
        def job():
            m = self._get(name)
            if m.model.state == "warm":
                self._warm(m)                    # still refreshes its place in the LRU order
                return {"op": None, "seconds": 0.0, "bytes": 0}
            self._warm(m)
            return m.model.last_transfer
        self._get(name)
        return self._job(f"warm {name}", job, wait=wait)

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
                 "cached_tokens": len(m.model.cache_tokens),
                 "last_restore": m.last_restore}
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

    def set_arena_label(self, label: str) -> None:
        """What `hotseat ps` says this process is ("serve http://127.0.0.1:8080")."""
        if self.arena is not None:
            self.arena.set_member(label=label[:200])

    def device_job(self, fn: Callable[[], object], name: str | None = None,
                   why: str = "device work"):
        """fn() on the engine thread as one job, holding the arena's token, with the model
        `name` made warm first: nothing is released until it returns. For benchmarks that
        drive a Model or the device directly."""
        def job():
            if name is not None:
                self._warm(self._get(name))
            return fn()
        return self._job(why, job)

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
                 cancel: threading.Event | None = None,
                 wait: float | None = None) -> Completion:
        """One request, run on the engine thread as one job; on_text is called there.
        wait: with an arena, the most seconds to wait for the GPU (another process's turn,
        a yield) before ArenaBusy; None waits as long as it takes."""
        m = self._get(name)
        prompt_ids = tokens if tokens is not None else self.prompt_tokens(name, prompt, messages)
        if not prompt_ids:
            raise ValueError("the prompt is empty")
        if len(prompt_ids) >= m.model.n_ctx:
            raise ValueError(f"the prompt has {len(prompt_ids)} tokens; the context holds "
                             f"{m.model.n_ctx}")
        max_tokens = max(0, min(int(max_tokens), m.model.n_ctx - len(prompt_ids)))
        params = sampling or SamplingParams()
        sampler = None if params.plain_greedy else Sampler(params)
        cancel = cancel if cancel is not None else threading.Event()
        t0 = time.perf_counter()

        def job():
            if m.name not in self.models:
                raise KeyError(f"no model named {m.name!r} is loaded")
            self._warm(m)
            turn = None if self.arena is None else lambda: self._arena_turn(m, cancel)
            self._running += 1
            try:
                return _decode(m, prompt_ids, max_tokens, sampler, stop, on_text, cancel, turn)
            except _Cancelled:         # the client left during the prompt or a wait for the GPU
                return [], "", "cancelled", Timings()
            finally:
                self._running -= 1
        try:
            out, text, finish, timings = self._job(f"generate {m.name}", job, wait=wait)
        except KeyboardInterrupt:
            cancel.set()                 # the job stops at its next token or prompt chunk
            raise
        t = timings.as_dict()
        t["total_s"] = time.perf_counter() - t0
        return Completion(list(prompt_ids), out, text, finish, t)

    # -- the cross-process arena --------------------------------------------------------------
    def resident_bytes(self) -> int:
        """Device bytes held by all models now."""
        return sum(sum(m.model.device_bytes().values()) for m in list(self.models.values()))

    def arena_status(self) -> dict | None:
        """Where this process stands in the arena (None without one): "state" is "holder"
        (it holds the GPU token), "yielded" (a yield is in force, "until" then), "waiting"
        (a request waits for the token) or "cold"; "holder_pid" is the token's holder,
        "processes" every live member of the arena with its own state. Reads bookkeeping
        only."""
        a = self.arena
        if a is None:
            return None
        until = a.yielded()
        held = a.held
        device = self.dev.allocator.reserved_bytes()
        held = held or a.held          # read around the bytes: a handover between counts held
        holder = a.holder()
        holder_pid = holder["pid"] if holder else None
        waiting = self._arena_waiting
        state = "holder" if held else "yielded" if until else "waiting" if waiting else "cold"
        procs = []
        for p in a.members():
            pid = p["pid"]
            procs.append({"pid": pid, "label": p.get("label") or "",
                          "state": "holder" if pid == holder_pid else "yielded" if until
                          else "waiting" if p.get("waiting") else "cold",
                          "until": until, "self": pid == a.pid})
        return {"state": state, "until": until, "holder_pid": holder_pid, "pid": a.pid,
                "dir": a.dir, "yielded_by": a.yield_by if until else None,
                "waiting_requests": waiting, "requests_running": self._running,
                "wake_on_free": self.wake_on_free,
                "device_bytes": device, "acquisitions": a.acquisitions,
                "held_for_s": a.held_for(), "last_wait_s": self._arena_last_wait_s,
                "processes": procs}

    def _arena_claim(self, why: str, wait: float | None = None) -> bool:
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
            if not self.arena.held:
                self._arena_wait(why, wait)
        except BaseException:
            self._arena_unclaim()
            raise
        return True

    def _arena_wait(self, why: str, timeout: float | None = None,
                    cancel: threading.Event | None = None) -> None:
        """Take the token, counted as waiting meanwhile: up to timeout seconds (None: the
        arena's timeout, by default as long as it takes; 0: only a free token, without
        ringing), or until cancel is set (then _Cancelled)."""
        a = self.arena
        if timeout is not None and timeout <= 0:
            if not a.try_acquire(why):
                until = a.yielded()
                if until is not None:
                    a.acquire(why, timeout=0)          # ArenaBusy, saying until when
                h = a.holder()
                who = f"Hotseat process {h['pid']} ({h.get('reason') or 'busy'})" if h \
                    else "another Hotseat process"
                raise ArenaBusy(f"the GPU is held by {who}")
            return
        with self._claims_lock:
            self._arena_waiting += 1
            first = self._arena_waiting == 1
        if first:
            a.set_member(waiting=True)
        t0 = time.monotonic()
        try:
            if cancel is None:
                a.acquire(why, timeout=timeout)
            else:
                while not a.held:
                    try:               # each try is one more flock thread: not too many
                        a.acquire(why, timeout=2.0)
                    except ArenaBusy as exc:
                        if cancel.is_set():
                            raise _Cancelled() from None
                        if exc.retry_after:           # a yield: nothing to ring for
                            cancel.wait(min(exc.retry_after, 0.5))
        finally:
            with self._claims_lock:
                self._arena_waiting -= 1
                last = self._arena_waiting == 0
            if last:
                a.set_member(waiting=False)
        self._arena_last_wait_s = time.monotonic() - t0

    def _arena_turn(self, m: Loaded, cancel: threading.Event) -> None:
        """A safe point inside a request (engine thread, between prefill chunks and decoded
        tokens): for a yield at once, for another process's ring after ARENA_SLICE_S of
        holding, go fully cold and hand the token over, then wait for it and restore m."""
        a = self.arena
        if not a.held:
            return
        a.poll()                       # the watcher may be waiting for this very job
        if not a.wanted() or (a.yielded() is None and a.held_for() < ARENA_SLICE_S):
            return
        self._arena_evict_all()
        self._yield_wanted = False
        self._arena_wait(f"generate {m.name}", cancel=cancel)
        self._warm(m)

    def _arena_wake(self) -> None:
        """The token is free (on the arena's watcher thread): with wake_on_free, take it back
        without ringing and restore the models the arena took, unless another process has
        just rung (the token is on its way to it) or a yield has just ended (processes with
        requests waiting for it take the token first)."""
        a = self.arena
        if not self.wake_on_free or a is None or a.held or not self._arena_evicted \
                or a.rung_recently(2 * a.ring_interval) or a.is_taken():
            return
        if time.time() - a.yield_ended < a.ring_interval:
            return                     # a yield just ended: requests waiting for it go first
        with self._claims_lock:
            self._arena_claims += 1
        try:
            got = a.try_acquire("wake " + ", ".join(self._arena_evicted))
        except BaseException:
            self._arena_unclaim()
            raise
        if not got:
            self._arena_unclaim()
            return
        names, self._arena_evicted = self._arena_evicted, []

        def job():
            self._arena_unclaim()
            if not a.held:             # taken again meanwhile by a ring: nothing to wake
                return
            for name in names:
                m = self.models.get(name)
                if m is not None and m.model.state != "warm":
                    try:
                        self._warm(m)
                    except BudgetError:
                        break
            self._arena_drop_if_idle()
        try:
            self.thread.run(job)
        except RuntimeError:           # closed meanwhile
            pass

    def _arena_ledger(self, path: str) -> Callable[[str, dict], None]:
        fd = self._ledger_fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT
                                       | os.O_CLOEXEC, 0o600)
        pid = os.getpid()

        def write(event: str, info: dict) -> None:
            if event not in ("acquired", "released", "waiting"):
                return
            rec = {"t": time.monotonic(), "wall": time.time(), "pid": pid, "event": event,
                   "alloc": self.dev.allocator.reserved_bytes(),
                   "bytes": self.resident_bytes(), "reason": info.get("reason", "")}
            os.write(fd, (json.dumps(rec) + "\n").encode())
        return write

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
        self._arena_evict_all()
        self._yield_wanted = False

    def _arena_evict_all(self) -> None:
        """Every model fully cold, the spare blocks freed, the token dropped."""
        evicted = []
        for m in list(self.models.values()):
            if m.model.device_bytes():
                if m.model.state == "warm":
                    evicted.append(m.name)
                m.model.release(full=True)
                self.arbiter.update(m.name, sum(m.model.device_bytes().values()))
        if evicted:
            self._arena_evicted = evicted
        self.dev.allocator.trim()      # the other process gets the memory, not our spares
        self.arena.release()

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
        if self._own_arena:
            self.arena.close()
        if self._ledger_fd >= 0:
            os.close(self._ledger_fd)
            self._ledger_fd = -1

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _decode(m: Loaded, prompt_ids: list[int], max_tokens: int, sampler, stop, on_text,
            cancel: threading.Event, turn: Callable[[], None] | None = None):
    """The token loop of one request: (tokens, text, finish reason, timings). turn() is the
    arena's safe point, between prefill chunks and after every token. A client gone (cancel
    set) stops a long prompt between its chunks too (_Cancelled), not after all of it."""
    timings = Timings()

    def prompt_point() -> None:
        if cancel.is_set():
            raise _Cancelled()
        if turn is not None:
            turn()

    out: list[int] = []
    decoder = StreamDecoder(m.tokenizer)
    text, finish = "", "length"
    hold = max((len(s) for s in stop), default=0)    # text held back to catch stop strings
    emitted = 0
    if max_tokens > 0:
        gen = m.model.generate(prompt_ids, max_tokens,
                               None if sampler is None else sampler.sample,
                               m.tokenizer.eog_ids, timings, between_chunks=prompt_point)
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
            if turn is not None and len(out) < max_tokens:
                turn()
        gen.close()
    if finish == "length":
        text += decoder.flush()
    if on_text and len(text) > emitted:
        on_text(text[emitted:])
    return out, text, finish, timings


def _find_stop(text: str, stop) -> int | None:
    cuts = [text.find(s) for s in stop if s and s in text]
    return min(cuts) if cuts else None
