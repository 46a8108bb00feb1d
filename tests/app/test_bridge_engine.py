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


def test_idle_eviction_and_yield_are_the_engines(qtbot, smollm2_path, tmp_path, monkeypatch):
    """On the real engine (no arena): its idle thread evicts an unused model and the
    bridge's log says so; a yield makes the model cold and shows until when."""
    import time

    # the yield rings every process of the arena: one of this test's own, not the session's
    monkeypatch.setenv("HOTSEAT_ARENA", str(tmp_path / "arena"))
    bridge = EngineBridge(engine_factory=lambda **kw: small_engine(arena=False, **kw))
    rec = Recorder(bridge)
    lines, arena = [], []
    bridge.log_entry.connect(lines.append)
    bridge.arena_changed.connect(arena.append)
    try:
        bridge.start()
        bridge.load(smollm2_path)
        until(qtbot, lambda: rec.loaded or rec.failed, timeout=LOAD_TIMEOUT_MS)
        assert not rec.failed, rec.failed
        name = rec.loaded[0][1]
        until(qtbot, lambda: rec.model(name).get("state") == "warm", timeout=LOAD_TIMEOUT_MS)
        bridge.set_idle_evict_s(1.0)
        until(qtbot, lambda: rec.model(name).get("state") == "cold", timeout=10_000)
        until(qtbot, lambda: any(x.endswith(f"Evicted {name} after 0 min unused")
                                 for x in lines))
        bridge.set_idle_evict_s(0)
        bridge.warm(name)
        until(qtbot, lambda: rec.model(name).get("state") == "warm", timeout=LOAD_TIMEOUT_MS)
        bridge.yield_gpu(300)
        until(qtbot, lambda: rec.model(name).get("state") == "cold", timeout=LOAD_TIMEOUT_MS)
        until(qtbot, lambda: arena and arena[-1].get("state") == "yielded")
        assert 290 < arena[-1]["until"] - time.time() <= 300
        hm = time.strftime("%H:%M", time.localtime(arena[-1]["until"]))
        until(qtbot, lambda: any(x.endswith(f"Yielded the GPU until {hm}") for x in lines))
        assert not rec.errors, rec.errors
    finally:
        bridge.close()
