"""Game mode: Hotseat gives the GPU up by itself when another program needs its memory.

A game, ComfyUI or a CUDA job that allocates VRAM makes the driver's budget for this process
shrink (VK_EXT_memory_budget: heapBudget is what this process may use, about the free VRAM
plus its own usage, so it moves with the others' usage and not with ours). When what is left
free to the others falls under a margin, the engine goes fully cold at its next safe point,
through the arbiter like every other release, and says why; a request running then ends with
`GaveUp` (a 503 over HTTP). The next request comes back only once the budget allows its
model with twice the margin to spare; until then it gets the same error, saying how much is
free and how much the model needs.

Two parts: `GameMode`, the policy, a small pure class fed readings (no Vulkan, no threads);
`GameWatch`, its place in an engine: a daemon thread that reads the budget every POLL_S
while this process holds device memory, and the hooks the engine calls on its own thread
(`point` at safe points, `gate` before every upload).

    $HOTSEAT_GAME_MODE=0           off (the budget is not watched, nothing is refused)
    $HOTSEAT_GAME_MARGIN_MIB=N     the margin in MiB (default: max(512 MiB, 3% of the heap))
"""
from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass
from typing import Callable

from .arbiter import BudgetError

MiB = 1 << 20
GiB = 1 << 30
POLL_S = 0.25                  # between readings of the budget while device memory is held
MIN_MARGIN = 512 * MiB
MARGIN_FRACTION = 0.03
RESUME_FACTOR = 2              # coming back needs this many margins left free
RETRY_AFTER_S = 5              # what a refused request is told to wait before trying again

log = logging.getLogger(__name__)


class GaveUp(BudgetError):
    """The GPU was given up to another program (game mode): a request running then, or one
    that came while its model may not come back yet."""
    code = "gpu_given_up"
    retry_after = RETRY_AFTER_S


def size(n: int) -> str:
    """Bytes for people: GiB with one decimal from 1 GiB, else MiB."""
    return f"{n / GiB:.1f} GiB" if n >= GiB else f"{n / MiB:.0f} MiB"


@dataclass(frozen=True)
class Reading:
    """One reading of VK_EXT_memory_budget's device-local heap."""
    budget: int                # heapBudget: what this process may use
    usage: int                 # heapUsage: what it uses

    @property
    def free(self) -> int:
        """What is left free to the other programs."""
        return max(0, self.budget - self.usage)


class GameMode:
    """The policy. `check` while holding device memory: "release" when the free VRAM left
    to others fell under the margin, else "fits". `may_come_back` before an upload of `need`
    bytes: whether the margin stays free after it (twice the margin after a release, so that
    others' usage hovering at the edge does not make the engine load and release in turns;
    only the budget lifts it, never a timer).

    The margin, by default max(512 MiB, 3% of the heap): a game or a CUDA job allocates in
    steps of hundreds of MiB, and a desktop compositor needs a few hundred MiB more when a
    window opens; 3% of a 24 GiB card is 737 MiB, of an H200 (140 GiB) 4.2 GiB, where
    CUDA's own context and a framework's caching allocator add as much. Since every upload
    passes `may_come_back`, the engine's own allocations never push the free VRAM under the
    margin: only another program's do. On a small card that means the engine's budget is in
    effect capped at the free VRAM less the margin; lower the margin, or turn game mode off,
    to use the rest."""

    def __init__(self, heap_bytes: int, margin_bytes: int | None = None,
                 enabled: bool = True):
        self.heap = int(heap_bytes)
        self.margin = int(margin_bytes) if margin_bytes is not None else \
            max(MIN_MARGIN, int(self.heap * MARGIN_FRACTION))
        if self.margin < 0:
            raise ValueError(f"the game-mode margin must be >= 0, got {self.margin}")
        self.enabled = bool(enabled)
        self.given_up = False          # released for another program; lifted by the budget

    @classmethod
    def from_env(cls, heap_bytes: int, environ=None) -> "GameMode":
        """$HOTSEAT_GAME_MODE=0 (or off, false, no) turns it off; $HOTSEAT_GAME_MARGIN_MIB
        sets the margin."""
        env = os.environ if environ is None else environ
        enabled = env.get("HOTSEAT_GAME_MODE", "1").strip().lower() not in (
            "0", "off", "false", "no")
        raw = env.get("HOTSEAT_GAME_MARGIN_MIB", "").strip()
        margin = None
        if raw:
            try:
                margin = int(float(raw) * MiB)
            except ValueError:
                raise ValueError(f"HOTSEAT_GAME_MARGIN_MIB must be a number of MiB, got "
                                 f"{raw!r}") from None
            if margin < 0:
                raise ValueError(f"HOTSEAT_GAME_MARGIN_MIB must be >= 0, got {raw!r}")
        return cls(heap_bytes, margin, enabled)

    @property
    def resume_margin(self) -> int:
        return RESUME_FACTOR * self.margin

    def check(self, reading: Reading, held: int) -> str:
        """"release" when this process holds device memory (held bytes) and others left it
        less than the margin free; else "fits"."""
        if not self.enabled or held <= 0 or reading.free >= self.margin:
            return "fits"
        self.given_up = True
        return "release"

    def may_come_back(self, reading: Reading, need: int) -> bool:
        """Whether need more bytes may be uploaded now: the margin (after a release, twice
        it) must stay free. A yes lifts the release."""
        if not self.enabled:
            return True
        ok = reading.free - max(0, need) >= self.margin_now
        if ok:
            self.given_up = False
        return ok

    @property
    def margin_now(self) -> int:
        """What must stay free after an upload now."""
        return self.resume_margin if self.given_up else self.margin

    def describe(self) -> dict:
        return {"enabled": self.enabled, "margin_bytes": self.margin,
                "resume_margin_bytes": self.resume_margin, "given_up": self.given_up}


