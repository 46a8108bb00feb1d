"""A served model's slot: its name, context and FIFO queue. Below app.py, openai.py and
metrics.py, which all read it (so none of them imports app.py)."""
from __future__ import annotations

import asyncio
from dataclasses import dataclass, field


@dataclass
class ModelSlot:
    """A served model and its queue."""
    name: str
    n_ctx: int
    created: int
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    depth: int = 0                        # requests holding or waiting for the lock
    closed: bool = False                  # unloaded; requests still queued get a 404
