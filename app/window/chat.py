"""A small chat box to try a model: pick it, type, read the answer as it streams.

The request runs on the bridge's generate lane (EngineBridge.chat); the pieces arrive as
chat_delta signals, so the UI thread only appends text. Stop cancels at the next token.
An image (dropped on the box, or picked with Image…) goes with the next message, shown as a
thumbnail until it is sent; a model loaded with a vision projector reads it.
"""
from __future__ import annotations

import os

from PySide6.QtCore import Qt, Slot
from PySide6.QtGui import QPixmap, QTextCursor
from PySide6.QtWidgets import (QComboBox, QFileDialog, QHBoxLayout, QLabel, QLineEdit,
                               QPlainTextEdit, QPushButton, QSpinBox, QVBoxLayout, QWidget)

from engine.vision.prompt import MARKER

from ..bridge import EngineBridge

DEFAULT_MAX_TOKENS = 256
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp", ".gif", ".bmp")
THUMBNAIL = 96             # pixels a side of the attached image's preview


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
        self.image_button = QPushButton("Image…")
        self.image_button.setToolTip("Attach an image to the next message (or drop one here)")
        self.image_preview = QLabel()              # the attached image's thumbnail
        self.image_preview.hide()
        self.image: tuple[str, bytes] | None = None    # (file name, bytes) for the next message
        self.setAcceptDrops(True)

        top = QHBoxLayout()
        top.addWidget(QLabel("Model"))
        top.addWidget(self.model_combo, 1)
        top.addWidget(self.max_spin)
        top.addWidget(self.clear_button)
        bottom = QHBoxLayout()
        bottom.addWidget(self.image_preview)
        bottom.addWidget(self.image_button)
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
        self.image_button.clicked.connect(self.on_image_clicked)
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

    def attach_image(self, path: str) -> bool:
        """Take an image file for the next message; False (and a line saying why) where it
        cannot be read or is not an image."""
        try:
            with open(path, "rb") as f:
                data = f.read()
        except OSError as exc:
            self.rate_label.setText(f"Cannot read {os.path.basename(path)}: {exc.strerror}")
            return False
        pix = QPixmap()
        if not pix.loadFromData(data):
            self.rate_label.setText(f"{os.path.basename(path)} is not an image")
            return False
        self.image = (os.path.basename(path), data)
        self.image_preview.setPixmap(pix.scaled(THUMBNAIL, THUMBNAIL,
                                                Qt.AspectRatioMode.KeepAspectRatio,
                                                Qt.TransformationMode.SmoothTransformation))
        self.image_preview.setToolTip(self.image[0])
        self.image_preview.show()
        self.rate_label.setText(f"{self.image[0]} goes with the next message")
        return True

    def _drop_image(self, event) -> str | None:
        mime = event.mimeData()
        paths = [u.toLocalFile() for u in mime.urls() if u.isLocalFile()] if mime.hasUrls() \
            else []
        return paths[0] if len(paths) == 1 and paths[0].lower().endswith(IMAGE_SUFFIXES) \
            else None

    def dragEnterEvent(self, event) -> None:
        if self._drop_image(event):
            event.acceptProposedAction()
        else:
            event.ignore()

    def dropEvent(self, event) -> None:
        path = self._drop_image(event)
        if path is None:
            event.ignore()
            return
        event.acceptProposedAction()
        self.attach_image(path)

    @Slot()
    def on_image_clicked(self) -> None:
        path, _ = QFileDialog.getOpenFileName(
            self, "Attach an image", os.path.expanduser("~"),
            "Images (" + " ".join("*" + s for s in IMAGE_SUFFIXES) + ");;All files (*)")
        if path:
            self.attach_image(path)

    @Slot()
    def on_send_clicked(self) -> None:
        text = self.input.text().strip()
        name = self.model_combo.currentText()
        if not text or not name or self.request is not None:
            return
        self.input.clear()
        shown = text
        if self.image is not None:              # its place: before the text
            self.history.append({"role": "user", "content": MARKER + text,
                                 "images": [self.image[1]]})
            shown = f"[image: {self.image[0]}] {text}"
            self.image = None
            self.image_preview.hide()
        else:
            self.history.append({"role": "user", "content": text})
        self._append(("\n\n" if self.transcript.toPlainText() else "") + f"You: {shown}\n\n"
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
        self.image = None
        self.image_preview.hide()

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
