"""Engine messages in words for people."""
from __future__ import annotations

import pytest

from app.errors import friendly


@pytest.mark.parametrize("message, summary", [
    ("/m/x.gguf: wrong magic b'root', expected b'GGUF': not a GGUF model",
     "This is not a GGUF model file"),
    ("/m/x.gguf: empty file (0 bytes), not a GGUF model", "This is not a GGUF model file"),
    ("/m/x.gguf: truncated or corrupt file: array of 48900 items cannot fit in the 1200 bytes "
     "left (in metadata key 'tokenizer.ggml.tokens', at byte 900)",
     "The file is incomplete (truncated download?)"),
    ("/m/x.gguf: truncated or corrupt file: tensor 'output.weight' (Q8_0 (2048, 49152)) ends "
     "at byte 9, past the end of the file (8 bytes)",
     "The file is incomplete (truncated download?)"),
    ("/m/x.gguf: no such file", "The file was not found (moved or deleted?)"),
    ("/m/x.gguf: unsupported architecture 'mamba' (supported: llama, gemma3)",
     "This model's architecture is not supported yet"),
    ("VRAM budget exceeded pinning a", "Not enough VRAM in the budget (unpin a model, or "
                                       "raise the budget in Preferences)"),
    ("cpu_moe 2: x (llama) is not a mixture-of-experts model, it has no expert tensors",
     "This model has no experts to keep in RAM (cpu_moe is for mixture-of-experts models)"),
])
def test_known_messages(message, summary):
    assert friendly(message) == (summary, message)


def test_unknown_messages_stay_as_they_are():
    assert friendly("something\nelse") == ("something else", "something else")
