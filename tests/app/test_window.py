"""The main window on the fake engine: rows, buttons, the bars, drag and drop, progress, the
endpoint toggle, the settings area and the watched-folder offer."""
from __future__ import annotations

import json
import urllib.request

import pytest
from PySide6.QtCore import QMimeData, QPointF, Qt, QUrl
from PySide6.QtGui import QDragEnterEvent, QDropEvent

from app.window import MainWindow
from tests.helpers.fake_engine import MODEL_BYTES, fake_status
from tests.helpers.signals import until

pytestmark = pytest.mark.filterwarnings("ignore:It is recommended to use web.AppKey")


@pytest.fixture
def window(qtbot, bridge):
    w = MainWindow(bridge)
    qtbot.addWidget(w)
    yield w
    w.timer.stop()


def mime_for(*paths: str) -> QMimeData:
    mime = QMimeData()
    mime.setUrls([QUrl.fromLocalFile(p) for p in paths])
    return mime


def drop(window: MainWindow, *paths: str) -> QDropEvent:
    mime = mime_for(*paths)
    ev = QDropEvent(QPointF(20, 20), Qt.DropAction.CopyAction, mime,
                    Qt.MouseButton.LeftButton, Qt.KeyboardModifier.NoModifier)
    window.dropEvent(ev)
    return ev


def test_rows_appear_and_go_with_models_changed(qtbot, window, bridge):
    assert window.rows == {} and not window.empty_label.isHidden()
    bridge.models_changed.emit([fake_status("a"), fake_status("b", "cold")])
    until(qtbot, lambda: len(window.rows) == 2)
    assert window.empty_label.isHidden()
    a = window.rows["a"]
    assert a.name_label.text() == "a"
    assert "llama" in a.details.text() and "Q4_K_M" in a.details.text()
    assert "100 MiB" in a.details.text()                         # the file's size
    assert [window.rows_layout.itemAt(i).widget() for i in range(2)] == \
        [window.rows["a"], window.rows["b"]]
    bridge.models_changed.emit([fake_status("b", "cold")])
    until(qtbot, lambda: list(window.rows) == ["b"])
    bridge.models_changed.emit([])
    until(qtbot, lambda: not window.rows)
    assert not window.empty_label.isHidden()


def test_badge_and_bar_follow_the_state(qtbot, window, bridge):
    bridge.vram_changed.emit({"budget_bytes": 1024 << 20, "granted_bytes": 0})
    bridge.models_changed.emit([fake_status("a")])
    until(qtbot, lambda: "a" in window.rows)
    row = window.rows["a"]
    assert row.badge.text() == "WARM" and row.badge.property("state") == "warm"
    assert row.bar.device_bytes == MODEL_BYTES and row.bar.budget == 1024 << 20
    kinds = [k for k, _, _ in row.bar.segments(1024)]
    assert kinds == ["weights", "kv", "recurrent", "compute", "scratch"]
    # one pixel per MiB on a 1024-pixel bar: each segment as wide as its bytes
    widths = {k: w for k, _, w in row.bar.segments(1024)}
    assert widths == pytest.approx({k: v / (1 << 20) for k, v in MODEL_BYTES.items()})
    assert "113 MiB of 1.0 GiB" in row.bar_text.text()
    assert row.evict_button.isEnabled()

    bridge.models_changed.emit([fake_status("a", "cold", device_bytes={"kv": 6 << 20})])
    until(qtbot, lambda: row.badge.text() == "COLD")
    assert row.badge.property("state") == "cold"
    assert row.bar.device_bytes == {"kv": 6 << 20}
    # both stay where they are; only which one is enabled changes
    assert row.evict_button.isVisible() == row.warm_button.isVisible()
    assert not row.evict_button.isEnabled() and row.warm_button.isEnabled()
    assert "RAM" in row.bar_text.text()                          # its host shadow
    # the window's total bar sums the rows
    assert window.total_bar.device_bytes == {"kv": 6 << 20}

    bridge.models_changed.emit([fake_status("a", pinned=True)])
    until(qtbot, lambda: row.pin_button.isChecked())
    assert not row.pinned_mark.isHidden() and not row.evict_button.isEnabled()

    # the GPU lost (the engine says "unusable"): nothing to warm or evict, and why
    bridge.models_changed.emit([fake_status("a", "unusable", device_bytes={})])
    until(qtbot, lambda: row.badge.text() == "UNUSABLE")
    assert not row.warm_button.isEnabled() and not row.evict_button.isEnabled()
    assert "restart Hotseat" in row.badge.toolTip()


