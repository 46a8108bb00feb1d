"""What the engine is doing and has waiting, per model: the busy labels of the window's rows
("generating · 5.2 tok/s", "queued: warm") and the tray icon's state. Plain Python, safe from
any thread; the bridge reports into it and turns its changes into signals.

    act = Activity(on_change=callback)
    op = act.begin("smollm2", "warm")    # queued (in the bridge, or behind the engine's job)
    act.start(op)                        # the call into the engine is made
    act.tick(op)                         # one more token (generations)
    act.end(op)

The engine runs device work one job at a time in the order the calls reach it, so of the
ops whose call has been made the earliest is the one running; the others wait behind it.
A load counts only from its upload on (its first progress callback): it parses the file on
the caller's thread, beside whatever runs on the device.
"""
from __future__ import annotations

import itertools
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

VERBS = {"generate": "generating", "warm": "warming", "evict": "evicting", "pin": "pinning",
         "unpin": "unpinning", "unload": "unloading", "load": "uploading"}
RATE_EVERY_S = 0.3          # tick changes are reported at most this often


@dataclass
class Op:
    id: int
    model: str
    kind: str                                 # a key of VERBS
    source: str = "app"                       # "app", "chat" or "endpoint"
    t_queued: float = field(default_factory=time.monotonic)
    t_started: float | None = None            # the call reached the engine
    tokens: int = 0
    t_first: float | None = None              # the first token came
    t_last: float | None = None

    def rate(self) -> float | None:
        """Tokens per second so far (after the first token), or None with too few."""
        if self.tokens < 2 or self.t_first is None or self.t_last is None:
            return None
        dt = self.t_last - self.t_first
        return (self.tokens - 1) / dt if dt > 0 else None


class Activity:
    def __init__(self, on_change: Callable[[], None] | None = None):
        self.on_change = on_change
        self._ops: dict[int, Op] = {}
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._reported = 0.0

    def begin(self, model: str, kind: str, source: str = "app") -> Op:
        with self._lock:
            op = Op(next(self._ids), model, kind, source)
            self._ops[op.id] = op
        self._changed()
        return op

    def start(self, op: Op) -> None:
        with self._lock:
            if op.t_started is None:
                op.t_started = time.monotonic()
        self._changed()

    def tick(self, op: Op, n: int = 1) -> None:
        now = time.monotonic()
        with self._lock:
            if op.t_started is None:
                op.t_started = now
            if op.t_first is None:
                op.t_first = now
            op.tokens += n
            op.t_last = now
            due = now - self._reported >= RATE_EVERY_S or op.tokens == 1
        if due:
            self._changed()

    def end(self, op: Op) -> None:
        with self._lock:
            self._ops.pop(op.id, None)
        self._changed()

    def _changed(self) -> None:
        self._reported = time.monotonic()
        if self.on_change is not None:
            self.on_change()

    def ops(self) -> list[Op]:
        with self._lock:
            return sorted(self._ops.values(), key=lambda o: o.t_queued)

    def running(self) -> Op | None:
        """The op the engine is working on: a generation that is producing tokens, else
        the earliest of those whose call was made."""
        started = [o for o in self.ops() if o.t_started is not None]
        if not started:
            return None
        producing = [o for o in started if o.kind == "generate" and o.t_first is not None]
        if producing:
            return min(producing, key=lambda o: o.t_first)
        return min(started, key=lambda o: o.t_started)

    def busy(self) -> dict[str, str]:
        """model -> what its row says: the running op's verb (with tokens/s for a
        generation), or "queued: <kind>" for the first op it waits on; "+N" more."""
        ops = self.ops()
        run = self.running()
        out: dict[str, str] = {}
        per: dict[str, list[Op]] = {}
        for o in ops:
            per.setdefault(o.model, []).append(o)
        for model, mine in per.items():
            first = next((o for o in mine if o is run), mine[0])
            if first is run:
                text = VERBS.get(first.kind, first.kind)
                if first.kind == "generate":
                    r = first.rate()
                    text += f" · {r:.1f} tok/s" if r is not None else " · prompt"
            else:
                text = f"queued: {first.kind}"
            if len(mine) > 1:
                text += f" (+{len(mine) - 1})"
            out[model] = text
        return out

    def generating(self) -> bool:
        return any(o.kind == "generate" and o.t_started is not None for o in self.ops())
