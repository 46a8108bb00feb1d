"""The main window: one row per model, the VRAM budget, drag-and-drop loading, the endpoint
toggle and the settings.

Everything here reacts to the bridge's signals and asks the bridge for work; nothing waits
for the engine. Messages (a bad file, a refused pin) show in an inline label, never in a
modal dialog.
"""
from __future__ import annotations

import os

from PySide6.QtCore import QSize, Qt, QTimer, Signal, Slot
from PySide6.QtGui import QDragEnterEvent, QDropEvent
from PySide6.QtWidgets import (QCheckBox, QComboBox, QFileDialog, QFormLayout, QFrame,
                               QGridLayout, QGroupBox, QHBoxLayout, QLabel, QLineEdit,
                               QMainWindow, QProgressBar, QPushButton, QScrollArea, QSpinBox,
                               QToolButton, QVBoxLayout, QWidget)

from .bridge import EngineBridge
from .icons import app_icon
from .settings import FLASH_ATTN_MODES, RELEASE_MODES, Settings
from .vrambar import KIND_COLORS, KIND_LABELS, KINDS, Swatch, VramBar, format_bytes

REFRESH_MS = 1000
RELEASE_LABELS = {"full": "Full (weights, KV and compute)", "weights": "Weights only (KV stays)"}
FLASH_ATTN_LABELS = {"auto": "Automatic", "on": "On", "off": "Off"}
MAX_BUDGET_MIB = 1 << 20
BAR_TEXT_WIDTH = 220

STYLE = """
QFrame#modelRow { background: palette(base); border: 1px solid #d5d9e0; border-radius: 6px; }
QLabel#modelName { font-weight: 600; font-size: 11pt; }
QLabel#details, QLabel#barText, QLabel#deviceLabel { color: #5b6472; }
QLabel#badge { border-radius: 8px; padding: 1px 8px; font-weight: 600; font-size: 8pt;
               color: white; }
QLabel#badge[state="warm"] { background: #e4572e; }
QLabel#badge[state="cold"] { background: #4a78c2; }
QLabel#pinnedMark { color: #b5651d; font-size: 8pt; font-weight: 600; }
QLabel#message[kind="error"] { background: #fdecea; color: #8a1f11; border: 1px solid #f5c2bb;
                               border-radius: 4px; padding: 6px; }
QLabel#message[kind="info"] { background: #eef4fb; color: #1f3f66; border: 1px solid #c8dbf0;
                              border-radius: 4px; padding: 6px; }
QFrame#offer { background: #f3f8ee; border: 1px solid #cfe3bd; border-radius: 4px; }
QLabel#empty { color: #7a8494; font-size: 11pt; padding: 24px; }
"""


