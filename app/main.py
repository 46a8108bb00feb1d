"""`hotseat-tray`: the tray app. Wires the bridge, the window, the tray icon, the watched
folder and the saved settings together.

    hotseat-tray                      # the window, and the tray icon where a tray exists
    hotseat-tray --minimized          # only the tray icon (the autostart entry uses this)
    hotseat-tray --headless-check [--model PATH]
                                      # offscreen: open the GPU, build the UI, optionally
                                      # load PATH and generate two tokens; prints one JSON line

At start the saved models are loaded again (and re-pinned), the endpoint is started if it was
on, and the watched folder is watched. Every change of the models or the settings is saved.

Quitting (the tray's Quit, SIGTERM, SIGINT, SIGHUP, the session ending) runs one teardown
in order: settings saved, the endpoint stopped, the engine closed on its thread, the Qt
objects hidden; then the process ends, within 2 s even with the window open.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import socket
import sys
import time
from typing import Callable

from PySide6.QtCore import QByteArray, QEventLoop, QObject, QSocketNotifier, QTimer, Slot
from PySide6.QtWidgets import QApplication

from . import autostart
from . import settings as settings_mod
from .bridge import EngineBridge
from .collector import GarbageCollector
from .icons import app_icon, resources_dir
from .settings import ModelEntry
from .tray import Tray
from .watch import FolderWatcher
from .window import MainWindow

log = logging.getLogger("hotseat.app")


QUIT_DEADLINE_S = 1.5          # of the 2 s a quit may take: the rest is Qt and the exit
HOOK_ENV = "HOTSEAT_TEST_HOOK"


class HotseatApp(QObject):
    def __init__(self, engine_factory: Callable[..., object] | None = None,
                 use_system_tray: bool | None = None, parent: QObject | None = None):
        super().__init__(parent)
        self.settings, warning = settings_mod.load()
        self.settings.autostart = autostart.is_enabled()
        s = self.settings
        self.bridge = EngineBridge(engine_factory, budget_bytes=s.budget_bytes,
                                   full_release=s.full_release, port=s.port,
                                   flash_attn=s.flash_attn, host=s.host, api_key=s.api_key,
                                   host_budget_bytes=s.host_budget_bytes)
        self.bridge.set_idle_evict_s(s.idle_evict_min * 60)
        self.window = MainWindow(self.bridge, s)
        self.tray = Tray(self.bridge, use_system_tray=use_system_tray)
        self.window.hide_on_close = self.tray.available
        if s.window_geometry:
            self.window.restoreGeometry(QByteArray.fromBase64(s.window_geometry.encode()))
        self.watcher = FolderWatcher(self)
        self._pending: dict[str, ModelEntry] = {}   # saved models not loaded back yet
        # per path: the context size the user chose (0: the engine's default)
        self._n_ctx: dict[str, int] = {e.path: e.n_ctx for e in s.models if e.n_ctx}
        self._closed = False

        self.bridge.models_changed.connect(self.on_models_changed)
        self.bridge.load_finished.connect(self.on_load_finished)
        self.bridge.load_failed.connect(self.on_load_failed)
        self.bridge.endpoint_changed.connect(self.on_endpoint_changed)
        self.bridge.error.connect(self.on_engine_error)
        self.window.setting_changed.connect(self.on_setting_changed)
        self.window.model_options_changed.connect(self.on_model_options_changed)
        self.watcher.offered.connect(self.window.on_model_offered)
        self.watcher.error.connect(self.window.show_error)
        self.tray.show_window_requested.connect(self.on_show_window)
        self.tray.preferences_requested.connect(self.on_show_preferences)
        self.tray.quit_requested.connect(self.on_quit)
        if warning:
            self.window.show_error(warning)

    def start(self) -> None:
        self.bridge.start()
        for entry in self.settings.models:
            self._pending[entry.path] = entry
            self.window.add_pending(entry.path)        # a progress row from the start
            self.bridge.load(entry.path, entry.name, entry.pinned, entry.n_ctx or None,
                             entry.cpu_moe)
        if self.settings.endpoint:
            self.bridge.set_endpoint(True)
        if self.settings.watched_folder:
            self.watcher.set_folder(self.settings.watched_folder)

    def save(self) -> None:
        try:
            settings_mod.save(self.settings)
        except OSError as exc:
            self.window.show_error(f"Settings could not be saved: {exc}")

    def _notify(self, title: str, text: str) -> None:
        """Tell the user through the tray while the window is hidden."""
        if self.settings.notifications and not self.window.isVisible() and not self._closed:
            self.tray.notify(title, text)

    # -- what the engine reports --------------------------------------------------------------
    @Slot(list)
    def on_models_changed(self, models: list) -> None:
        if self._closed:
            return
        entries = [ModelEntry(m["path"], m["name"], bool(m["pinned"]),
                              self._n_ctx.get(m["path"], 0), float(m.get("cpu_moe") or 0.0))
                   for m in models]
        loaded = {m["path"] for m in models}
        entries += [e for p, e in self._pending.items() if p not in loaded]
        if entries != self.settings.models:
            self.settings.models = entries
            self.save()

    @Slot(str, str)
    def on_load_finished(self, path: str, name: str) -> None:
        self._pending.pop(path, None)
        self._notify("Model loaded", f"{name} is ready")

    @Slot(str, str, str)
    def on_load_failed(self, path: str, summary: str, details: str) -> None:
        self._notify("Could not load a model", f"{os.path.basename(path)}: {summary}")
        if self._pending.pop(path, None) is not None:
            self.settings.models = [e for e in self.settings.models if e.path != path]
            self.save()
            self.window.show_error(f"Could not load the saved model {os.path.basename(path)} "
                                   f"again: {summary}", details)

    @Slot(str, str)
    def on_engine_error(self, summary: str, _details: str) -> None:
        self._notify("Hotseat", summary)

    @Slot(bool, str)
    def on_endpoint_changed(self, running: bool, _detail: str) -> None:
        if not self._closed and running != self.settings.endpoint:
            self.settings.endpoint = running
            self.save()

    # -- what the user does -------------------------------------------------------------------
    @Slot(str, object)
    def on_setting_changed(self, key: str, value) -> None:
        setattr(self.settings, key, value)
        s = self.settings
        if key == "port":
            self.bridge.set_port(int(value))
        elif key == "budget_mib":
            self.bridge.set_budget_bytes(s.budget_bytes)
        elif key == "host_budget_mib":
            self.bridge.set_host_budget_bytes(s.host_budget_bytes)
        elif key == "release_mode":
            self.bridge.set_full_release(s.full_release)
        elif key == "flash_attn":
            self.bridge.set_flash_attn(value)
        elif key == "idle_evict_min":
            self.bridge.set_idle_evict_s(int(value) * 60)
        elif key in ("api_key", "lan", "lan_without_key"):
            self.bridge.set_access(s.host, s.api_key)
            if s.lan and s.host != "0.0.0.0":
                self.window.show_info("The endpoint stays on this computer until an API key "
                                      "is set (or serving without one is allowed).")
        elif key == "watched_folder":
            self.watcher.set_folder(value)
        elif key == "autostart":
            try:
                autostart.set_enabled(bool(value))
            except OSError as exc:
                self.window.show_error(f"Start at login: {exc}")
        self.save()

    @Slot(str, int, float)
    def on_model_options_changed(self, name: str, n_ctx: int, _cpu_moe: float) -> None:
        path = self.window.rows[name].status["path"] if name in self.window.rows else ""
        if path:
            self._n_ctx[path] = n_ctx

    @Slot()
    def on_show_window(self) -> None:
        self.window.show()
        self.window.raise_()
        self.window.activateWindow()

    @Slot()
    def on_show_preferences(self) -> None:
        self.on_show_window()
        self.window.on_preferences_clicked()

    @Slot()
    def on_quit(self) -> None:
        """Quit from the tray menu, a signal (SIGTERM, SIGINT, SIGHUP) or the session: the
        teardown first (the window's hide-on-close is bypassed), then the event loop ends."""
        self.shutdown()
        QApplication.exit(0)

    @Slot()
    def on_commit_data(self, *_args) -> None:
        """The session is ending (logout): save now, whatever comes next."""
        self._save_geometry()
        self.save()

    def _save_geometry(self) -> None:
        self.settings.window_geometry = bytes(self.window.saveGeometry().toBase64()).decode()

    def shutdown(self, deadline_s: float = QUIT_DEADLINE_S) -> None:
        """In order: stop the timers and the folder watcher, save the settings (window
        geometry included), stop the endpoint (the port closes) and close the engine on its
        thread within deadline_s, then hide the tray icon and the window."""
        if self._closed:
            return
        self._closed = True
        self.window.quitting = True
        self.window.timer.stop()
        self.watcher.stop()
        self._save_geometry()
        self.save()
        self.bridge.shutdown(deadline_s)
        self.tray.close()
        self.window.preferences.hide()
        self.window.about.hide()
        self.window.hide()

    def close(self) -> None:
        self.shutdown(30.0)


class _SignalWaker(QObject):
    """Unix signals as a Qt event: the C handler writes the signal's number to a socket
    that a QSocketNotifier watches, so a SIGTERM is acted on at once, on the UI thread,
    however long the event loop sleeps."""

    def __init__(self, handlers: dict[int, Callable[[], None]], parent: QObject | None = None):
        super().__init__(parent)
        self.handlers = handlers
        self._r, self._w = socket.socketpair()
        for sock in (self._r, self._w):
            sock.setblocking(False)
        signal.set_wakeup_fd(self._w.fileno(), warn_on_full_buffer=False)
        for sig in handlers:
            signal.signal(sig, lambda *_: None)     # the wakeup fd does the work
        self.notifier = QSocketNotifier(self._r.fileno(), QSocketNotifier.Type.Read, self)
        self.notifier.activated.connect(self.on_activated)

    @Slot()
    def on_activated(self, *_args) -> None:
        try:
            data = self._r.recv(64)
        except OSError:
            return
        for signum in data:
            handler = self.handlers.get(signum)
            if handler is not None:
                handler()


class _TestHook(QObject):
    """For the real-process tests ($HOTSEAT_TEST_HOOK=DIR): writes DIR/state.json (pid, tray
    icon, window, endpoint URL) as they change, and SIGUSR1 triggers the tray menu's Quit
    action, the same QAction a click on the menu triggers."""

    def __init__(self, hs: "HotseatApp", folder: str, parent: QObject | None = None):
        super().__init__(parent)
        self.hs, self.folder = hs, folder
        self.url = ""
        hs.bridge.endpoint_changed.connect(self.on_endpoint_changed)
        hs.bridge.models_changed.connect(self.on_models_changed)
        self.models: list[str] = []

    @Slot(bool, str)
    def on_endpoint_changed(self, running: bool, detail: str) -> None:
        self.url = detail if running else ""
        self.write()

    @Slot(list)
    def on_models_changed(self, models: list) -> None:
        names = [m["name"] for m in models]
        if names != self.models:
            self.models = names
            self.write()

    def trigger_quit(self) -> None:
        self.hs.tray.quit_action.trigger()

    def write(self) -> None:
        hs = self.hs
        state = {"pid": os.getpid(), "tray": hs.tray.available,
                 "tray_visible": bool(hs.tray.icon and hs.tray.icon.isVisible()),
                 "window": hs.window.isVisible(), "endpoint": self.url, "models": self.models}
        tmp = os.path.join(self.folder, "state.json.tmp")
        with open(tmp, "w") as f:
            json.dump(state, f)
        os.replace(tmp, os.path.join(self.folder, "state.json"))


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="hotseat-tray",
                                description="Hotseat: several local LLMs sharing one GPU")
    p.add_argument("--minimized", action="store_true",
                   help="start with only the tray icon (where a system tray exists)")
    p.add_argument("--headless-check", action="store_true",
                   help="open the GPU and build the UI offscreen, print a JSON line, exit")
    p.add_argument("--model", help="with --headless-check: also load this GGUF file and "
                                   "generate two tokens")
    p.add_argument("--timeout", type=float, default=120.0,
                   help="with --headless-check: seconds to wait (default 120)")
    p.add_argument("--no-arena", action="store_true",
                   help="do not take turns on the GPU with other Hotseat processes")
    return p


