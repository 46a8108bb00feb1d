"""The window's dialogs: Preferences (applied as they are edited), About, and a model's
options (context size, cpu_moe), which reload the model."""
from __future__ import annotations

import secrets

from PySide6.QtCore import Qt, Signal, Slot
from PySide6.QtWidgets import (QCheckBox, QComboBox, QDialog, QDialogButtonBox,
                               QDoubleSpinBox, QFileDialog, QFormLayout, QHBoxLayout, QLabel,
                               QLineEdit, QPushButton, QSpinBox, QVBoxLayout, QWidget)

from ..icons import app_icon
from ..settings import FLASH_ATTN_MODES, MAX_IDLE_MIN, RELEASE_MODES, Settings

RELEASE_LABELS = {"full": "Full (weights, KV and compute)", "weights": "Weights only (KV stays)"}
FLASH_ATTN_LABELS = {"auto": "Automatic", "on": "On", "off": "Off"}
MAX_BUDGET_MIB = 1 << 20
MAX_CTX = 1 << 20
LAN_WARNING = ("Other computers on your network can reach the endpoint. Without an API key "
               "anyone there can run the models and load or unload them.")
LAN_NEEDS_KEY = ("Set an API key, or tick the box below, to serve on the network; until then "
                 "the endpoint stays on this computer (127.0.0.1).")

STYLE = """
QLabel#warning { background: #fff4e5; color: #7a4100; border: 1px solid #f3c98b;
                 border-radius: 4px; padding: 6px; }
"""


