"""The bridge's lanes (one daemon thread each, jobs in order) and the real engine's factory."""
from __future__ import annotations

import queue
import threading
from typing import Callable


def real_engine(**kw):
    from engine.api import Engine
    from engine.args import arena_enabled

    # the tray takes turns on the GPU with the user's other Hotseat processes, unless
    # $HOTSEAT_NO_ARENA or hotseat-tray --no-arena says otherwise
    kw.setdefault("arena", arena_enabled())
    kw.setdefault("arena_label", "tray")
    return Engine(**kw)


class Lane:
    """A daemon thread running jobs in order; None ends it."""

    def __init__(self, name: str):
        self.jobs: queue.SimpleQueue = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._run, name=f"hotseat-{name}", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def put(self, job: Callable[[], None] | None) -> None:
        self.jobs.put(job)

    def _run(self) -> None:
        while True:
            job = self.jobs.get()
            if job is None:
                return
            job()

