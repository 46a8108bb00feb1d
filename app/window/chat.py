"""A small chat box to try a model: pick it, type, read the answer as it streams.

The request runs on the bridge's generate lane (EngineBridge.chat); the pieces arrive as
chat_delta signals, so the UI thread only appends text. Stop cancels at the next token.
"""
from __future__ import annotations

from PySide6.QtCore import Slot
from PySide6.QtGui import QTextCursor
from PySide6.QtWidgets import (QComboBox, QHBoxLayout, QLabel, QLineEdit, QPlainTextEdit,
                               QPushButton, QSpinBox, QVBoxLayout, QWidget)

from ..bridge import EngineBridge

DEFAULT_MAX_TOKENS = 256


class ChatPanel(QWidget):
    def __init__(self, bridge: EngineBridge, parent: QWidget | None = None):
        super().__init__(parent)
        self.bridge = bridge
        self.history: list[dict] = []        # the conversation sent with each request
        self.request: int | None = None      # the id of the answer being streamed
        self.answer = ""
        self.model_combo = QComboBox()
        self.model_combo.setMinimumContentsLength(18)
        self.max_spin = QSpinBox()
        self.max_spin.setRange(1, 4096)
        self.max_spin.setValue(DEFAULT_MAX_TOKENS)
        self.max_spin.setPrefix("up to ")
        self.max_spin.setSuffix(" tokens")
        self.clear_button = QPushButton("New chat")
        self.transcript = QPlainTextEdit(readOnly=True)
        self.transcript.setPlaceholderText("Load a model, then ask it something.")
        self.input = QLineEdit()
        self.input.setPlaceholderText("Message")
        self.send_button = QPushButton("Send")
        self.send_button.setDefault(True)
        self.stop_button = QPushButton("Stop")
        self.stop_button.setEnabled(False)
        self.rate_label = QLabel()
        self.rate_label.setObjectName("barText")

        top = QHBoxLayout()
        top.addWidget(QLabel("Model"))
        top.addWidget(self.model_combo, 1)
        top.addWidget(self.max_spin)
        top.addWidget(self.clear_button)
        bottom = QHBoxLayout()
        bottom.addWidget(self.input, 1)
        bottom.addWidget(self.send_button)
        bottom.addWidget(self.stop_button)
        root = QVBoxLayout(self)
        root.setContentsMargins(0, 4, 0, 0)
        root.addLayout(top)
        root.addWidget(self.transcript, 1)
        root.addLayout(bottom)
        root.addWidget(self.rate_label)

        self.send_button.clicked.connect(self.on_send_clicked)
        self.input.returnPressed.connect(self.on_send_clicked)
        self.stop_button.clicked.connect(self.on_stop_clicked)
        self.clear_button.clicked.connect(self.on_clear_clicked)
        bridge.models_changed.connect(self.on_models_changed)
        bridge.chat_delta.connect(self.on_chat_delta)
        bridge.chat_done.connect(self.on_chat_done)
        self._update_buttons()

    def _update_buttons(self) -> None:
        busy = self.request is not None
        self.send_button.setEnabled(not busy and self.model_combo.count() > 0)
        self.stop_button.setEnabled(busy)
        self.model_combo.setEnabled(not busy)

    def _append(self, text: str) -> None:
        cur = self.transcript.textCursor()
        cur.movePosition(QTextCursor.MoveOperation.End)
        cur.insertText(text)
        self.transcript.setTextCursor(cur)
        self.transcript.ensureCursorVisible()

    @Slot(list)
    def on_models_changed(self, models: list) -> None:
        names = [m["name"] for m in models]
        if names == [self.model_combo.itemText(i) for i in range(self.model_combo.count())]:
            return
        current = self.model_combo.currentText()
        self.model_combo.blockSignals(True)
        self.model_combo.clear()
        self.model_combo.addItems(names)
        if current in names:
            self.model_combo.setCurrentText(current)
        self.model_combo.blockSignals(False)
        self._update_buttons()

    def select_model(self, name: str) -> None:
        i = self.model_combo.findText(name)
        if i >= 0 and self.request is None:
            self.model_combo.setCurrentIndex(i)

    @Slot()
    def on_send_clicked(self) -> None:
        text = self.input.text().strip()
        name = self.model_combo.currentText()
        if not text or not name or self.request is not None:
            return
        self.input.clear()
        self.history.append({"role": "user", "content": text})
        self._append(("\n\n" if self.transcript.toPlainText() else "") + f"You: {text}\n\n"
                     f"{name}: ")
        self.answer = ""
        self.rate_label.setText("Waiting for the model…")
        self.request = self.bridge.chat(name, list(self.history), self.max_spin.value())
        self._update_buttons()

    @Slot()
    def on_stop_clicked(self) -> None:
        if self.request is not None:
            self.bridge.cancel_chat(self.request)

    @Slot()
    def on_clear_clicked(self) -> None:
        if self.request is not None:
            self.bridge.cancel_chat(self.request)
        self.history = []
        self.transcript.clear()
        self.rate_label.clear()

    @Slot(int, str)
    def on_chat_delta(self, rid: int, piece: str) -> None:
        if rid != self.request:
            return
        self.answer += piece
        self._append(piece)

    @Slot(int, dict)
    def on_chat_done(self, rid: int, info: dict) -> None:
        if rid != self.request:
            return
        self.request = None
        if info.get("error"):
            self._append(f"[{info['error']}]")
            self.rate_label.setText("The request failed")
            if self.history and self.history[-1]["role"] == "user":
                self.history.pop()
        else:
            self.history.append({"role": "assistant", "content": info.get("text", "")})
            rate = info.get("tokens_per_s")
            stopped = " (stopped)" if info.get("finish_reason") == "cancelled" else ""
            self.rate_label.setText(f"{info.get('tokens', 0)} tokens"
                                    + (f" at {rate:.1f} tok/s" if rate else "") + stopped)
        self._update_buttons()