def main(argv: list[str] | None = None) -> int:
    args, qt_args = _parser().parse_known_args(argv)
    logging.basicConfig(level=logging.WARNING, format="hotseat: %(levelname)s: %(message)s")
    if args.no_arena:
        from engine.args import NO_ARENA_ENV
        os.environ[NO_ARENA_ENV] = "1"          # read where the bridge creates the engine
    if args.headless_check:
        return _exit(headless_check(args.model, args.timeout))
    app = QApplication.instance() or QApplication([sys.argv[0], *qt_args])
    app.setApplicationName("Hotseat")
    app.setDesktopFileName("hotseat")
    app.setWindowIcon(app_icon())
    collector = GarbageCollector(app)
    collector.start()
    hs = HotseatApp()
    app.setQuitOnLastWindowClosed(not hs.tray.available)
    app.aboutToQuit.connect(hs.shutdown)        # any other way out runs the same teardown
    app.commitDataRequest.connect(hs.on_commit_data)
    handlers = {signal.SIGINT: hs.on_quit, signal.SIGTERM: hs.on_quit,
                signal.SIGHUP: hs.on_quit}
    hook_dir = os.environ.get(HOOK_ENV)
    hook = _TestHook(hs, hook_dir, app) if hook_dir else None
    if hook is not None:
        handlers[signal.SIGUSR1] = hook.trigger_quit
    waker = _SignalWaker(handlers, app)
    hs.start()
    if not (args.minimized and hs.tray.available):
        hs.window.show()
    if hook is not None:
        QTimer.singleShot(0, hook.write)
    rc = app.exec()
    hs.shutdown()
    del waker
    return _exit(rc)


