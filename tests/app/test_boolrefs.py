"""The guard against PySide6's emissions running True's reference count down to zero."""
from __future__ import annotations

import sys

import pytest
from PySide6.QtCore import QObject, Signal

import app  # noqa: F401  (importing the package applies the guard)
from app.boolrefs import HEADROOM, emit_drops_a_reference, keep_bools_alive


class Emitter(QObject):
    ping = Signal(dict)


def test_many_emissions_leave_true_alive():
    if sys.version_info >= (3, 12) or not emit_drops_a_reference():
        pytest.skip("True is immortal here, or this PySide6 keeps its references")
    # without the guard True holds a few thousand references: far fewer than these
    assert sys.getrefcount(True) > HEADROOM // 2
    e = Emitter()
    before = sys.getrefcount(True)
    for _ in range(20_000):
        e.ping.emit({"pinned": True})
    assert before - sys.getrefcount(True) >= 19_000          # the bug is still there
    assert sys.getrefcount(True) > HEADROOM // 2 and sys.getrefcount(False) > HEADROOM // 2
    assert keep_bools_alive() is False                       # applied once only
