"""`hotseat-tray`: the tray app. Wires the bridge, the window, the tray icon, the watched
folder and the saved settings together.

    hotseat-tray                      # the window, and the tray icon where a tray exists
    hotseat-tray --minimized          # only the tray icon (the autostart entry uses this)
    hotseat-tray --headless-check [--model PATH]
                                      # offscreen: open the GPU, build the UI, optionally
                                      # load PATH and generate two tokens; prints one JSON line

At start the saved models are loaded again (and re-pinned), the endpoint is started if it was
on, and the watched folder is watched. Every change of the models or the settings is saved.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import time
from typing import Callable

from PySide6.QtCore import QEventLoop, QObject, QTimer, Slot
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


class HotseatApp(QObject):
    def __init__(self, engine_factory: Callable[..., object] | None = None,
                 use_system_tray: bool | None = None, parent: QObject | None = None):
        super().__init__(parent)
        self.settings, warning = settings_mod.load()
        self.settings.autostart = autostart.is_enabled()
        s = self.settings
        self.bridge = EngineBridge(engine_factory, budget_bytes=s.budget_bytes,
                                   full_release=s.full_release, port=s.port,
                                   flash_attn=s.flash_attn)
        self.window = MainWindow(self.bridge, s)
        self.tray = Tray(self.bridge, use_system_tray=use_system_tray)
        self.window.hide_on_close = self.tray.available
        self.watcher = FolderWatcher(self)
        self._pending: dict[str, ModelEntry] = {}   # saved models not loaded back yet
        self._closed = False

        self.bridge.models_changed.connect(self.on_models_changed)
        self.bridge.load_finished.connect(self.on_load_finished)
        self.bridge.load_failed.connect(self.on_load_failed)
        self.bridge.endpoint_changed.connect(self.on_endpoint_changed)
        self.window.setting_changed.connect(self.on_setting_changed)
        self.watcher.offered.connect(self.window.on_model_offered)
        self.watcher.error.connect(self.window.on_error)
        self.tray.show_window_requested.connect(self.on_show_window)
        self.tray.quit_requested.connect(self.on_quit)
        if warning:
            self.window.show_error(warning)

    def start(self) -> None:
        self.bridge.start()
        for entry in self.settings.models:
            self._pending[entry.path] = entry
            self.window.loading.append(entry.path)
            self.bridge.load(entry.path, entry.name, entry.pinned)
        if self.settings.endpoint:
            self.bridge.set_endpoint(True)
        if self.settings.watched_folder:
            self.watcher.set_folder(self.settings.watched_folder)

    def save(self) -> None:
        try:
            settings_mod.save(self.settings)
        except OSError as exc:
            self.window.show_error(f"Settings could not be saved: {exc}")

    # -- what the engine reports --------------------------------------------------------------
    @Slot(list)
    def on_models_changed(self, models: list) -> None:
        if self._closed:
            return
        entries = [ModelEntry(m["path"], m["name"], bool(m["pinned"])) for m in models]
        loaded = {m["path"] for m in models}
        entries += [e for p, e in self._pending.items() if p not in loaded]
        if entries != self.settings.models:
            self.settings.models = entries
            self.save()

    @Slot(str, str)
    def on_load_finished(self, path: str, _name: str) -> None:
        self._pending.pop(path, None)

    @Slot(str, str)
    def on_load_failed(self, path: str, message: str) -> None:
        if self._pending.pop(path, None) is not None:
            self.settings.models = [e for e in self.settings.models if e.path != path]
            self.save()
            self.window.show_error(f"Could not load the saved model {os.path.basename(path)} "
                                   f"again: {message}")

    @Slot(bool, str)
    def on_endpoint_changed(self, running: bool, _detail: str) -> None:
        if not self._closed and running != self.settings.endpoint:
            self.settings.endpoint = running
            self.save()

    # -- what the user does -------------------------------------------------------------------
    @Slot(str, object)
    def on_setting_changed(self, key: str, value) -> None:
        setattr(self.settings, key, value)
        if key == "port":
            self.bridge.set_port(int(value))
        elif key == "budget_mib":
            self.bridge.set_budget_bytes(self.settings.budget_bytes)
        elif key == "release_mode":
            self.bridge.set_full_release(self.settings.full_release)
        elif key == "flash_attn":
            self.bridge.set_flash_attn(value)
        elif key == "watched_folder":
            self.watcher.set_folder(value)
        elif key == "autostart":
            try:
                autostart.set_enabled(bool(value))
            except OSError as exc:
                self.window.show_error(f"Start at login: {exc}")
        self.save()

    @Slot()
    def on_show_window(self) -> None:
        self.window.show()
        self.window.raise_()
        self.window.activateWindow()

    @Slot()
    def on_quit(self) -> None:
        QApplication.quit()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.window.timer.stop()
        self.watcher.stop()
        self.bridge.close()
        self.tray.close()


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
        return headless_check(args.model, args.timeout)
    app = QApplication.instance() or QApplication([sys.argv[0], *qt_args])
    app.setApplicationName("Hotseat")
    app.setDesktopFileName("hotseat")
    app.setWindowIcon(app_icon())
    collector = GarbageCollector(app)
    collector.start()
    hs = HotseatApp()
    app.setQuitOnLastWindowClosed(not hs.tray.available)
    app.aboutToQuit.connect(hs.close)
    # Ctrl+C and a logout's SIGTERM end the event loop, so close() runs in order; Python
    # sees the signal when the collector's timer next runs Python code
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: QApplication.quit())
    hs.start()
    if not (args.minimized and hs.tray.available):
        hs.window.show()
    return app.exec()


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
        report["error"] = events["error"][0]
    if "load_failed" in events:
        report["error"] = events["load_failed"][1]
    report["tray_menu"] = [t for t in tray.texts() if t]
    report["ok"] = bool(ok and report["icon"] and report["spv_modules"])
    window.timer.stop()
    bridge.close()
    tray.close()
    collector.stop()
    print(json.dumps(report), flush=True)
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
