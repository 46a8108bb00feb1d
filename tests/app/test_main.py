"""The whole app on the fake engine: settings saved as the models change, restored at the
next start (models loaded again, pins set again), and a corrupt file that only warns."""
from __future__ import annotations

import json
import os

import pytest

from app import settings
from app.main import HotseatApp
from tests.helpers.fake_engine import FakeEngine
from tests.helpers.signals import Recorder, until

pytestmark = pytest.mark.filterwarnings("ignore:It is recommended to use web.AppKey")


class Factory:
    def __init__(self):
        self.engines: list[FakeEngine] = []

    def __call__(self, **kw) -> FakeEngine:
        self.engines.append(FakeEngine(**kw))
        return self.engines[-1]


@pytest.fixture
def start_app(qtbot):
    apps = []

    def start(right_after_start=None) -> tuple[HotseatApp, FakeEngine]:
        factory = Factory()
        hs = HotseatApp(engine_factory=factory, use_system_tray=False)
        qtbot.addWidget(hs.window)
        hs.rec = Recorder(hs.bridge)
        apps.append(hs)
        hs.start()
        if right_after_start is not None:
            right_after_start(hs)
        until(qtbot, lambda: factory.engines)
        return hs, factory.engines[0]

    yield start
    for hs in apps:
        hs.close()


def saved() -> dict:
    with open(settings.settings_path()) as f:
        return json.load(f)


def test_models_and_pins_are_saved_and_restored(qtbot, start_app, models):
    hs, eng = start_app()
    hs.window.load_paths([models["a"], models["b"]])
    until(qtbot, lambda: set(hs.window.rows) == {"a", "b"})
    hs.window.rows["b"].pin_button.click()
    until(qtbot, lambda: any(m["pinned"] for m in saved()["models"]))
    assert saved()["models"] == [
        {"path": models["a"], "name": "a", "pinned": False, "n_ctx": 0, "cpu_moe": 0.0},
        {"path": models["b"], "name": "b", "pinned": True, "n_ctx": 0, "cpu_moe": 0.0}]
    hs.close()

    hs2, eng2 = start_app()
    until(qtbot, lambda: set(hs2.window.rows) == {"a", "b"})
    until(qtbot, lambda: hs2.rec.model("b").get("pinned"))
    assert [c for c in eng2.calls if c[0] in ("load", "pin")] == \
        [("load", models["a"]), ("load", models["b"]), ("pin", "b")]
    assert not hs2.rec.model("a")["pinned"]
    until(qtbot, lambda: not hs2.window.pending)


def test_unload_is_saved(qtbot, start_app, models):
    hs, eng = start_app()
    hs.window.load_paths([models["a"]])
    until(qtbot, lambda: saved()["models"] if os.path.exists(settings.settings_path())
          else None)
    hs.window.rows["a"].unload_button.click()
    until(qtbot, lambda: saved()["models"] == [])


def test_settings_edits_are_saved_and_applied(qtbot, start_app, tmp_path):
    hs, eng = start_app()
    w = hs.window.preferences
    w.budget_spin.setValue(512)
    w.budget_spin.editingFinished.emit()
    until(qtbot, lambda: eng.budget == 512 << 20)
    w.host_budget_spin.setValue(768)
    w.host_budget_spin.editingFinished.emit()
    until(qtbot, lambda: eng.host_budget == 768 << 20)
    w.release_combo.setCurrentIndex(w.release_combo.findData("weights"))
    until(qtbot, lambda: eng.full_release is False)
    w.flash_combo.setCurrentIndex(w.flash_combo.findData("on"))
    until(qtbot, lambda: eng.flash_attn == "on")
    w.port_spin.setValue(9123)
    w.port_spin.editingFinished.emit()
    w.folder_edit.setText(str(tmp_path))
    w.folder_edit.editingFinished.emit()
    assert hs.watcher.folder == str(tmp_path)
    w.autostart_check.setChecked(True)
    assert os.path.exists(tmp_path / "xdg" / "autostart" / "hotseat.desktop")
    s = saved()
    assert (s["budget_mib"], s["release_mode"], s["port"], s["watched_folder"],
            s["autostart"], s["flash_attn"]) == (512, "weights", 9123, str(tmp_path), True, "on")
    assert s["host_budget_mib"] == 768
    hs.close()

    hs2, eng2 = start_app()                                    # restored into engine and UI
    assert eng2.budget == 512 << 20 and eng2.full_release is False
    assert eng2.host_budget == 768 << 20
    p2 = hs2.window.preferences
    assert p2.host_budget_spin.value() == 768
    assert eng2.flash_attn == "on" and p2.flash_combo.currentData() == "on"
    assert hs2.bridge.port == 9123 and p2.port_spin.value() == 9123
    assert p2.autostart_check.isChecked() and hs2.watcher.folder == str(tmp_path)
    p2.autostart_check.setChecked(False)
    assert not os.path.exists(tmp_path / "xdg" / "autostart" / "hotseat.desktop")


def test_endpoint_state_is_restored(qtbot, start_app):
    settings.save(settings.Settings(port=0, endpoint=True))
    hs, eng = start_app()
    until(qtbot, lambda: hs.rec.endpoint, timeout=10000)
    assert hs.rec.endpoint[-1][0] is True
    until(qtbot, lambda: hs.tray.endpoint_action.isChecked())
    hs.window.endpoint_toggle.setChecked(False)
    until(qtbot, lambda: saved()["endpoint"] is False, timeout=10000)


