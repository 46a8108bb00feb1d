"""EngineBridge: its signals, its life cycle, the requests the UI makes (each only queues a
job on a lane), the status reads and what the engine reports by itself (idle evictions,
yields), all through the engine facade (engine.facade.EngineAPI)."""
from __future__ import annotations

import logging
import os
import threading
import time
from typing import Callable

from PySide6.QtCore import QObject, Signal, Slot

from .. import modelinfo
from ..activity import Activity
from ..errors import NO_GPU, message
from .endpoint import HOST, Endpoint
from .jobs import ModelJobs
from .lanes import Lane, real_engine
from .messages import NoEngine
from .serving import EndpointControl

log = logging.getLogger("hotseat.app")

CLOSE_TIMEOUT_S = 30.0
YIELD_S = 600


class EngineBridge(ModelJobs, EndpointControl, QObject):
    #: the engine is open: the device's name
    device_ready = Signal(str)
    #: the models, after every change and every refresh(): a list of the engine's status()
    #: dicts (name, path, arch, n_ctx, state, pinned, device_bytes, host_shadow_bytes,
    #: warm_bytes, cached_tokens, cpu_moe...), each with "quant" and "file_bytes" added
    models_changed = Signal(list)
    #: the VRAM budget and use, with each models_changed: Engine.vram()'s dict
    vram_changed = Signal(dict)
    #: (path): a queued load has started: the file is being read (no progress until upload)
    load_started = Signal(str)
    #: (path, done bytes, total bytes) while a model's weights upload; once per percent
    load_progress = Signal(str, "qlonglong", "qlonglong")
    #: (path, name): the model at path is loaded (and pinned, if asked) under name
    load_finished = Signal(str, str)
    #: (path, summary, details): the model at path could not be loaded; summary in words for
    #: people (app/errors.py), details the engine's own line naming the file
    load_failed = Signal(str, str, str)
    #: (summary, details): a refused pin, evict, budget change...; summary one line in words
    #: for people, details the engine's own text ("" when there is no more to say)
    error = Signal(str, str)
    #: (name, text): a generate() finished
    generated = Signal(str, str)
    #: (request id, text): the next piece of a chat() answer, as it is generated
    chat_delta = Signal(int, str)
    #: (request id, info): a chat() answer ended; info has text, tokens, finish_reason,
    #: tokens_per_s (None when unknown) and error ("" unless it failed)
    chat_done = Signal(int, dict)
    #: (running, detail): the local endpoint started (detail: its URL) or stopped (detail:
    #: "" or why it could not start)
    endpoint_changed = Signal(bool, str)
    #: model name -> what it is busy with ("generating · 5.2 tok/s", "queued: warm"); models
    #: that are idle are not in it
    busy_changed = Signal(dict)
    #: a line for the activity log ("12:03:04 Loaded smollm2 in 4.1 s")
    log_entry = Signal(str)
    #: the cross-process arena as the engine reports it (Engine.arena_status(): state,
    #: until, holder_pid, gave_up: game mode's record while another program keeps the
    #: engine off the GPU); {} when the engine is not in an arena and has nothing to say
    arena_changed = Signal(dict)

    def __init__(self, engine_factory: Callable[..., object] | None = None, *,
                 budget_bytes: int | None = None, full_release: bool = True,
                 port: int = 8080, flash_attn: str = "auto", host: str = HOST,
                 api_key: str = "", host_budget_bytes: int | None = None,
                 parent: QObject | None = None):
        super().__init__(parent)
        self._factory = engine_factory or real_engine
        self._budget_bytes = budget_bytes
        self._host_budget_bytes = host_budget_bytes
        self._full_release = full_release
        self._flash_attn = flash_attn
        self._port = int(port)
        self._host = host
        self._api_key = api_key
        self._engine = None                # set once on the control lane
        self._opened = threading.Event()   # set when the open finished (or failed)
        self._open_error = ""
        self._endpoint: Endpoint | None = None
        self._lanes = {n: Lane(n) for n in ("control", "load", "generate", "status")}
        self._refresh_queued = threading.Event()
        self._closing = False
        self._started = False
        self._cancels: dict[int, threading.Event] = {}
        self._chat_ids = iter(range(1, 1 << 62))
        self._idle_s = 0.0                 # 0: never evict for idleness
        self._arena: dict = {}
        self._busy: dict[str, str] = {}
        self._busy_lock = threading.RLock()      # a slot may change the activity again
        self.activity = Activity(on_change=self._activity_changed)
        self.device_name = ""              # set once the engine is open

    # -- life cycle -------------------------------------------------------------------------
    def start(self) -> None:
        if self._started:
            return
        self._started = True
        for lane in self._lanes.values():
            lane.start()
        self._lanes["control"].put(lambda: self._guard(self._open))

    def shutdown(self, timeout_s: float = CLOSE_TIMEOUT_S) -> bool:
        """Cancel the chat box's requests, stop the endpoint (its port closes, its requests
        are cancelled), then close the engine, all within timeout_s; jobs still queued are
        dropped and no signal is emitted after this returns. True when the engine closed in
        time (False: a load was still parsing or an upload running; the process may exit
        anyway, the kernel frees the device memory)."""
        if self._closing:
            return True
        self._closing = True
        for ev in list(self._cancels.values()):
            ev.set()
        if not self._started:
            return True
        for lane in self._lanes.values():
            lane.put(None)
        done = threading.Event()

        def close() -> None:
            # the server first: it stops taking requests and cancels the running one, so the
            # engine thread is free for the close job
            if self._endpoint is not None:
                try:
                    self._endpoint.stop()
                except Exception:
                    log.exception("stopping the endpoint failed")
                self._endpoint = None
            if self._opened.wait(timeout_s) and self._engine is not None:
                try:
                    self._engine.close()
                except Exception:
                    log.exception("closing the engine failed")
            done.set()
        threading.Thread(target=close, name="hotseat-close", daemon=True).start()
        if not done.wait(timeout_s):
            log.warning("the engine did not close within %.1f s", timeout_s)
            return False
        return True

    def close(self, timeout_s: float = CLOSE_TIMEOUT_S) -> None:
        self.shutdown(timeout_s)

    @property
    def closing(self) -> bool:
        return self._closing

    @property
    def port(self) -> int:
        return self._port

    # -- requests (UI thread) ---------------------------------------------------------------
    @Slot(str)
    def load(self, path: str, name: str | None = None, pin: bool = False,
             n_ctx: int | None = None, cpu_moe: float = 0.0,
             mmproj: str | None = None) -> None:
        """Load a model file (mmproj: its vision projector, loaded with it)."""
        path = os.fspath(path)
        self._submit("load", lambda: self._load(path, name, pin, n_ctx, cpu_moe, mmproj))

    def reload(self, name: str, n_ctx: int | None = None, cpu_moe: float = 0.0) -> None:
        """Load a model again with another context size or cpu_moe (unload, then load)."""
        self._submit("load", lambda: self._reload(name, n_ctx, cpu_moe))

    @Slot(str)
    def unload(self, name: str) -> None:
        self._device_op(name, "unload")

    @Slot(str)
    def pin(self, name: str) -> None:
        self._device_op(name, "pin")

    @Slot(str)
    def unpin(self, name: str) -> None:
        self._device_op(name, "unpin")

    def set_pinned(self, name: str, pinned: bool) -> None:
        (self.pin if pinned else self.unpin)(name)

    @Slot(str)
    def evict(self, name: str) -> None:
        self._device_op(name, "evict")

    @Slot(str)
    def warm(self, name: str) -> None:
        self._device_op(name, "warm")

    def _device_op(self, name: str, method: str) -> None:
        if self._closing:
            return
        op = self.activity.begin(name, method)      # shows as queued at once
        self._submit("control", lambda: self._call(method, name, op), lambda: self.activity.end(op))

    def generate(self, name: str, prompt: str, max_tokens: int = 16) -> None:
        """A greedy completion of prompt on the generate lane; the text comes as generated."""
        self._submit("generate", lambda: self._generate(name, prompt, int(max_tokens)))

    def chat(self, name: str, messages: list[dict], max_tokens: int = 256,
             temperature: float = 0.7) -> int:
        """Answer messages ([{"role", "content"}...]) with the model on the generate lane,
        streamed as chat_delta; returns the request id that chat_delta and chat_done carry."""
        rid = next(self._chat_ids)
        cancel = threading.Event()
        self._cancels[rid] = cancel
        if self._closing:
            return rid
        op = self.activity.begin(name, "generate", "chat")
        self._submit("generate", lambda: self._chat(rid, name, list(messages),
                                                    int(max_tokens), float(temperature),
                                                    cancel, op),
                     lambda: self.activity.end(op))
        return rid

    def cancel_chat(self, rid: int) -> None:
        ev = self._cancels.get(rid)
        if ev is not None:
            ev.set()

    @Slot()
    def refresh(self) -> None:
        """Queue a status read, unless one is already waiting (the timer never piles up)."""
        if self._refresh_queued.is_set() or self._closing:
            return
        self._refresh_queued.set()
        self._submit("status", self._refresh)

    @Slot(bool)
    def set_endpoint(self, enabled: bool) -> None:
        self._submit("control", lambda: self._set_endpoint(bool(enabled)))

    @Slot(int)
    def set_port(self, port: int) -> None:
        """The endpoint's port (0: any free one); a running endpoint moves to it."""
        self._submit("control", lambda: self._move_endpoint(port=int(port)))

    def set_access(self, host: str, api_key: str) -> None:
        """The endpoint's address (127.0.0.1, or 0.0.0.0 for the LAN) and API key ("" for
        none); a running endpoint moves to them."""
        self._submit("control", lambda: self._move_endpoint(host=host, api_key=api_key))

    def set_budget_bytes(self, budget_bytes: int | None) -> None:
        """The VRAM budget; None: the engine's default. Applies to the next acquisition."""
        self._submit("control", lambda: self._set_budget(budget_bytes))

    def set_host_budget_bytes(self, budget_bytes: int | None) -> None:
        """The RAM for every model's host shadows; None: the engine's default."""
        self._submit("control", lambda: self._set_host_budget(budget_bytes))

    @Slot(bool)
    def set_full_release(self, full: bool) -> None:
        self._submit("control", lambda: self._set_full_release(bool(full)))

    @Slot(str)
    def set_flash_attn(self, mode: str) -> None:
        """Prompt attention "auto", "on" or "off"; loaded models whose kernels change go cold
        and come back with them at their next use."""
        self._submit("control", lambda: self._set_flash_attn(str(mode)))

    def set_idle_evict_s(self, seconds: float) -> None:
        """The engine evicts a warm, unpinned model after this many seconds unused; 0:
        never. The log says so ("idle_evicted")."""
        self._idle_s = max(0.0, float(seconds))
        if self._started:                  # else the open applies it
            self._submit("control", lambda: self._set_idle_evict(self._idle_s))

    def yield_gpu(self, seconds: float = YIELD_S) -> None:
        """Ask every Hotseat process (this one too) to go cold and stay off the GPU."""
        self._submit("control", lambda: self._need_engine().yield_gpu(float(seconds)))

    def log(self, text: str) -> None:
        if not self._closing:
            self.log_entry.emit(f"{time.strftime('%H:%M:%S')} {text}")

    def _submit(self, lane: str, job: Callable[[], None],
                dropped: Callable[[], None] | None = None) -> None:
        if self._closing:
            if dropped is not None:
                dropped()
            return
        if not self._started:
            self.start()

        def run() -> None:
            if self._closing:
                if dropped is not None:
                    dropped()
                return
            if lane != "control" and not self._opened.wait(CLOSE_TIMEOUT_S):
                return
            self._guard(job)
        self._lanes[lane].put(run)

    # -- jobs (lanes) -----------------------------------------------------------------------
    def _guard(self, job: Callable[[], None]) -> None:
        if self._closing:
            return
        try:
            job()
        except Exception as exc:          # a job never kills its lane
            if self._closing:
                return
            log.exception("engine job failed")
            self.error.emit(f"{type(exc).__name__}: {message(exc)}", "")

    def _open(self) -> None:
        try:
            self._engine = self._factory(budget_bytes=self._budget_bytes,
                                         full_release=self._full_release,
                                         flash_attn=self._flash_attn,
                                         host_budget_bytes=self._host_budget_bytes)
        except Exception as exc:
            self._open_error = f"Cannot open the GPU: {message(exc)}"
            log.warning("%s", self._open_error)
            self.error.emit(NO_GPU, self._open_error)
            return
        finally:
            self._opened.set()
        self._engine.subscribe(self._on_engine_event)
        if self._idle_s:
            self._engine.set_idle_evict(self._idle_s)
        self.device_name = str(self._engine.device_name)
        self.device_ready.emit(self.device_name)
        self._emit_status()

    def _need_engine(self):
        if self._engine is None:
            raise NoEngine(self._open_error or "the engine is not open")
        return self._engine

    def _refresh(self) -> None:
        self._refresh_queued.clear()
        self._emit_status()
        self._check_arena()

    def _emit_status(self) -> None:
        if self._engine is None or self._closing:
            return
        if self._lanes["status"].thread is not threading.current_thread():
            self.refresh()                # every status goes out from one lane, in order
            return
        models = self._engine.status()
        for s in models:
            s.update(modelinfo.describe(s["path"], s.get("file_type"), "file_type" in s))
        vram = dict(self._engine.vram())
        if self._closing:
            return
        self.models_changed.emit(models)
        self.vram_changed.emit(vram)

    def _check_arena(self) -> None:
        try:
            st = dict(self._engine.arena_status() or {})
            if not st or st.get("enabled") is False:
                until = self._engine.yielded_until()
                if until:
                    # no arena in this engine: its own yield, as the arena would report it
                    st.update({"state": "yielded", "until": until, "holder_pid": None})
        except Exception:
            log.exception("arena_status failed")
            st = {}
        if st != self._arena and not self._closing:
            self._arena = st
            self.arena_changed.emit(dict(st))

    def _on_engine_event(self, event: str, info: dict) -> None:
        """What the engine did by itself (on its own threads): said in the log."""
        if event == "idle_evicted":
            self.log(f"Evicted {info['name']} after {info['idle_s'] / 60:.0f} min unused")
        elif event == "yielded":
            until = time.strftime("%H:%M", time.localtime(info["until"]))
            self.log(f"Yielded the GPU until {until}")
        elif event == "gave_up":
            self.log(f"Gave the GPU up to another app: {info['reason']}")
        elif event == "came_back":
            self.log("Back on the GPU: the other app's memory is free again")
        elif event == "device_fault":
            if info.get("lost"):
                self.log(f"The GPU was lost during {info['during']}: restart Hotseat")
            else:
                self.log(f"The GPU failed during {info['during']}; the models were reset "
                         "from their copies in RAM")
        self.refresh()

    def _set_budget(self, budget: int | None) -> None:
        """None: the engine's default."""
        self._budget_bytes = budget
        if self._engine is not None:
            self._engine.set_budget(budget)
            self._emit_status()

    def _set_host_budget(self, budget: int | None) -> None:
        self._host_budget_bytes = budget
        if self._engine is not None:
            self._engine.set_host_budget(budget)
            self._emit_status()

    def _set_full_release(self, full: bool) -> None:
        self._full_release = full
        if self._engine is not None:
            self._engine.set_full_release(full)
            self._emit_status()

    def _set_idle_evict(self, seconds: float) -> None:
        if self._engine is not None:
            self._engine.set_idle_evict(seconds)

    def _set_flash_attn(self, mode: str) -> None:
        self._flash_attn = mode
        if self._engine is not None:
            self._engine.set_flash_attn(mode)
            self._emit_status()

    # -- activity ---------------------------------------------------------------------------
    def _activity_changed(self) -> None:
        # read and sent under one lock: two threads' changes leave in the order they were
        # read, so the last dict sent is the activity as it stands
        with self._busy_lock:
            busy = self.activity.busy()
            if busy == self._busy:
                return
            self._busy = busy
            if not self._closing:
                self.busy_changed.emit(dict(busy))

