"""The models table's rows: a loaded model (ModelRow), a load on its way (PendingRow), a
model found in the watched folder (OfferRow)."""
from __future__ import annotations

import os

from PySide6.QtCore import Qt, Signal, Slot
from PySide6.QtWidgets import (QFrame, QGridLayout, QHBoxLayout, QLabel, QProgressBar,
                               QPushButton, QToolButton, QWidget)

from .vrambar import VramBar, breakdown_html, format_bytes

BAR_TEXT_WIDTH = 220


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
        self.warm_button.setEnabled(state == "cold")
        self.badge.setToolTip("The GPU was lost: restart Hotseat" if state == "unusable"
                              else "")
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

