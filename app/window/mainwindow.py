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

from PySide6.QtCore import QSize, Qt, QTimer, Signal, Slot
from PySide6.QtGui import QDragEnterEvent, QDropEvent, QGuiApplication
from PySide6.QtWidgets import (QCheckBox, QFileDialog, QFrame, QHBoxLayout, QLabel,
                               QMainWindow, QPlainTextEdit, QPushButton, QScrollArea,
                               QTabWidget, QToolButton, QVBoxLayout, QWidget)

from ..bridge import EngineBridge
from ..icons import app_icon
from ..modelinfo import is_mmproj, mmproj_beside
from ..settings import Settings
from .chat import ChatPanel
from .dialogs import AboutDialog, ModelOptionsDialog, PreferencesDialog
from .rows import BAR_TEXT_WIDTH, ModelRow, OfferRow, PendingRow
from .status_text import SOFTWARE_WARNING, arena_text, is_software_renderer
from .style import STYLE
from .vrambar import VramBar, breakdown_html, format_bytes

REFRESH_MS = 1000
SUFFIX = ".gguf"
LOG_LINES = 500


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

    @Slot(str, str)
    def on_error(self, summary: str, details: str) -> None:
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
            if is_mmproj(path):
                self.statusBar().showMessage(
                    f"{os.path.basename(path)} is a vision projector: load its model from "
                    "the same folder and it comes with it", 8000)
                continue
            self.add_pending(path)
            self.bridge.load(path, mmproj=mmproj_beside(path))

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

    @Slot(str, str, str)
    def on_load_failed(self, path: str, summary: str, details: str) -> None:
        self.drop_pending(path)
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
