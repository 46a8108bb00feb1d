"""The tray menu: models with their state, the endpoint toggle, open and quit. Offscreen there
is no system tray, so the menu is tested as the object it is."""
from __future__ import annotations

import pytest
from PySide6.QtWidgets import QSystemTrayIcon

from app.tray import Tray, model_title
from tests.helpers.fake_engine import fake_status
from tests.helpers.signals import until

pytestmark = pytest.mark.filterwarnings("ignore:It is recommended to use web.AppKey")


@pytest.fixture
def tray(qtbot, bridge):
    t = Tray(bridge, use_system_tray=False)
    yield t
    t.close()


def sub_texts(tray: Tray, name: str) -> list[str]:
    return [a.text() for a in tray.model_menus[name].actions()]


def test_no_system_tray_offscreen_means_no_icon(qtbot, bridge):
    assert QSystemTrayIcon.isSystemTrayAvailable() is False
    t = Tray(bridge)                          # asks Qt: the window alone works
    assert not t.available and t.icon is None
    t.close()


def test_menu_lists_models_with_their_state(qtbot, tray, bridge):
    until(qtbot, lambda: tray.device == "Fake GPU")
    tail = ["", "Local endpoint", "Yield the GPU for 10 minutes", "", "Open Hotseat",
            "Preferences…", "", "Quit"]
    assert tray.texts() == ["Hotseat — Fake GPU", "", "No models loaded"] + tail
    bridge.models_changed.emit([fake_status("a"), fake_status("b", "cold", pinned=True)])
    until(qtbot, lambda: len(tray.model_menus) == 2)
    assert tray.texts() == ["Hotseat — Fake GPU", "", "●  a — warm",
                            "○  b — cold, pinned"] + tail
    assert sub_texts(tray, "a") == ["Pinned", "Evict", "Make warm", "Unload"]
    b = tray.model_menus["b"].actions()
    assert b[0].isChecked() and not b[1].isEnabled() and b[2].isEnabled()


def test_model_actions_reach_the_engine(qtbot, tray, bridge, models):
    bridge.load(models["a"])
    until(qtbot, lambda: "a" in tray.model_menus)
    pin, evict, warm, unload = tray.model_menus["a"].actions()
    pin.trigger()
    until(qtbot, lambda: tray.texts()[2] == "●  a — warm, pinned")
    pin, evict, warm, unload = tray.model_menus["a"].actions()
    pin.trigger()
    until(qtbot, lambda: tray.texts()[2] == "●  a — warm")
    pin, evict, warm, unload = tray.model_menus["a"].actions()
    evict.trigger()
    until(qtbot, lambda: tray.texts()[2] == "○  a — cold")
    pin, evict, warm, unload = tray.model_menus["a"].actions()
    warm.trigger()
    until(qtbot, lambda: tray.texts()[2] == "●  a — warm")
    tray.model_menus["a"].actions()[3].trigger()
    until(qtbot, lambda: "No models loaded" in tray.texts())
    assert [c[0] for c in bridge.fake.calls] == ["load", "pin", "unpin", "evict", "warm",
                                                 "unload"]


def test_endpoint_action_toggles_the_server(qtbot, make_bridge):
    bridge = make_bridge(port=0)
    tray = Tray(bridge, use_system_tray=False)
    try:
        tray.endpoint_action.trigger()
        until(qtbot, lambda: tray.endpoint_url, timeout=10000)
        assert tray.endpoint_action.isChecked()
        assert tray.endpoint_action.text() == f"Local endpoint ({tray.endpoint_url})"
        tray.endpoint_action.trigger()
        until(qtbot, lambda: not tray.endpoint_url, timeout=10000)
        assert not tray.endpoint_action.isChecked()
        assert [r for r, _ in bridge.rec.endpoint] == [True, False]
    finally:
        tray.close()


def test_open_and_quit_are_signals(qtbot, tray):
    with qtbot.waitSignal(tray.show_window_requested, timeout=1000):
        tray.open_action.trigger()
    with qtbot.waitSignal(tray.quit_requested, timeout=1000):
        tray.quit_action.trigger()


def test_refresh_with_no_change_keeps_the_menu(qtbot, tray, bridge):
    bridge.models_changed.emit([fake_status("a")])
    until(qtbot, lambda: "a" in tray.model_menus)
    sub = tray.model_menus["a"]
    bridge.models_changed.emit([fake_status("a", cached_tokens=12)])
    qtbot.wait(20)
    assert tray.model_menus["a"] is sub                 # an open menu is not torn down


def test_model_title():
    assert model_title(fake_status("x", "cold")) == "○  x — cold"


def test_icon_state_follows_busy_and_arena(qtbot, tray, bridge):
    assert tray.state == "idle"
    bridge.busy_changed.emit({"a": "generating · 4.0 tok/s"})
    until(qtbot, lambda: tray.state == "generating")
    bridge.busy_changed.emit({"a": "queued: warm"})
    until(qtbot, lambda: tray.state == "busy")
    bridge.arena_changed.emit({"state": "yielded", "until": 2e9, "holder_pid": None})
    until(qtbot, lambda: tray.state == "yielded")
    assert tray.texts()[1].startswith("Yielded to another app until ")
    bridge.arena_changed.emit({})
    bridge.busy_changed.emit({})
    until(qtbot, lambda: tray.state == "idle")
    assert not any(t.startswith("Yielded") for t in tray.texts())


def test_icon_and_menu_say_game_mode_gave_the_gpu_up(qtbot, tray, bridge):
    bridge.arena_changed.emit({"state": "cold", "holder_pid": None, "gave_up": {
        "t": 2e9, "free_bytes": 3 << 30, "need_bytes": 5 << 30, "reason": "..."}})
    until(qtbot, lambda: tray.state == "yielded")
    assert tray.texts()[1].startswith("Gave the GPU up to another app at ")
    assert "(3.0 GiB of VRAM was free)" in tray.texts()[1]
    bridge.arena_changed.emit({"state": "holder", "holder_pid": 1, "gave_up": None})
    until(qtbot, lambda: tray.state == "idle")
    assert not any(t.startswith("Gave") for t in tray.texts())


def test_state_icons_differ():
    from app.icons import state_icon

    keys = {s: state_icon(s).pixmap(32, 32).toImage() for s in
            ("idle", "generating", "busy", "yielded")}
    assert len({img.pixelColor(26, 26).name() for img in keys.values()}) == 4


def test_yield_action_calls_the_bridge(qtbot, tray, bridge, monkeypatch):
    asked = []
    monkeypatch.setattr(bridge, "yield_gpu", lambda s: asked.append(s))
    tray.yield_action.trigger()
    assert asked == [600]


def test_notify_records_without_an_icon(tray):
    tray.notify("Model loaded", "a is ready")
    assert tray.notifications == [("Model loaded", "a is ready")]


def test_preferences_action_is_a_signal(qtbot, tray):
    with qtbot.waitSignal(tray.preferences_requested, timeout=1000):
        tray.prefs_action.trigger()
