"""Engine messages in words for people: `friendly(message)` is (summary, details).

The engine's messages name the file, the byte offset and the check that failed: what a bug
report needs, not what someone who dragged the wrong file needs. The window shows the
summary and keeps the engine's text behind a Details button.
"""
from __future__ import annotations

import re

# (pattern in the engine's message, what to say), first match wins
RULES: list[tuple[str, str]] = [
    (r"wrong magic|not a GGUF|empty file \(0 bytes\)|not a regular file",
     "This is not a GGUF model file"),
    (r"truncated|cannot fit in the|past the end of the file|shorter than a GGUF header",
     "The file is incomplete (truncated download?)"),
    (r"no such file|No such file", "The file was not found (moved or deleted?)"),
    (r"is a directory|is a folder", "This is a folder, not a model file"),
    (r"[Pp]ermission denied", "Hotseat may not read this file (permission denied)"),
    (r"unsupported GGUF version|big-endian", "This GGUF version is not supported"),
    (r"unknown tensor type|tensor type id", "This file uses a tensor type Hotseat does not "
                                            "support yet"),
    (r"unsupported architecture|architecture .* not supported|no architecture",
     "This model's architecture is not supported yet"),
    (r"missing tensor|missing metadata|unusable tokenizer",
     "The file is missing parts a model needs (a damaged or unusual GGUF file)"),
    (r"corrupt", "The file is damaged (corrupt GGUF file)"),
    (r"already loaded", "A model with this name is already loaded"),
    (r"VRAM budget|budget exceeded|not enough VRAM",
     "Not enough VRAM in the budget (unpin a model, or raise the budget in Preferences)"),
    (r"cpu_moe .* not|is not a mixture", "This model has no experts to keep in RAM "
                                         "(cpu_moe is for mixture-of-experts models)"),
    (r"Cannot open the GPU|vkCreate|Vulkan", "The GPU could not be opened"),
]


def friendly(message: str) -> tuple[str, str]:
    """(what to tell the user, the engine's own text for the details)."""
    text = " ".join(str(message).split())
    for pattern, summary in RULES:
        if re.search(pattern, text):
            return summary, text
    return text, text
