"""The engine facade: the one small API the CLI, the HTTP server and the tray app share
(its surface is `engine.facade.EngineAPI`).

    eng = Engine()                       # opens the Vulkan device
    name = eng.load(path)                # weights uploaded, graphs recorded on first use
    out = eng.generate(Request(name, prompt="...", max_tokens=64, sampling=SamplingParams(0)))
    eng.status()                         # models and their device bytes by kind
    eng.close()

`load(path, cpu_moe=N.F)` keeps the expert tensors of a mixture-of-experts model's first
layers in host memory that the GPU reads in place (engine/residency/placement.py): the model
then holds that much less VRAM, which status() and vram() report as host_weight_bytes.

All work on the device runs on the engine's own thread, one job at a time (a load's upload,
a warm, an evict, a whole request), so callers on several threads are safe and a release
never races a decode. `status()` and `vram()` read the bookkeeping without queueing, so they
answer during a generation.

Residency: every model is warm (all device buffers resident) or cold (weights released;
with full eviction also KV and compute buffers, the KV kept as a host shadow). Making a
model warm acquires VRAM budget from the arbiter, which releases the least recently used
unpinned models first; a generate on a cold model restores it before reading its KV. Every
release goes through the arbiter (engine/residency/arbiter.py), whoever asks for it: a
user's evict, a change of kernels, the arena, idle eviction.

Across processes (`Engine(arena=True)` joins the user's arena, `Engine(arena=Arena(dir))` a
given one): engine/residency/turns.py holds the policy, `arena_status()` says where the
engine stands.

Why this module is long: it is the facade's one implementation, a method for each entry of
`EngineAPI`, each a short job handed to the engine thread; the work itself lives in
residency/, gpu/ and text/. Split by topic, a reader would lose the one place that shows
every way in.
"""
from __future__ import annotations

import os
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Callable, Sequence

from .facade import Completion, Embeddings, EngineFault, ModelExists, Request, TokenLogprob
from .formats.gguf_file import ModelFileError
from .gpu import vk
from .gpu.kernels import KernelCache
from .gpu.paths import flash_attn_mode
from .gpu.runstate import TOP_LOGPROBS
from .residency import embed as embedding
from .residency import loop, promptcache
from .residency.arbiter import Arbiter, PinnedError
from .residency.arena import Arena
from .residency.pool import SharedPool
from .residency.pool import enabled as shared_pool_enabled
from .residency.check import Target, check_file
from .residency.gamemode import GameMode, GameWatch, GaveUp
from .residency.loop import Cancelled, Timings
from .residency.model import Media, Model, default_flash_attn
from .residency.turns import ARENA_SLICE_S, EngineThread, Turns
from .text.chat import ChatTemplate
from .text.constrain import Constraint
from .text.sampling import Sampler, SamplingParams
from .text.tokenizer import Tokenizer
from .vision import prompt as media_prompt
from .vision.image import Image

MEDIA_KEPT = 16               # images' soft tokens kept per model

__all__ = ["ARENA_SLICE_S", "Completion", "Engine", "ModelExists", "default_budget"]

DEFAULT_CTX = 2048
BUDGET_MARGIN = 0.10          # of the device heap, left for the desktop and other programs
MIN_MARGIN = 256 << 20