class PreferencesDialog(QDialog):
    """Every setting but the models; each edit is emitted at once (no OK to forget)."""

    #: (key, value): a setting was edited; keys are Settings field names (port, budget_mib,
    #: release_mode, flash_attn, watched_folder, autostart, idle_evict_min, api_key, lan,
    #: lan_without_key, notifications)
    setting_changed = Signal(str, object)

    def __init__(self, settings: Settings | None = None, parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName("preferences")
        self.setWindowTitle("Hotseat Preferences")
        self.setStyleSheet(STYLE)
        form = QFormLayout()
        self.port_spin = QSpinBox()
        self.port_spin.setRange(0, 65535)
        self.port_spin.setSpecialValueText("any free port")
        self.budget_spin = QSpinBox()
        self.budget_spin.setRange(0, MAX_BUDGET_MIB)
        self.budget_spin.setSingleStep(256)
        self.budget_spin.setSuffix(" MiB")
        self.budget_spin.setSpecialValueText("automatic")
        self.host_budget_spin = QSpinBox()
        self.host_budget_spin.setRange(0, MAX_BUDGET_MIB)
        self.host_budget_spin.setSingleStep(256)
        self.host_budget_spin.setSuffix(" MiB")
        self.host_budget_spin.setSpecialValueText("automatic")
        self.host_budget_spin.setToolTip("RAM for the copies of the models not on the GPU; "
                                         "past it the least recently used go to disk. "
                                         "Automatic: half the memory free at start")
        self.release_combo = QComboBox()
        for mode in RELEASE_MODES:
            self.release_combo.addItem(RELEASE_LABELS[mode], mode)
        self.release_combo.setToolTip("What evicting a model frees: weights only keeps its KV "
                                      "cache in VRAM for the fastest switch back")
        self.flash_combo = QComboBox()
        for mode in FLASH_ATTN_MODES:
            self.flash_combo.addItem(FLASH_ATTN_LABELS[mode], mode)
        self.flash_combo.setToolTip("Tiled attention for prompts. Automatic turns it on where "
                                    "it is faster (AMD GCN GPUs, models with large heads)")
        self.idle_spin = QSpinBox()
        self.idle_spin.setRange(0, MAX_IDLE_MIN)
        self.idle_spin.setSuffix(" min")
        self.idle_spin.setSpecialValueText("never")
        self.idle_spin.setToolTip("Evict a warm model that has not been used for this long "
                                  "(pinned models stay)")
        folder_row = QHBoxLayout()
        self.folder_edit = QLineEdit()
        self.folder_edit.setPlaceholderText("none")
        self.folder_button = QPushButton("Browse…")
        folder_row.addWidget(self.folder_edit, 1)
        folder_row.addWidget(self.folder_button)
        self.autostart_check = QCheckBox("Start Hotseat at login")
        self.notify_check = QCheckBox("Notify me while the window is hidden")

        key_row = QHBoxLayout()
        self.key_edit = QLineEdit()
        self.key_edit.setPlaceholderText("none")
        self.key_edit.setToolTip("Clients send it as a Bearer token; without one any program "
                                 "on this computer may connect")
        self.key_edit.setEchoMode(QLineEdit.EchoMode.PasswordEchoOnEdit)
        self.key_button = QPushButton("Generate")
        key_row.addWidget(self.key_edit, 1)
        key_row.addWidget(self.key_button)
        self.lan_check = QCheckBox("Serve on the local network (LAN), not only this computer")
        self.lan_warning = QLabel(LAN_WARNING, objectName="warning")
        self.lan_warning.setWordWrap(True)
        self.lan_nokey_check = QCheckBox("Serve on the network without a key (anyone there "
                                         "can use it)")

        form.addRow("Endpoint port", self.port_spin)
        form.addRow("API key", key_row)
        form.addRow("", self.lan_check)
        form.addRow("", self.lan_warning)
        form.addRow("", self.lan_nokey_check)
        form.addRow("VRAM budget", self.budget_spin)
        form.addRow("RAM budget", self.host_budget_spin)
        form.addRow("Eviction", self.release_combo)
        form.addRow("Evict when unused for", self.idle_spin)
        form.addRow("Flash attention", self.flash_combo)
        form.addRow("Watched folder", folder_row)
        form.addRow("", self.autostart_check)
        form.addRow("", self.notify_check)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Close)
        buttons.rejected.connect(self.hide)
        root = QVBoxLayout(self)
        root.addLayout(form)
        root.addWidget(buttons)

        self.port_spin.editingFinished.connect(self.on_port_edited)
        self.budget_spin.editingFinished.connect(self.on_budget_edited)
        self.host_budget_spin.editingFinished.connect(self.on_host_budget_edited)
        self.idle_spin.editingFinished.connect(self.on_idle_edited)
        self.release_combo.currentIndexChanged.connect(self.on_release_mode_changed)
        self.flash_combo.currentIndexChanged.connect(self.on_flash_attn_changed)
        self.folder_edit.editingFinished.connect(self.on_folder_edited)
        self.folder_button.clicked.connect(self.on_browse_clicked)
        self.autostart_check.toggled.connect(self.on_autostart_toggled)
        self.notify_check.toggled.connect(self.on_notify_toggled)
        self.key_edit.editingFinished.connect(self.on_key_edited)
        self.key_button.clicked.connect(self.on_generate_key_clicked)
        self.lan_check.toggled.connect(self.on_lan_toggled)
        self.lan_nokey_check.toggled.connect(self.on_lan_nokey_toggled)
        self._applied: dict = {}
        self.apply_settings(settings or Settings())

    def apply_settings(self, s: Settings) -> None:
        """Show s without emitting setting_changed."""
        widgets = (self.port_spin, self.budget_spin, self.host_budget_spin, self.release_combo,
                   self.flash_combo, self.folder_edit, self.autostart_check, self.idle_spin,
                   self.key_edit,
                   self.lan_check, self.lan_nokey_check, self.notify_check)
        for w in widgets:
            w.blockSignals(True)
        try:
            self.port_spin.setValue(s.port)
            self.budget_spin.setValue(s.budget_mib)
            self.host_budget_spin.setValue(s.host_budget_mib)
            self.release_combo.setCurrentIndex(max(0, self.release_combo.findData(
                s.release_mode)))
            self.flash_combo.setCurrentIndex(max(0, self.flash_combo.findData(s.flash_attn)))
            self.folder_edit.setText(s.watched_folder)
            self.autostart_check.setChecked(s.autostart)
            self.idle_spin.setValue(s.idle_evict_min)
            self.key_edit.setText(s.api_key)
            self.lan_check.setChecked(s.lan)
            self.lan_nokey_check.setChecked(s.lan_without_key)
            self.notify_check.setChecked(s.notifications)
        finally:
            for w in widgets:
                w.blockSignals(False)
        self._applied = {"port": s.port, "budget_mib": s.budget_mib,
                         "host_budget_mib": s.host_budget_mib,
                         "release_mode": s.release_mode, "flash_attn": s.flash_attn,
                         "watched_folder": s.watched_folder, "autostart": s.autostart,
                         "idle_evict_min": s.idle_evict_min, "api_key": s.api_key,
                         "lan": s.lan, "lan_without_key": s.lan_without_key,
                         "notifications": s.notifications}
        self._update_lan()

    def _update_lan(self) -> None:
        lan = self.lan_check.isChecked()
        no_key = not self.key_edit.text().strip()
        self.lan_warning.setVisible(lan)
        self.lan_warning.setText(LAN_WARNING + (" " + LAN_NEEDS_KEY if no_key and not
                                                self.lan_nokey_check.isChecked() else ""))
        self.lan_nokey_check.setVisible(lan and no_key)

    def _edited(self, key: str, value) -> None:
        if self._applied.get(key) != value:
            self._applied[key] = value
            self.setting_changed.emit(key, value)

    @Slot()
    def on_port_edited(self) -> None:
        self._edited("port", self.port_spin.value())

    @Slot()
    def on_budget_edited(self) -> None:
        self._edited("budget_mib", self.budget_spin.value())

    @Slot()
    def on_host_budget_edited(self) -> None:
        self._edited("host_budget_mib", self.host_budget_spin.value())

    @Slot()
    def on_idle_edited(self) -> None:
        self._edited("idle_evict_min", self.idle_spin.value())

    @Slot(int)
    def on_release_mode_changed(self, _index: int) -> None:
        self._edited("release_mode", self.release_combo.currentData())

    @Slot(int)
    def on_flash_attn_changed(self, _index: int) -> None:
        self._edited("flash_attn", self.flash_combo.currentData())

    @Slot()
    def on_folder_edited(self) -> None:
        self._edited("watched_folder", self.folder_edit.text().strip())

    @Slot()
    def on_browse_clicked(self) -> None:
        folder = QFileDialog.getExistingDirectory(self, "Folder to watch for models",
                                                  self.folder_edit.text())
        if folder:
            self.folder_edit.setText(folder)
            self.on_folder_edited()

    @Slot(bool)
    def on_autostart_toggled(self, enabled: bool) -> None:
        self._edited("autostart", enabled)

    @Slot(bool)
    def on_notify_toggled(self, enabled: bool) -> None:
        self._edited("notifications", enabled)

    @Slot()
    def on_key_edited(self) -> None:
        self._update_lan()
        self._edited("api_key", self.key_edit.text().strip())

    @Slot()
    def on_generate_key_clicked(self) -> None:
        self.key_edit.setText("hs-" + secrets.token_urlsafe(24))
        self.on_key_edited()

    @Slot(bool)
    def on_lan_toggled(self, enabled: bool) -> None:
        self._update_lan()
        self._edited("lan", enabled)

    @Slot(bool)
    def on_lan_nokey_toggled(self, enabled: bool) -> None:
        self._update_lan()
        self._edited("lan_without_key", enabled)


