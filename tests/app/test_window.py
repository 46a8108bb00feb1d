"""The main window on the fake engine: rows, buttons, the bars, drag and drop, progress, the
endpoint toggle, the settings area and the watched-folder offer."""
from __future__ import annotations

import json
import urllib.request

import pytest
from PySide6.QtCore import QMimeData, QPointF, Qt, QUrl
from PySide6.QtGui import QDragEnterEvent, QDropEvent

from app.settings import Settings
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
    assert row.evict_button.isHidden() and not row.warm_button.isHidden()
    assert "RAM" in row.bar_text.text()                          # its host shadow
    # the window's total bar sums the rows
    assert window.total_bar.device_bytes == {"kv": 6 << 20}

    bridge.models_changed.emit([fake_status("a", pinned=True)])
    until(qtbot, lambda: row.pin_button.isChecked())
    assert not row.pinned_mark.isHidden() and not row.evict_button.isEnabled()


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
    assert row.warm_button.isHidden()
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
    bridge.error.emit("VRAM budget exceeded pinning a")
    until(qtbot, lambda: not window.message.isHidden())
    assert window.message.text() == "VRAM budget exceeded pinning a"
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
    seen = []
    ev = drop(window, models["a"])
    assert ev.isAccepted()
    assert not window.progress.isHidden() and window.progress.value() == 0
    assert "a.gguf" in window.progress_label.text()
    until(qtbot, lambda: 0 < window.progress.value() < 100)       # a step of the upload
    seen.append(window.progress.value())
    until(qtbot, lambda: "a" in window.rows)
    until(qtbot, lambda: window.progress.isHidden())
    assert seen[0] in (25, 50, 75)
    assert window.message.isHidden()
    window.timer.stop()


def test_drop_several_files_queues_them(qtbot, window, bridge, models):
    drop(window, models["a"], models["b"])
    assert "+1 queued" in window.progress_label.text()
    until(qtbot, lambda: set(window.rows) == {"a", "b"})
    until(qtbot, lambda: window.progress.isHidden())
    assert window.rows["b"].details.text().split("  ·  ")[1] == "Q4_0"   # dominant type


@pytest.mark.parametrize("key", ["bad", "text"])
def test_drop_a_bad_file_shows_a_clear_message(qtbot, window, bridge, models, key):
    drop(window, models[key])
    until(qtbot, lambda: not window.message.isHidden())
    text = window.message.text()
    assert text.startswith(f"Could not load {key}.gguf: ")
    assert "not a GGUF file" in text and "\n" not in text
    assert window.message.property("kind") == "error"
    until(qtbot, lambda: window.progress.isHidden())
    assert window.rows == {}


def test_drop_a_folder_says_so(qtbot, window, tmp_path):
    drop(window, str(tmp_path))
    assert "is a folder" in window.message.text()


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
        assert json.loads(r.read()) == {"status": "ok"}
    window.endpoint_toggle.setChecked(False)
    until(qtbot, lambda: len(bridge.rec.endpoint) == 2, timeout=10000)
    until(qtbot, lambda: window.endpoint_label.text() == "")
    assert not window.endpoint_toggle.isChecked()
    window.timer.stop()


def test_endpoint_failure_unchecks_the_toggle(qtbot, window, bridge):
    window.endpoint_toggle.setChecked(True)
    bridge.endpoint_changed.emit(False, "cannot listen on 127.0.0.1:1: Permission denied")
    until(qtbot, lambda: not window.endpoint_toggle.isChecked())


def test_settings_area_shows_and_emits(qtbot, window):
    s = Settings(port=9001, budget_mib=4096, release_mode="weights",
                 watched_folder="/models", autostart=True, flash_attn="off")
    window.apply_settings(s)
    assert window.port_spin.value() == 9001 and window.budget_spin.value() == 4096
    assert window.release_combo.currentData() == "weights"
    assert window.flash_combo.currentData() == "off"
    assert window.folder_edit.text() == "/models" and window.autostart_check.isChecked()
    got = []
    window.setting_changed.connect(lambda k, v: got.append((k, v)))
    window.port_spin.setValue(9002)
    window.port_spin.editingFinished.emit()
    window.port_spin.editingFinished.emit()                       # unchanged: no repeat
    window.budget_spin.setValue(0)
    window.budget_spin.editingFinished.emit()
    window.release_combo.setCurrentIndex(window.release_combo.findData("full"))
    window.flash_combo.setCurrentIndex(window.flash_combo.findData("auto"))
    window.folder_edit.setText("/other ")
    window.folder_edit.editingFinished.emit()
    window.autostart_check.setChecked(False)
    assert got == [("port", 9002), ("budget_mib", 0), ("release_mode", "full"),
                   ("flash_attn", "auto"), ("watched_folder", "/other"), ("autostart", False)]
    assert window.budget_spin.text() == "automatic"


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
