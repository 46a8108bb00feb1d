"""Game mode (engine/residency/gamemode.py): the policy against scripted budget readings, then
the watcher in an Engine whose driver budget is faked (lavapipe has none), on SmolLM2: warm,
another program "allocates", the engine is cold within 1 s and says why, and comes back with
the same answer once the budget allows it."""
from __future__ import annotations

import threading
import time

import pytest

from engine.residency.gamemode import GameMode, GameWatch, GaveUp, Reading

MiB = 1 << 20
GiB = 1 << 30
HEAP = 24 * GiB
MODEL = 5 * GiB


def reading(others: int, own: int, heap: int = HEAP) -> Reading:
    """What VK_EXT_memory_budget reports with `others` bytes used by other programs and
    `own` by this process: the budget is what others leave, the usage our own."""
    return Reading(heap - others, own)


# -- the policy -------------------------------------------------------------------------------

def test_default_margin_is_3_percent_of_the_heap_and_at_least_512_mib():
    assert GameMode(HEAP).margin == int(HEAP * 0.03)
    assert GameMode(4 * GiB).margin == 512 * MiB
    assert GameMode(140 * GiB).margin == int(140 * GiB * 0.03)
    assert GameMode(HEAP).resume_margin == 2 * GameMode(HEAP).margin


def test_fits_while_others_leave_the_margin_free_then_release():
    gm = GameMode(HEAP)
    m = gm.margin
    assert gm.check(reading(0, MODEL), MODEL) == "fits"
    # others grow up to the margin's edge: still fits
    edge = HEAP - MODEL - m
    assert gm.check(reading(edge, MODEL), MODEL) == "fits"
    assert gm.check(reading(edge + 1, MODEL), MODEL) == "release"
    assert gm.given_up


def test_nothing_held_is_never_released():
    gm = GameMode(HEAP)
    assert gm.check(reading(HEAP, 0), 0) == "fits"
    assert not gm.given_up


def test_coming_back_needs_the_budget_not_time():
    """After a release, others' usage unchanged: the model may not come back, however often
    it asks; it may once others shrank so far that twice the margin stays free."""
    gm = GameMode(HEAP)
    m = gm.margin
    others = HEAP - MODEL - m // 2            # half the margin left free: release
    assert gm.check(reading(others, MODEL), MODEL) == "release"
    cold = reading(others, 0)                 # released: own usage 0
    for _ in range(100):
        assert not gm.may_come_back(cold, MODEL)
    # others shrink to where one margin is free after the upload: still not (hysteresis)
    assert not gm.may_come_back(reading(HEAP - MODEL - m, 0), MODEL)
    assert not gm.may_come_back(reading(HEAP - MODEL - 2 * m + 1, 0), MODEL)
    assert gm.may_come_back(reading(HEAP - MODEL - 2 * m, 0), MODEL)
    assert not gm.given_up
    # back and warm with one margin free: fits again, no flapping at the edge it came at
    assert gm.check(reading(HEAP - MODEL - m, MODEL), MODEL) == "fits"


