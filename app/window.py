"""The main window: one row per model with its stacked VRAM bar, the budget, a progress row
per pending load, the endpoint toggle with its URL, a chat box, the activity log.

Everything here reacts to the bridge's signals and asks the bridge for work; nothing waits
for the engine. Messages (a bad file, a refused pin) show in an inline banner in words for
people, the engine's own text behind Details; settings live in the Preferences dialog.
Controls keep their place: the endpoint toggle does not move when its URL appears, and a
row's Warm and Evict buttons are both always there, one of them disabled.
"""
from __future__ import annotations

import os
import time

from PySide6.QtCore import QSize, Qt, QTimer, Signal, Slot
from PySide6.QtGui import QDragEnterEvent, QDropEvent, QGuiApplication
from PySide6.QtWidgets import (QCheckBox, QFileDialog, QFrame, QGridLayout, QHBoxLayout,
                               QLabel, QMainWindow, QPlainTextEdit, QProgressBar, QPushButton,
                               QScrollArea, QTabWidget, QToolButton, QVBoxLayout, QWidget)

from .bridge import EngineBridge
from .chat import ChatPanel
from .dialogs import AboutDialog, ModelOptionsDialog, PreferencesDialog
from .errors import friendly
from .icons import app_icon
from .settings import Settings
from .vrambar import VramBar, breakdown_html, format_bytes

REFRESH_MS = 1000
BAR_TEXT_WIDTH = 220
SUFFIX = ".gguf"
SOFTWARE_RENDERERS = ("llvmpipe", "lavapipe", "swiftshader", "softpipe")
SOFTWARE_WARNING = "No GPU found: running on the CPU, slow"
LOG_LINES = 500

STYLE = """
QFrame#modelRow { background: palette(base); border: 1px solid #d5d9e0; border-radius: 6px; }
QFrame#modelRow[selected="true"] { border: 2px solid #4a78c2; }
QFrame#pendingRow { background: palette(base); border: 1px dashed #b9c0cb; border-radius: 6px; }
QLabel#modelName { font-weight: 600; font-size: 11pt; }
QLabel#details, QLabel#barText, QLabel#deviceLabel, QLabel#breakdown { color: #5b6472; }
QLabel#busy { color: #1f6f3f; font-weight: 600; }
QLabel#badge { border-radius: 8px; padding: 1px 8px; font-weight: 600; font-size: 8pt;
               color: white; }
QLabel#badge[state="warm"] { background: #e4572e; }
QLabel#badge[state="cold"] { background: #4a78c2; }
QLabel#pinnedMark { color: #b5651d; font-size: 8pt; font-weight: 600; }
QLabel#message[kind="error"] { background: #fdecea; color: #8a1f11; border: 1px solid #f5c2bb;
                               border-radius: 4px; padding: 6px; }
QLabel#message[kind="info"] { background: #eef4fb; color: #1f3f66; border: 1px solid #c8dbf0;
                              border-radius: 4px; padding: 6px; }
QLabel#banner { background: #fff4e5; color: #7a4100; border: 1px solid #f3c98b;
                border-radius: 4px; padding: 6px; font-weight: 600; }
QLabel#arenaBanner { background: #eceff3; color: #3b4452; border: 1px solid #c7ced8;
                     border-radius: 4px; padding: 6px; font-weight: 600; }
QPlainTextEdit#details { color: #5b6472; font-family: monospace; }
QFrame#offer { background: #f3f8ee; border: 1px solid #cfe3bd; border-radius: 4px; }
QLabel#empty { color: #7a8494; font-size: 11pt; padding: 24px; }
"""


def is_software_renderer(device: str) -> bool:
    d = device.lower()
    return any(s in d for s in SOFTWARE_RENDERERS)


def arena_text(st: dict) -> str:
    """What the window and the tray say about the arena; "" when there is nothing to say."""
    state = st.get("state")
    if state == "yielded":
        until = st.get("until")
        if until:
            return f"Yielded to another app until {time.strftime('%H:%M', time.localtime(until))}"
        return "Yielded to another app"
    if state == "waiting":
        pid = st.get("holder_pid")
        return "Waiting for the GPU" + (f" (another app, pid {pid}, has it)" if pid else "")
    return ""


