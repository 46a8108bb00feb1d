"""Fixtures for the tray app's tests: offscreen Qt, a config dir per test, a bridge on the
fake engine, and small GGUF files."""
from __future__ import annotations

import os

# before anything imports Qt: no display is needed, and none is touched
os.environ["QT_QPA_PLATFORM"] = "offscreen"

import gc  # noqa: E402

import pytest  # noqa: E402

from tests.helpers.fake_engine import FakeEngine, write_gguf  # noqa: E402


@pytest.fixture(scope="session")
def _frozen_heap():
    """What is alive before the first test (modules, numpy, Qt) is never garbage; freezing
    it keeps the collections after each test short."""
    gc.collect()
    gc.freeze()
    yield
    gc.unfreeze()


@pytest.fixture(autouse=True)
def collect_on_the_ui_thread(_frozen_heap):
    """As app.collector does in the app: no automatic collection, which could run on a
    worker thread and delete a widget there; one collection on this thread after each test
    instead."""
    gc.disable()
    yield
    gc.collect()
    gc.enable()


@pytest.fixture(autouse=True)
def config_dir(tmp_path, monkeypatch):
    """Settings and the autostart entry go under tmp_path, never the user's own dirs."""
    d = tmp_path / "config"
    monkeypatch.setenv("HOTSEAT_CONFIG_DIR", str(d))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    return d


@pytest.fixture
def models(tmp_path):
    """a.gguf and b.gguf (real, tiny), bad.gguf (the fake's rejected name), text.gguf (not
    GGUF at all)."""
    d = tmp_path / "models"
    d.mkdir()
    out = {"a": write_gguf(d / "a.gguf"), "b": write_gguf(d / "b.gguf", file_type=None,
                                                           tensor_type="Q4_0"),
           "bad": write_gguf(d / "bad.gguf")}
    text = d / "text.gguf"
    text.write_text("this is not a model\n")
    out["text"] = str(text)
    return out


@pytest.fixture
def make_bridge(qtbot):
    """make_bridge(**EngineBridge kwargs) -> a started bridge on a FakeEngine; the engine is
    bridge.fake, a Recorder of its signals bridge.rec. Closed at the end of the test."""
    from app.bridge import EngineBridge
    from tests.helpers.signals import Recorder, until

    made = []

    def make(load_delay_s: float = 0.0, **kw):
        engines = []

        def factory(**ekw):
            e = FakeEngine(load_delay_s=load_delay_s, **ekw)
            engines.append(e)
            return e

        b = EngineBridge(engine_factory=factory, **kw)
        made.append(b)
        b.rec = Recorder(b)
        b.start()
        # the first status after the device opens: nothing from start-up is still queued
        until(qtbot, lambda: b.rec.devices and b.rec.vram, timeout=5000)
        b.fake = engines[0]
        return b

    yield make
    for b in made:
        b.close()


@pytest.fixture
def bridge(make_bridge):
    return make_bridge()