def test_bar_paints(qtbot, window, bridge):
    bridge.vram_changed.emit({"budget_bytes": 256 << 20})
    bridge.models_changed.emit([fake_status("a"), fake_status("b", "cold")])
    until(qtbot, lambda: len(window.rows) == 2)
    window.resize(700, 500)
    img = window.rows["a"].bar.grab().toImage()
    assert img.width() > 100
    # the left end is a weights segment, the right end the empty track
    left = img.pixelColor(3, img.height() // 2)
    right = img.pixelColor(img.width() - 4, img.height() // 2)
    assert left.blue() > left.red() and right.red() > 200
    assert not window.rows["b"].bar.grab().toImage().isNull()


def test_pin_toggle_calls_pin_and_unpin(qtbot, window, bridge, models):
    window.load_paths([models["a"]])
    until(qtbot, lambda: "a" in window.rows)
    row = window.rows["a"]
    row.pin_button.click()
    until(qtbot, lambda: bridge.rec.model("a").get("pinned"))
    until(qtbot, lambda: row.pin_button.isChecked() and row.pin_button.text() == "Pinned")
    assert ("pin", "a") in bridge.fake.calls
    row.pin_button.click()
    until(qtbot, lambda: not bridge.rec.model("a").get("pinned"))
    until(qtbot, lambda: not row.pin_button.isChecked())
    assert ("unpin", "a") in bridge.fake.calls


def test_evict_and_warm_buttons(qtbot, window, bridge, models):
    window.load_paths([models["a"]])
    until(qtbot, lambda: "a" in window.rows)
    row = window.rows["a"]
    assert not row.warm_button.isEnabled() and not row.warm_button.isHidden()
    row.evict_button.click()
    until(qtbot, lambda: row.badge.text() == "COLD")
    assert ("evict", "a") in bridge.fake.calls and row.bar.device_bytes == {}
    row.warm_button.click()
    until(qtbot, lambda: row.badge.text() == "WARM")
    assert ("warm", "a") in bridge.fake.calls and row.bar.device_bytes == MODEL_BYTES


def test_unload_button_removes_the_row(qtbot, window, bridge, models):
    window.load_paths([models["a"]])
    until(qtbot, lambda: "a" in window.rows)
    window.rows["a"].unload_button.click()
    until(qtbot, lambda: not window.rows)
    assert ("unload", "a") in bridge.fake.calls


def test_a_refused_pin_shows_inline(qtbot, window, bridge):
    from app.errors import describe
    from engine.residency.arbiter import BudgetError

    bridge.error.emit(*describe(BudgetError("VRAM budget exceeded pinning a")))
    until(qtbot, lambda: not window.message.isHidden())
    assert window.message.text().startswith("Not enough VRAM in the budget")
    assert window.details_text.toPlainText() == "VRAM budget exceeded pinning a"
    assert window.message.property("kind") == "error"
    window.message_close.click()
    assert window.message.isHidden()


def drag_enter(window: MainWindow, mime: QMimeData) -> bool:
    # the event does not own its mime data: mime must outlive it
    ev = QDragEnterEvent(QPointF(5, 5), Qt.DropAction.CopyAction, mime,
                         Qt.MouseButton.LeftButton, Qt.KeyboardModifier.NoModifier)
    window.dragEnterEvent(ev)
    return ev.isAccepted()


def test_drag_enter_accepts_local_files_only(window, models):
    local = mime_for(models["a"])
    assert drag_enter(window, local)
    web = QMimeData()
    web.setUrls([QUrl("https://example.com/a.gguf")])
    assert not drag_enter(window, web)
    text = QMimeData()
    text.setText("hello")
    assert not drag_enter(window, text)


def test_drop_a_good_file_loads_it_with_progress(qtbot, make_bridge, models):
    bridge = make_bridge(load_delay_s=0.15)
    window = MainWindow(bridge)
    qtbot.addWidget(window)
    ev = drop(window, models["a"])
    assert ev.isAccepted()
    row = window.pending[models["a"]]                 # a progress row at once
    assert "a.gguf" in row.name_label.text() and window.empty_label.isHidden()
    until(qtbot, lambda: row.stage == "uploading" and 0 < row.percent < 100)
    assert row.percent in (25, 50, 75)
    until(qtbot, lambda: "a" in window.rows)
    # the progress row goes in the same update that brings the model's row
    assert models["a"] not in window.pending
    assert window.message.isHidden()
    window.timer.stop()


def test_drop_several_files_gives_a_row_each(qtbot, window, bridge, models):
    drop(window, models["a"], models["b"])
    assert list(window.pending) == [models["a"], models["b"]]
    until(qtbot, lambda: set(window.rows) == {"a", "b"})
    until(qtbot, lambda: not window.pending)
    assert window.rows["b"].details.text().split("  ·  ")[1] == "Q4_0"   # dominant type


@pytest.mark.parametrize("key, summary", [
    ("bad", "This is not a GGUF model file"), ("text", "This is not a GGUF model file")])
def test_drop_a_bad_file_shows_a_clear_message(qtbot, window, bridge, models, key, summary):
    drop(window, models[key])
    until(qtbot, lambda: not window.message.isHidden())
    assert window.message.text() == f"Could not load {key}.gguf: {summary}"
    assert window.message.property("kind") == "error"
    assert not window.details_button.isHidden() and window.details_text.isHidden()
    window.details_button.click()                     # the engine's words, on demand
    assert not window.details_text.isHidden()
    assert "not a GGUF file" in window.details_text.toPlainText()
    until(qtbot, lambda: not window.pending)
    assert window.rows == {}


def test_a_truncated_file_says_so(qtbot, window, bridge, models, tmp_path):
    whole = open(models["a"], "rb").read()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(whole[: len(whole) // 2])
    drop(window, str(cut))
    until(qtbot, lambda: not window.message.isHidden())
    assert window.message.text() == ("Could not load cut.gguf: The file is incomplete "
                                     "(truncated download?)")


def test_drag_accepts_only_gguf_files(window, models, tmp_path):
    assert drag_enter(window, mime_for(models["a"]))
    assert drag_enter(window, mime_for(models["a"], models["b"]))
    other = tmp_path / "notes.txt"
    other.write_text("x")
    assert not drag_enter(window, mime_for(str(other)))       # the cursor: not allowed
    assert not drag_enter(window, mime_for(models["a"], str(other)))
    assert not drag_enter(window, mime_for(str(tmp_path)))    # a folder


def test_a_file_that_will_not_run_shows_the_checks_reasons(qtbot, window, bridge, tmp_path):
    """The engine's check refuses it before any load: the reasons show, nothing loads."""
    from tests.helpers.fake_engine import write_gguf

    path = write_gguf(tmp_path / "ds.gguf", arch="deepseek2")
    reasons = bridge.fake.check(path)["problems"]
    assert reasons and reasons[0].startswith("architecture deepseek2 is not supported")
    drop(window, path)
    until(qtbot, lambda: not window.message.isHidden())
    assert window.message.text() == f"Could not load ds.gguf: {'; '.join(reasons)}"
    assert window.message.property("kind") == "error"
    window.details_button.click()
    details = window.details_text.toPlainText().splitlines()
    assert details == [f"{path}: Hotseat cannot run this file:"] + [f"- {r}" for r in reasons]
    until(qtbot, lambda: not window.pending)
    assert ("load", path) not in bridge.fake.calls and window.rows == {}


def test_a_file_that_runs_logs_what_it_takes(qtbot, window, bridge, models):
    drop(window, models["a"])
    until(qtbot, lambda: "a" in window.rows)
    r = bridge.fake.check(models["a"])
    vram, ram = r["vram"]["total_bytes"] >> 20, r["ram"]["weights_bytes"] >> 20
    until(qtbot, lambda: f"({vram} MiB of VRAM warm, {ram} MiB of RAM cold)"
          in window.log_view.toPlainText())


def test_dropping_a_loaded_model_selects_its_row(qtbot, window, bridge, models):
    window.load_paths([models["a"], models["b"]])
    until(qtbot, lambda: set(window.rows) == {"a", "b"})
    n = len([c for c in bridge.fake.calls if c[0] == "load"])
    drop(window, models["b"])
    assert window.selected == "b"
    assert window.rows["b"].property("selected") == "true"
    assert window.rows["a"].property("selected") == "false"
    qtbot.wait(50)
    assert len([c for c in bridge.fake.calls if c[0] == "load"]) == n     # not loaded again
    assert window.message.isHidden()


def test_add_model_opens_a_gguf_file_dialog(qtbot, window, bridge, models, monkeypatch):
    from PySide6.QtWidgets import QFileDialog

    asked = []

    def fake_dialog(parent, title, folder, filters):
        asked.append(filters)
        return [models["a"]], filters

    monkeypatch.setattr(QFileDialog, "getOpenFileNames", staticmethod(fake_dialog))
    window.add_button.click()
    assert "*.gguf" in asked[0]
    until(qtbot, lambda: "a" in window.rows)


def test_endpoint_toggle_starts_and_stops_the_server(qtbot, make_bridge, models):
    bridge = make_bridge(port=0)
    window = MainWindow(bridge)
    qtbot.addWidget(window)
    window.load_paths([models["a"]])
    until(qtbot, lambda: "a" in window.rows)
    window.endpoint_toggle.setChecked(True)
    until(qtbot, lambda: bridge.rec.endpoint, timeout=10000)
    running, url = bridge.rec.endpoint[-1]
    assert running
    until(qtbot, lambda: url in window.endpoint_label.text())
    with urllib.request.urlopen(url + "/health", timeout=5) as r:
        assert json.loads(r.read()) == {"status": "ok", "faults": 0, "last_fault": None}
    window.endpoint_toggle.setChecked(False)
    until(qtbot, lambda: len(bridge.rec.endpoint) == 2, timeout=10000)
    until(qtbot, lambda: window.endpoint_label.text() == "")
    assert not window.endpoint_toggle.isChecked()
    window.timer.stop()


def test_endpoint_failure_unchecks_the_toggle(qtbot, window, bridge):
    window.endpoint_toggle.setChecked(True)
    bridge.endpoint_changed.emit(False, "cannot listen on 127.0.0.1:1: Permission denied")
    until(qtbot, lambda: not window.endpoint_toggle.isChecked())


def test_refresh_timer_asks_the_bridge(qtbot, window, bridge):
    n = len(bridge.rec.vram)
    window.timer.setInterval(50)
    until(qtbot, lambda: len(bridge.rec.vram) >= n + 2)


def test_watched_folder_offer(qtbot, window, bridge, models):
    window.on_model_offered(models["a"])
    window.on_model_offered(models["a"])                          # offered once
    assert list(window.offers) == [models["a"]]
    offer = window.offers[models["a"]]
    assert "a.gguf" in offer.label.text()
    offer.add_button.click()
    assert window.offers == {}
    until(qtbot, lambda: "a" in window.rows)
    window.on_model_offered(models["a"])                          # loaded: not offered
    assert window.offers == {}
    window.on_model_offered(models["b"])
    window.offers[models["b"]].dismiss_button.click()
    assert window.offers == {}
    assert ("load", models["b"]) not in bridge.fake.calls


# the offscreen platform's own complaint when a window is shown
@pytest.mark.qt_log_ignore("propagateSizeHints")
def test_close_hides_when_a_tray_holds_the_app(qtbot, window):
    window.show()
    window.hide_on_close = True
    window.close()
    assert window.isHidden()


# -- looks (item 6) ---------------------------------------------------------------------------
def test_software_renderer_is_said_plainly(qtbot, window):
    assert window.software_banner.isHidden()
    window.on_device_ready("llvmpipe (LLVM 15.0.6, 256 bits)")
    assert not window.software_banner.isHidden()
    assert window.software_banner.text() == "No GPU found: running on the CPU, slow"
    window.on_device_ready("AMD Radeon RX 7900 XTX (RADV NAVI31)")
    assert window.software_banner.isHidden()


def test_row_breakdown_and_legend_list_only_the_kinds_present(qtbot, window, bridge):
    bridge.vram_changed.emit({"budget_bytes": 1024 << 20})
    warm = fake_status("a", device_bytes={"weights": 96 << 20, "kv": 6 << 20,
                                          "compute": 8 << 20})
    cold = fake_status("b", "cold")
    bridge.models_changed.emit([warm, cold])
    until(qtbot, lambda: len(window.rows) == 2)
    text = window.rows["a"].breakdown.text()
    assert "Weights 96.0 MiB" in text and "KV cache 6.0 MiB" in text
    assert "Compute 8.0 MiB" in text and "= 110 MiB" in text
    assert "Recurrent" not in text and "Scratch" not in text
    assert [k for k, _, _ in window.rows["a"].bar.segments(500)] == ["weights", "kv", "compute"]
    assert window.rows["b"].breakdown.text() == "Nothing in VRAM"
    legend = window.legend.text()
    assert "Weights" in legend and "KV cache" in legend and "Compute" in legend
    assert "Recurrent" not in legend and "Scratch" not in legend and "MiB" not in legend


@pytest.mark.qt_log_ignore("propagateSizeHints")
def test_endpoint_toggle_does_not_move_when_its_url_appears(qtbot, window):
    window.resize(900, 600)
    window.show()
    qtbot.waitExposed(window)
    before = window.endpoint_toggle.mapTo(window, window.endpoint_toggle.rect().topLeft())
    window.on_endpoint_changed(True, "http://127.0.0.1:65535")
    qtbot.wait(20)
    after = window.endpoint_toggle.mapTo(window, window.endpoint_toggle.rect().topLeft())
    assert before == after
    assert window.copy_button.isEnabled()
    window.on_endpoint_changed(False, "")
    assert not window.copy_button.isEnabled()


@pytest.mark.qt_log_ignore("propagateSizeHints")
def test_warm_and_evict_keep_their_places(qtbot, window, bridge):
    window.resize(900, 600)
    window.show()
    qtbot.waitExposed(window)
    bridge.models_changed.emit([fake_status("a")])
    until(qtbot, lambda: "a" in window.rows)
    row = window.rows["a"]
    qtbot.wait(20)
    where = {b.text(): b.geometry() for b in (row.warm_button, row.evict_button)}
    bridge.models_changed.emit([fake_status("a", "cold")])
    until(qtbot, lambda: row.badge.text() == "COLD")
    qtbot.wait(20)
    assert {b.text(): b.geometry() for b in (row.warm_button, row.evict_button)} == where
    bridge.models_changed.emit([fake_status("a", pinned=True)])
    until(qtbot, lambda: row.pin_button.text() == "Pinned")
    qtbot.wait(20)
    assert {b.text(): b.geometry() for b in (row.warm_button, row.evict_button)} == where


def test_copy_url_puts_the_base_url_on_the_clipboard(qtbot, window):
    from PySide6.QtGui import QGuiApplication

    window.on_endpoint_changed(True, "http://127.0.0.1:8080")
    window.copy_button.click()
    assert QGuiApplication.clipboard().text() == "http://127.0.0.1:8080/v1"


@pytest.mark.qt_log_ignore("propagateSizeHints", r"support raise\(\)")
def test_preferences_and_about_open_from_the_window(qtbot, window):
    window.prefs_button.click()
    assert window.preferences.isVisible()
    window.about_button.click()
    assert window.about.isVisible() and "Hotseat" in window.about.text.text()
    assert "Fake GPU" in window.about.text.text()
    window.preferences.hide()
    window.about.hide()
    # the settings are no longer in the window itself
    assert window.findChild(type(window.preferences.port_spin)) is window.preferences.port_spin


# -- busy state, activity, arena (items 4 and 9) ----------------------------------------------
def test_busy_labels_follow_the_bridge(qtbot, window, bridge):
    bridge.models_changed.emit([fake_status("a"), fake_status("b", "cold")])
    until(qtbot, lambda: len(window.rows) == 2)
    bridge.busy_changed.emit({"a": "generating · 5.2 tok/s", "b": "queued: warm"})
    until(qtbot, lambda: window.rows["b"].busy_label.text() == "queued: warm")
    assert window.rows["a"].busy_label.text() == "generating · 5.2 tok/s"
    bridge.busy_changed.emit({})
    until(qtbot, lambda: window.rows["a"].busy_label.text() == "")


def test_activity_log_gets_the_bridges_entries(qtbot, window, bridge, models):
    window.load_paths([models["a"]])
    until(qtbot, lambda: "Loaded a in" in window.log_view.toPlainText())


def test_arena_banner(qtbot, window, bridge):
    import time as _time

    until_t = _time.mktime((2030, 1, 1, 14, 20, 0, 0, 0, -1))
    bridge.arena_changed.emit({"state": "yielded", "until": until_t, "holder_pid": 7})
    until(qtbot, lambda: not window.arena_banner.isHidden())
    assert window.arena_banner.text() == "Yielded to another app until 14:20"
    bridge.arena_changed.emit({"state": "holder", "until": None, "holder_pid": None})
    until(qtbot, lambda: window.arena_banner.isHidden())


def test_arena_banner_says_game_mode_gave_the_gpu_up(qtbot, window, bridge):
    import time as _time

    t = _time.mktime((2030, 1, 1, 21, 5, 0, 0, 0, -1))
    bridge.arena_changed.emit({"enabled": False, "state": "cold", "gave_up": {
        "t": t, "free_bytes": 300 << 20, "need_bytes": 5 << 30, "reason": "..."}})
    until(qtbot, lambda: not window.arena_banner.isHidden())
    assert window.arena_banner.text() == ("Gave the GPU up to another app at 21:05 (300 MiB "
                                          "of VRAM was free); back once it is free")
    bridge.arena_changed.emit({})
    until(qtbot, lambda: window.arena_banner.isHidden())


# -- model options (item 8) -------------------------------------------------------------------
@pytest.mark.qt_log_ignore("propagateSizeHints")
def test_model_options_reload_the_model(qtbot, window, bridge, models):
    window.load_paths([models["a"]])
    until(qtbot, lambda: "a" in window.rows)
    window.rows["a"].options_button.click()
    dlg = window.options_dialog
    assert dlg.ctx_spin.value() == 2048 and dlg.moe_spin.value() == 0.0
    dlg.ctx_spin.setValue(512)
    dlg.moe_spin.setValue(1.5)
    got = []
    window.model_options_changed.connect(lambda *a: got.append(a))
    dlg.buttons.button(dlg.buttons.StandardButton.Ok).click()
    assert got == [("a", 512, 1.5)]
    until(qtbot, lambda: bridge.rec.model("a").get("n_ctx") == 512)
    assert bridge.fake.load_options["a"] == {"n_ctx": 512, "cpu_moe": 1.5}
    assert [c[0] for c in bridge.fake.calls].count("unload") == 1
    until(qtbot, lambda: "ctx 512" in window.rows["a"].details.text())
    assert "cpu_moe 1.5" in window.rows["a"].details.text()
    until(qtbot, lambda: not window.pending)
