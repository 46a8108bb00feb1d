"""The details line of a failed load, and the rate shown in the log."""
from __future__ import annotations

import logging
import os

from engine.facade import error_code

from ..errors import message

log = logging.getLogger("hotseat.app")


def rate_text(timings: dict | None) -> str:
    rate = (timings or {}).get("decode_tokens_per_s")
    return f" at {rate:.1f} tok/s" if rate else ""


def load_message(path: str, exc: BaseException) -> str:
    """The details of a failed load, one line naming the file (the engine's ModelFileError
    already does)."""
    code = error_code(exc)
    if code == "model_file":
        return str(exc)
    if isinstance(exc, OSError):
        return f"{path}: {exc.strerror or exc}"
    base = os.path.basename(path)
    if code != "internal":
        return f"{base}: {message(exc)}"
    log.warning("loading %s failed: %s", path, exc)
    return f"{base}: {type(exc).__name__}: {exc}"


class NoEngine(Exception):
    """The engine did not open (its message says why)."""
    code = "no_device"
