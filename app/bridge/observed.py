"""The engine as the tray's endpoint sees it: the whole facade (engine.facade.EngineAPI),
each method passed through to the engine as it is called; generate() also reports to the
bridge's activity (busy state, tokens/s) and log.

The pass-through methods are made from the Protocol itself, so they take what it takes
(tests/engine/test_facade.py compares the signatures); only generate() is written out.
"""
from __future__ import annotations

import functools
import inspect
import threading
from typing import Callable, Protocol

from engine.facade import Completion, EngineAPI, Request

from .messages import rate_text



class Observer(Protocol):
    """What the wrapper reports to (the bridge): the activity and its log."""
    activity: object

    def log(self, text: str) -> None: ...


def api_methods() -> list[str]:
    """The names of EngineAPI's methods."""
    return [n for n, v in vars(EngineAPI).items()
            if not n.startswith("_") and inspect.isfunction(v)]


def _pass_through(name: str):
    proto = getattr(EngineAPI, name)

    @functools.wraps(proto)
    def method(self, *args, **kw):
        return getattr(self._engine, name)(*args, **kw)
    del method.__wrapped__                # its own signature, set from the Protocol's below
    method.__signature__ = inspect.signature(proto)
    method.__qualname__ = f"ObservedEngine.{name}"
    return method


class ObservedEngine:
    """Every EngineAPI method of `engine`; generate() observed by `bridge`."""

    def __init__(self, engine: EngineAPI, bridge: Observer):
        self._engine, self._bridge = engine, bridge

    @property
    def device_name(self) -> str:
        return self._engine.device_name

    def generate(self, request: Request, on_text: Callable[[str], None] | None = None,
                 cancel: threading.Event | None = None) -> Completion:
        name = request.name
        b = self._bridge
        op = b.activity.begin(name or "?", "generate", "endpoint")
        b.activity.start(op)

        def counted(text: str, *entries) -> None:      # entries: with logprobs
            b.activity.tick(op)
            if on_text is not None:
                on_text(text, *entries)
        try:
            out = self._engine.generate(request, on_text=counted, cancel=cancel)
        finally:
            b.activity.end(op)
        b.log(f"Endpoint: {len(out.tokens)} tokens from {name}{rate_text(out.timings)}")
        return out


for _name in api_methods():
    if _name not in vars(ObservedEngine):
        setattr(ObservedEngine, _name, _pass_through(_name))
del _name
