"""The chat box on the fake engine: streamed answers, the conversation kept, stop."""
from __future__ import annotations

import pytest

from app.window.chat import ChatPanel
from tests.helpers.signals import until

pytestmark = pytest.mark.filterwarnings("ignore:It is recommended to use web.AppKey")


@pytest.fixture
def panel(qtbot, bridge):
    p = ChatPanel(bridge)
    qtbot.addWidget(p)
    return p


def test_send_streams_the_answer(qtbot, panel, bridge, models):
    assert not panel.send_button.isEnabled()                 # no model yet
    bridge.load(models["a"])
    until(qtbot, lambda: panel.model_combo.count() == 1)
    assert panel.send_button.isEnabled()
    panel.max_spin.setValue(3)
    deltas = []
    bridge.chat_delta.connect(lambda rid, t: deltas.append(t))
    panel.input.setText("Hello")
    panel.send_button.click()
    assert not panel.send_button.isEnabled() and panel.stop_button.isEnabled()
    until(qtbot, lambda: panel.request is None)
    assert deltas == [" ok"] * 3
    assert panel.transcript.toPlainText() == "You: Hello\n\na:  ok ok ok"
    assert panel.history == [{"role": "user", "content": "Hello"},
                             {"role": "assistant", "content": " ok ok ok"}]
    assert panel.rate_label.text().startswith("3 tokens")
    panel.input.setText("Again")
    panel.input.returnPressed.emit()
    until(qtbot, lambda: panel.request is None)
    assert len(panel.history) == 4
    assert ("generate", "a") in bridge.fake.calls


def test_stop_cancels(qtbot, panel, bridge, models):
    bridge.load(models["a"])
    until(qtbot, lambda: panel.model_combo.count() == 1)
    bridge.fake.token_delay_s = 0.02
    panel.max_spin.setValue(1000)
    panel.input.setText("Tell me everything")
    panel.send_button.click()
    until(qtbot, lambda: panel.answer)
    panel.stop_button.click()
    until(qtbot, lambda: panel.request is None, timeout=3000)
    assert panel.rate_label.text().endswith("(stopped)")
    panel.clear_button.click()
    assert panel.history == [] and panel.transcript.toPlainText() == ""


def test_a_failed_request_is_shown_and_dropped(qtbot, panel, bridge):
    panel.model_combo.addItem("gone")                       # unloaded meanwhile
    panel._update_buttons()
    panel.input.setText("hi")
    panel.send_button.click()
    until(qtbot, lambda: panel.request is None)
    assert "no model named 'gone'" in panel.transcript.toPlainText()
    assert panel.history == []
