"""/v1/embeddings: pooled, L2-normalized hidden states of the generative models Hotseat runs
(the engine's embed(); engine/residency/embed.py says how they are made), in OpenAI's shape.

`input` is a string, a list of strings, a list of token ids or a list of such lists;
`encoding_format` "float" or "base64" (little-endian float32, as OpenAI's); `dimensions` is
refused unless it is the model's own size. `pooling` ("mean", "cls", "last") is Hotseat's
addition: without it, the model's declared {arch}.pooling_type, else mean.
"""
from __future__ import annotations

import asyncio
import base64
import logging
import threading
from typing import TYPE_CHECKING, Any

import numpy as np

from ..facade import EngineFault
from ..residency.arbiter import BudgetError
from ..residency.embed import POOLINGS
from ..residency.loop import Cancelled
from .errors import ApiError, bad, device_fault, json_response, over_budget, show
from .metrics import CLIENT_GONE_STATUS
from .slots import queued

if TYPE_CHECKING:
    from aiohttp import web

log = logging.getLogger("hotseat.serve")

MAX_INPUTS = 2048           # inputs per request (OpenAI's limit)
POLL_S = 0.25               # how often a running request checks its client


def _is_ids(v: Any) -> bool:
    return isinstance(v, list) and bool(v) and all(
        isinstance(t, int) and not isinstance(t, bool) for t in v)


def parse_input(v: Any) -> list:
    """The inputs: strings and token-id lists, one list of them."""
    if v is None:
        raise bad("input is required", "input", "missing_required_parameter")
    if isinstance(v, str):
        v = [v]
    elif _is_ids(v):
        v = [v]
    if not isinstance(v, list) or not v:
        raise bad("input must be a string, a list of strings, a list of token ids or a list "
                  "of such lists", "input", "invalid_type")
    if len(v) > MAX_INPUTS:
        raise bad(f"input: at most {MAX_INPUTS} inputs per request, got {len(v)}", "input",
                  "invalid_value")
    for i, x in enumerate(v):
        if isinstance(x, str):
            if not x:
                raise bad(f"input[{i}] is empty", "input", "invalid_value")
        elif not _is_ids(x):
            raise bad(f"input[{i}] must be a non-empty string or a non-empty list of token "
                      f"ids, got {show(x)}", "input", "invalid_type")
        elif min(x) < 0:
            raise bad(f"input[{i}]: token ids must be >= 0", "input", "invalid_value")
    return v


class EmbeddingRoutes:
    """The /v1/embeddings handler (a mixin of Server, as OpenAIRoutes)."""

    async def embeddings(self, request: web.Request) -> web.Response:
        from .turns import check_yield, parse_wait

        body = await self._body(request)
        if not isinstance(body, dict):
            raise bad("the request body must be a JSON object", None, "invalid_type")
        model = body.get("model")
        if model is not None and not isinstance(model, str):
            raise bad("model must be a string", "model", "invalid_type")
        inputs = parse_input(body.get("input"))
        fmt = body.get("encoding_format", "float")
        if fmt not in ("float", "base64"):
            raise bad(f'encoding_format must be "float" or "base64", got {show(fmt)}',
                      "encoding_format", "invalid_value")
        pooling = body.get("pooling")
        if pooling is not None and pooling not in POOLINGS:
            raise bad(f"pooling must be one of {', '.join(POOLINGS)}, got {show(pooling)}",
                      "pooling", "invalid_value")
        dims = body.get("dimensions")
        if dims is not None and (isinstance(dims, bool) or not isinstance(dims, int)):
            raise bad(f"dimensions must be an integer, got {show(dims)}", "dimensions",
                      "invalid_type")
        wait = parse_wait(request)
        slot = self._slot(model or "")
        check_yield(self.engine, wait)

        cancel = threading.Event()
        async with queued(slot, self.turn):
            out = await self._embed(request, slot.name, inputs, pooling, cancel, wait)
        if out is None:                        # the client left
            return json_response({}, CLIENT_GONE_STATUS)
        if dims is not None and dims != out.dim:
            raise bad(f"dimensions: {slot.name} gives embeddings of {out.dim} dimensions and "
                      f"cannot shorten them; leave dimensions out or give {out.dim}",
                      "dimensions", "invalid_value")

        def encode(v: list[float]):
            if fmt == "float":
                return v
            return base64.b64encode(np.asarray(v, "<f4").tobytes()).decode("ascii")
        data = [{"object": "embedding", "index": i, "embedding": encode(v)}
                for i, v in enumerate(out.vectors)]
        return json_response({"object": "list", "data": data, "model": slot.name,
                              "usage": {"prompt_tokens": out.prompt_tokens,
                                        "total_tokens": out.prompt_tokens}})

    async def _embed(self, request: web.Request, name: str, inputs: list, pooling, cancel,
                     wait):
        """engine.embed on a worker thread, cancelled if the client goes away; None then."""
        from .openai import _gone

        self._cancels.add(cancel)
        fut = asyncio.ensure_future(self._run(
            self.engine.embed, name, inputs, pooling, cancel=cancel,
            **({} if wait is None else {"wait": wait})))
        try:
            while True:
                done, _ = await asyncio.wait({fut}, timeout=POLL_S)
                if done:
                    break
                if _gone(request):
                    cancel.set()
        except asyncio.CancelledError:
            cancel.set()
            raise
        finally:
            self._cancels.discard(cancel)
        try:
            return fut.result()
        except Cancelled:
            return None
        except KeyError:
            raise ApiError(404, f"the model {name!r} was unloaded", "model",
                           "model_not_found") from None
        except ValueError as exc:              # an input too long for the context, ...
            raise bad(str(exc), "input", "invalid_value") from None
        except BudgetError as exc:
            raise over_budget(exc) from None
        except EngineFault as exc:
            raise device_fault(exc) from None
        except Exception as exc:
            log.exception("embeddings on %s failed", name)
            raise ApiError(500, f"embeddings failed: {exc}", None, "engine_error") from None
