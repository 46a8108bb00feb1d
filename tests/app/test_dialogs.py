"""Preferences (each edit emitted at once, the LAN warning), About, a model's options."""
from __future__ import annotations

from app.window.dialogs import AboutDialog, ModelOptionsDialog, PreferencesDialog
from app.settings import Settings
from tests.helpers.fake_engine import fake_status


def test_preferences_show_and_emit(qtbot):
    d = PreferencesDialog()
    qtbot.addWidget(d)
    s = Settings(port=9001, budget_mib=4096, release_mode="weights", watched_folder="/models",
                 autostart=True, flash_attn="off", idle_evict_min=10, api_key="k",
                 notifications=False, host_budget_mib=2048)
    d.apply_settings(s)
    assert d.port_spin.value() == 9001 and d.budget_spin.value() == 4096
    assert d.host_budget_spin.value() == 2048
    assert d.release_combo.currentData() == "weights" and d.flash_combo.currentData() == "off"
    assert d.folder_edit.text() == "/models" and d.autostart_check.isChecked()
    assert d.idle_spin.value() == 10 and d.key_edit.text() == "k"
    assert not d.notify_check.isChecked()
    got = []
    d.setting_changed.connect(lambda k, v: got.append((k, v)))
    d.port_spin.setValue(9002)
    d.port_spin.editingFinished.emit()
    d.port_spin.editingFinished.emit()                       # unchanged: no repeat
    d.budget_spin.setValue(0)
    d.budget_spin.editingFinished.emit()
    d.host_budget_spin.setValue(512)
    d.host_budget_spin.editingFinished.emit()
    d.release_combo.setCurrentIndex(d.release_combo.findData("full"))
    d.flash_combo.setCurrentIndex(d.flash_combo.findData("auto"))
    d.folder_edit.setText("/other ")
    d.folder_edit.editingFinished.emit()
    d.autostart_check.setChecked(False)
    d.idle_spin.setValue(0)
    d.idle_spin.editingFinished.emit()
    d.notify_check.setChecked(True)
    assert got == [("port", 9002), ("budget_mib", 0), ("host_budget_mib", 512),
                   ("release_mode", "full"),
                   ("flash_attn", "auto"), ("watched_folder", "/other"), ("autostart", False),
                   ("idle_evict_min", 0), ("notifications", True)]
    assert d.budget_spin.text() == "automatic" and d.idle_spin.text() == "never"


def test_lan_without_a_key_warns_and_asks_for_the_explicit_opt_in(qtbot):
    d = PreferencesDialog(Settings())
    qtbot.addWidget(d)
    assert d.lan_warning.isHidden() and d.lan_nokey_check.isHidden()
    got = []
    d.setting_changed.connect(lambda k, v: got.append((k, v)))
    d.lan_check.setChecked(True)
    assert not d.lan_warning.isHidden()
    assert "anyone there" in d.lan_warning.text() and "stays on this computer" in \
        d.lan_warning.text()
    assert not d.lan_nokey_check.isHidden()                  # the opt-in is offered
    d.lan_nokey_check.setChecked(True)
    assert "stays on this computer" not in d.lan_warning.text()
    d.key_button.click()                                     # a key: no opt-in needed
    assert d.key_edit.text().startswith("hs-") and len(d.key_edit.text()) > 20
    assert d.lan_nokey_check.isHidden() and not d.lan_warning.isHidden()
    keys = [k for k, _ in got]
    assert keys == ["lan", "lan_without_key", "api_key"]


def test_about_names_the_version_and_device(qtbot):
    d = AboutDialog("Fake GPU")
    qtbot.addWidget(d)
    assert "Hotseat 0.1.0" in d.text.text() and "Fake GPU" in d.text.text()


def test_model_options(qtbot):
    d = ModelOptionsDialog(fake_status("a", n_ctx=1024, cpu_moe=2.0))
    qtbot.addWidget(d)
    assert d.ctx_spin.value() == 1024 and d.moe_spin.value() == 2.0
    got = []
    d.chosen.connect(lambda *a: got.append(a))
    d.ctx_spin.setValue(4096)
    d.buttons.accepted.emit()
    assert got == [("a", 4096, 2.0)]