class ModelRow(QFrame):
    """One model: name, architecture, quantization, size, warm/cold badge, pin toggle, evict
    and unload buttons, and its VRAM bar against the budget."""

    #: (name, pinned): the pin toggle was clicked
    pin_toggled = Signal(str, bool)
    #: (name): the evict button was clicked
    evict_clicked = Signal(str)
    #: (name): the warm button (shown while the model is cold) was clicked
    warm_clicked = Signal(str)
    #: (name): the unload button was clicked
    unload_clicked = Signal(str)

    def __init__(self, status: dict, budget: int, parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName("modelRow")
        self.name = status["name"]
        self.status: dict = {}
        grid = QGridLayout(self)
        grid.setContentsMargins(10, 8, 10, 8)
        grid.setHorizontalSpacing(8)
        grid.setVerticalSpacing(4)

        self.name_label = QLabel(self.name, objectName="modelName")
        self.badge = QLabel(objectName="badge")
        self.pinned_mark = QLabel("PINNED", objectName="pinnedMark")
        self.details = QLabel(objectName="details")
        self.pin_button = QToolButton(text="Pin", checkable=True)
        self.pin_button.setToolTip("Keep this model warm: it is never evicted to make room")
        self.evict_button = QToolButton(text="Evict")
        self.warm_button = QToolButton(text="Warm")
        self.warm_button.setToolTip("Upload it to VRAM again now (others may be evicted)")
        self.unload_button = QToolButton(text="Unload")
        self.unload_button.setToolTip("Remove the model from the engine")
        self.bar = VramBar()
        self.bar_text = QLabel(objectName="barText")
        self.bar_text.setFixedWidth(BAR_TEXT_WIDTH)     # every bar as long as the others

        top = QHBoxLayout()
        top.setSpacing(8)
        top.addWidget(self.name_label)
        top.addWidget(self.badge)
        top.addWidget(self.pinned_mark)
        top.addStretch(1)
        top.addWidget(self.pin_button)
        top.addWidget(self.evict_button)
        top.addWidget(self.warm_button)
        top.addWidget(self.unload_button)
        grid.addLayout(top, 0, 0, 1, 2)
        grid.addWidget(self.details, 1, 0, 1, 2)
        grid.addWidget(self.bar, 2, 0)
        grid.addWidget(self.bar_text, 2, 1)
        grid.setColumnStretch(0, 1)

        self.pin_button.clicked.connect(self.on_pin_clicked)
        self.evict_button.clicked.connect(self.on_evict_clicked)
        self.warm_button.clicked.connect(self.on_warm_clicked)
        self.unload_button.clicked.connect(self.on_unload_clicked)
        self.update_status(status, budget)

    def update_status(self, status: dict, budget: int) -> None:
        self.status = status
        state = status.get("state", "cold")
        pinned = bool(status.get("pinned"))
        self.badge.setText(state.upper())
        if self.badge.property("state") != state:
            self.badge.setProperty("state", state)
            self.badge.style().unpolish(self.badge)
            self.badge.style().polish(self.badge)
        self.pinned_mark.setVisible(pinned)
        self.pin_button.setChecked(pinned)
        self.pin_button.setText("Pinned" if pinned else "Pin")
        self.evict_button.setEnabled(state == "warm" and not pinned)
        self.evict_button.setVisible(state == "warm")
        self.warm_button.setVisible(state != "warm")
        self.evict_button.setToolTip("Unpin it first" if pinned else
                                     "Free its VRAM now; it stays loaded in RAM")
        size = format_bytes(status.get("file_bytes", 0)) if status.get("file_bytes") else "?"
        self.details.setText(f"{status.get('arch', '?')}  ·  {status.get('quant', '?')}  ·  "
                             f"{size}  ·  ctx {status.get('n_ctx', '?')}")
        self.details.setToolTip(status.get("path", ""))
        self.set_budget(budget)

    def set_budget(self, budget: int) -> None:
        dev = self.status.get("device_bytes", {})
        self.bar.set_data(dev, budget, self.status.get("warm_bytes", 0))
        text = f"{format_bytes(sum(dev.values()))} of {format_bytes(budget)}"
        if self.status.get("state") == "cold" and self.status.get("host_shadow_bytes"):
            text += f"  (RAM {format_bytes(self.status['host_shadow_bytes'])})"
        self.bar_text.setText(text)

    @Slot(bool)
    def on_pin_clicked(self, checked: bool) -> None:
        self.pin_toggled.emit(self.name, checked)

    @Slot()
    def on_evict_clicked(self) -> None:
        self.evict_clicked.emit(self.name)

    @Slot()
    def on_warm_clicked(self) -> None:
        self.warm_clicked.emit(self.name)

    @Slot()
    def on_unload_clicked(self) -> None:
        self.unload_clicked.emit(self.name)


class OfferRow(QFrame):
    """"New model in the watched folder: X.gguf  [Add] [Dismiss]"."""

    #: (path): Add was clicked
    accepted = Signal(str)
    #: (path): Dismiss was clicked
    dismissed = Signal(str)

    def __init__(self, path: str, parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName("offer")
        self.path = path
        lay = QHBoxLayout(self)
        lay.setContentsMargins(8, 4, 8, 4)
        self.label = QLabel(f"New model in the watched folder: <b>{os.path.basename(path)}</b>")
        self.label.setToolTip(path)
        self.add_button = QPushButton("Add")
        self.dismiss_button = QPushButton("Dismiss")
        lay.addWidget(self.label, 1)
        lay.addWidget(self.add_button)
        lay.addWidget(self.dismiss_button)
        self.add_button.clicked.connect(self.on_add_clicked)
        self.dismiss_button.clicked.connect(self.on_dismiss_clicked)

    @Slot()
    def on_add_clicked(self) -> None:
        self.accepted.emit(self.path)

    @Slot()
    def on_dismiss_clicked(self) -> None:
        self.dismissed.emit(self.path)


class MainWindow(QMainWindow):
    #: (key, value): a setting was edited; keys are Settings field names (port, budget_mib,
    #: release_mode, flash_attn, watched_folder, autostart)
    setting_changed = Signal(str, object)

    def __init__(self, bridge: EngineBridge, settings: Settings | None = None,
                 parent: QWidget | None = None):
        super().__init__(parent)
        self.bridge = bridge
        self.rows: dict[str, ModelRow] = {}
        self.offers: dict[str, OfferRow] = {}
        self.loading: list[str] = []           # paths queued for loading, in order
        self.budget = 0
        self.hide_on_close = False             # with a tray icon, closing only hides
        self.setWindowTitle("Hotseat")
        self.setWindowIcon(app_icon())
        self.setAcceptDrops(True)
        self.setStyleSheet(STYLE)
        self._build()
        self.apply_settings(settings or Settings())
        if bridge.device_name:
            self.on_device_ready(bridge.device_name)

        bridge.device_ready.connect(self.on_device_ready)
        bridge.models_changed.connect(self.on_models_changed)
        bridge.vram_changed.connect(self.on_vram_changed)
        bridge.load_progress.connect(self.on_load_progress)
        bridge.load_finished.connect(self.on_load_finished)
        bridge.load_failed.connect(self.on_load_failed)
        bridge.error.connect(self.on_error)
        bridge.endpoint_changed.connect(self.on_endpoint_changed)

        self.timer = QTimer(self)
        self.timer.setInterval(REFRESH_MS)
        self.timer.timeout.connect(bridge.refresh)
        self.timer.start()

    # -- layout -----------------------------------------------------------------------------
    def _build(self) -> None:
        central = QWidget()
        root = QVBoxLayout(central)
        root.setContentsMargins(12, 10, 12, 10)
        root.setSpacing(8)

        header = QHBoxLayout()
        title = QLabel("<b style='font-size:14pt'>Hotseat</b>")
        self.device_label = QLabel("Opening the GPU…", objectName="deviceLabel")
        self.endpoint_toggle = QCheckBox("Local endpoint")
        self.endpoint_toggle.setToolTip("Serve the loaded models over the OpenAI API on "
                                        "127.0.0.1")
        self.endpoint_label = QLabel()
        self.endpoint_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        header.addWidget(title)
        header.addWidget(self.device_label)
        header.addStretch(1)
        header.addWidget(self.endpoint_toggle)
        header.addWidget(self.endpoint_label)
        root.addLayout(header)

        budget_row = QHBoxLayout()
        budget_row.addWidget(QLabel("VRAM"))
        self.total_bar = VramBar()
        self.total_bar.setMinimumHeight(16)
        self.total_label = QLabel(objectName="barText")
        self.total_label.setFixedWidth(BAR_TEXT_WIDTH + 10)   # the rows' frame margin
        budget_row.addWidget(self.total_bar, 1)
        budget_row.addWidget(self.total_label)
        root.addLayout(budget_row)

        legend = QHBoxLayout()
        legend.setSpacing(4)
        for kind in KINDS:
            legend.addWidget(Swatch(KIND_COLORS[kind]))
            legend.addWidget(QLabel(KIND_LABELS[kind]))
            legend.addSpacing(10)
        legend.addStretch(1)
        root.addLayout(legend)

        self.offer_box = QVBoxLayout()
        self.offer_box.setSpacing(4)
        root.addLayout(self.offer_box)

        msg_row = QHBoxLayout()
        self.message = QLabel(objectName="message")
        self.message.setWordWrap(True)
        self.message.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.message_close = QToolButton(text="✕")
        self.message_close.setAutoRaise(True)
        self.message_close.clicked.connect(self.on_message_closed)
        msg_row.addWidget(self.message, 1)
        msg_row.addWidget(self.message_close, 0, Qt.AlignmentFlag.AlignTop)
        root.addLayout(msg_row)
        self._show_message("", "info")

        progress_row = QHBoxLayout()
        self.progress_label = QLabel()
        self.progress = QProgressBar()
        self.progress.setRange(0, 100)
        progress_row.addWidget(self.progress_label)
        progress_row.addWidget(self.progress, 1)
        root.addLayout(progress_row)
        self._set_progress_visible(False)

        self.rows_widget = QWidget()
        self.rows_layout = QVBoxLayout(self.rows_widget)
        self.rows_layout.setContentsMargins(0, 0, 0, 0)
        self.rows_layout.setSpacing(6)
        self.empty_label = QLabel("Drop a .gguf model file here to load it.",
                                  objectName="empty")
        self.empty_label.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.rows_layout.addWidget(self.empty_label)
        self.rows_layout.addStretch(1)
        scroll = QScrollArea()
        scroll.setWidgetResizable(True)
        scroll.setFrameShape(QFrame.Shape.NoFrame)
        scroll.setWidget(self.rows_widget)
        root.addWidget(scroll, 1)

        root.addWidget(self._build_settings())
        self.setCentralWidget(central)
        self.statusBar().showMessage("Drop .gguf files onto the window to load them")

        self.endpoint_toggle.toggled.connect(self.on_endpoint_toggled)

    def _build_settings(self) -> QGroupBox:
        box = QGroupBox("Settings")
        form = QFormLayout(box)
        self.port_spin = QSpinBox()
        self.port_spin.setRange(0, 65535)
        self.port_spin.setSpecialValueText("any free port")
        self.budget_spin = QSpinBox()
        self.budget_spin.setRange(0, MAX_BUDGET_MIB)
        self.budget_spin.setSingleStep(256)
        self.budget_spin.setSuffix(" MiB")
        self.budget_spin.setSpecialValueText("automatic")
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
        folder_row = QHBoxLayout()
        self.folder_edit = QLineEdit()
        self.folder_edit.setPlaceholderText("none")
        self.folder_button = QPushButton("Browse…")
        folder_row.addWidget(self.folder_edit, 1)
        folder_row.addWidget(self.folder_button)
        self.autostart_check = QCheckBox("Start Hotseat at login")
        form.addRow("Endpoint port", self.port_spin)
        form.addRow("VRAM budget", self.budget_spin)
        form.addRow("Eviction", self.release_combo)
        form.addRow("Flash attention", self.flash_combo)
        form.addRow("Watched folder", folder_row)
        form.addRow("", self.autostart_check)

        self.port_spin.editingFinished.connect(self.on_port_edited)
        self.budget_spin.editingFinished.connect(self.on_budget_edited)
        self.release_combo.currentIndexChanged.connect(self.on_release_mode_changed)
        self.flash_combo.currentIndexChanged.connect(self.on_flash_attn_changed)
        self.folder_edit.editingFinished.connect(self.on_folder_edited)
        self.folder_button.clicked.connect(self.on_browse_clicked)
        self.autostart_check.toggled.connect(self.on_autostart_toggled)
        return box

    def sizeHint(self) -> QSize:
        return QSize(820, 600)

    def apply_settings(self, s: Settings) -> None:
        """Show s in the settings area without emitting setting_changed."""
        widgets = (self.port_spin, self.budget_spin, self.release_combo, self.flash_combo,
                   self.folder_edit, self.autostart_check)
        for w in widgets:
            w.blockSignals(True)
        try:
            self.port_spin.setValue(s.port)
            self.budget_spin.setValue(s.budget_mib)
            self.release_combo.setCurrentIndex(max(0, self.release_combo.findData(
                s.release_mode)))
            self.flash_combo.setCurrentIndex(max(0, self.flash_combo.findData(s.flash_attn)))
            self.folder_edit.setText(s.watched_folder)
            self.autostart_check.setChecked(s.autostart)
        finally:
            for w in widgets:
                w.blockSignals(False)
        self._applied = {"port": s.port, "budget_mib": s.budget_mib,
                         "release_mode": s.release_mode, "flash_attn": s.flash_attn,
                         "watched_folder": s.watched_folder, "autostart": s.autostart}

    def _edited(self, key: str, value) -> None:
        if self._applied.get(key) != value:
            self._applied[key] = value
            self.setting_changed.emit(key, value)

    # -- messages and progress ----------------------------------------------------------------
    def _show_message(self, text: str, kind: str = "info") -> None:
        self.message.setText(text)
        self.message.setProperty("kind", kind)
        self.message.style().unpolish(self.message)
        self.message.style().polish(self.message)
        self.message.setVisible(bool(text))
        self.message_close.setVisible(bool(text))

    def show_error(self, text: str) -> None:
        self._show_message(text, "error")

    def show_info(self, text: str) -> None:
        self._show_message(text, "info")

    def _set_progress_visible(self, visible: bool) -> None:
        self.progress.setVisible(visible)
        self.progress_label.setVisible(visible)

    def _update_progress_label(self) -> None:
        if not self.loading:
            self._set_progress_visible(False)
            return
        n = len(self.loading)
        more = f" (+{n - 1} queued)" if n > 1 else ""
        self.progress_label.setText(f"Loading {os.path.basename(self.loading[0])}{more}")
        self._set_progress_visible(True)

    # -- loading ------------------------------------------------------------------------------
    def load_paths(self, paths: list[str]) -> None:
        for path in paths:
            self.loading.append(path)
            self.bridge.load(path)
        if paths:
            if len(self.loading) == len(paths):
                self.progress.setValue(0)
            self._update_progress_label()

    @staticmethod
    def _local_files(event) -> list[str]:
        mime = event.mimeData()
        if not mime.hasUrls():
            return []
        return [u.toLocalFile() for u in mime.urls() if u.isLocalFile() and u.toLocalFile()]

    def dragEnterEvent(self, event: QDragEnterEvent) -> None:
        if self._local_files(event):
            event.acceptProposedAction()
        else:
            event.ignore()

    def dragMoveEvent(self, event) -> None:
        if self._local_files(event):
            event.acceptProposedAction()
        else:
            event.ignore()

    def dropEvent(self, event: QDropEvent) -> None:
        paths = self._local_files(event)
        if not paths:
            event.ignore()
            return
        event.acceptProposedAction()
        folders = [p for p in paths if os.path.isdir(p)]
        if folders:
            self.show_error(f"{os.path.basename(folders[0])} is a folder; drop .gguf files, "
                            "or set it as the watched folder")
        self.load_paths([p for p in paths if not os.path.isdir(p)])

    @Slot(str, "qlonglong", "qlonglong")
    def on_load_progress(self, path: str, done: int, total: int) -> None:
        if path not in self.loading:
            self.loading.insert(0, path)       # a load not started here (restored at start)
        if self.loading[0] != path:
            self.loading.remove(path)
            self.loading.insert(0, path)
        self.progress.setValue(int(done * 100 // total) if total else 100)
        self._update_progress_label()

    def _load_done(self, path: str) -> None:
        if path in self.loading:
            self.loading.remove(path)
        self.progress.setValue(0)
        self._update_progress_label()

    @Slot(str, str)
    def on_load_finished(self, path: str, name: str) -> None:
        self._load_done(path)
        self.statusBar().showMessage(f"Loaded {name}", 5000)
        self.drop_offer(path)

    @Slot(str, str)
    def on_load_failed(self, path: str, message: str) -> None:
        self._load_done(path)
        self.show_error(f"Could not load {os.path.basename(path)}: {message}")

    @Slot(str)
    def on_error(self, message: str) -> None:
        self.show_error(message)

    @Slot()
    def on_message_closed(self) -> None:
        self._show_message("", "info")

    # -- models -------------------------------------------------------------------------------
    @Slot(str)
    def on_device_ready(self, name: str) -> None:
        self.device_label.setText(name)

    @Slot(list)
    def on_models_changed(self, models: list) -> None:
        seen = set()
        for i, status in enumerate(models):
            name = status["name"]
            seen.add(name)
            row = self.rows.get(name)
            if row is None:
                row = ModelRow(status, self.budget)
                row.pin_toggled.connect(self.on_pin_toggled)
                row.evict_clicked.connect(self.bridge.evict)
                row.warm_clicked.connect(self.bridge.warm)
                row.unload_clicked.connect(self.bridge.unload)
                self.rows[name] = row
                self.rows_layout.insertWidget(i, row)
            else:
                row.update_status(status, self.budget)
                if self.rows_layout.indexOf(row) != i:
                    self.rows_layout.removeWidget(row)
                    self.rows_layout.insertWidget(i, row)
        for name in [n for n in self.rows if n not in seen]:
            row = self.rows.pop(name)
            self.rows_layout.removeWidget(row)
            row.deleteLater()
        self.empty_label.setVisible(not self.rows)
        loaded = {s["path"] for s in models}
        for path in [p for p in self.offers if p in loaded]:
            self.drop_offer(path)
        self._total_from_rows()

    @Slot(str, bool)
    def on_pin_toggled(self, name: str, pinned: bool) -> None:
        self.bridge.set_pinned(name, pinned)

    @Slot(dict)
    def on_vram_changed(self, vram: dict) -> None:
        self.budget = int(vram.get("budget_bytes", 0))
        for row in self.rows.values():
            row.set_budget(self.budget)
        self._total_from_rows()

    def _total_from_rows(self) -> None:
        total: dict[str, int] = {}
        for row in self.rows.values():
            for k, v in row.status.get("device_bytes", {}).items():
                total[k] = total.get(k, 0) + v
        self.total_bar.set_data(total, self.budget)
        self.total_label.setText(f"{format_bytes(sum(total.values()))} of "
                                 f"{format_bytes(self.budget)} budget")

    # -- endpoint -----------------------------------------------------------------------------
    @Slot(bool)
    def on_endpoint_toggled(self, enabled: bool) -> None:
        self.endpoint_label.setText("starting…" if enabled else "")
        self.bridge.set_endpoint(enabled)

    @Slot(bool, str)
    def on_endpoint_changed(self, running: bool, detail: str) -> None:
        self.endpoint_toggle.blockSignals(True)
        self.endpoint_toggle.setChecked(running)
        self.endpoint_toggle.blockSignals(False)
        self.endpoint_label.setText(f"<a href='{detail}'>{detail}</a>" if running else "")
        self.endpoint_label.setOpenExternalLinks(running)

    # -- watched folder -----------------------------------------------------------------------
    @Slot(str)
    def on_model_offered(self, path: str) -> None:
        loaded = {row.status.get("path") for row in self.rows.values()}
        if path in self.offers or path in loaded or path in self.loading:
            return
        offer = OfferRow(path)
        offer.accepted.connect(self.on_offer_accepted)
        offer.dismissed.connect(self.drop_offer)
        self.offers[path] = offer
        self.offer_box.addWidget(offer)

    @Slot(str)
    def on_offer_accepted(self, path: str) -> None:
        self.drop_offer(path)
        self.load_paths([path])

    @Slot(str)
    def drop_offer(self, path: str) -> None:
        offer = self.offers.pop(path, None)
        if offer is not None:
            self.offer_box.removeWidget(offer)
            offer.deleteLater()

    # -- settings -----------------------------------------------------------------------------
    @Slot()
    def on_port_edited(self) -> None:
        self._edited("port", self.port_spin.value())

    @Slot()
    def on_budget_edited(self) -> None:
        self._edited("budget_mib", self.budget_spin.value())

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

    def closeEvent(self, event) -> None:
        if self.hide_on_close:
            event.ignore()
            self.hide()
        else:
            event.accept()