def test_no_flapping_when_others_hover_at_the_edge():
    """Others' usage oscillating by less than a margin around the release point: one
    release, and no return while it oscillates, whatever the model asks."""
    gm = GameMode(HEAP)
    m = gm.margin
    edge = HEAP - MODEL - m
    events = []
    own = MODEL
    for i in range(200):
        others = edge + (m // 4 if i % 2 else -m // 4)
        if own:
            if gm.check(reading(others, own), own) == "release":
                events.append("release")
                own = 0
        elif gm.may_come_back(reading(others, own), MODEL):
            events.append("back")
            own = MODEL
    assert events == ["release"]


def test_a_fresh_upload_keeps_one_margin_free():
    gm = GameMode(HEAP)
    m = gm.margin
    assert gm.may_come_back(reading(HEAP - MODEL - m, 0), MODEL)
    assert not gm.may_come_back(reading(HEAP - MODEL - m + 1, 0), MODEL)


def test_margin_from_the_environment_and_the_off_switch():
    gm = GameMode.from_env(HEAP, {"HOTSEAT_GAME_MARGIN_MIB": "100"})
    assert gm.enabled and gm.margin == 100 * MiB
    assert gm.check(reading(HEAP - MODEL - 99 * MiB, MODEL), MODEL) == "release"
    gm = GameMode.from_env(HEAP, {"HOTSEAT_GAME_MARGIN_MIB": "100"})
    assert gm.check(reading(HEAP - MODEL - 101 * MiB, MODEL), MODEL) == "fits"
    assert GameMode.from_env(HEAP, {}).margin == GameMode(HEAP).margin
    for off in ("0", "off", "false", "no", "OFF"):
        gm = GameMode.from_env(HEAP, {"HOTSEAT_GAME_MODE": off})
        assert not gm.enabled
        assert gm.check(reading(HEAP, MODEL), MODEL) == "fits"
        assert gm.may_come_back(reading(HEAP, 0), MODEL)
    with pytest.raises(ValueError, match="HOTSEAT_GAME_MARGIN_MIB"):
        GameMode.from_env(HEAP, {"HOTSEAT_GAME_MARGIN_MIB": "lots"})
    with pytest.raises(ValueError, match="HOTSEAT_GAME_MARGIN_MIB"):
        GameMode.from_env(HEAP, {"HOTSEAT_GAME_MARGIN_MIB": "-1"})


# -- the watcher, without an engine --------------------------------------------------------------

class Fake:
    """A device budget scripted by the test and an engine thread that releases."""

    def __init__(self):
        self.others = 0
        self.own = MODEL
        self.released = 0
        self.events: list[tuple[str, dict]] = []

    def read(self):
        return HEAP - self.others, self.own

    def release(self):
        self.released += 1
        self.own = 0
        return ["m"]


def watch(fake: Fake, gm: GameMode) -> GameWatch:
    return GameWatch(gm, read=fake.read, held=lambda: fake.own, warm_need=lambda: MODEL,
                     release=fake.release, run=lambda fn: fn(),
                     emit=lambda e, i: fake.events.append((e, i)))


def test_watch_releases_once_and_gates_until_the_budget_allows():
    fake, gm = Fake(), GameMode(HEAP)
    w = watch(fake, gm)
    assert w.poll() == "fits" and w.status() is None
    fake.others = HEAP - MODEL - 100 * MiB
    assert w.poll() == "release" and fake.released == 1
    st = w.status()
    assert st["kind"] == "released" and st["free_bytes"] == 100 * MiB
    assert st["need_bytes"] == MODEL and st["models"] == ["m"]
    assert "another program" in st["reason"] and "100 MiB was left free" in st["reason"]
    assert [e for e, _ in fake.events] == ["gave_up"]
    assert w.poll() == "idle"                     # nothing held: nothing read, no release
    with pytest.raises(GaveUp, match="needs 5.0 GiB") as exc:
        w.gate("m", MODEL)
    assert exc.value.code == "gpu_given_up"
    assert w.status()["checked"]["free_bytes"] == MODEL + 100 * MiB
    fake.others = 0
    w.gate("m", MODEL)                            # passes: the record is lifted
    assert w.status() is None and [e for e, _ in fake.events] == ["gave_up", "came_back"]


def test_watch_point_releases_and_ends_the_request():
    """A give-up asked for while a job runs: the job's next safe point releases and raises;
    the queued release then finds nothing to do."""
    fake, gm = Fake(), GameMode(HEAP)
    queued = []
    w = GameWatch(gm, read=fake.read, held=lambda: fake.own, warm_need=lambda: MODEL,
                  release=fake.release, run=queued.append, emit=lambda e, i: None)
    fake.others = HEAP
    assert w.poll() == "release" and fake.released == 0 and len(queued) == 1
    with pytest.raises(GaveUp, match="the request was stopped"):
        w.point()
    assert fake.released == 1
    assert queued[0]() is None and fake.released == 1
    w.point()                                     # nothing pending: no error


def test_watch_thread_polls_and_stops():
    fake, gm = Fake(), GameMode(HEAP)
    w = watch(fake, gm)
    w.poll_s = 0.01
    done = threading.Event()
    w._emit = lambda e, i: done.set()
    w.start()
    try:
        fake.others = HEAP
        assert done.wait(2.0) and fake.released == 1
    finally:
        w.stop()
    assert not w._thread.is_alive()
