"""This process's turns on the GPU: the engine thread and the cross-process arena's policy.

All device work runs on one thread (`EngineThread`), one job at a time, so a release never
races a decode. With an arena (engine/residency/arena.py), `Turns` takes the arena's token
before any upload and holds it while any model has device memory. When another process
rings the doorbell, the engine goes fully cold at its next safe point and hands the token
over; pinned models go too, since the arena outranks in-process pins. Safe points are
between jobs, and inside a request between prefill chunks and between decoded tokens: there
the request hands over at once for a yield (`hotseat yield`), and for another process's
ring once it has held the token ARENA_SLICE_S (so that two busy processes take turns
instead of swapping at every token), then waits for the token and restores its model. The
next request takes the token back; with `wake_on_free` the engine also takes a free token
back by itself and restores the models the arena took, so that its next request finds them
warm. With $HOTSEAT_ARENA_LOG set to a file, every arena event is appended there as a JSON
line with this process's device bytes (a diagnostic the cross-process tests read).

Turns never frees memory itself: it asks the engine to (`Seat.release_all`), which goes
through the arbiter like every other release.
"""
from __future__ import annotations

import json
import logging
import os
import queue
import threading
import time
from concurrent.futures import Future
from typing import Callable, Protocol

from .arbiter import BudgetError
from .arena import Arena, ArenaBusy
from .loop import Cancelled

ARENA_SLICE_S = 1.0           # a request holds the token this long before handing it over

log = logging.getLogger(__name__)


