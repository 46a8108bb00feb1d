"""The details of a failed load, a file the engine's check refuses, and the figures shown
in the log."""
from __future__ import annotations

import logging
import os

from engine.facade import error_code

from ..errors import message

log = logging.getLogger("hotseat.app")


def rate_text(timings: dict | None) -> str:
    rate = (timings or {}).get("decode_tokens_per_s")
    return f" at {rate:.1f} tok/s" if rate else ""


def mib(n: int) -> str:
    return f"{n / (1 << 20):.0f} MiB" if n < 10 << 30 else f"{n / (1 << 30):.1f} GiB"


def sizes_text(report: dict) -> str:
    """What a file the check passed takes: " (145 MiB of VRAM warm, 92 MiB of RAM cold)"."""
    vram, ram = report.get("vram"), report.get("ram")
    if not vram or not ram:
        return ""
    return f" ({mib(vram['total_bytes'])} of VRAM warm, {mib(ram['weights_bytes'])} of RAM cold)"


class WontRun(Exception):
    """A file the engine's check says will not run (Engine.check): str() is its problems on
    one line, `problems` each of them."""
    code = "wont_run"

    def __init__(self, path: str, problems: list[str]):
        self.path, self.problems = path, list(problems)
        super().__init__("; ".join(self.problems) or "the check refused it")


def load_message(path: str, exc: BaseException) -> str:
    """The details of a failed load: one line naming the file (the engine's ModelFileError
    already does), or for a file the check refused, a line per problem after it."""
    if isinstance(exc, WontRun):
        return "\n".join([f"{path}: Hotseat cannot run this file:"] +
                          [f"- {p}" for p in exc.problems])
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
