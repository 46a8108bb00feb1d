"""The engine as the tray's endpoint sees it."""
from __future__ import annotations

from typing import TYPE_CHECKING

from .messages import rate_text

if TYPE_CHECKING:
    from .core import EngineBridge


class ObservedEngine:
    """The engine as the endpoint sees it: generate() also reports to the activity (busy
    state, tokens/s, last use); everything else is the engine's own."""

    def __init__(self, engine, bridge: EngineBridge):
        self._engine, self._bridge = engine, bridge

    def __getattr__(self, name: str):
        return getattr(self._engine, name)

    def generate(self, name=None, prompt=None, messages=None, tokens=None, max_tokens=128,
                 sampling=None, stop=(), on_text=None, cancel=None):
        b = self._bridge
        op = b.activity.begin(name or "?", "generate", "endpoint")
        b.activity.start(op)

        def counted(text: str) -> None:
            b.activity.tick(op)
            if on_text is not None:
                on_text(text)
        try:
            out = self._engine.generate(name, prompt=prompt, messages=messages, tokens=tokens,
                                        max_tokens=max_tokens, sampling=sampling, stop=stop,
                                        on_text=counted, cancel=cancel)
        finally:
            b.activity.end(op)
            b.touch(name)
        b.log(f"Endpoint: {len(out.tokens)} tokens from {name}{rate_text(out.timings)}")
        return out

