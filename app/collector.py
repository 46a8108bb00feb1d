"""Garbage collection on the UI thread only.

Python's cyclic collector runs in whichever thread happens to allocate when a threshold is
crossed: the engine's worker, watchdog's observer, the endpoint's loop. Collecting a cycle
that holds a Qt widget there deletes the widget off the UI thread, which crashes. So the
automatic collector is switched off and this timer runs it, by generation, on the UI thread.
"""
from __future__ import annotations

import gc

from PySide6.QtCore import QObject, QTimer, Slot

INTERVAL_MS = 250


class GarbageCollector(QObject):
    def __init__(self, parent: QObject | None = None):
        super().__init__(parent)
        self.timer = QTimer(self)
        self.timer.setInterval(INTERVAL_MS)
        self.timer.timeout.connect(self.on_timeout)

    def start(self) -> None:
        gc.disable()
        self.timer.start()

    def stop(self) -> None:
        self.timer.stop()
        gc.enable()

    @Slot()
    def on_timeout(self) -> None:
        # the same thresholds the automatic collector uses, checked here instead
        t0, t1, t2 = gc.get_threshold()
        c0, c1, c2 = gc.get_count()
        if c0 > t0:
            gc.collect(2 if c2 > t2 else 1 if c1 > t1 else 0)
