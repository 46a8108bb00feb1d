"""Start-up with two saved models on the real engine (lavapipe here) and the bundled
SmolLM2: the window answers within 1 s, the endpoint opens before the loads are done, both
rows are ready within the time of their loads, and no multi-second header parse runs
(the quantization comes from the engine's status)."""
from __future__ import annotations

import re
import time

import pytest
from PySide6.QtCore import QTimer

from app import modelinfo, settings
from tests.helpers.signals import Recorder, until

pytestmark = [pytest.mark.gpu,
              pytest.mark.filterwarnings("ignore:It is recommended to use web.AppKey")]
LOAD_TIMEOUT_MS = 180_000
OVERHEAD_S = 2.0              # the app's share on top of the loads (a shared 2-core machine)
ENDPOINT_S = 3.0              # the server's own start, imports included (a shared machine)


def small_engine(**kw):
    from engine.api import Engine

    return Engine(n_ctx=256, **kw)


@pytest.mark.qt_log_ignore("propagateSizeHints")
def test_start_with_two_saved_models(qtbot, smollm2_path, monkeypatch):
    from app.main import HotseatApp

    settings.save(settings.Settings(
        models=[settings.ModelEntry(smollm2_path, "a"),
                settings.ModelEntry(smollm2_path, "b", pinned=True)],
        port=0, endpoint=True))
    parse_s: list[float] = []
    describe = modelinfo.describe

    def timed(*a, **kw):
        t = time.monotonic()
        try:
            return describe(*a, **kw)
        finally:
            parse_s.append(time.monotonic() - t)
    monkeypatch.setattr(modelinfo, "describe", timed)

    ticks: list[float] = []
    timer = QTimer()
    timer.setInterval(20)
    timer.timeout.connect(lambda: ticks.append(time.monotonic()))

    t0 = time.monotonic()
    hs = HotseatApp(engine_factory=small_engine, use_system_tray=False)
    qtbot.addWidget(hs.window)
    rec = Recorder(hs.bridge)
    logs: list[str] = []
    loaded_at: list[float] = []          # since t0, each "Loaded" line's arrival
    hs.bridge.log_entry.connect(logs.append)
    hs.bridge.log_entry.connect(
        lambda x: loaded_at.append(time.monotonic() - t0) if re.search(r"Loaded \w+ in", x)
        else None)
    try:
        hs.start()
        hs.window.show()
        timer.start()
        until(qtbot, lambda: ticks, timeout=5000)
        interactive = ticks[0] - t0
        assert interactive < 1.0, interactive
        assert set(hs.window.pending) == {smollm2_path}        # one path, both on their way

        until(qtbot, lambda: rec.endpoint, timeout=LOAD_TIMEOUT_MS)
        endpoint_at = time.monotonic() - t0
        until(qtbot, lambda: set(hs.window.rows) == {"a", "b"} or rec.failed,
              timeout=LOAD_TIMEOUT_MS)
        assert not rec.failed, rec.failed
        ready = time.monotonic() - t0
        timer.stop()
        loads = [float(m.group(1)) for m in (re.search(r"Loaded \w+ in ([\d.]+) s", x)
                                             for x in logs) if m]
        assert len(loads) == 2
        # the endpoint does not wait for the loads: it opens before the first is done, or,
        # where loads are quicker than the server's start (warm caches), within a bound
        assert rec.endpoint[0][0] is True
        assert endpoint_at < max(loaded_at[0], ENDPOINT_S), (endpoint_at, loaded_at, loads)
        assert ready <= sum(loads) + OVERHEAD_S, (ready, loads)
        assert not hs.window.pending
        assert hs.window.rows["a"].status["quant"] == "Q4_1"
        assert max(parse_s) < 0.25, max(parse_s)              # no whole-header parse
        gaps = [b - a for a, b in zip(ticks, ticks[1:])]
        assert max(gaps) < 1.0, max(gaps)                     # the UI never stalled
        print(f"interactive {interactive:.2f} s, endpoint {endpoint_at:.2f} s, rows "
              f"{ready:.2f} s for loads of {loads} s, longest UI gap {max(gaps):.2f} s, "
              f"longest describe {max(parse_s) * 1000:.1f} ms")
        until(qtbot, lambda: rec.model("b").get("pinned"), timeout=LOAD_TIMEOUT_MS)
    finally:
        timer.stop()
        hs.close()
