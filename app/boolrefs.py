"""A guard against a PySide6 reference bug that ends the process.

PySide6 6.12's `SignalInstance.emit()` (and connect/disconnect) returns `True` without
taking a reference to it, so every emission takes one reference from `True` that nobody
gave. On Python 3.12 and later `True` is immortal and nothing happens; on 3.11 its count
runs down with every signal the tray emits (each status refresh, each chat token) until it
reaches zero, and the interpreter aborts: "Fatal Python error: bool_dealloc". An idle tray
loses two a second (the status refresh) from some 5,000: zero within the hour. A test
process with two real-engine bridges got there at its exit.

`keep_bools_alive()` checks whether this PySide6 has the bug and, where `True` is not
immortal, gives `True` and `False` enough references to outlive any session: what 3.12
does. The proper cure is a PySide6 without the bug.
"""
from __future__ import annotations

import ctypes
import sys

HEADROOM = 1 << 40              # references; one emission takes one


def emit_drops_a_reference() -> bool:
    """Whether emitting a signal takes a reference from True that it never gave."""
    from PySide6.QtCore import QObject, Signal

    class Probe(QObject):
        probed = Signal()

    probe = Probe()
    before = sys.getrefcount(True)
    for _ in range(4):
        probe.probed.emit()
    return sys.getrefcount(True) < before


def keep_bools_alive() -> bool:
    """Give True and False HEADROOM more references when emissions drop them and they are
    not immortal; whether it did."""
    if sys.version_info >= (3, 12) or sys.implementation.name != "cpython":
        return False
    if sys.getrefcount(True) > HEADROOM // 2 or not emit_drops_a_reference():
        return False
    for b in (True, False):
        # ob_refcnt is the first field of every CPython object, at its id()
        ctypes.c_ssize_t.from_address(id(b)).value += HEADROOM
    return True
