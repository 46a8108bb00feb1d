"""The bridge and the window on the real engine (lavapipe where no GPU is present), with the
embedded SmolLM2: load, warm, evict to cold, pin back to warm."""
from __future__ import annotations

import pytest

from app.bridge import EngineBridge
from app.window import MainWindow
from tests.helpers.signals import Recorder, until

pytestmark = pytest.mark.gpu
LOAD_TIMEOUT_MS = 120_000


def small_engine(**kw):
    from engine.api import Engine

    return Engine(n_ctx=256, **kw)


def test_load_evict_pin_on_the_real_engine(qtbot, smollm2_path):
    bridge = EngineBridge(engine_factory=small_engine)
    rec = Recorder(bridge)
    window = MainWindow(bridge)
    qtbot.addWidget(window)
    try:
        bridge.start()
        until(qtbot, lambda: rec.devices or rec.errors, timeout=LOAD_TIMEOUT_MS)
        assert not rec.errors, rec.errors
        window.load_paths([smollm2_path])
        until(qtbot, lambda: rec.loaded or rec.failed, timeout=LOAD_TIMEOUT_MS)
        assert not rec.failed, rec.failed
        name = rec.loaded[0][1]
        until(qtbot, lambda: rec.model(name).get("state") == "warm", timeout=LOAD_TIMEOUT_MS)
        m = rec.model(name)
        assert m["arch"] == "llama" and m["quant"] == "Q4_1" and not m["pinned"]
        assert m["device_bytes"]["weights"] > 50 << 20 and m["device_bytes"]["kv"] > 0
        total = rec.progress[-1][2]
        assert rec.progress[-1] == (smollm2_path, total, total)
        until(qtbot, lambda: name in window.rows)
        row = window.rows[name]
        until(qtbot, lambda: row.badge.text() == "WARM")

        row.evict_button.click()
        until(qtbot, lambda: rec.model(name).get("state") == "cold", timeout=LOAD_TIMEOUT_MS)
        cold = rec.model(name)
        assert cold["device_bytes"].get("weights", 0) == 0 and cold["host_shadow_bytes"] > 0
        until(qtbot, lambda: row.badge.text() == "COLD")

        row.pin_button.click()
        until(qtbot, lambda: rec.model(name).get("pinned"), timeout=LOAD_TIMEOUT_MS)
        assert rec.model(name)["state"] == "warm"
        until(qtbot, lambda: row.badge.text() == "WARM" and row.pin_button.isChecked())
        # the VRAM breakdown comes on the status lane, after the model's own update
        until(qtbot, lambda: rec.vram and rec.vram[-1]["granted_bytes"]
              >= rec.model(name)["warm_bytes"], timeout=LOAD_TIMEOUT_MS)
        assert not rec.errors, rec.errors
    finally:
        window.timer.stop()
        bridge.close()