def _exit(rc: int) -> int:
    """End the process once the teardown is done: interpreter finalization would destroy
    the Qt wrappers, the Vulkan binding's handles and the lanes' threads in no defined
    order (an exit crashed with "none_dealloc" in the collector that way), and it has
    nothing left to do: the settings are saved, the port closed, the engine closed."""
    sys.stdout.flush()
    sys.stderr.flush()
    logging.shutdown()
    os._exit(rc)


def headless_check(model: str | None = None, timeout_s: float = 120.0) -> int:
    """What a bundle needs in order to run: Qt's platform plugin, the icon, the SPIR-V
    modules, the Vulkan device and (with model) a load and a short generation, all through
    the bridge and the window as the app uses them."""
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    app = QApplication.instance() or QApplication([sys.argv[0]])
    collector = GarbageCollector(app)
    collector.start()
    report: dict = {"ok": False, "platform": app.platformName(),
                    "resources": os.path.isdir(resources_dir()),
                    "icon": not app_icon().isNull()}
    try:
        import shaders
        spv = os.path.join(os.path.dirname(os.path.abspath(shaders.__file__)), "spv")
        report["spv_modules"] = len([f for f in os.listdir(spv) if f.endswith(".spv")])
    except (ImportError, OSError):
        report["spv_modules"] = 0
    bridge = EngineBridge()
    window = MainWindow(bridge)
    tray = Tray(bridge, use_system_tray=False)
    events: dict = {}
    loop = QEventLoop()

    def done(key: str) -> Callable:
        def record(*a) -> None:
            events[key] = a
            loop.quit()
        return record

    for sig, key in ((bridge.device_ready, "device"), (bridge.error, "error"),
                     (bridge.load_finished, "loaded"), (bridge.load_failed, "load_failed"),
                     (bridge.generated, "generated")):
        sig.connect(done(key))

    def wait(*keys: str) -> bool:
        deadline = time.monotonic() + timeout_s
        while not any(k in events for k in keys) and time.monotonic() < deadline:
            QTimer.singleShot(int(max(1, (deadline - time.monotonic()) * 1000)), loop.quit)
            loop.exec()
        return any(k in events for k in keys)

    bridge.start()
    ok = wait("device", "error") and "device" in events
    report["device"] = events["device"][0] if "device" in events else None
    if ok and model:
        bridge.load(model)
        ok = wait("loaded", "load_failed") and "loaded" in events
        if ok:
            name = events["loaded"][1]
            bridge.generate(name, "The capital of France is", 2)
            ok = wait("generated", "error") and "generated" in events
            report["generated"] = events["generated"][1] if ok else None
        report["model_rows"] = len(window.rows) if ok else 0
    if "error" in events:
        report["error"] = events["error"][1] or events["error"][0]     # the engine's text
    if "load_failed" in events:
        report["error"] = events["load_failed"][2]
    report["tray_menu"] = [t for t in tray.texts() if t]
    report["ok"] = bool(ok and report["icon"] and report["spv_modules"])
    window.timer.stop()
    bridge.shutdown(30.0)
    tray.close()
    print(json.dumps(report), flush=True)
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
