"""A served model's slot: its name, context and FIFO queue. Below app.py, openai.py and
metrics.py, which all read it (so none of them imports app.py)."""
from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field
from typing import AsyncIterator

from .errors import ApiError, bad


@dataclass
class ModelSlot:
    """A served model and its queue."""
    name: str
    n_ctx: int
    created: int
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    depth: int = 0                        # requests holding or waiting for the lock
    closed: bool = False                  # unloaded; requests still queued get a 404

    def room(self, n_prompt: int, asked: int | None = None, param: str = "max_tokens",
             what: str = "prompt", window: int | None = None) -> int:
        """The most tokens an answer may take after a prompt of n_prompt tokens: what the
        client asked for, or (None) all the room the context (or a narrower `window`)
        leaves. Asking for more than that room is a 400 naming `param`, as OpenAI answers
        it; every route computes its budget here."""
        n_ctx = self.n_ctx if window is None else window
        left = n_ctx - n_prompt
        if asked is None:
            return left
        if asked > left:
            raise bad(f"{param} is too large: {asked}. The context of {self.name!r} "
                      f"({n_ctx} tokens) holds at most {left} completion tokens after the "
                      f"{n_prompt} of the {what}, whereas you provided {asked}.", param,
                      "invalid_value")
        return asked


@contextlib.asynccontextmanager
async def queued(slot: ModelSlot, turn: asyncio.Lock, shown: str | None = None,
                 param: str = "model") -> AsyncIterator[None]:
    """A request's place in its model's FIFO queue, then the device's turn: held for the
    block. A model unloaded while the request waited is a 404 naming it (`shown`: the name
    the client used, else the slot's) and the request `param` that named it."""
    slot.depth += 1
    try:
        async with slot.lock, turn:
            if slot.closed:
                raise ApiError(404, f"the model {shown or slot.name!r} was unloaded", param,
                               "model_not_found")
            yield
    finally:
        slot.depth -= 1