def default_budget(dev: vk.Device) -> int:
    heap = dev.device_heap_bytes
    return max(heap - max(int(heap * BUDGET_MARGIN), MIN_MARGIN), heap // 2)


def default_host_budget() -> int:
    """RAM for every model's shadows together: $HOTSEAT_HOST_BUDGET_MIB, else half the
    memory the system has available when the engine starts."""
    value = os.environ.get("HOTSEAT_HOST_BUDGET_MIB")
    if value:
        try:
            mib = int(value)
        except ValueError:
            raise ValueError(f"HOTSEAT_HOST_BUDGET_MIB must be a whole number of MiB, got "
                             f"{value!r}") from None
        if mib < 0:
            raise ValueError(f"HOTSEAT_HOST_BUDGET_MIB must not be negative, got {mib}")
        return mib << 20
    return available_memory() // 2


def available_memory() -> int:
    """MemAvailable from /proc/meminfo (Linux), else the free physical pages."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) << 10
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


@dataclass
class Loaded:
    name: str
    model: Model
    tokenizer: Tokenizer
    chat: ChatTemplate
    last_restore: dict | None = None     # the last restore's transfer (Model.last_transfer)
    last_used: float = 0.0               # time.monotonic() of its last request or warm
    busy: int = 0                        # requests queued or running on it
    # an image's soft tokens by its digest, the latest used last (MEDIA_KEPT of them): a
    # follow-up question about the same image does not encode it again
    media: "OrderedDict[bytes, Media]" = field(default_factory=OrderedDict)


class Engine:
    def __init__(self, device: str | None = None, n_ctx: int = DEFAULT_CTX,
                 budget_bytes: int | None = None, full_release: bool = True,
                 arena: Arena | bool | None = None, flash_attn: str | None = None,
                 wake_on_free: bool = False, arena_label: str = "",
                 prompt_cache: bool = True, host_budget_bytes: int | None = None):
        """flash_attn: prefill attention, "auto" (tiled where it pays: AMD GCN, heads of 256
        and more), "on" or "off"; None: $HOTSEAT_FLASH_ATTN, else "auto". arena: True joins
        the user's arena (closed with the engine), an Arena joins that one (the caller
        closes it), None or False none; arena_label says what this process is in `hotseat
        ps` ("serve http://...", "tray"). wake_on_free: take a free token back by itself
        after the arena took the GPU (engine/residency/turns.py). prompt_cache: keep each
        model's prompt cache across restarts (residency/promptcache.py; the benchmarks,
        which time loads and cold prompts, keep none). host_budget_bytes: RAM for every
        model's shadows together, past which the least recently used move to disk (None:
        default_host_budget())."""
        self.flash_attn = flash_attn_mode(flash_attn) if flash_attn else default_flash_attn()
        self.prompt_cache = prompt_cache
        host_budget = default_host_budget() if host_budget_bytes is None else host_budget_bytes
        owned = arena is True
        arena = Arena() if arena is True else arena or None
        try:
            self.dev = vk.Device(device)
        except BaseException:
            if owned:
                arena.close()
            raise
        self.kernels = KernelCache(self.dev)
        self.n_ctx = n_ctx
        self.models: dict[str, Loaded] = {}
        self.arbiter = Arbiter(default_budget(self.dev) if budget_bytes is None else budget_bytes,
                               full_release, host_budget)
        promptcache.remove_stale_spills()       # what crashed processes left
        # freed device blocks are kept for the next model while within the budget: a switch
        # then needs no new device allocation (the arena and close() trim them)
        self.dev.allocator.spare_limit = self.arbiter.budget
        self._names_lock = threading.Lock()
        self._loading: set[str] = set()
        self._listeners: list[Callable[[str, dict], None]] = []
        self._own_yield_until = 0.0          # a yield asked here, where there is no arena
        self._idle_s = 0.0
        self._idle_by_name: dict[str, float] = {}   # a model's own idle time (0: never)
        self._idle_thread: threading.Thread | None = None
        self._closed = threading.Event()
        self.faults: list[dict] = []         # device faults recovered from (last 20)
        self.fault_count = 0
        self.lost: str | None = None         # why the device is gone, once it is
        self.thread = EngineThread()
        pool = None
        if arena is not None and shared_pool_enabled(self.dev):
            pool = self.dev.allocator.pool = SharedPool(arena.dir, self.dev)
        self.turns = None if arena is None else Turns(
            arena, self.thread, _Seat(self), wake_on_free=wake_on_free, label=arena_label,
            owned=owned, pool=pool)
        self.thread.after_each = self._safe_point
        # game mode: where the driver reports a memory budget, give the GPU up by itself
        # when another program needs its memory (engine/residency/gamemode.py)
        self.game = GameMode.from_env(self.dev.device_heap_bytes)
        self._game: GameWatch | None = None
        if self.game.enabled and self.dev.memory_budget() is not None:
            self._game = GameWatch(
                self.game, read=self.dev.memory_budget, held=self._held_bytes,
                warm_need=self._warm_need, release=self._release_for_game,
                run=self.thread.run, emit=self._emit)
            self._game.start()

    @property
    def device_name(self) -> str:
        return self.dev.name

    @property
    def arena(self) -> Arena | None:
        return None if self.turns is None else self.turns.arena

    def _job(self, why: str, fn: Callable, *args, wait: float | None = None):
        """fn on the engine thread; with an arena, the token is taken first (waiting here,
        not on the engine thread, so that other work goes on meanwhile; at most `wait`
        seconds when given, else ArenaBusy)."""
        self._check_device()
        turns = self.turns
        claimed = turns is not None and turns.claim(why, wait)

        def job():
            if claimed:
                turns.start(why)
            try:
                return fn(*args)
            finally:
                if claimed:
                    turns.end(why)
        try:
            return self._on_thread(why, job)
        except BaseException:
            if claimed and not self.thread.on_thread():
                self.thread.run(self._drop_if_idle)
            raise

    def _on_thread(self, why: str, fn: Callable, *args):
        """fn on the engine thread; a Vulkan error in it leaves no model on stale device
        state (see _recover) and reaches the caller as an EngineFault."""
        def guarded():
            try:
                return fn(*args)
            except vk.OutOfMemory:                # refused before any work: nothing to reset
                raise
            except vk.VulkanError as exc:
                raise self._recover(why, exc) from exc
        return self.thread.run(guarded)

    def _check_device(self) -> None:
        if self.lost is not None:
            raise EngineFault(f"the GPU is lost ({self.lost}); restart Hotseat", lost=True)

    def _recover(self, why: str, exc: vk.VulkanError) -> EngineFault:
        """After a Vulkan error (engine thread): what any model holds on the device may be
        half-written, so every model with device memory is released with nothing copied
        back (host shadows stay; a model whose KV lived only on the device recomputes its
        prompt), and the spare blocks go back. Fail closed: nothing later reads state the
        failed work may have touched."""
        lost = bool(getattr(exc, "lost", False) or getattr(self.dev, "lost", False))
        if lost:
            self.lost = str(exc)
        for m in list(self.models.values()):
            if m.model.device_bytes() or m.model.state == "warm":
                try:
                    self.arbiter.release(m.name, full=True, discard=True)
                except Exception:                 # freeing on a lost device
                    if not lost:
                        raise
        try:
            self.dev.allocator.trim()
        except Exception:
            if not lost:
                raise
        self.fault_count += 1
        self.faults = (self.faults + [{"t": time.time(), "error": str(exc), "during": why,
                                        "lost": lost}])[-20:]
        self._drop_if_idle()
        self._emit("device_fault", dict(self.faults[-1]))
        if lost:
            return EngineFault(f"the GPU was lost during {why} ({exc}); restart Hotseat",
                               lost=True)
        return EngineFault(f"the GPU failed during {why} ({exc}); the models were reset "
                           "from their host copies, so a retry gives the right answer")

    def health(self) -> dict:
        last = dict(self.faults[-1]) if self.faults else None
        status = "device_lost" if self.lost else "recovered" if self.fault_count else "ok"
        return {"status": status, "faults": self.fault_count, "last_fault": last}

    def _safe_point(self) -> None:
        if self.turns is not None:
            self.turns.safe_point()

    def _drop_if_idle(self) -> None:
        if self.turns is not None:
            self.turns.drop_if_idle()

    def _emit(self, event: str, info: dict) -> None:
        for fn in list(self._listeners):
            fn(event, info)

    # -- models -----------------------------------------------------------------------------
    def load(self, path: str, name: str | None = None, n_ctx: int | None = None,
             progress: Callable[[int, int], None] | None = None, cpu_moe: float = 0.0,
             mmproj: str | None = None, image_max_tokens: int | None = None) -> str:
        """Parse the file here, then upload on the engine thread (budget acquired first).
        mmproj: a vision projector file for the model's images, warm and cold with it;
        image_max_tokens: an image's most soft tokens where the projector sizes images."""
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
                if mmproj is not None:
                    model.attach_vision(os.fspath(mmproj), image_max_tokens)
            except ModelFileError:
                model.close()
                raise
            except Exception as exc:
                model.close()
                raise ModelFileError(path, f"unusable tokenizer metadata ({exc})") from None

            def upload():
                self.arbiter.register(name, model)
                try:
                    self.arbiter.acquire(name, model.warm_bytes())   # budget before upload
                    try:
                        self._game_gate(name, model)
                        if self.prompt_cache:       # the KV it had before a restart
                            promptcache.load(model)
                        model.restore(progress)
                        self.arbiter.fit_host()     # a weight copy made for the upload
                    except GaveUp:     # another program holds the VRAM: loaded cold
                        self.arbiter.release(name, full=True)
                        self._drop_if_idle()
                except BaseException:
                    self.arbiter.unregister(name)
                    model.close()
                    self._drop_if_idle()
                    raise
                self.models[name] = Loaded(name, model, tok, chat, last_used=time.monotonic())
            self._job(f"load {name}", upload)
            return name
        finally:
            with self._names_lock:
                self._loading.discard(name)

    def check(self, path: str, n_ctx: int | None = None, mmproj: str | None = None) -> dict:
        """Whether the file will run on this device under this budget, read on the caller's
        thread (no device work): engine/residency/check.py."""
        target = Target.of_device(self.dev, self.flash_attn, self.arbiter.budget)
        return check_file(os.fspath(path), n_ctx or self.n_ctx, target,
                          None if mmproj is None else os.fspath(mmproj))

    def _warm(self, m: Loaded) -> None:
        """Make m warm: acquire budget (evicting others), then restore from host shadows.
        Game mode: GaveUp while another program holds the VRAM it needs."""
        if self._game is not None:
            self._game.point()
        if self.turns is not None:
            self.turns.arena.acquire(f"warm {m.name}")     # at once: the job claimed it
        self.arbiter.acquire(m.name, m.model.warm_bytes())
        m.last_used = time.monotonic()
        if m.model.state != "warm":
            try:
                self._game_gate(m.name, m.model)
            except GaveUp:
                self.arbiter.release(m.name, full=True)    # the grant back, its KV to host
                self.dev.allocator.trim()                  # and the spares to the others
                self._drop_if_idle()
                raise
            m.last_restore = dict(m.model.restore())
            self.arbiter.fit_host()     # the host budget holds a warm model's copies too

    def _game_gate(self, name: str, model: Model) -> None:
        """Game mode: GaveUp unless the driver's budget allows what model's upload adds
        (its warm bytes less what it holds, the spare blocks and the idle shared pool
        blocks it can reuse)."""
        if self._game is not None:
            alloc = self.dev.allocator
            idle = alloc.pool.idle_bytes() if alloc.pool is not None else 0
            need = model.warm_bytes() - sum(model.device_bytes().values()) \
                - alloc.spare_bytes() - idle
            self._game.gate(name, max(0, need))

    def _held_bytes(self) -> int:
        """What game mode would give up: the device memory this process holds while a model
        or a spare block is in it (0 otherwise: nothing to release), and the arena's shared
        pool while this process maps it, in use or not."""
        alloc = self.dev.allocator
        pool = alloc.pool.mapped_bytes() if alloc.pool is not None else 0
        held = alloc.reserved_bytes() if self.resident_bytes() or alloc.spare_bytes() else 0
        return max(held, pool)

    def _warm_need(self) -> int:
        return sum(m.model.warm_bytes() for m in list(self.models.values())
                   if m.model.state == "warm")

    def _release_for_game(self) -> list[str]:
        """Every model fully cold for another program (engine thread): with an arena by
        handing the token over, else through the arbiter; the names that were warm."""
        if self.turns is not None and self.turns.arena.held:
            warm = [m.name for m in self.models.values() if m.model.state == "warm"]
            self.turns.hand_over()
        else:
            warm = _Seat(self).release_all()
        if self.turns is not None:
            self.turns.drop_pool()       # the other program needs the memory itself
        return warm

    def _turn(self, name: str, cancel: threading.Event) -> Callable[[], None] | None:
        """A request's safe point: game mode's give-up, then the arena's turn."""
        game, turns = self._game, self.turns
        if game is None and turns is None:
            return None

        def turn() -> None:
            if game is not None:
                game.point()
            if turns is not None:
                turns.turn(name, cancel)
        return turn

    def unload(self, name: str) -> None:
        def job():
            model = self._get(name).model
            if self.prompt_cache:               # for the next load of it
                promptcache.save(model)
            model.close()
            self.arbiter.unregister(name)
            del self.models[name]
            self._idle_by_name.pop(name, None)
            self._drop_if_idle()
        self._on_thread(f"unload {name}", job)

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
            self.arbiter.release(name, full)
            self._drop_if_idle()
            return m.model.last_transfer
        self._check_device()
        return self._on_thread(f"evict {name}", job)

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

    # -- settings -------------------------------------------------------------------------------
    def set_flash_attn(self, mode: str) -> None:
        """Prefill attention for the loaded models and later loads: "auto", "on" or "off". A
        model whose kernels change goes cold (KV kept on the host) and restores with them at
        its next use."""
        mode = flash_attn_mode(mode)

        def job():
            self.flash_attn = mode
            for m in self.models.values():
                if m.model.set_flash_attn(mode):
                    self.arbiter.release(m.name, full=True)
            self._drop_if_idle()
        self._on_thread("a change of kernels", job)

    def default_budget(self) -> int:
        return default_budget(self.dev)

    def set_budget(self, budget_bytes: int | None) -> int:
        """The VRAM budget (None: the device's default). Models over it are released at
        their next turn on the arbiter, not now."""
        budget = self.default_budget() if budget_bytes is None else int(budget_bytes)
        if budget <= 0:
            raise ValueError(f"VRAM budget must be positive, got {budget}")
        self.arbiter.budget = budget
        self.dev.allocator.spare_limit = budget
        return budget

    def set_host_budget(self, budget_bytes: int | None) -> int:
        budget = default_host_budget() if budget_bytes is None else int(budget_bytes)
        if budget < 0:
            raise ValueError(f"host budget must not be negative, got {budget}")
        self._on_thread("host budget", lambda: self.arbiter.set_host_budget(budget))
        return budget

    def set_full_release(self, full: bool) -> None:
        self.arbiter.full_release = bool(full)

    def set_idle_evict(self, seconds: float, name: str | None = None) -> None:
        """Evict a warm, unpinned model no request has used for this long (0: never);
        subscribers hear "idle_evicted". With a name, that model's own idle time (0: never,
        whatever the engine's is), until it is unloaded."""
        seconds = float(seconds)
        if not seconds >= 0:
            raise ValueError(f"idle eviction takes seconds >= 0, got {seconds}")
        if name is None:
            self._idle_s = seconds
        else:
            self._get(name)
            self._idle_by_name[name] = seconds
        if seconds and self._idle_thread is None:
            self._idle_thread = threading.Thread(target=self._idle_loop, daemon=True,
                                                 name="hotseat-idle")
            self._idle_thread.start()

    def _idle_limits(self) -> dict[str, float]:
        """Each loaded model's idle time now (0: never)."""
        return {n: self._idle_by_name.get(n, self._idle_s) for n in list(self.models)}

    def _idle_loop(self) -> None:
        def poll() -> float:
            shortest = min((s for s in self._idle_limits().values() if s), default=0.0)
            return min(5.0, max(0.2, shortest / 4 or 5.0))
        while not self._closed.wait(poll()):
            try:
                self.evict_idle()
            except RuntimeError:           # closed meanwhile
                return

    def evict_idle(self, now: float | None = None) -> list[str]:
        """Evict the models idle past the idle-eviction time now; their names."""
        limits = self._idle_limits()
        if not any(limits.values()):
            return []
        now = time.monotonic() if now is None else now

        def job():
            out = []
            for m in list(self.models.values()):
                idle, limit = now - m.last_used, limits.get(m.name, 0.0)
                if limit and m.model.state == "warm" and not m.busy and idle >= limit \
                        and m.name not in self.arbiter.pinned:
                    self.arbiter.release(m.name)
                    out.append((m.name, idle))
            self._drop_if_idle()
            return out
        done = self._on_thread("idle eviction", job)
        for name, idle in done:
            self._emit("idle_evicted", {"name": name, "idle_s": idle})
        return [n for n, _ in done]

    def subscribe(self, fn: Callable[[str, dict], None]) -> None:
        self._listeners.append(fn)

    # -- status ---------------------------------------------------------------------------------
    def tokenizer(self, name: str | None = None) -> Tokenizer:
        return self._get(name).tokenizer

    def status(self) -> list[dict]:
        """Per model: state, pin, device bytes by kind (released buffers skipped) and host
        shadow bytes, weights placed in host memory (cpu_moe), the file's quantization id. Reads
        bookkeeping only, so it answers while a request runs."""
        pinned = set(self.arbiter.pinned)
        lost = self.lost is not None
        now = time.monotonic()
        return [{"name": m.name, "path": m.model.path, "arch": m.model.gguf.arch,
                 "n_ctx": m.model.n_ctx, "state": "unusable" if lost else m.model.state,
                 "pinned": m.name in pinned,
                 "device_bytes": m.model.device_bytes(),
                 "host_shadow_bytes": m.model.host_shadow_bytes(),
                 # its shadows' anonymous RAM (the host budget's), and its KV on disk
                 "ram_bytes": m.model.ram_bytes(), "disk_bytes": m.model.disk_bytes(),
                 "pinned_host_bytes": m.model.pinned_bytes(),
                 "cpu_moe": m.model.cpu_moe,
                 # llama.cpp's quantization id (LlamaFileType), None where the file has none
                 "file_type": m.model.gguf.get("general.file_type"),
                 "host_weight_bytes": m.model.host_weight_bytes,
                 "warm_bytes": m.model.warm_bytes(),
                 "cached_tokens": len(m.model.cache_tokens),
                 # the vision projector's file, None without one ("vision" in device_bytes
                 # while it is warm)
                 "mmproj": m.model.vision.path if m.model.vision is not None else None,
                 "faults": m.model.faults,
                 "last_restore": m.last_restore,
                 # seconds since its last request or warm, and the idle time that evicts it
                 "idle_s": now - m.last_used,
                 "idle_evict_s": self._idle_by_name.get(m.name, self._idle_s)}
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
                                        for m in list(self.models.values())),
               # every model's shadows in RAM under the host budget, and on disk below it
               "host_budget_bytes": self.arbiter.host_budget,
               "host_used_bytes": sum(m.model.ram_bytes() for m in list(self.models.values())),
               "host_disk_bytes": sum(m.model.disk_bytes()
                                      for m in list(self.models.values()))}
        driver = self.dev.memory_budget()
        if driver is not None:
            out["driver_budget_bytes"], out["driver_usage_bytes"] = driver
        if self.turns is not None:
            out["arena"] = self.turns.arena.describe()
        out["game_mode"] = {**self.game.describe(), "watching": self._game is not None}
        return out

    def resident_bytes(self) -> int:
        """Device bytes held by all models now."""
        return sum(sum(m.model.device_bytes().values()) for m in list(self.models.values()))

    # -- the GPU's turns ------------------------------------------------------------------------
    def arena_status(self) -> dict | None:
        """The arena's status (turns.py) and "gave_up", game mode's record while it keeps
        the engine off the GPU (gamemode.py), else None. Without an arena: None, or while
        game mode holds, {"enabled": False, "state": "cold", "pid", "gave_up"}."""
        gave_up = None if self._game is None else self._game.status()
        if self.turns is None:
            return None if gave_up is None else {"enabled": False, "state": "cold",
                                                 "pid": os.getpid(), "gave_up": gave_up}
        return {**self.turns.status(), "gave_up": gave_up}

    def yielded_until(self) -> float | None:
        if self.turns is not None:
            return self.turns.arena.yielded()
        return self._own_yield_until if self._own_yield_until > time.time() else None

    def yield_gpu(self, seconds: float) -> float:
        """Ring every Hotseat process to go cold for `seconds` (without waiting for them);
        this engine goes cold through its arena, or, without one, by evicting its warm,
        unpinned models now. The yield's end."""
        arena_dir = self.turns.arena.dir if self.turns is not None else None
        with Arena(arena_dir, watch=False) as ring:
            until = float(ring.yield_gpu(seconds, wait=0)["until"])
        if self.turns is None:
            self._own_yield_until = until

            def job():
                for m in list(self.models.values()):
                    if m.model.state == "warm" and m.name not in self.arbiter.pinned:
                        self.arbiter.release(m.name)
            self._on_thread("a yield", job)
        self._emit("yielded", {"until": until})
        return until

    def set_arena_label(self, label: str) -> None:
        """What `hotseat ps` says this process is ("serve http://127.0.0.1:8080")."""
        if self.turns is not None:
            self.turns.arena.set_member(label=label[:200])

    # -- tools ------------------------------------------------------------------------------------
    def device_job(self, fn: Callable[..., object], name: str | None = None,
                   why: str = "device work"):
        """fn on the engine thread as one job, holding the arena's token: nothing is
        released until it returns. With a name, that model is made warm first and fn gets
        its Model (benchmarks drive it directly); without, fn gets the vk.Device."""
        def job():
            if name is not None:
                m = self._get(name)
                self._warm(m)
                return fn(m.model)
            return fn(self.dev)
        return self._job(why, job)

    def trim(self) -> int:
        """Give spare device blocks back to the driver; the bytes freed."""
        return self.thread.run(self.dev.allocator.trim)

    # -- generation -----------------------------------------------------------------------------
    def prompt_tokens(self, name: str | None, prompt: str | None = None,
                      messages: list[dict] | None = None, images: Sequence[Image] = (),
                      template_args: dict | None = None) -> list[int]:
        """The prompt's ids; with images, one at each of the text's media markers (an
        image's soft tokens as its media id: engine/vision/prompt.py)."""
        m = self._get(name)
        extra = template_args or {}
        if images:
            vision = m.model.vision
            if vision is None:
                raise ValueError(f"{m.name} reads no images: it was loaded without a vision "
                                 "projector (mmproj)")
            text = m.chat.prompt_text(m.tokenizer, messages, **extra) \
                if messages is not None else prompt or ""
            return media_prompt.tokenize(m.tokenizer, text, list(images), vision.config)
        if messages is not None:
            return m.chat.tokenize(m.tokenizer, messages, **extra)
        return m.tokenizer.encode(prompt or "", add_special=True, parse_special=False)

    def _media(self, m: Loaded, images: list[Image]) -> dict[int, Media]:
        """The request's images' soft tokens by media id (on the engine thread, the model
        warm): encoded, or from the model's recent ones."""
        out = {}
        for image in images:
            media = m.media.get(image.digest)
            if media is None:
                media = Media(*m.model.vision.encode(image))
                m.media[image.digest] = media
                while len(m.media) > MEDIA_KEPT:
                    m.media.popitem(last=False)
            m.media.move_to_end(image.digest)
            out[media_prompt.media_id(image)] = media
        return out

    def chat_template(self, name: str | None = None) -> ChatTemplate:
        return self._get(name).chat

    def generate(self, request: Request, on_text: Callable[[str], None] | None = None,
                 cancel: threading.Event | None = None) -> Completion:
        """One request, run on the engine thread as one job; on_text is called there (the
        facade's generate says how)."""
        r = request
        name, logprobs, stop, constraint = r.name, r.logprobs, list(r.stop), r.constraint
        if logprobs is not None and (isinstance(logprobs, bool) or not isinstance(logprobs, int)
                                     or not 0 <= logprobs <= TOP_LOGPROBS):
            raise ValueError(f"logprobs must be an integer from 0 to {TOP_LOGPROBS}, "
                             f"got {logprobs!r}")
        m = self._get(name)
        images = [i if isinstance(i, Image) else Image.from_bytes(i) for i in r.images]
        prompt_ids = r.tokens if r.tokens is not None else \
            self.prompt_tokens(name, r.prompt, r.messages, images)
        if not prompt_ids:
            raise ValueError("the prompt is empty")
        if len(prompt_ids) >= m.model.n_ctx:
            raise ValueError(f"the prompt has {len(prompt_ids)} tokens; the context holds "
                             f"{m.model.n_ctx}")
        max_tokens = max(0, min(int(r.max_tokens), m.model.n_ctx - len(prompt_ids)))
        params = r.sampling or SamplingParams()
        cancel = cancel if cancel is not None else threading.Event()
        t0 = time.perf_counter()
        turns = self.turns

        def job():
            if m.name not in self.models:
                raise KeyError(f"no model named {m.name!r} is loaded")
            self._warm(m)
            turn = self._turn(m.name, cancel)
            if turns is not None:
                turns.running += 1
            sampler = None if params.plain_greedy else Sampler(params)   # afresh on a retry
            entries.clear()
            grammar = None if constraint is None else Constraint(
                constraint, m.tokenizer, m.model.config.n_vocab)
            m.model.media = self._media(m, images) if images else {}
            try:
                return loop.request(m.model, m.tokenizer, prompt_ids, max_tokens, sampler,
                                    stop, on_text, cancel, turn,
                                    None if logprobs is None else entries,
                                    frozenset(r.preserved_tokens), grammar)
            except Cancelled:          # the client left during the prompt or a wait for the GPU
                return [], "", "cancelled", Timings()
            finally:
                if grammar is not None:
                    grammar.close()
                if turns is not None:
                    turns.running -= 1
                m.last_used = time.monotonic()
        emitted = []
        entries: list = []

        def entry(e: tuple) -> TokenLogprob:
            return TokenLogprob(e[0], e[1], e[2][:logprobs])
        if on_text is not None:
            def on_text(piece: str, *got, _to=on_text) -> None:
                emitted.append(True)
                if got:
                    _to(piece, [entry(e) for e in got[0]])
                else:
                    _to(piece)
        m.busy += 1
        try:
            for attempt in range(2):
                try:
                    out, text, finish, timings = self._job(f"generate {m.name}", job,
                                                           wait=r.wait)
                    break
                except EngineFault as exc:
                    # the models were reset from their host copies: a request that has
                    # shown nothing yet runs once more from there
                    if exc.lost or emitted or attempt or cancel.is_set():
                        raise
        except KeyboardInterrupt:
            cancel.set()                 # the job stops at its next token or prompt chunk
            raise
        finally:
            m.busy -= 1
        t = timings.as_dict()
        t["total_s"] = time.perf_counter() - t0
        return Completion(list(prompt_ids), out, text, finish, t,
                          None if logprobs is None else [entry(e) for e in entries])

    def embed(self, name: str | None, inputs: list, pooling: str | None = None,
              cancel: threading.Event | None = None,
              wait: float | None = None) -> Embeddings:
        """Embeddings of texts (tokenized with the model's special tokens, as a prompt) or
        token-id lists, packed into as few passes as fit, on the engine thread as one job
        (engine/residency/embed.py)."""
        m = self._get(name)
        if not isinstance(inputs, list) or not inputs:
            raise ValueError("inputs must be a non-empty list")
        if pooling is not None and pooling not in embedding.POOLINGS:
            raise ValueError(f"pooling must be one of {', '.join(embedding.POOLINGS)}, "
                             f"got {pooling!r}")
        how = pooling or embedding.declared_pooling(m.model) or "mean"
        seqs = [m.tokenizer.encode(x, add_special=True, parse_special=True)
                if isinstance(x, str) else list(x) for x in inputs]
        n_ctx = m.model.n_ctx
        for i, ids in enumerate(seqs):
            if not ids:
                raise ValueError(f"input {i} is empty")
            if len(ids) > n_ctx:
                raise ValueError(f"input {i} has {len(ids)} tokens; the context of {m.name} "
                                 f"holds {n_ctx}")
            if min(ids) < 0 or max(ids) >= m.tokenizer.n_vocab:
                raise ValueError(f"input {i}: token ids must be in 0..{m.tokenizer.n_vocab - 1}")
        turns = self.turns
        cancel = cancel if cancel is not None else threading.Event()

        def job():
            if m.name not in self.models:
                raise KeyError(f"no model named {m.name!r} is loaded")
            self._warm(m)
            turn = self._turn(m.name, cancel)

            def point() -> None:
                if cancel.is_set():
                    raise Cancelled()
                if turn is not None:
                    turn()
            if turns is not None:
                turns.running += 1
            try:
                point()
                return embedding.embed(m.model, seqs, how, point)
            finally:
                if turns is not None:
                    turns.running -= 1
                m.last_used = time.monotonic()
        m.busy += 1
        try:
            for attempt in range(2):
                try:
                    vectors = self._job(f"embed {m.name}", job, wait=wait)
                    break
                except EngineFault as exc:       # reset from the host copies: once more
                    if exc.lost or attempt:
                        raise
        finally:
            m.busy -= 1
        return Embeddings([v.tolist() for v in vectors], sum(len(s) for s in seqs), how,
                          m.model.config.n_embd)

    def close(self) -> None:
        self._closed.set()
        if self._game is not None:
            self._game.stop()          # before the device goes: it reads the device's budget

        def job():
            for name in list(self.models):
                self.unload(name)
            if self.turns is not None:
                self.turns.leave()
            self.kernels.close()
            self.dev.close()
        self.thread.run(job)
        self.thread.stop()
        if self.turns is not None:
            self.turns.close()

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class _Seat:
    """The engine as its arena policy (Turns) sees it."""

    def __init__(self, engine: Engine):
        self.e = engine

    def release_all(self) -> list[str]:
        e = self.e
        warm = [m.name for m in e.models.values() if m.model.state == "warm"]
        e.arbiter.release_all()
        e.dev.allocator.trim(host=False)   # the other process gets the VRAM, not our spares
        return warm

    def warm_named(self, name: str) -> None:
        m = self.e.models.get(name)
        if m is None:
            raise KeyError(name)
        self.e._warm(m)

    def holds_device(self) -> bool:
        return any(m.model.device_bytes() for m in list(self.e.models.values()))

    def device_bytes(self) -> int:
        return self.e.dev.allocator.reserved_bytes()

    def resident_bytes(self) -> int:
        return self.e.resident_bytes()

    def trim(self) -> int:
        return self.e.dev.allocator.trim(host=False)