class ModelRow(QFrame):
    """One model: name, warm/cold badge, what it is busy with, pin, warm, evict, options and
    unload buttons, its details, its VRAM bar against the budget and the breakdown by kind."""

    #: (name, pinned): the pin toggle was clicked
    pin_toggled = Signal(str, bool)
    #: (name): the evict button was clicked
    evict_clicked = Signal(str)
    #: (name): the warm button was clicked
    warm_clicked = Signal(str)
    #: (name): the unload button was clicked
    unload_clicked = Signal(str)
    #: (name): the options button was clicked
    options_clicked = Signal(str)

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
        self.busy_label = QLabel(objectName="busy")
        self.details = QLabel(objectName="details")
        self.pin_button = QToolButton(text="Pin", checkable=True)
        self.pin_button.setToolTip("Keep this model warm: it is never evicted to make room")
        self.pin_button.setFixedWidth(self.pin_button.fontMetrics().horizontalAdvance(
            "Pinned") + 24)                            # "Pin" and "Pinned" the same width
        self.warm_button = QToolButton(text="Warm")
        self.warm_button.setToolTip("Upload it to VRAM again now (others may be evicted)")
        self.evict_button = QToolButton(text="Evict")
        self.options_button = QToolButton(text="Options…")
        self.options_button.setToolTip("Context size and experts in RAM (cpu_moe)")
        self.unload_button = QToolButton(text="Unload")
        self.unload_button.setToolTip("Remove the model from the engine")
        self.bar = VramBar()
        self.bar_text = QLabel(objectName="barText")
        self.bar_text.setFixedWidth(BAR_TEXT_WIDTH)     # every bar as long as the others
        self.breakdown = QLabel(objectName="breakdown")
        self.breakdown.setTextFormat(Qt.TextFormat.RichText)

        top = QHBoxLayout()
        top.setSpacing(8)
        top.addWidget(self.name_label)
        top.addWidget(self.badge)
        top.addWidget(self.pinned_mark)
        top.addWidget(self.busy_label)
        top.addStretch(1)
        for b in (self.pin_button, self.warm_button, self.evict_button, self.options_button,
                  self.unload_button):
            top.addWidget(b)
        grid.addLayout(top, 0, 0, 1, 2)
        grid.addWidget(self.details, 1, 0, 1, 2)
        grid.addWidget(self.bar, 2, 0)
        grid.addWidget(self.bar_text, 2, 1)
        grid.addWidget(self.breakdown, 3, 0, 1, 2)
        grid.setColumnStretch(0, 1)

        self.pin_button.clicked.connect(self.on_pin_clicked)
        self.evict_button.clicked.connect(self.on_evict_clicked)
        self.warm_button.clicked.connect(self.on_warm_clicked)
        self.options_button.clicked.connect(self.on_options_clicked)
        self.unload_button.clicked.connect(self.on_unload_clicked)
        self.set_selected(False)
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
        self.warm_button.setEnabled(state != "warm")
        self.evict_button.setToolTip("Unpin it first" if pinned else
                                     "Free its VRAM now; it stays loaded in RAM")
        size = format_bytes(status.get("file_bytes", 0)) if status.get("file_bytes") else "?"
        moe = f"  ·  cpu_moe {status['cpu_moe']:g}" if status.get("cpu_moe") else ""
        self.details.setText(f"{status.get('arch', '?')}  ·  {status.get('quant', '?')}  ·  "
                             f"{size}  ·  ctx {status.get('n_ctx', '?')}{moe}")
        self.details.setToolTip(status.get("path", ""))
        self.set_budget(budget)

    def set_budget(self, budget: int) -> None:
        dev = self.status.get("device_bytes", {})
        self.bar.set_data(dev, budget, self.status.get("warm_bytes", 0))
        text = f"{format_bytes(sum(dev.values()))} of {format_bytes(budget)}"
        if self.status.get("state") == "cold" and self.status.get("host_shadow_bytes"):
            text += f"  (RAM {format_bytes(self.status['host_shadow_bytes'])})"
        self.bar_text.setText(text)
        html = breakdown_html(dev)
        self.breakdown.setText(html or "Nothing in VRAM")

    def set_busy(self, text: str) -> None:
        self.busy_label.setText(text)

    def set_selected(self, selected: bool) -> None:
        self.setProperty("selected", "true" if selected else "false")
        self.style().unpolish(self)
        self.style().polish(self)

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
    def on_options_clicked(self) -> None:
        self.options_clicked.emit(self.name)

    @Slot()
    def on_unload_clicked(self) -> None:
        self.unload_clicked.emit(self.name)


