"""The busy labels: what runs, what waits, tokens per second."""
from __future__ import annotations

import time

from app.activity import Activity


def test_running_and_queued():
    changes = []
    act = Activity(on_change=lambda: changes.append(1))
    gen = act.begin("a", "generate", "chat")
    act.start(gen)
    warm = act.begin("b", "warm")
    act.start(warm)                                 # called, waiting on the engine thread
    assert act.running() is gen
    assert act.busy() == {"a": "generating · prompt", "b": "queued: warm"}
    for _ in range(3):
        act.tick(gen)
        time.sleep(0.01)
    assert act.busy()["a"].startswith("generating · ") and act.busy()["a"].endswith("tok/s")
    act.end(gen)
    assert act.busy() == {"b": "warming"}
    act.end(warm)
    assert act.busy() == {} and changes


def test_an_op_not_yet_called_is_queued_and_more_are_counted():
    act = Activity()
    a = act.begin("a", "evict")
    act.begin("a", "warm")
    assert act.busy() == {"a": "queued: evict (+1)"}
    act.start(a)
    assert act.busy() == {"a": "evicting (+1)"}


def test_rate():
    act = Activity()
    op = act.begin("a", "generate")
    act.tick(op)
    op.t_first -= 1.0                               # the first token a second ago
    act.tick(op, 10)
    assert 9 < op.rate() < 11.5
    assert act.generating()