class EngineThread:
    """The thread that does all device work, one job at a time, in order of arrival.

    `run(fn)` queues fn and waits for its result (its exception is raised in the caller);
    called from the engine thread itself it runs fn at once. `after_each` runs after every
    job: the safe point where releases asked for by other threads happen.
    """

    def __init__(self, name: str = "hotseat-engine"):
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self.after_each: Callable[[], None] | None = None
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    def on_thread(self) -> bool:
        return threading.current_thread() is self._thread

    def run(self, fn: Callable, *args, **kwargs):
        if self.on_thread():
            return fn(*args, **kwargs)
        if not self._thread.is_alive():
            raise RuntimeError("the engine is closed")
        fut: Future = Future()
        self._jobs.put((fut, fn, args, kwargs))
        return fut.result()

    def _loop(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            fut, fn, args, kwargs = job
            if not fut.set_running_or_notify_cancel():
                continue
            try:
                fut.set_result(fn(*args, **kwargs))
            except BaseException as exc:      # handed to the caller
                fut.set_exception(exc)
            if self.after_each is not None:
                try:
                    self.after_each()
                except Exception:             # a failed release must not stop the engine
                    log.exception("release at a safe point failed")

    def stop(self) -> None:
        if self._thread.is_alive() and not self.on_thread():
            self._jobs.put(None)
            self._thread.join()


class Seat(Protocol):
    """What Turns needs of the engine (all called on the engine thread)."""

    def release_all(self) -> list[str]:
        """Every model fully cold through the arbiter, pinned ones too, spare blocks
        freed; the names that were warm."""

    def warm_named(self, name: str) -> None:
        """Make a loaded model warm (budget first); KeyError when it is gone."""

    def holds_device(self) -> bool:
        """Whether any model holds device memory."""

    def device_bytes(self) -> int:
        """What this process holds on the device, spare blocks included."""

    def resident_bytes(self) -> int:
        """Device bytes held by the models."""

    def trim(self) -> int:
        """Free the spare device blocks."""


class Turns:
    """The arena's policy for one engine. `claim` before queueing a job, `turn` at a safe
    point inside a request, `safe_point` between jobs; the arena calls `on_ring` and
    `on_free` from its watcher thread."""

    def __init__(self, arena: Arena, thread: EngineThread, seat: Seat, *,
                 wake_on_free: bool = False, label: str = "", owned: bool = False,
                 pool=None):
        self.arena = arena
        self.pool = pool                     # the arena's shared VRAM (pool.py), or None
        self.thread = thread
        self.seat = seat
        self.wake_on_free = bool(wake_on_free)
        self.owned = owned                   # closed with the engine
        self.claims = 0                      # queued jobs holding the token, not yet running
        self.waiting = 0                     # callers waiting for the token
        self.evicted: list[str] = []         # warm when the arena took the GPU: woken first
        self.last_wait_s: float | None = None
        self.running = 0                     # generations on the engine thread now
        self.jobs = 0                        # claimed jobs running (start .. end), nested
        self.yield_wanted = False
        self._lock = threading.Lock()
        self._ledger_fd = -1
        log_path = os.environ.get("HOTSEAT_ARENA_LOG")
        if log_path and arena.on_event is None:
            arena.on_event = self._ledger(log_path)
        arena.attach(self.on_ring, self.on_free, label)

    # -- jobs ---------------------------------------------------------------------------------
    def claim(self, why: str, wait: float | None = None) -> bool:
        """Wait for the token before queueing a job, so that status and other models' work
        go on meanwhile; the safe point leaves a claimed token to its job. A new request
        hands the token over first when another process has asked for it, so that
        back-to-back requests of one process do not starve the others."""
        if self.thread.on_thread():
            return False
        if self.arena.wanted():
            self.on_ring()             # someone is waiting: hand over first, then queue up
        with self._lock:
            self.claims += 1
        try:
            if not self.arena.held:
                self.wait(why, wait)
        except BaseException:
            self.unclaim()
            raise
        return True

    def unclaim(self) -> None:
        with self._lock:
            self.claims -= 1

    def start(self, why: str) -> None:
        """A claimed job starts (engine thread): take the token back if a request before it
        handed it over mid-way; the holder file says which job runs."""
        self.unclaim()
        if not self.arena.held:
            self.wait(why)
        elif not self.jobs:
            self.arena.retell(why)
        self.jobs += 1

    def end(self, why: str) -> None:
        """A claimed job is over (engine thread): the holder file says the token is kept
        idle, once no job runs (a job's own jobs run inside it)."""
        self.jobs -= 1
        if not self.jobs:
            self.arena.retell(f"idle after {why}")

    def wait(self, why: str, timeout: float | None = None,
             cancel: threading.Event | None = None) -> None:
        """Take the token, counted as waiting meanwhile: up to timeout seconds (None: the
        arena's timeout, by default as long as it takes; 0: only a free token, without
        ringing), or until cancel is set (then Cancelled)."""
        a = self.arena
        if timeout is not None and timeout <= 0:
            if not a.try_acquire(why):
                if a.yielded() is not None:
                    a.acquire(why, timeout=0)          # ArenaBusy, saying until when
                h = a.holder()
                who = f"Hotseat process {h['pid']} ({h.get('reason') or 'busy'})" if h \
                    else "another Hotseat process"
                raise ArenaBusy(f"the GPU is held by {who}")
            return
        with self._lock:
            self.waiting += 1
            first = self.waiting == 1
        if first:
            a.set_member(waiting=True)
        t0 = time.monotonic()
        try:
            if cancel is None:
                a.acquire(why, timeout=timeout)
            else:
                while not a.held:
                    try:               # each try is one more flock thread: not too many
                        a.acquire(why, timeout=2.0)
                    except ArenaBusy as exc:
                        if cancel.is_set():
                            raise Cancelled() from None
                        if exc.retry_after:           # a yield: nothing to ring for
                            cancel.wait(min(exc.retry_after, 0.5))
        finally:
            with self._lock:
                self.waiting -= 1
                last = self.waiting == 0
            if last:
                a.set_member(waiting=False)
        self.last_wait_s = time.monotonic() - t0

    def turn(self, name: str, cancel: threading.Event) -> None:
        """A safe point inside a request (engine thread, between prefill chunks and decoded
        tokens): for a yield at once, for another process's ring after ARENA_SLICE_S of
        holding, go fully cold and hand the token over, then wait for it and restore the
        request's model."""
        a = self.arena
        if not a.held:
            return
        a.poll()                       # the watcher may be waiting for this very job
        if not a.wanted() or (a.yielded() is None and a.held_for() < ARENA_SLICE_S):
            return
        self.hand_over()
        self.yield_wanted = False
        self.wait(f"generate {name}", cancel=cancel)
        self.seat.warm_named(name)

    def hand_over(self) -> None:
        """Every model fully cold (through the engine, so through the arbiter), the token
        dropped."""
        t0 = time.monotonic()
        evicted = self.seat.release_all()
        if evicted:
            self.evicted = evicted
        if self.arena.yielded() is not None:
            self.drop_pool()           # a yield: the memory goes back to the device
        self.arena.emit("handed", {"release_s": time.monotonic() - t0, "t0": t0})
        self.arena.release()

    def drop_pool(self) -> None:
        """Unmap the shared pool's blocks this process does not use (pool.py): once every
        process has, the device has the memory back."""
        if self.pool is not None:
            self.pool.drop_idle()

    def drop_if_idle(self) -> None:
        if self.arena.held and not self.claims and not self.seat.holds_device():
            self.seat.trim()
            self.drop_pool()           # nobody asked for the GPU: give the memory back
            self.arena.release()

    def safe_point(self) -> None:
        """Between jobs, on the engine thread: act on a ring of the doorbell."""
        if not self.yield_wanted:
            return
        if not self.arena.held:
            self.yield_wanted = False
            return
        if self.claims:
            return                     # a queued job holds the token; after it
        self.hand_over()
        self.yield_wanted = False

    # -- the arena's watcher ------------------------------------------------------------------
    def on_ring(self) -> None:
        """The doorbell rang (on the arena's watcher thread, or a new request saw the ring):
        at the next safe point, evict every model fully, pinned ones too, and hand the token
        over. Returns once the token is handed over (or was not held)."""
        self.yield_wanted = True
        while self.arena.held and self.yield_wanted:
            try:
                self.thread.run(self.safe_point)
            except RuntimeError:       # closed meanwhile
                return
            if self.yield_wanted and self.arena.held:
                time.sleep(0.005)      # a queued job holds the token: it runs first

    def on_free(self) -> None:
        """The token is free (on the arena's watcher thread): with wake_on_free, take it back
        without ringing and restore the models the arena took, unless another process has
        just rung (the token is on its way to it) or a yield has just ended (processes with
        requests waiting for it take the token first)."""
        a = self.arena
        if self.pool is not None and not a.held and not a.rung_recently(2 * a.ring_interval) \
                and (a.yielded() is not None or not a.is_taken()):
            self.drop_pool()           # a yield, or a token left free: nobody needs the pool
        if not self.wake_on_free or a.held or not self.evicted or a.yielded() is not None \
                or a.rung_recently(2 * a.ring_interval) or a.is_taken():
            return
        if time.time() - a.yield_ended < a.ring_interval:
            return                     # a yield just ended: requests waiting for it go first
        with self._lock:
            self.claims += 1
        try:
            got = a.try_acquire("wake " + ", ".join(self.evicted))
        except BaseException:
            self.unclaim()
            raise
        if not got:
            self.unclaim()
            return
        names, self.evicted = self.evicted, []

        def job():
            self.unclaim()
            if not a.held:             # taken again meanwhile by a ring: nothing to wake
                return
            for name in names:
                try:
                    self.seat.warm_named(name)
                except KeyError:       # unloaded meanwhile
                    continue
                except BudgetError:
                    break
            self.drop_if_idle()
        try:
            self.thread.run(job)
        except RuntimeError:           # closed meanwhile
            pass

    # -- status -------------------------------------------------------------------------------
    def status(self) -> dict:
        """Where this process stands in the arena: "state" is "holder" (it holds the GPU
        token), "yielded" (a yield is in force, "until" then), "waiting" (a request waits
        for the token) or "cold"; "holder_pid" is the token's holder, "processes" every live
        member of the arena with its own state. Reads bookkeeping only."""
        a = self.arena
        until = a.yielded()
        held = a.held
        device = self.seat.device_bytes()
        held = held or a.held          # read around the bytes: a handover between counts held
        holder = a.holder()
        holder_pid = holder["pid"] if holder else None
        waiting = self.waiting
        state = "holder" if held else "yielded" if until else "waiting" if waiting else "cold"
        procs = []
        for p in a.members():
            pid = p["pid"]
            procs.append({"pid": pid, "label": p.get("label") or "",
                          "state": "holder" if pid == holder_pid else "yielded" if until
                          else "waiting" if p.get("waiting") else "cold",
                          "until": until, "self": pid == a.pid})
        return {"state": state, "until": until, "holder_pid": holder_pid, "pid": a.pid,
                "dir": a.dir, "yielded_by": a.yield_by if until else None,
                "waiting_requests": waiting, "requests_running": self.running,
                "wake_on_free": self.wake_on_free,
                "device_bytes": device, "acquisitions": a.acquisitions,
                "held_for_s": a.held_for(), "last_wait_s": self.last_wait_s,
                "pool": self.pool.describe() if self.pool is not None else None,
                "processes": procs}

    def _ledger(self, path: str) -> Callable[[str, dict], None]:
        fd = self._ledger_fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT
                                       | os.O_CLOEXEC, 0o600)
        pid = os.getpid()

        def write(event: str, info: dict) -> None:
            if event not in ("acquired", "released", "waiting", "rung", "handed"):
                return
            rec = {"t": time.monotonic(), "wall": time.time(), "pid": pid, "event": event,
                   "alloc": self.seat.device_bytes(),
                   "bytes": self.seat.resident_bytes(), "reason": info.get("reason", "")}
            if event == "rung":        # when the ring was written (wall clock) and by whom
                rec.update(ring_wall=info.get("t"), by=info.get("pid"))
            elif event == "handed":    # the release at the safe point, from its start
                rec.update(release_s=info["release_s"], t0=info["t0"])
            os.write(fd, (json.dumps(rec) + "\n").encode())
        return write

    def leave(self) -> None:
        """On the engine thread, at close: stop listening and drop the token."""
        self.arena.detach(self.on_ring)
        self.arena.release()

    def close(self) -> None:
        if self.owned:
            self.arena.close()
        if self._ledger_fd >= 0:
            os.close(self._ledger_fd)
            self._ledger_fd = -1
