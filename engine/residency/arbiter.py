"""The in-process VRAM arbiter: a model is resident iff it holds budget.

Models register themselves: anything with `release(full=...)` and `device_bytes()` (by
kind). `acquire(name, n)`
grants n bytes to a model, first releasing the least recently used unpinned models until the
grant fits (in the configured mode, weights-only or full, and fully when weights-only does
not free enough); pinned models
are never released, and when they alone leave no room the request fails with a clear
`BudgetError`. Only the arbiter evicts. Every change is appended to `ledger`, so a test can
check that the granted total never exceeded the budget.

The host budget bounds the RAM of every model's shadows together (`ram_bytes()`: KV shadows,
recurrent states, weight copies). After each release that leaves more, the least recently
used unpinned models free what a file can hold instead (`spill()`: weight copies, which
the GGUF file holds, and KV shadows and recurrent states, which go to files) until they
fit; a pinned model's stay in RAM.
"""
from __future__ import annotations

import threading
import time
from typing import Protocol

MiB = 1 << 20


class BudgetError(RuntimeError):
    code = "budget"


class PinnedError(BudgetError):
    """An eviction asked of a pinned model (unpin it first)."""
    code = "pinned"


class Releasable(Protocol):
    def release(self, full: bool = True, discard: bool = False) -> dict: ...

    def device_bytes(self) -> dict[str, int]: ...

    def ram_bytes(self) -> int: ...

    def spill(self) -> int: ...


class Arbiter:
    def __init__(self, budget_bytes: int, full_release: bool = True,
                 host_budget: int | None = None):
        if budget_bytes <= 0:
            raise ValueError(f"VRAM budget must be positive, got {budget_bytes}")
        self.budget = int(budget_bytes)
        self.full_release = full_release
        self.host_budget = host_budget          # None: no bound
        self._held: dict[str, int] = {}
        self._models: dict[str, Releasable] = {}
        self._order: list[str] = []          # least recently used first
        self.pinned: set[str] = set()
        self.ledger: list[tuple[float, str, str, int, int]] = []   # t, model, op, bytes, total
        self._lock = threading.RLock()

    @property
    def used(self) -> int:
        return sum(self._held.values())

    def held(self, name: str) -> int:
        return self._held.get(name, 0)

    def register(self, name: str, model: Releasable) -> None:
        with self._lock:
            self._models[name] = model
            self._held.setdefault(name, 0)
            self._touch(name)

    def unregister(self, name: str) -> None:
        with self._lock:
            self._models.pop(name, None)
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
                self._held[victim] = self._free(victim, self.full_release)
                if self._held[victim] > 0 and self.used + need > self.budget:
                    # weights-only kept KV and compute buffers; they are needed too
                    self._held[victim] = self._free(victim, True)
                self._log(victim, "release", self._held[victim])
                released.append(victim)
            self._held[name] = int(nbytes)
            self._log(name, "acquire", int(nbytes))
            return released

    def release(self, name: str, full: bool | None = None, discard: bool = False) -> int:
        """Release one model now (weights-only or full; None: the configured mode), pinned
        or not (the caller decides whether a pin forbids it); the bytes it keeps. discard:
        everything, nothing copied back (its device contents are not to be trusted)."""
        with self._lock:
            if name not in self._models:
                raise KeyError(f"no model named {name!r} is loaded")
            kept = self._free(name, self.full_release if full is None else full, discard)
            self._held[name] = int(kept)
            self._log(name, "release", int(kept))
            return int(kept)

    def _free(self, name: str, full: bool, discard: bool = False) -> int:
        """The one place a model releases device memory; the bytes it keeps."""
        model = self._models[name]
        model.release(full=full, discard=discard)
        self.fit_host()
        return sum(model.device_bytes().values())

    @property
    def host_used(self) -> int:
        return sum(m.ram_bytes() for m in self._models.values())

    def fit_host(self) -> list[str]:
        """Move the least recently used unpinned models' shadows to disk until the host
        budget holds them all; the names moved."""
        with self._lock:
            if self.host_budget is None:
                return []
            total, moved = self.host_used, []
            for name in list(self._order):                  # least recently used first
                if total <= self.host_budget:
                    break
                if name in self.pinned or not self._models[name].ram_bytes():
                    continue
                freed = self._models[name].spill()
                if freed:
                    total -= freed
                    moved.append(name)
                    self._log(name, "spill", freed)
            return moved

    def set_host_budget(self, nbytes: int | None) -> None:
        with self._lock:
            if nbytes is not None and nbytes < 0:
                raise ValueError(f"host budget must not be negative, got {nbytes}")
            self.host_budget = nbytes
            self.fit_host()

    def release_all(self) -> list[str]:
        """Release every model that holds device memory fully, pinned ones too (the arena
        outranks pins); the names released, least recently used first."""
        with self._lock:
            out = [n for n in self._order if self._held.get(n, 0) > 0]
            for n in out:
                self.release(n, full=True)
            return out

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

