"""Idle eviction on the real engine: the engine's idle time, and a model's own (which
Ollama's keep_alive sets through the server), with nothing generated."""
from __future__ import annotations

import time

import pytest

from engine.api import Engine

pytestmark = pytest.mark.gpu


def test_a_models_own_idle_time_overrides_the_engines(smollm2_path):
    with Engine(n_ctx=64) as eng:
        a = eng.load(smollm2_path, name="a")
        b = eng.load(smollm2_path, name="b")
        state = lambda: {s["name"]: s["state"] for s in eng.status()}   # noqa: E731
        eng.warm(a)
        eng.warm(b)
        now = time.monotonic()
        assert eng.evict_idle(now + 1000) == []               # no idle eviction at all
        eng.set_idle_evict(60)                                # the engine's
        eng.set_idle_evict(0, name=a)                         # a: never
        eng.set_idle_evict(5, name=b)                         # b: after 5 s
        limits = {s["name"]: s["idle_evict_s"] for s in eng.status()}
        assert limits == {"a": 0.0, "b": 5.0}
        assert all(0 <= s["idle_s"] < 60 for s in eng.status())
        assert eng.evict_idle(now + 4) == []
        assert eng.evict_idle(now + 6) == ["b"]
        assert state() == {"a": "warm", "b": "cold"}
        assert eng.evict_idle(now + 1000) == []               # a never goes idle-cold
        with pytest.raises(KeyError):
            eng.set_idle_evict(5, name="nobody")
        with pytest.raises(ValueError):
            eng.set_idle_evict(-1, name=a)
        eng.unload(a)                                         # its own time goes with it
        eng.load(smollm2_path, name="a")
        eng.warm("a")
        assert eng.evict_idle(time.monotonic() + 61) == ["a"]  # the engine's 60 s again
