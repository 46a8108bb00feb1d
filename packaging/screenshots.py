"""Screenshots of the tray app on the real engine, for the README and the release page.

    xvfb-run -a python packaging/screenshots.py

Loads the embedded SmolLM2 (pinned) and, where its package is installed, Gemma 3 270M (then
evicted with weights-only release, so one row is cold and still holds its KV cache and
compute buffers), turns the local endpoint on, and saves resources/screenshots/window.png,
resources/screenshots/tray-menu.png (the tray's menu shown as a popup: a virtual X server
has no system tray) and resources/screenshots/preferences.png. Settings go to a temporary
directory; the user's own are not touched.
"""
from __future__ import annotations

import os
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
OUT = os.path.join(ROOT, "resources", "screenshots")
BUDGET_MIB = 640              # small enough that the bars read at a glance
TIMEOUT_S = 300


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> int:
    tmp = tempfile.mkdtemp(prefix="hotseat-shots-")
    os.environ["HOTSEAT_CONFIG_DIR"] = os.path.join(tmp, "config")
    os.environ["XDG_CONFIG_HOME"] = os.path.join(tmp, "xdg")

    from PySide6.QtCore import QEventLoop, QPoint, QTimer
    from PySide6.QtWidgets import QApplication

    from app import settings
    from app.collector import GarbageCollector
    from app.icons import app_icon
    from app.main import HotseatApp
    from engine.formats.bundled import gemma3_path, smollm2_path
    from tests.helpers.signals import Recorder

    app = QApplication([sys.argv[0]])
    app.setApplicationName("Hotseat")
    app.setWindowIcon(app_icon())
    app.setStyle("Fusion")
    gcol = GarbageCollector(app)
    gcol.start()

    models = [settings.ModelEntry(smollm2_path(), "smollm2-135m-instruct", pinned=True)]
    try:
        models.append(settings.ModelEntry(gemma3_path(), "gemma3-270m"))
    except Exception as exc:                          # the second model is optional
        print(f"gemma3 not available ({exc}); one model only", file=sys.stderr)
    settings.save(settings.Settings(models=models, port=free_port(), budget_mib=BUDGET_MIB,
                                    endpoint=True, watched_folder="", release_mode="weights",
                                    idle_evict_min=30))

    def small_engine(**kw):
        from engine.api import Engine
        return Engine(n_ctx=1024, **kw)

    hs = HotseatApp(engine_factory=small_engine, use_system_tray=False)
    rec = Recorder(hs.bridge)
    loop = QEventLoop()

    def wait_until(cond, what: str) -> None:
        deadline = time.monotonic() + TIMEOUT_S
        while not cond():
            if time.monotonic() > deadline:
                raise SystemExit(f"timed out waiting for {what}; errors: {rec.errors} "
                                 f"{rec.failed}")
            QTimer.singleShot(50, loop.quit)
            loop.exec()

    def pause(ms: int) -> None:
        QTimer.singleShot(ms, loop.quit)
        loop.exec()

    hs.start()
    hs.window.resize(900, 640)
    hs.window.show()
    wait_until(lambda: len(rec.loaded) + len(rec.failed) == len(models), "the models to load")
    if rec.failed:
        raise SystemExit(f"loading failed: {rec.failed}")
    if len(models) > 1:
        hs.bridge.evict(models[1].name)
        wait_until(lambda: rec.model(models[1].name).get("state") == "cold", "the eviction")
    wait_until(lambda: rec.endpoint and rec.endpoint[-1][0], "the endpoint")
    wait_until(lambda: all(n.name in hs.window.rows for n in models), "the rows")
    hs.window.statusBar().clearMessage()
    pause(1500)                                       # a refresh or two, then paint

    os.makedirs(OUT, exist_ok=True)
    window_png = os.path.join(OUT, "window.png")
    hs.window.grab().save(window_png)

    menu = hs.tray.menu
    menu.popup(QPoint(40, 40))
    pause(400)
    menu_png = os.path.join(OUT, "tray-menu.png")
    menu.grab().save(menu_png)
    menu.hide()

    prefs = hs.window.preferences
    prefs.show()
    pause(400)
    prefs_png = os.path.join(OUT, "preferences.png")
    prefs.grab().save(prefs_png)
    prefs.hide()

    hs.close()
    gcol.stop()
    for path in (window_png, menu_png, prefs_png):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