def test_corrupt_settings_start_with_defaults_and_a_warning(qtbot, start_app, config_dir):
    os.makedirs(config_dir)
    with open(settings.settings_path(), "w") as f:
        f.write('{"models": [{"path": ')
    hs, eng = start_app()
    assert hs.settings.models == [] and hs.settings.port == 8080
    assert not hs.window.message.isHidden()
    assert "corrupt" in hs.window.message.text()
    assert os.path.exists(settings.settings_path() + ".bad")


def test_a_saved_model_that_is_gone_is_dropped_with_a_message(qtbot, start_app, models,
                                                              tmp_path):
    gone = str(tmp_path / "gone.gguf")
    settings.save(settings.Settings(models=[settings.ModelEntry(gone, "gone"),
                                            settings.ModelEntry(models["a"], "a")]))
    hs, eng = start_app()
    until(qtbot, lambda: "a" in hs.window.rows)
    until(qtbot, lambda: "gone.gguf" in hs.window.message.text())
    until(qtbot, lambda: [m["name"] for m in saved()["models"]] == ["a"])


# the offscreen platform's own complaints when a window is shown and raised
@pytest.mark.qt_log_ignore("propagateSizeHints", r"support raise\(\)")
def test_tray_open_shows_the_window(qtbot, start_app):
    hs, eng = start_app()
    assert hs.window.isHidden() and not hs.tray.available
    hs.tray.open_action.trigger()
    until(qtbot, lambda: hs.window.isVisible())



@pytest.mark.qt_log_ignore("propagateSizeHints", r"support raise\(\)")
def test_quit_with_the_window_open_bypasses_hide_on_close(qtbot, start_app, monkeypatch):
    from PySide6.QtWidgets import QApplication

    hs, eng = start_app()
    hs.window.hide_on_close = True                  # as with a tray icon
    hs.window.show()
    qtbot.waitExposed(hs.window)
    hs.window.close()                               # the window's close button: hides
    assert hs.window.isHidden() and not hs.bridge.closing
    hs.window.show()
    exits = []
    monkeypatch.setattr(QApplication, "exit", staticmethod(lambda rc=0: exits.append(rc)))
    hs.tray.quit_action.trigger()                   # the menu's Quit
    assert exits == [0]
    assert hs.bridge.closing and eng.closed and hs.window.isHidden()
    assert saved()["window_geometry"]               # saved on the way out


@pytest.mark.qt_log_ignore("propagateSizeHints")
def test_window_geometry_is_restored(qtbot, start_app):
    hs, eng = start_app()
    hs.window.resize(731, 517)
    hs.window.show()
    qtbot.waitExposed(hs.window)
    hs.close()
    hs2, _ = start_app()
    assert (hs2.window.width(), hs2.window.height()) == (731, 517)


def test_notifications_only_while_hidden(qtbot, start_app, models):
    hs, eng = start_app()
    assert hs.window.isHidden()
    hs.window.load_paths([models["a"]])
    until(qtbot, lambda: hs.tray.notifications)
    assert hs.tray.notifications == [("Model loaded", "a is ready")]
    hs.window.load_paths([models["text"]])
    until(qtbot, lambda: len(hs.tray.notifications) == 2)
    assert hs.tray.notifications[1] == ("Could not load a model",
                                        "text.gguf: This is not a GGUF model file")


def test_lan_and_key_settings_reach_the_bridge(qtbot, start_app, monkeypatch):
    hs, eng = start_app()
    calls = []
    monkeypatch.setattr(hs.bridge, "set_access", lambda host, key: calls.append((host, key)))
    p = hs.window.preferences
    p.lan_check.setChecked(True)
    assert calls[-1] == ("127.0.0.1", "")           # no key: not on the network yet
    assert "stays on this computer" in hs.window.message.text()
    p.key_edit.setText("k1")
    p.key_edit.editingFinished.emit()
    assert calls[-1] == ("0.0.0.0", "k1")
    assert saved()["lan"] is True and saved()["api_key"] == "k1"


def test_model_options_are_saved_and_used_at_the_next_start(qtbot, start_app, models):
    hs, eng = start_app()
    hs.window.load_paths([models["a"]])
    until(qtbot, lambda: "a" in hs.window.rows)
    hs.window.on_options_chosen("a", 512, 0.0)
    until(qtbot, lambda: saved()["models"][0]["n_ctx"] == 512)
    hs.close()
    hs2, eng2 = start_app()
    until(qtbot, lambda: "a" in hs2.window.rows)
    assert eng2.load_options["a"]["n_ctx"] == 512


def test_saved_models_show_progress_rows_from_the_start(qtbot, start_app, models):
    settings.save(settings.Settings(models=[settings.ModelEntry(models["a"], "a"),
                                            settings.ModelEntry(models["b"], "b")]))
    seen = []
    hs, eng = start_app(lambda hs: seen.append((set(hs.window.pending),
                                                hs.window.empty_label.isHidden())))
    assert seen == [({models["a"], models["b"]}, True)]     # before any load ran
    until(qtbot, lambda: set(hs.window.rows) == {"a", "b"})
    until(qtbot, lambda: not hs.window.pending)


def test_idle_setting_reaches_the_bridge(qtbot, start_app):
    hs, eng = start_app()
    hs.window.preferences.idle_spin.setValue(15)
    hs.window.preferences.idle_spin.editingFinished.emit()
    assert saved()["idle_evict_min"] == 15
    until(qtbot, lambda: eng.idle_s == 15 * 60)           # the engine evicts, not the tray


@pytest.mark.qt_log_ignore("propagateSizeHints")
def test_the_session_ending_saves_at_once(qtbot, start_app):
    hs, eng = start_app()
    hs.window.resize(700, 500)
    hs.window.show()
    qtbot.waitExposed(hs.window)
    hs.on_commit_data()                        # what QApplication.commitDataRequest calls
    assert saved()["window_geometry"] == hs.settings.window_geometry != ""
