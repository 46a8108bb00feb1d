"""One-line messages for what failed, and the rate shown in the log."""
from __future__ import annotations

import logging
import os

log = logging.getLogger("hotseat.app")


def rate_text(timings: dict | None) -> str:
    rate = (timings or {}).get("decode_tokens_per_s")
    return f" at {rate:.1f} tok/s" if rate else ""


def default_budget_of(engine) -> int | None:
    """The budget the engine picks by itself, to return to when the user clears theirs."""
    try:
        from engine.api import default_budget

        return default_budget(engine.dev)
    except Exception:                     # a fake engine, or no device heap to read
        return None


def load_message(path: str, exc: BaseException) -> str:
    """One line for a failed load: the engine's ModelFileError already names the file."""
    from engine.formats.gguf_file import ModelFileError
    from engine.residency.arbiter import BudgetError

    base = os.path.basename(path)
    if isinstance(exc, ModelFileError):
        return str(exc)
    if isinstance(exc, OSError):
        return f"{path}: {exc.strerror or exc}"
    if isinstance(exc, (ValueError, KeyError, BudgetError)):
        return f"{base}: {message(exc)}"
    log.warning("loading %s failed: %s", path, exc)
    return f"{base}: {type(exc).__name__}: {exc}"


class NoEngine(Exception):
    pass


def message(exc: BaseException) -> str:
    # KeyError's str() is the repr of its argument; the others read as they are.
    if isinstance(exc, KeyError) and exc.args:
        return str(exc.args[0])
    return str(exc) or type(exc).__name__
