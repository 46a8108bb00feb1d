"""The GPU's turns across processes, as the HTTP API shows them: GET /api/arena, and the
request header by which a client says how long it waits for the GPU.

    X-Hotseat-Wait: 0       # answer at once: 503 with Retry-After when the GPU is yielded
                            # (`hotseat yield`) or another Hotseat process holds it
    X-Hotseat-Wait: 2.5     # wait at most 2.5 s for it, then the same 503

Without the header a request waits for the GPU as long as it takes (a yield lasts until its
end; another process hands the GPU over at its next safe point).
"""
from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING

from .errors import bad, gpu_unavailable, json_response

if TYPE_CHECKING:
    from aiohttp import web

WAIT_HEADER = "X-Hotseat-Wait"


def parse_wait(request: web.Request) -> float | None:
    """The seconds a request waits for the GPU (X-Hotseat-Wait), None without the header."""
    raw = request.headers.get(WAIT_HEADER)
    if raw is None:
        return None
    try:
        v = float(raw)
    except ValueError:
        v = math.nan
    if not math.isfinite(v) or v < 0:
        raise bad(f"the {WAIT_HEADER} header must be a number of seconds >= 0, got "
                  f"{raw[:40]!r}", WAIT_HEADER, "invalid_value")
    return v


def check_yield(engine, wait: float | None) -> None:
    """Fail at once (before queueing behind other requests) when a yield outlasts `wait`."""
    if wait is None:
        return
    until = engine.yielded_until()
    if until is not None and until - time.time() > wait:
        from ..residency.arena import ArenaBusy

        st = engine.arena_status() or {}
        by = f" (by process {st['yielded_by']})" if st.get("yielded_by") else ""
        raise gpu_unavailable(ArenaBusy(
            f"the GPU is yielded to other programs until "
            f"{time.strftime('%H:%M:%S', time.localtime(until))}{by}",
            retry_after=until - time.time()))


class ArenaRoutes:
    """GET /api/arena (a mixin of Server: it uses the engine and the worker pool)."""

    async def api_arena(self, request: web.Request) -> web.Response:
        status = await self._run(_arena_status, self.engine)
        return json_response({"enabled": status is not None, **(status or {})})


def _arena_status(engine) -> dict | None:
    return engine.arena_status()
