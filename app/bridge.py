"""The one QObject between Qt and the engine facade.

    bridge = EngineBridge()              # or EngineBridge(engine_factory=FakeEngine) in tests
    bridge.models_changed.connect(window.on_models_changed)
    bridge.start()                       # opens the device on the worker thread
    bridge.load("/models/a.gguf")        # returns at once; progress and result come as signals
    bridge.close()

The engine lives on one worker QThread that runs jobs from a queue in order; every method
here only queues a job, so the UI thread never waits for the device, a load or the endpoint.
Results come back as signals, emitted on the worker thread and delivered (queued) to
receivers on the UI thread.
"""
from __future__ import annotations

import logging
import os
import queue
import threading
from typing import Callable

from PySide6.QtCore import QObject, QThread, Signal, Slot

from . import modelinfo
from .endpoint import Endpoint

log = logging.getLogger("hotseat.app")

CLOSE_TIMEOUT_MS = 30_000


def _real_engine(**kw):
    from engine.api import Engine
    from engine.args import arena_enabled

    # the tray takes turns on the GPU with the user's other Hotseat processes, unless
    # $HOTSEAT_NO_ARENA or hotseat-tray --no-arena says otherwise
    kw.setdefault("arena", arena_enabled())
    kw.setdefault("arena_label", "tray")
    return Engine(**kw)


class _Worker(QThread):
    """Runs the bridge's jobs one at a time; None ends it."""

    def __init__(self, jobs: queue.Queue, parent: QObject | None = None):
        super().__init__(parent)
        self.jobs = jobs
        self.setObjectName("hotseat-engine")

    def run(self) -> None:
        while True:
            job = self.jobs.get()
            if job is None:
                return
            job()


