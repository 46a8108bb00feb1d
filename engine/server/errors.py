"""Errors in OpenAI's shape, `{"error": {"message", "type", "param", "code"}}`, and the checks
of request values that raise them (a 400 naming the parameter).
"""
from __future__ import annotations

import json
import math
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from aiohttp import web

    from ..residency.arbiter import BudgetError
    from ..residency.arena import ArenaBusy


class ApiError(Exception):
    """A request that gets an OpenAI-shaped error response."""

    def __init__(self, status: int, message: str, param: str | None = None,
                 code: str | None = None, type_: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.type = type_ or ("server_error" if status >= 500 else "invalid_request_error")
        self.headers: dict | None = None          # sent with the error (Retry-After)

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param,
                          "code": self.code}}


def bad(message: str, param: str | None = None, code: str | None = None) -> ApiError:
    return ApiError(400, message, param, code)


def json_response(obj: Any, status: int = 200, headers: dict | None = None) -> web.Response:
    from aiohttp import web

    return web.Response(text=json.dumps(obj, ensure_ascii=False), status=status,
                        content_type="application/json", headers=headers)




def gpu_unavailable(exc: ArenaBusy) -> ApiError:
    """503 with Retry-After: the GPU did not come within the wait the client allowed
    (X-Hotseat-Wait, see turns.py): a yield until then, or another process's turn."""
    retry = exc.retry_after
    err = ApiError(503, str(exc), None, "gpu_yielded" if retry else "gpu_busy")
    err.headers = {"Retry-After": str(max(1, math.ceil(retry or 1)))}
    return err


def over_budget(exc: BudgetError) -> ApiError:
    from ..residency.arbiter import PinnedError
    from ..residency.arena import ArenaBusy
    from ..residency.gamemode import GaveUp

    if isinstance(exc, ArenaBusy):            # not the budget: the GPU's turn did not come
        return gpu_unavailable(exc)
    if isinstance(exc, GaveUp):               # game mode: another program holds the VRAM
        err = ApiError(503, str(exc), None, exc.code)
        err.headers = {"Retry-After": str(exc.retry_after)}
        return err
    code = "model_pinned" if isinstance(exc, PinnedError) else "budget_exceeded"
    return ApiError(409, str(exc), None, code)




# -- request values ------------------------------------------------------------------------

def show(v: Any) -> str:
    """A client's value for an error message, kept short."""
    text = json.dumps(v)
    return text if len(text) <= 40 else text[:37] + "..."


def number(body: dict, key: str, default: float, lo: float | None = None,
            hi: float | None = None, lo_open: bool = False) -> float:
    """body[key] within [lo, hi] ((lo, hi] with lo_open), or default when it is absent."""
    v = body.get(key)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise bad(f"{key} must be a number, got {show(v)}", key, "invalid_type")
    if (lo is not None and (v <= lo if lo_open else v < lo)) or (hi is not None and v > hi):
        low = f"> {lo}" if lo_open else f">= {lo}"
        span = (f"between {lo} and {hi}" if not lo_open else f"{low} and <= {hi}") \
            if lo is not None and hi is not None else low if lo is not None else f"<= {hi}"
        raise bad(f"{key} must be {span}, got {v}", key, "invalid_value")
    return float(v)


def integer(body: dict, key: str, default: int | None, lo: int | None = None) -> int | None:
    v = body.get(key)
    if v is None:
        return default
    # 1e12 is an integer written as a JSON float; 1.5, true and "8" are not
    if isinstance(v, float) and math.isfinite(v) and v.is_integer():
        v = int(v)
    if isinstance(v, bool) or not isinstance(v, int):
        raise bad(f"{key} must be an integer, got {show(v)}", key, "invalid_type")
    if lo is not None and v < lo:
        raise bad(f"{key} must be >= {lo}, got {v}", key, "invalid_value")
    return v


def boolean(body: dict, key: str, default: bool | None) -> bool | None:
    v = body.get(key)
    if v is None:
        return default
    if not isinstance(v, bool):
        raise bad(f"{key} must be true or false, got {show(v)}", key, "invalid_type")
    return v


def device_fault(exc) -> ApiError:
    """An EngineFault: a 503, with Retry-After when the engine recovered (a retry gives the
    answer a fresh start gives), without when the device is lost."""
    err = ApiError(503, str(exc), None, exc.code)
    if not exc.lost:
        err.headers = {"Retry-After": "1"}
    return err