def version() -> str:
    try:
        from importlib.metadata import version as v

        return v("hotseat")
    except Exception:                     # a bundle without the dist-info
        return "?"


class AboutDialog(QDialog):
    def __init__(self, device: str = "", parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName("about")
        self.setWindowTitle("About Hotseat")
        icon = QLabel()
        icon.setPixmap(app_icon().pixmap(64, 64))
        self.text = QLabel()
        self.text.setTextFormat(Qt.TextFormat.RichText)
        self.text.setWordWrap(True)
        self.set_device(device)
        top = QHBoxLayout()
        top.addWidget(icon, 0, Qt.AlignmentFlag.AlignTop)
        top.addWidget(self.text, 1)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Close)
        buttons.rejected.connect(self.hide)
        root = QVBoxLayout(self)
        root.addLayout(top)
        root.addWidget(buttons)

    def set_device(self, device: str) -> None:
        self.text.setText(
            f"<b style='font-size:13pt'>Hotseat {version()}</b><p>Several local LLMs (GGUF "
            "files) sharing one GPU, taking turns: the model in use is warm in VRAM, the "
            "others wait cold in RAM and come back with a copy, not a reload.</p>"
            "<p>An OpenAI-compatible endpoint on this computer, a Vulkan engine of its own. "
            f"MIT licence.</p><p>Device: {device or 'not open yet'}</p>")


class ModelOptionsDialog(QDialog):
    """A model's context size and cpu_moe; OK reloads it with them."""

    #: (name, n_ctx, cpu_moe): OK was clicked with these values
    chosen = Signal(str, int, float)

    def __init__(self, status: dict, parent: QWidget | None = None):
        super().__init__(parent)
        self.name = status["name"]
        self.setObjectName("modelOptions")
        self.setWindowTitle(f"{self.name}: options")
        self.ctx_spin = QSpinBox()
        self.ctx_spin.setRange(16, MAX_CTX)
        self.ctx_spin.setSingleStep(512)
        self.ctx_spin.setValue(int(status.get("n_ctx") or 2048))
        self.ctx_spin.setSuffix(" tokens")
        self.ctx_spin.setToolTip("The longest prompt and answer together; the KV cache grows "
                                 "with it")
        self.moe_spin = QDoubleSpinBox()
        self.moe_spin.setRange(0.0, 1000.0)
        self.moe_spin.setDecimals(2)
        self.moe_spin.setSingleStep(1.0)
        self.moe_spin.setValue(float(status.get("cpu_moe") or 0.0))
        self.moe_spin.setSpecialValueText("off (all on the GPU)")
        self.moe_spin.setToolTip("Mixture-of-experts models: keep the expert tensors of this "
                                 "many layers in RAM, which the GPU reads in place (like "
                                 "llama.cpp's --n-cpu-moe). Saves VRAM, same answers.")
        form = QFormLayout()
        form.addRow("Context size", self.ctx_spin)
        form.addRow("Experts in RAM (cpu_moe)", self.moe_spin)
        note = QLabel("OK loads the model again with these settings.")
        note.setWordWrap(True)
        self.buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Ok
                                        | QDialogButtonBox.StandardButton.Cancel)
        self.buttons.accepted.connect(self.on_accepted)
        self.buttons.rejected.connect(self.reject)
        root = QVBoxLayout(self)
        root.addLayout(form)
        root.addWidget(note)
        root.addWidget(self.buttons)

    @Slot()
    def on_accepted(self) -> None:
        self.chosen.emit(self.name, self.ctx_spin.value(), self.moe_spin.value())
        self.accept()
