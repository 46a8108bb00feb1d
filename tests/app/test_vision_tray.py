"""Images in the tray, on the real engine: a model dropped with an mmproj*.gguf beside it
loads with its projector, the chat tab sends an image with a message and shows the answer,
and the model's row shows its `vision` bytes (the synthetic Gemma 3 of tests/data/synth)."""
from __future__ import annotations

import shutil

import pytest

from app.bridge import EngineBridge
from app.modelinfo import mmproj_beside
from app.window import MainWindow
from tests.helpers.signals import Recorder, until
from tests.helpers.synth_reference import DATA

pytestmark = pytest.mark.gpu
LOAD_TIMEOUT_MS = 120_000
IMAGES = DATA.parent / "images"


def vision_engine(**kw):
    from engine.api import Engine

    return Engine(n_ctx=1024, **kw)


def test_mmproj_beside_a_model(tmp_path):
    model = tmp_path / "gemma-3-4b-it-Q4_K_M.gguf"
    model.write_bytes(b"")
    assert mmproj_beside(str(model)) is None
    (tmp_path / "mmproj-other-model-f16.gguf").write_bytes(b"")
    assert mmproj_beside(str(model)).endswith("mmproj-other-model-f16.gguf")   # the only one
    (tmp_path / "mmproj-gemma-3-4b-it-f16.gguf").write_bytes(b"")
    assert mmproj_beside(str(model)).endswith("mmproj-gemma-3-4b-it-f16.gguf")  # the closer
    assert mmproj_beside(str(tmp_path / "mmproj-gemma-3-4b-it-f16.gguf")) is None


def test_an_image_from_the_chat_tab(qtbot, tmp_path):
    model = tmp_path / "gemma3-synth.gguf"
    shutil.copy(DATA / "gemma3-f16.gguf", model)
    shutil.copy(DATA / "gemma3-mmproj-f16.gguf", tmp_path / "mmproj-gemma3-synth.gguf")
    bridge = EngineBridge(engine_factory=vision_engine)
    rec = Recorder(bridge)
    window = MainWindow(bridge)
    qtbot.addWidget(window)
    try:
        bridge.start()
        until(qtbot, lambda: rec.devices or rec.errors, timeout=LOAD_TIMEOUT_MS)
        window.load_paths([str(model)])
        until(qtbot, lambda: rec.loaded or rec.failed, timeout=LOAD_TIMEOUT_MS)
        assert not rec.failed, rec.failed
        name = rec.loaded[0][1]
        until(qtbot, lambda: rec.model(name).get("state") == "warm", timeout=LOAD_TIMEOUT_MS)
        assert rec.model(name)["mmproj"] == str(tmp_path / "mmproj-gemma3-synth.gguf")
        assert rec.model(name)["device_bytes"]["vision"] > 0
        until(qtbot, lambda: name in window.rows)
        row = window.rows[name]
        until(qtbot, lambda: "Vision" in row.breakdown.text())
        assert "Vision:" in row.bar.toolTip()

        chat = window.chat
        until(qtbot, lambda: chat.model_combo.count() == 1)
        assert not chat.attach_image(str(model))               # not an image: refused
        assert "is not an image" in chat.rate_label.text()
        assert chat.attach_image(str(IMAGES / "square.png"))
        assert chat.image_preview.isVisible() or not window.isVisible()
        assert chat.image_preview.pixmap().width() == 96
        chat.max_spin.setValue(4)
        chat.input.setText("What is in this picture?")
        chat.send_button.click()
        until(qtbot, lambda: chat.request is None, timeout=LOAD_TIMEOUT_MS)
        text = chat.transcript.toPlainText()
        assert text.startswith("You: [image: square.png] What is in this picture?")
        assert chat.rate_label.text().startswith("4 tokens")
        assert chat.history[0]["images"] == [(IMAGES / "square.png").read_bytes()]
        assert chat.image is None and chat.image_preview.isHidden()
        assert not rec.errors, rec.errors
    finally:
        window.timer.stop()
        bridge.close()