class GameWatch:
    """Game mode in one engine. The watcher thread reads the budget every POLL_S while this
    process holds device memory; on "release" it asks the engine thread to release every
    model (`release`, through the arbiter and, with an arena, by handing the token over) at
    its next safe point: between jobs, or inside a request at `point()`, which then raises
    GaveUp. `gate()` runs before every upload and raises GaveUp while the budget does not
    allow it. `status()` is the record of the give-up while it holds (None otherwise)."""

    def __init__(self, policy: GameMode, *, read: Callable[[], tuple[int, int] | None],
                 held: Callable[[], int], warm_need: Callable[[], int],
                 release: Callable[[], list[str]], run: Callable,
                 emit: Callable[[str, dict], None], poll_s: float = POLL_S):
        self.policy = policy
        self._read, self._held, self._warm_need = read, held, warm_need
        self._release, self._run, self._emit = release, run, emit
        self.poll_s = poll_s
        self._lock = threading.Lock()
        self._pending: dict | None = None    # a give-up asked for, not yet done
        self._active: dict | None = None     # the give-up in force, until an upload passes
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.releases = 0

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="hotseat-game-mode",
                                        daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        t = self._thread
        if t is not None and t is not threading.current_thread():
            t.join(timeout=10.0)

    def reading(self) -> Reading | None:
        raw = self._read()
        return None if raw is None else Reading(int(raw[0]), int(raw[1]))

    # -- the watcher thread -----------------------------------------------------------------
    def _loop(self) -> None:
        failed = False
        while not self._stop.wait(self.poll_s):
            try:
                self.poll()
            except RuntimeError:           # the engine closed meanwhile
                if self._stop.is_set():
                    return
                if not failed:
                    log.exception("game mode: a reading of the budget failed")
                failed = True
            except Exception:
                if not failed:             # once: a broken reading must not flood the log
                    log.exception("game mode: a reading of the budget failed")
                failed = True

    def poll(self) -> str:
        """One reading and what it led to: "idle" (no device memory held, nothing read),
        "fits" or "release" (the give-up done when this returns)."""
        held = self._held()
        if held <= 0:
            return "idle"
        r = self.reading()
        if r is None:
            return "idle"
        with self._lock:
            verdict = self.policy.check(r, held)
            if verdict != "release":
                return verdict
            need = self._warm_need()
            self._pending = {
                "t": time.time(), "kind": "released", "free_bytes": r.free,
                "budget_bytes": r.budget, "usage_bytes": r.usage, "held_bytes": held,
                "need_bytes": need, "margin_bytes": self.policy.margin,
                "reason": (f"another program is using the GPU's memory: {size(r.free)} was "
                           f"left free, under the {size(self.policy.margin)} game mode "
                           f"keeps free for other programs, so Hotseat released its "
                           f"{size(held)}; it comes back at the next request once "
                           f"{size(need + self.policy.resume_margin)} is free")}
        self._run(self.apply)
        return "release"

    # -- on the engine thread ---------------------------------------------------------------
    def apply(self) -> dict | None:
        """Do a give-up asked for (engine thread): every model released; its record."""
        with self._lock:
            rec = self._pending
            self._pending = None
        if rec is None:
            return None
        rec.update(models=[], release_s=None)     # filled in once released
        with self._lock:
            self._active = rec         # shown from the start: the engine is going cold
        t0 = time.monotonic()
        names = self._release()
        with self._lock:
            rec.update(models=names, release_s=time.monotonic() - t0)
            self.releases += 1
        log.warning("game mode: %s", rec["reason"])
        self._emit("gave_up", dict(rec))
        return rec

    def point(self) -> None:
        """A safe point (engine thread): with a give-up asked for, release now and end the
        request with GaveUp."""
        if self._pending is None:
            return
        rec = self.apply()
        if rec is not None:
            raise GaveUp(f"the request was stopped: {rec['reason']}")

    def gate(self, name: str, need: int) -> None:
        """Before need bytes are uploaded for a model (engine thread): GaveUp unless the
        budget allows them."""
        r = self.reading()
        if r is None:
            return
        with self._lock:
            margin = self.policy.margin_now
            if self.policy.may_come_back(r, need):
                if self._active is not None:
                    came = self._active
                    self._active = None
                    log.info("game mode: back on the GPU (%s free)", size(r.free))
                    self._emit("came_back", {"gave_up": came, "free_bytes": r.free})
                return
            why = (f"another program is using the GPU's memory: {size(r.free)} of VRAM is "
                   f"free, and {name} needs {size(need)} with {size(margin)} left free for "
                   f"other programs (game mode; $HOTSEAT_GAME_MODE=0 turns it off). Hotseat "
                   f"comes back once that much is free")
            if self._active is None:
                self._active = {"t": time.time(), "kind": "refused", "free_bytes": r.free,
                                "budget_bytes": r.budget, "usage_bytes": r.usage,
                                "held_bytes": 0, "need_bytes": need,
                                "margin_bytes": margin, "models": [], "reason": why}
            self._active["checked"] = {"t": time.time(), "free_bytes": r.free,
                                       "need_bytes": need, "model": name}
        raise GaveUp(why)

    # -- status -----------------------------------------------------------------------------
    def status(self) -> dict | None:
        with self._lock:
            if self._active is None:
                return None
            rec = dict(self._active)
        if "checked" in rec:
            rec["checked"] = dict(rec["checked"])
        return rec