class EngineBridge(QObject):
    #: the engine is open: the device's name
    device_ready = Signal(str)
    #: the models, after every change and every refresh(): a list of the engine's status()
    #: dicts (name, path, arch, n_ctx, state, pinned, device_bytes, host_shadow_bytes,
    #: warm_bytes, cached_tokens), each with "quant" and "file_bytes" added
    models_changed = Signal(list)
    #: the VRAM budget and use, with each models_changed: Engine.vram()'s dict
    vram_changed = Signal(dict)
    #: (path, done bytes, total bytes) while a model's weights upload; once per percent
    load_progress = Signal(str, "qlonglong", "qlonglong")
    #: (path, name): the model at path is loaded (and pinned, if asked) under name
    load_finished = Signal(str, str)
    #: (path, message): the model at path could not be loaded; the message is one line
    load_failed = Signal(str, str)
    #: a one-line message for the user: a refused pin, evict, budget change...
    error = Signal(str)
    #: (name, text): a generate() finished
    generated = Signal(str, str)
    #: (running, detail): the local endpoint started (detail: its URL) or stopped (detail:
    #: "" or why it could not start)
    endpoint_changed = Signal(bool, str)

    def __init__(self, engine_factory: Callable[..., object] | None = None, *,
                 budget_bytes: int | None = None, full_release: bool = True,
                 port: int = 8080, flash_attn: str = "auto", parent: QObject | None = None):
        super().__init__(parent)
        self._factory = engine_factory or _real_engine
        self._budget_bytes = budget_bytes
        self._full_release = full_release
        self._flash_attn = flash_attn
        self._port = int(port)
        self._engine = None                # touched on the worker thread only
        self._open_error = ""
        self._auto_budget: int | None = None
        self._endpoint: Endpoint | None = None
        self._jobs: queue.Queue = queue.Queue()
        self._worker = _Worker(self._jobs, self)
        self._refresh_queued = threading.Event()
        self._closing = False
        self._started = False
        self.device_name = ""              # set once the engine is open

    # -- life cycle -------------------------------------------------------------------------
    def start(self) -> None:
        if self._started:
            return
        self._started = True
        self._worker.start()
        self._submit(self._open)

    def close(self, timeout_ms: int = CLOSE_TIMEOUT_MS) -> None:
        """Stop the endpoint and close the engine; jobs still queued are dropped."""
        if self._closing or not self._started:
            self._closing = True
            return
        self._closing = True
        self._jobs.put(self._shutdown)
        self._jobs.put(None)
        if not self._worker.wait(timeout_ms):
            log.warning("the engine thread did not stop within %d ms", timeout_ms)

    @property
    def port(self) -> int:
        return self._port

    # -- requests (UI thread) ---------------------------------------------------------------
    @Slot(str)
    def load(self, path: str, name: str | None = None, pin: bool = False) -> None:
        self._submit(lambda: self._load(os.fspath(path), name, pin))

    @Slot(str)
    def unload(self, name: str) -> None:
        self._submit(lambda: self._call("unload", name))

    @Slot(str)
    def pin(self, name: str) -> None:
        self._submit(lambda: self._call("pin", name))

    @Slot(str)
    def unpin(self, name: str) -> None:
        self._submit(lambda: self._call("unpin", name))

    def set_pinned(self, name: str, pinned: bool) -> None:
        (self.pin if pinned else self.unpin)(name)

    @Slot(str)
    def evict(self, name: str) -> None:
        self._submit(lambda: self._call("evict", name))

    @Slot(str)
    def warm(self, name: str) -> None:
        self._submit(lambda: self._call("warm", name))

    def generate(self, name: str, prompt: str, max_tokens: int = 16) -> None:
        """A greedy completion of prompt on the worker thread; the text comes as generated."""
        self._submit(lambda: self._generate(name, prompt, int(max_tokens)))

    @Slot()
    def refresh(self) -> None:
        """Queue a status read, unless one is already waiting (the timer never piles up)."""
        if self._refresh_queued.is_set():
            return
        self._refresh_queued.set()
        self._submit(self._refresh)

    @Slot(bool)
    def set_endpoint(self, enabled: bool) -> None:
        self._submit(lambda: self._set_endpoint(bool(enabled)))

    @Slot(int)
    def set_port(self, port: int) -> None:
        """The endpoint's port (0: any free one); a running endpoint moves to it."""
        self._submit(lambda: self._move_endpoint(int(port)))

    def set_budget_bytes(self, budget_bytes: int | None) -> None:
        """The VRAM budget; None: the engine's default. Applies to the next acquisition."""
        self._submit(lambda: self._set_arbiter(budget=budget_bytes))

    @Slot(bool)
    def set_full_release(self, full: bool) -> None:
        self._submit(lambda: self._set_arbiter(full_release=bool(full)))

    @Slot(str)
    def set_flash_attn(self, mode: str) -> None:
        """Prompt attention "auto", "on" or "off"; loaded models whose kernels change go cold
        and come back with them at their next use."""
        self._submit(lambda: self._set_flash_attn(str(mode)))

    def _submit(self, job: Callable[[], None]) -> None:
        if self._closing:
            return
        if not self._started:
            self.start()
        self._jobs.put(lambda: self._guard(job))

    # -- jobs (worker thread) ---------------------------------------------------------------
    def _guard(self, job: Callable[[], None]) -> None:
        if self._closing:
            return
        try:
            job()
        except Exception as exc:          # a job never kills the worker
            log.exception("engine job failed")
            self.error.emit(f"{type(exc).__name__}: {exc}")

    def _open(self) -> None:
        try:
            self._engine = self._factory(budget_bytes=self._budget_bytes,
                                         full_release=self._full_release,
                                         flash_attn=self._flash_attn)
        except Exception as exc:
            self._open_error = f"Cannot open the GPU: {_message(exc)}"
            log.warning("%s", self._open_error)
            self.error.emit(self._open_error)
            return
        self._auto_budget = _default_budget(self._engine)
        if self._auto_budget is None and self._budget_bytes is None:
            self._auto_budget = self._engine.arbiter.budget
        self.device_name = str(self._engine.device_name)
        self.device_ready.emit(self.device_name)
        self._emit_status()

    def _need_engine(self):
        if self._engine is None:
            raise _NoEngine(self._open_error or "the engine is not open")
        return self._engine

    def _load(self, path: str, name: str | None, pin: bool) -> None:
        from engine.formats.gguf_file import ModelFileError
        from engine.residency.arbiter import BudgetError

        try:
            eng = self._need_engine()
        except _NoEngine as exc:
            self.load_failed.emit(path, str(exc))
            return
        last = [-1]

        def progress(done: int, total: int) -> None:
            pct = done * 100 // total if total else 100
            if pct != last[0]:
                last[0] = pct
                self.load_progress.emit(path, int(done), int(total))

        base = os.path.basename(path)
        try:
            name = eng.load(path, name=name, progress=progress)
        except ModelFileError as exc:
            self.load_failed.emit(path, str(exc))
            return
        except OSError as exc:
            self.load_failed.emit(path, f"{path}: {exc.strerror or exc}")
            return
        except (ValueError, BudgetError) as exc:
            self.load_failed.emit(path, f"{base}: {exc}")
            return
        except Exception as exc:
            log.exception("loading %s failed", path)
            self.load_failed.emit(path, f"{base}: {type(exc).__name__}: {exc}")
            return
        if pin:
            try:
                eng.pin(name)
            except BudgetError as exc:
                self.error.emit(str(exc))
        if self._endpoint is not None:
            n_ctx = next((s["n_ctx"] for s in eng.status() if s["name"] == name), None)
            if n_ctx is not None:
                self._endpoint.add_model(name, n_ctx)
        self.load_finished.emit(path, name)
        self._emit_status()

    def _call(self, method: str, name: str) -> None:
        from engine.residency.arbiter import BudgetError

        try:
            getattr(self._need_engine(), method)(name)
        except (BudgetError, KeyError, ValueError, _NoEngine) as exc:
            self.error.emit(_message(exc))
        else:
            if method == "unload" and self._endpoint is not None:
                self._endpoint.remove_model(name)
        self._emit_status()

    def _generate(self, name: str, prompt: str, max_tokens: int) -> None:
        from engine.text.sampling import SamplingParams

        try:
            out = self._need_engine().generate(name, prompt=prompt, max_tokens=max_tokens,
                                               sampling=SamplingParams(temperature=0.0))
        except (KeyError, ValueError, _NoEngine) as exc:
            self.error.emit(_message(exc))
            return
        self.generated.emit(name, out.text)
        self._emit_status()

    def _refresh(self) -> None:
        self._refresh_queued.clear()
        self._emit_status()

    def _emit_status(self) -> None:
        if self._engine is None or self._closing:
            return
        models = self._engine.status()
        for s in models:
            s.update(modelinfo.describe(s["path"]))
        vram = dict(self._engine.vram())
        self.models_changed.emit(models)
        self.vram_changed.emit(vram)

    def _set_arbiter(self, budget: int | None = -1, full_release: bool | None = None) -> None:
        """budget -1: unchanged; None: the engine's default."""
        if budget != -1:
            self._budget_bytes = budget
        if full_release is not None:
            self._full_release = full_release
        if self._engine is None:
            return
        arb = self._engine.arbiter
        if budget != -1:
            arb.budget = int(budget if budget is not None else self._auto_budget or arb.budget)
        if full_release is not None:
            arb.full_release = full_release
        self._emit_status()

    def _set_flash_attn(self, mode: str) -> None:
        self._flash_attn = mode
        if self._engine is not None:
            self._engine.set_flash_attn(mode)
            self._emit_status()

    def _set_endpoint(self, enabled: bool) -> None:
        if enabled and self._endpoint is None:
            try:
                eng = self._need_engine()
            except _NoEngine as exc:
                self.endpoint_changed.emit(False, str(exc))
                return
            models = [(s["name"], s["n_ctx"]) for s in eng.status()]
            ep = Endpoint(eng, models, self._port)
            try:
                url = ep.start()
            except OSError as exc:
                why = f"cannot listen on {ep.host}:{self._port}: {exc.strerror or exc}"
                self.endpoint_changed.emit(False, why)
                self.error.emit(f"Local endpoint: {why}")
                return
            self._endpoint = ep
            self.endpoint_changed.emit(True, url)
        elif not enabled and self._endpoint is not None:
            self._endpoint.stop()
            self._endpoint = None
            self.endpoint_changed.emit(False, "")
        else:
            running = self._endpoint is not None
            self.endpoint_changed.emit(running, self._endpoint.url if running else "")

    def _move_endpoint(self, port: int) -> None:
        changed = port != self._port
        self._port = port
        if changed and self._endpoint is not None:
            self._set_endpoint(False)
            self._set_endpoint(True)

    def _shutdown(self) -> None:
        if self._endpoint is not None:
            try:
                self._endpoint.stop()
            except Exception:
                log.exception("stopping the endpoint failed")
            self._endpoint = None
        if self._engine is not None:
            try:
                self._engine.close()
            except Exception:
                log.exception("closing the engine failed")
            self._engine = None


def _default_budget(engine) -> int | None:
    """The budget the engine picks by itself, to return to when the user clears theirs."""
    try:
        from engine.api import default_budget

        return default_budget(engine.dev)
    except Exception:                     # a fake engine, or no device heap to read
        return None


class _NoEngine(Exception):
    pass


def _message(exc: BaseException) -> str:
    # KeyError's str() is the repr of its argument; the others read as they are.
    if isinstance(exc, KeyError) and exc.args:
        return str(exc.args[0])
    return str(exc) or type(exc).__name__