class PendingRow(QFrame):
    """A model on its way: waiting, reading the file (no progress to show), uploading (a
    percentage), until its row is in the list."""

    def __init__(self, path: str, parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName("pendingRow")
        self.path = path
        lay = QHBoxLayout(self)
        lay.setContentsMargins(10, 6, 10, 6)
        self.name_label = QLabel(f"<b>{os.path.basename(path)}</b>")
        self.name_label.setToolTip(path)
        self.stage_label = QLabel()
        self.stage_label.setObjectName("barText")
        self.stage_label.setFixedWidth(150)
        self.bar = QProgressBar()
        self.bar.setTextVisible(False)
        self.bar.setMaximumHeight(12)
        lay.addWidget(self.name_label)
        lay.addWidget(self.stage_label)
        lay.addWidget(self.bar, 1)
        self.stage = ""
        self.set_stage("waiting")

    def set_stage(self, stage: str, done: int = 0, total: int = 0) -> None:
        """"waiting", "reading" or "uploading" (with done of total bytes)."""
        self.stage = stage
        if stage == "uploading":
            pct = int(done * 100 // total) if total else 100
            self.bar.setRange(0, 100)
            self.bar.setValue(pct)
            self.stage_label.setText(f"Uploading {pct}%")
        elif stage == "reading":
            self.bar.setRange(0, 0)                    # busy, no percentage
            self.stage_label.setText("Reading the file…")
        else:
            self.bar.setRange(0, 100)
            self.bar.setValue(0)
            self.stage_label.setText("Waiting")

    @property
    def percent(self) -> int:
        return self.bar.value() if self.stage == "uploading" else 0


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
    #: (key, value): a setting was edited in Preferences; keys are Settings field names
    setting_changed = Signal(str, object)
    #: (name, n_ctx, cpu_moe): a model's options were changed (it is being reloaded)
    model_options_changed = Signal(str, int, float)
    #: the window was hidden or shown (for notifications and the saved geometry)
    visibility_changed = Signal(bool)

    def __init__(self, bridge: EngineBridge, settings: Settings | None = None,
                 parent: QWidget | None = None):
        super().__init__(parent)
        self.bridge = bridge
        self.rows: dict[str, ModelRow] = {}
        self.pending: dict[str, PendingRow] = {}
        self.offers: dict[str, OfferRow] = {}
        self.busy: dict[str, str] = {}
        self.selected = ""
        self.budget = 0
        self.hide_on_close = False             # with a tray icon, closing only hides
        self.quitting = False                  # set by the quit path: closing then closes
        self.endpoint_url = ""
        self.setWindowTitle("Hotseat")
        self.setWindowIcon(app_icon())
        self.setAcceptDrops(True)
        self.setStyleSheet(STYLE)
        self.preferences = PreferencesDialog(settings, self)
        self.preferences.setting_changed.connect(self.setting_changed)
        self.about = AboutDialog(bridge.device_name, self)
        self.options_dialog: ModelOptionsDialog | None = None
        self._build()
        if bridge.device_name:
            self.on_device_ready(bridge.device_name)

        bridge.device_ready.connect(self.on_device_ready)
        bridge.models_changed.connect(self.on_models_changed)
        bridge.vram_changed.connect(self.on_vram_changed)
        bridge.load_started.connect(self.on_load_started)
        bridge.load_progress.connect(self.on_load_progress)
        bridge.load_finished.connect(self.on_load_finished)
        bridge.load_failed.connect(self.on_load_failed)
        bridge.error.connect(self.on_error)
        bridge.endpoint_changed.connect(self.on_endpoint_changed)
        bridge.busy_changed.connect(self.on_busy_changed)
        bridge.log_entry.connect(self.on_log_entry)
        bridge.arena_changed.connect(self.on_arena_changed)

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
        self.endpoint_toggle.setToolTip("Serve the loaded models over the OpenAI API")
        self.endpoint_label = QLabel()
        self.endpoint_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse
                                                    | Qt.TextInteractionFlag.LinksAccessibleByMouse)
        # room for the longest URL, so the toggle beside it never moves
        self.endpoint_label.setFixedWidth(self.endpoint_label.fontMetrics().horizontalAdvance(
            "http://127.0.0.255:65535") + 12)
        self.copy_button = QToolButton(text="Copy URL")
        self.copy_button.setToolTip("Copy the endpoint's base URL (for an OpenAI client)")
        self.copy_button.setEnabled(False)
        header.addWidget(title)
        header.addWidget(self.device_label)
        header.addStretch(1)
        header.addWidget(self.endpoint_toggle)
        header.addWidget(self.endpoint_label)
        header.addWidget(self.copy_button)
        root.addLayout(header)

        self.software_banner = QLabel(SOFTWARE_WARNING, objectName="banner")
        self.software_banner.setToolTip("Vulkan found only a software renderer (Mesa's "
                                        "llvmpipe / lavapipe). Models run, but far slower "
                                        "than on a GPU.")
        self.software_banner.hide()
        root.addWidget(self.software_banner)
        self.arena_banner = QLabel(objectName="arenaBanner")
        self.arena_banner.hide()
        root.addWidget(self.arena_banner)

        actions = QHBoxLayout()
        self.add_button = QPushButton("Add model…")
        self.add_button.setToolTip("Load a .gguf model file (or drop one on the window)")
        self.prefs_button = QPushButton("Preferences…")
        self.about_button = QPushButton("About")
        actions.addWidget(self.add_button)
        actions.addStretch(1)
        actions.addWidget(self.prefs_button)
        actions.addWidget(self.about_button)
        root.addLayout(actions)

        budget_row = QHBoxLayout()
        budget_row.addWidget(QLabel("VRAM"))
        self.total_bar = VramBar()
        self.total_bar.setMinimumHeight(16)
        self.total_label = QLabel(objectName="barText")
        self.total_label.setFixedWidth(BAR_TEXT_WIDTH + 10)   # the rows' frame margin
        budget_row.addWidget(self.total_bar, 1)
        budget_row.addWidget(self.total_label)
        root.addLayout(budget_row)
        self.legend = QLabel(objectName="breakdown")
        self.legend.setTextFormat(Qt.TextFormat.RichText)
        root.addWidget(self.legend)

        self.offer_box = QVBoxLayout()
        self.offer_box.setSpacing(4)
        root.addLayout(self.offer_box)

        msg_row = QHBoxLayout()
        self.message = QLabel(objectName="message")
        self.message.setWordWrap(True)
        self.message.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.details_button = QToolButton(text="Details", checkable=True)
        self.message_close = QToolButton(text="✕")
        self.message_close.setAutoRaise(True)
        msg_row.addWidget(self.message, 1)
        msg_row.addWidget(self.details_button, 0, Qt.AlignmentFlag.AlignTop)
        msg_row.addWidget(self.message_close, 0, Qt.AlignmentFlag.AlignTop)
        root.addLayout(msg_row)
        self.details_text = QPlainTextEdit(objectName="details", readOnly=True)
        self.details_text.setMaximumHeight(70)
        root.addWidget(self.details_text)
        self._show_message("", "info")

        self.pending_box = QVBoxLayout()
        self.pending_box.setSpacing(4)
        root.addLayout(self.pending_box)

        self.rows_widget = QWidget()
        self.rows_layout = QVBoxLayout(self.rows_widget)
        self.rows_layout.setContentsMargins(0, 0, 0, 0)
        self.rows_layout.setSpacing(6)
        self.empty_label = QLabel("Drop a .gguf model file here, or use Add model…",
                                  objectName="empty")
        self.empty_label.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.rows_layout.addWidget(self.empty_label)
        self.rows_layout.addStretch(1)
        self.scroll = QScrollArea()
        self.scroll.setWidgetResizable(True)
        self.scroll.setFrameShape(QFrame.Shape.NoFrame)
        self.scroll.setWidget(self.rows_widget)

        self.chat = ChatPanel(self.bridge)
        self.log_view = QPlainTextEdit(readOnly=True)
        self.log_view.setMaximumBlockCount(LOG_LINES)
        self.log_view.setPlaceholderText("Loads, requests and evictions show here.")
        self.tabs = QTabWidget()
        self.tabs.addTab(self.scroll, "Models")
        self.tabs.addTab(self.chat, "Chat")
        self.tabs.addTab(self.log_view, "Activity")
        root.addWidget(self.tabs, 1)

        self.setCentralWidget(central)
        self.statusBar().showMessage("Drop .gguf files onto the window to load them")

        self.endpoint_toggle.toggled.connect(self.on_endpoint_toggled)
        self.copy_button.clicked.connect(self.on_copy_url_clicked)
        self.add_button.clicked.connect(self.on_add_clicked)
        self.prefs_button.clicked.connect(self.on_preferences_clicked)
        self.about_button.clicked.connect(self.on_about_clicked)
        self.details_button.toggled.connect(self.on_details_toggled)
        self.message_close.clicked.connect(self.on_message_closed)

    def sizeHint(self) -> QSize:
        return QSize(860, 620)

    def apply_settings(self, s: Settings) -> None:
        self.preferences.apply_settings(s)

    # -- messages -----------------------------------------------------------------------------
    def _show_message(self, text: str, kind: str = "info", details: str = "") -> None:
        self.message.setText(text)
        self.message.setProperty("kind", kind)
        self.message.style().unpolish(self.message)
        self.message.style().polish(self.message)
        self.message.setVisible(bool(text))
        self.message_close.setVisible(bool(text))
        self.details_text.setPlainText(details)
        self.details_button.setVisible(bool(text and details and details != text))
        self.details_button.setChecked(False)
        self.details_text.setVisible(False)

    def show_error(self, text: str, details: str = "") -> None:
        self._show_message(text, "error", details)

    def show_info(self, text: str) -> None:
        self._show_message(text, "info")

    @Slot(bool)
    def on_details_toggled(self, shown: bool) -> None:
        self.details_text.setVisible(shown)

    @Slot()
    def on_message_closed(self) -> None:
        self._show_message("", "info")

    @Slot(str)
    def on_error(self, message: str) -> None:
        summary, details = friendly(message)
        self.show_error(summary, details)

    @Slot(str)
    def on_log_entry(self, line: str) -> None:
        self.log_view.appendPlainText(line)

    # -- loading ------------------------------------------------------------------------------
    def add_pending(self, path: str) -> PendingRow:
        row = self.pending.get(path)
        if row is None:
            row = PendingRow(path)
            self.pending[path] = row
            self.pending_box.addWidget(row)
        self._update_empty()
        return row

    def drop_pending(self, path: str) -> None:
        row = self.pending.pop(path, None)
        if row is not None:
            self.pending_box.removeWidget(row)
            row.deleteLater()
        self._update_empty()

    @property
    def loading(self) -> list[str]:
        """The paths on their way, in order."""
        return list(self.pending)

    def _loaded_paths(self) -> dict[str, str]:
        return {row.status.get("path"): name for name, row in self.rows.items()}

    def load_paths(self, paths: list[str]) -> None:
        loaded = self._loaded_paths()
        for path in paths:
            path = os.path.abspath(path)
            if path in loaded:
                self.select_row(loaded[path])          # already there: show it
                self.statusBar().showMessage(f"{os.path.basename(path)} is already loaded",
                                             5000)
                continue
            if path in self.pending:
                continue
            self.add_pending(path)
            self.bridge.load(path)

    @staticmethod
    def _local_files(event) -> list[str]:
        mime = event.mimeData()
        if not mime.hasUrls():
            return []
        return [u.toLocalFile() for u in mime.urls() if u.isLocalFile() and u.toLocalFile()]

    @classmethod
    def _models_in(cls, event) -> list[str]:
        """The dragged paths when every one is a .gguf file; [] otherwise (not allowed)."""
        paths = cls._local_files(event)
        if paths and all(p.lower().endswith(SUFFIX) and not os.path.isdir(p) for p in paths):
            return paths
        return []

    def dragEnterEvent(self, event: QDragEnterEvent) -> None:
        if self._models_in(event):
            event.acceptProposedAction()
        else:
            event.ignore()                         # the cursor shows "not allowed"

    def dragMoveEvent(self, event) -> None:
        self.dragEnterEvent(event)

    def dropEvent(self, event: QDropEvent) -> None:
        paths = self._models_in(event)
        if not paths:
            event.ignore()
            return
        event.acceptProposedAction()
        self.load_paths(paths)

    @Slot()
    def on_add_clicked(self) -> None:
        start = os.path.dirname(next(iter(self._loaded_paths()), "") or "") or \
            os.path.expanduser("~")
        paths, _ = QFileDialog.getOpenFileNames(self, "Add a model", start,
                                                "GGUF models (*.gguf);;All files (*)")
        if paths:
            self.load_paths(paths)

    @Slot(str)
    def on_load_started(self, path: str) -> None:
        self.add_pending(path).set_stage("reading")

    @Slot(str, "qlonglong", "qlonglong")
    def on_load_progress(self, path: str, done: int, total: int) -> None:
        self.add_pending(path).set_stage("uploading", done, total)

    @Slot(str, str)
    def on_load_finished(self, path: str, name: str) -> None:
        # the pending row stays until the model's row is there (models_changed)
        if path in self.pending:
            self.pending[path].set_stage("uploading", 1, 1)
        self.statusBar().showMessage(f"Loaded {name}", 5000)
        self.drop_offer(path)
        if name in self.rows:
            self.drop_pending(path)

    @Slot(str, str)
    def on_load_failed(self, path: str, message: str) -> None:
        self.drop_pending(path)
        summary, details = friendly(message)
        self.show_error(f"Could not load {os.path.basename(path)}: {summary}", details)

    # -- models -------------------------------------------------------------------------------
    @Slot(str)
    def on_device_ready(self, name: str) -> None:
        self.device_label.setText(name)
        self.software_banner.setVisible(is_software_renderer(name))
        self.about.set_device(name)

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
                row.options_clicked.connect(self.on_options_clicked)
                row.set_busy(self.busy.get(name, ""))
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
            if self.selected == name:
                self.selected = ""
        loaded = {s["path"] for s in models}
        for path in [p for p in self.pending if p in loaded]:
            self.drop_pending(path)                   # its row is ready
        for path in [p for p in self.offers if p in loaded]:
            self.drop_offer(path)
        self._update_empty()
        self._total_from_rows()

    def _update_empty(self) -> None:
        self.empty_label.setVisible(not self.rows and not self.pending)

    def select_row(self, name: str) -> None:
        self.selected = name
        for n, row in self.rows.items():
            row.set_selected(n == name)
        if name in self.rows:
            self.tabs.setCurrentWidget(self.scroll)
            self.scroll.ensureWidgetVisible(self.rows[name])
            self.chat.select_model(name)

    @Slot(dict)
    def on_busy_changed(self, busy: dict) -> None:
        self.busy = dict(busy)
        for name, row in self.rows.items():
            row.set_busy(self.busy.get(name, ""))

    @Slot(str, bool)
    def on_pin_toggled(self, name: str, pinned: bool) -> None:
        self.bridge.set_pinned(name, pinned)

    @Slot(str)
    def on_options_clicked(self, name: str) -> None:
        row = self.rows.get(name)
        if row is None:
            return
        if self.options_dialog is not None:
            self.options_dialog.deleteLater()
        self.options_dialog = ModelOptionsDialog(row.status, self)
        self.options_dialog.chosen.connect(self.on_options_chosen)
        self.options_dialog.show()

    @Slot(str, int, float)
    def on_options_chosen(self, name: str, n_ctx: int, cpu_moe: float) -> None:
        row = self.rows.get(name)
        if row is None:
            return
        if (n_ctx, cpu_moe) == (row.status.get("n_ctx"), float(row.status.get("cpu_moe") or 0)):
            return
        self.add_pending(row.status["path"])
        self.model_options_changed.emit(name, n_ctx, cpu_moe)
        self.bridge.reload(name, n_ctx, cpu_moe)

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
        self.legend.setText(breakdown_html(total, values=False))   # only the kinds present
        self.legend.setVisible(bool(self.legend.text()))

    @Slot(dict)
    def on_arena_changed(self, st: dict) -> None:
        text = arena_text(st)
        self.arena_banner.setText(text)
        self.arena_banner.setVisible(bool(text))

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
        self.endpoint_url = detail if running else ""
        self.endpoint_label.setText(f"<a href='{detail}'>{detail}</a>" if running else "")
        self.endpoint_label.setOpenExternalLinks(running)
        self.copy_button.setEnabled(running)

    @Slot()
    def on_copy_url_clicked(self) -> None:
        if self.endpoint_url:
            QGuiApplication.clipboard().setText(self.endpoint_url + "/v1")
            self.statusBar().showMessage(f"Copied {self.endpoint_url}/v1", 3000)

    # -- dialogs ------------------------------------------------------------------------------
    @Slot()
    def on_preferences_clicked(self) -> None:
        self.preferences.show()
        self.preferences.raise_()

    @Slot()
    def on_about_clicked(self) -> None:
        self.about.show()
        self.about.raise_()

    # -- watched folder -----------------------------------------------------------------------
    @Slot(str)
    def on_model_offered(self, path: str) -> None:
        if path in self.offers or path in self._loaded_paths() or path in self.pending:
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

    # -- window -------------------------------------------------------------------------------
    def showEvent(self, event) -> None:
        super().showEvent(event)
        self.visibility_changed.emit(True)

    def hideEvent(self, event) -> None:
        super().hideEvent(event)
        self.visibility_changed.emit(False)

    def closeEvent(self, event) -> None:
        if self.hide_on_close and not self.quitting:
            event.ignore()
            self.hide()
        else:
            event.accept()
