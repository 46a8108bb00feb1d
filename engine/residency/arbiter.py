"""The in-process VRAM arbiter: a model is resident iff it holds budget.

Models register with a release callback `release(full) -> bytes kept`. `acquire(name, n)`
grants n bytes to a model, first releasing the least recently used unpinned models until the
grant fits (in the configured mode, weights-only or full, and fully when weights-only does
not free enough); pinned models
are never released, and when they alone leave no room the request fails with a clear
`BudgetError`. Only the arbiter evicts. Every change is appended to `ledger`, so a test can
check that the granted total never exceeded the budget.
"""
from __future__ import annotations

import threading
import time
from typing import Callable

MiB = 1 << 20


class BudgetError(RuntimeError):
    pass


class PinnedError(BudgetError):
    """An eviction asked of a pinned model (unpin it first)."""


class Arbiter:
    def __init__(self, budget_bytes: int, full_release: bool = True):
        if budget_bytes <= 0:
            raise ValueError(f"VRAM budget must be positive, got {budget_bytes}")
        self.budget = int(budget_bytes)
        self.full_release = full_release
        self._held: dict[str, int] = {}
        self._release: dict[str, Callable[[bool], int]] = {}
        self._order: list[str] = []          # least recently used first
        self.pinned: set[str] = set()
        self.ledger: list[tuple[float, str, str, int, int]] = []   # t, model, op, bytes, total
        self._lock = threading.RLock()

    @property
    def used(self) -> int:
        return sum(self._held.values())

    def held(self, name: str) -> int:
        return self._held.get(name, 0)

    def register(self, name: str, release: Callable[[bool], int]) -> None:
        """release(full) frees the model's device memory and returns the bytes it keeps."""
        with self._lock:
            self._release[name] = release
            self._held.setdefault(name, 0)
            self._touch(name)

    def unregister(self, name: str) -> None:
        with self._lock:
            self._release.pop(name, None)
            self._held.pop(name, None)
            self.pinned.discard(name)
            if name in self._order:
                self._order.remove(name)
            self._log(name, "unregister", 0)

    def _touch(self, name: str) -> None:
        if name in self._order:
            self._order.remove(name)
        self._order.append(name)

    def _log(self, name: str, op: str, nbytes: int) -> None:
        self.ledger.append((time.monotonic(), name, op, nbytes, self.used))

    def acquire(self, name: str, nbytes: int) -> list[str]:
        """Grant nbytes to name, releasing others as needed; returns who was released."""
        with self._lock:
            self._touch(name)
            need = int(nbytes) - self.held(name)
            released = []
            if need <= 0:
                return released
            if name in self.pinned and self._pinned_total(extra=name, extra_bytes=nbytes) \
                    > self.budget:
                raise BudgetError(self._over_message(name, nbytes))
            while self.used + need > self.budget:
                victims = [n for n in self._order
                           if n != name and n not in self.pinned and self._held.get(n, 0) > 0]
                if not victims:
                    raise BudgetError(self._over_message(name, nbytes))
                victim = victims[0]
                self._held[victim] = self._release[victim](self.full_release)
                if self._held[victim] > 0 and self.used + need > self.budget:
                    # weights-only kept KV and compute buffers; they are needed too
                    self._held[victim] = self._release[victim](True)
                self._log(victim, "release", self._held[victim])
                released.append(victim)
            self._held[name] = int(nbytes)
            self._log(name, "acquire", int(nbytes))
            return released

    def update(self, name: str, nbytes: int) -> None:
        """The model's real device bytes after it released something on its own."""
        with self._lock:
            self._held[name] = int(nbytes)
            self._log(name, "update", int(nbytes))

    def pin(self, name: str, warm_bytes: int) -> None:
        with self._lock:
            if self._pinned_total(extra=name, extra_bytes=warm_bytes) > self.budget:
                raise BudgetError(self._over_message(name, warm_bytes, pinning=True))
            self.pinned.add(name)

    def unpin(self, name: str) -> None:
        with self._lock:
            self.pinned.discard(name)

    def _pinned_total(self, extra: str, extra_bytes: int) -> int:
        return sum(self._held.get(n, 0) for n in self.pinned if n != extra) + extra_bytes

    def _over_message(self, name: str, nbytes: int, pinning: bool = False) -> str:
        pinned = ", ".join(f"{n} ({self._held.get(n, 0) / MiB:.0f} MiB)"
                           for n in sorted(self.pinned) if n != name) or "none"
        what = "pinning" if pinning else "making warm"
        return (f"VRAM budget exceeded {what} {name} ({nbytes / MiB:.0f} MiB): budget "
                f"{self.budget / MiB:.0f} MiB, pinned models: {pinned}; unpin a model or "
                f"raise the budget")

