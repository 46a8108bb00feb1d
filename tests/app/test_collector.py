"""Garbage collection moved to the UI thread's timer."""
from __future__ import annotations

import gc

from app.collector import GarbageCollector


def test_start_disables_automatic_collection_and_the_timer_collects(qtbot):
    c = GarbageCollector()
    c.start()
    try:
        assert not gc.isenabled() and c.timer.isActive()
        for _ in range(gc.get_threshold()[0] + 10):
            a = []
            a.append(a)                          # a cycle only the collector frees
        before = gc.get_count()[0]
        c.on_timeout()
        assert gc.get_count()[0] < before
    finally:
        c.stop()
    assert not c.timer.isActive()
