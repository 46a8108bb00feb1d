"""Engine errors in words for people: `describe(exc)` is (summary, details).

The engine's messages name the file, the byte offset and the check that failed: what a bug
report needs, not what someone who dragged the wrong file needs. Its errors carry a code
(`engine.facade.error_code`) and a model file's error a reason (ModelFileError.reason); the
window shows the summary those map to and keeps the engine's text behind a Details button.
"""
from __future__ import annotations

from engine.facade import error_code

NO_GPU = "The GPU could not be opened"

# what to say for an engine error's code; codes not here show the engine's own text
BY_CODE: dict[str, str] = {
    "no_device": NO_GPU,                 # the bridge's own: the engine did not open
    "model_exists": "A model with this name is already loaded",
    "budget": "Not enough VRAM in the budget (unpin a model, or raise the budget in "
              "Preferences)",
    "gpu_given_up": "Another app is using the GPU's memory: Hotseat gave the GPU up and "
                    "comes back once it is free (game mode)",
    "placement": "This model has no experts to keep in RAM (cpu_moe is for "
                 "mixture-of-experts models)",
}

# what to say for a model file's error (code "model_file"), by its reason
BY_FILE_REASON: dict[str, str] = {
    "not_gguf": "This is not a GGUF model file",
    "truncated": "The file is incomplete (truncated download?)",
    "not_found": "The file was not found (moved or deleted?)",
    "directory": "This is a folder, not a model file",
    "permission": "Hotseat may not read this file (permission denied)",
    "version": "This GGUF version is not supported",
    "tensor_type": "This file uses a tensor type Hotseat does not support yet",
    "architecture": "This model's architecture is not supported yet",
    "incomplete": "The file is missing parts a model needs (a damaged or unusual GGUF file)",
    "corrupt": "The file is damaged (corrupt GGUF file)",
}


def one_line(text: str) -> str:
    return " ".join(str(text).split())


def message(exc: BaseException) -> str:
    """The engine's own text, on one line (a KeyError's without the quotes repr adds)."""
    if isinstance(exc, KeyError) and exc.args:
        return one_line(exc.args[0])
    return one_line(str(exc)) or type(exc).__name__


def summary_of(exc: BaseException) -> str:
    """What to tell the user about exc; the engine's text where there are no better words."""
    code = error_code(exc)
    if code == "model_file":
        found = BY_FILE_REASON.get(getattr(exc, "reason", ""))
    else:
        found = BY_CODE.get(code)
    return found or message(exc)


def describe(exc: BaseException) -> tuple[str, str]:
    """(what to tell the user, the engine's own text for the details)."""
    return summary_of(exc), message(exc)
