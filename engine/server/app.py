"""`hotseat serve`: an OpenAI-compatible HTTP server, a thin adapter over the engine facade.

    app = make_app(engine, [name])       # an aiohttp Application; run it with web.AppRunner

Routes are listed once in `Server.routes()`. Each model has one FIFO queue (an asyncio.Lock),
so requests to the same model run one at a time, and the head of each queue waits for the
device's turn (one more FIFO lock), so models take turns request by request. Generation runs
on a worker thread, never on the event loop; a client that goes away cancels its generation.

Bad input is always a 4xx with OpenAI's error shape
`{"error": {"message", "type", "param", "code"}}`; an engine failure is a 500 of the same
shape and the server keeps serving. A request the VRAM budget cannot hold (pinned models
fill it, or evicting a pinned model) is a 409 with the engine's message.

The management API under /api (list, load, unload, pin, unpin, evict, warm, vram) reads the
engine's residency; the operations on one model queue behind that model's generations, so
they answer in the order they were asked. /health and /metrics never wait for the engine.

aiohttp is imported inside the functions that use it: cli.py imports this module to build
its parser, and `hotseat tokenize` should not pay for a web framework.
"""
from __future__ import annotations

import argparse
import asyncio
import functools
import hmac
import json
import logging
import math
import os
import signal
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

from ..residency.arbiter import BudgetError

if TYPE_CHECKING:
    from aiohttp import web

    from ..api import Completion, Engine

log = logging.getLogger("hotseat.serve")

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8080
MAX_BODY = 4 << 20                       # bytes of request body; more is a 413
MAX_STOP = 16                            # stop strings per request
COMPLETIONS_DEFAULT_MAX_TOKENS = 16      # OpenAI's default for /v1/completions
POLL_S = 0.25                            # how often a waiting request checks its client
CHAT_ROLES = {"system": "system", "developer": "system", "user": "user",
              "assistant": "assistant"}
FINISH = {"stop": "stop", "length": "length", "cancelled": "stop"}
MAX_TOKENS_HEADER = "X-Hotseat-Max-Tokens"   # set when a max_tokens was clamped to the context


# -- errors --------------------------------------------------------------------------------

class ApiError(Exception):
    """A request that gets an OpenAI-shaped error response."""

    def __init__(self, status: int, message: str, param: str | None = None,
                 code: str | None = None, type_: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.type = type_ or ("server_error" if status >= 500 else "invalid_request_error")

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param,
                          "code": self.code}}


def _bad(message: str, param: str | None = None, code: str | None = None) -> ApiError:
    return ApiError(400, message, param, code)


def _json_response(obj: Any, status: int = 200, headers: dict | None = None) -> web.Response:
    from aiohttp import web

    return web.Response(text=json.dumps(obj, ensure_ascii=False), status=status,
                        content_type="application/json", headers=headers)


# -- request validation --------------------------------------------------------------------

def _show(v: Any) -> str:
    """A client's value for an error message, kept short."""
    text = json.dumps(v)
    return text if len(text) <= 40 else text[:37] + "..."


def _number(body: dict, key: str, default: float, lo: float | None = None,
            hi: float | None = None) -> float:
    v = body.get(key)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise _bad(f"{key} must be a number, got {_show(v)}", key, "invalid_type")
    if (lo is not None and v < lo) or (hi is not None and v > hi):
        span = f"between {lo} and {hi}" if lo is not None and hi is not None \
            else f">= {lo}" if lo is not None else f"<= {hi}"
        raise _bad(f"{key} must be {span}, got {v}", key, "invalid_value")
    return float(v)


def _integer(body: dict, key: str, default: int | None, lo: int | None = None) -> int | None:
    v = body.get(key)
    if v is None:
        return default
    # 1e12 is an integer written as a JSON float; 1.5, true and "8" are not
    if isinstance(v, float) and math.isfinite(v) and v.is_integer():
        v = int(v)
    if isinstance(v, bool) or not isinstance(v, int):
        raise _bad(f"{key} must be an integer, got {_show(v)}", key, "invalid_type")
    if lo is not None and v < lo:
        raise _bad(f"{key} must be >= {lo}, got {v}", key, "invalid_value")
    return v


def _boolean(body: dict, key: str, default: bool | None) -> bool | None:
    v = body.get(key)
    if v is None:
        return default
    if not isinstance(v, bool):
        raise _bad(f"{key} must be true or false, got {_show(v)}", key, "invalid_type")
    return v


def _text_content(content: Any, i: int) -> str:
    """A message's content: a string, or a list of {"type": "text", "text": ...} parts."""
    param = f"messages[{i}].content"
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text" \
                    or not isinstance(part.get("text"), str):
                raise _bad(f"{param}: only text parts are supported", param, "invalid_type")
            texts.append(part["text"])
        return "".join(texts)
    raise _bad(f"{param} must be a string or a list of text parts", param, "invalid_type")


def parse_messages(v: Any) -> list[dict]:
    if v is None:
        raise _bad("messages is required", "messages", "missing_required_parameter")
    if not isinstance(v, list) or not v:
        raise _bad("messages must be a non-empty list", "messages", "invalid_type")
    out = []
    for i, m in enumerate(v):
        if not isinstance(m, dict):
            raise _bad(f"messages[{i}] must be an object", f"messages[{i}]", "invalid_type")
        role = m.get("role")
        if role not in CHAT_ROLES:
            raise _bad(f"messages[{i}].role must be one of {', '.join(sorted(CHAT_ROLES))}, "
                       f"got {_show(role)}", f"messages[{i}].role", "invalid_value")
        if m.get("tool_calls"):
            raise _bad("tool calls are not supported", f"messages[{i}].tool_calls",
                       "unsupported_parameter")
        out.append({"role": CHAT_ROLES[role], "content": _text_content(m.get("content"), i)})
    return out


def parse_prompt(v: Any) -> str | list[int]:
    """A completions prompt: a string, a list of one string, or a list of token ids."""
    if v is None:
        raise _bad("prompt is required", "prompt", "missing_required_parameter")
    if isinstance(v, str):
        return v
    if isinstance(v, list) and len(v) == 1 and isinstance(v[0], str):
        return v[0]
    if isinstance(v, list) and v and all(isinstance(t, int) and not isinstance(t, bool)
                                         and t >= 0 for t in v):
        return list(v)
    if isinstance(v, list) and len(v) > 1 and all(isinstance(t, str) for t in v):
        raise _bad("only one prompt per request is supported", "prompt", "invalid_value")
    raise _bad("prompt must be a string or a list of token ids", "prompt", "invalid_type")


def parse_stop(v: Any) -> list[str]:
    if v is None:
        return []
    if isinstance(v, str):
        v = [v]
    if not isinstance(v, list) or not all(isinstance(s, str) for s in v):
        raise _bad("stop must be a string or a list of strings", "stop", "invalid_type")
    if len(v) > MAX_STOP:
        raise _bad(f"at most {MAX_STOP} stop strings, got {len(v)}", "stop", "invalid_value")
    return [s for s in v if s]


@dataclass
class GenRequest:
    """A validated /v1 generation request."""
    model: str
    messages: list[dict] | None
    prompt: str | list[int] | None
    max_tokens: int | None                # None: as many as the context allows
    sampling: Any                         # SamplingParams
    stop: list[str]
    stream: bool
    include_usage: bool


def parse_request(body: Any, chat: bool) -> GenRequest:
    from ..text.sampling import SamplingParams

    if not isinstance(body, dict):
        raise _bad("the request body must be a JSON object", None, "invalid_type")
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise _bad("model must be a string", "model", "invalid_type")
    messages = parse_messages(body.get("messages")) if chat else None
    prompt = None if chat else parse_prompt(body.get("prompt"))

    n = _integer(body, "n", 1)
    if n != 1:
        raise _bad("only n=1 is supported", "n", "invalid_value")
    best_of = _integer(body, "best_of", 1)
    if best_of != 1:
        raise _bad("only best_of=1 is supported", "best_of", "invalid_value")
    for key in ("logprobs", "echo"):
        if body.get(key) not in (None, False, 0):
            raise _bad(f"{key} is not supported", key, "unsupported_parameter")
    if body.get("top_logprobs") not in (None, 0):
        raise _bad("top_logprobs is not supported", "top_logprobs", "unsupported_parameter")
    if body.get("tools"):
        raise _bad("tools are not supported", "tools", "unsupported_parameter")
    fmt = body.get("response_format")
    if fmt is not None and (not isinstance(fmt, dict) or fmt.get("type") != "text"):
        raise _bad('only response_format {"type": "text"} is supported', "response_format",
                   "unsupported_parameter")
    if body.get("suffix") not in (None, ""):
        raise _bad("suffix is not supported", "suffix", "unsupported_parameter")

    key = "max_completion_tokens" if body.get("max_completion_tokens") is not None \
        else "max_tokens"
    max_tokens = _integer(body, key, None if chat else COMPLETIONS_DEFAULT_MAX_TOKENS, lo=0)

    d = SamplingParams()
    seed = _integer(body, "seed", None)
    sampling = SamplingParams(
        temperature=_number(body, "temperature", d.temperature, 0.0),
        top_k=_integer(body, "top_k", d.top_k, lo=0),
        top_p=_number(body, "top_p", d.top_p, 0.0, 1.0),
        min_p=_number(body, "min_p", d.min_p, 0.0, 1.0),
        repeat_penalty=_number(body, "repeat_penalty", d.repeat_penalty, 0.0),
        repeat_last_n=_integer(body, "repeat_last_n", d.repeat_last_n, lo=-1),
        seed=None if seed is None else seed % (1 << 64),
    )
    # accepted for compatibility; the sampler has no frequency or presence penalty
    _number(body, "frequency_penalty", 0.0, -2.0, 2.0)
    _number(body, "presence_penalty", 0.0, -2.0, 2.0)

    stream = _boolean(body, "stream", False)
    opts = body.get("stream_options")
    if opts is not None and not isinstance(opts, dict):
        raise _bad("stream_options must be an object", "stream_options", "invalid_type")
    include_usage = _boolean(opts or {}, "include_usage", False)
    return GenRequest(model or "", messages, prompt, max_tokens, sampling,
                      parse_stop(body.get("stop")), stream, include_usage)


# -- metrics -------------------------------------------------------------------------------

def _label(v: str) -> str:
    return v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


@dataclass
class Metrics:
    """Counters in Prometheus' text exposition format; touched only on the event loop."""
    requests: dict[tuple[str, int], int] = field(default_factory=dict)
    latency: dict[str, list[float]] = field(default_factory=dict)    # endpoint -> [sum, n]
    prompt_tokens: dict[str, int] = field(default_factory=dict)
    cached_tokens: dict[str, int] = field(default_factory=dict)
    generated_tokens: dict[str, int] = field(default_factory=dict)
    cancelled: dict[str, int] = field(default_factory=dict)

    def request(self, endpoint: str, status: int, seconds: float) -> None:
        self.requests[endpoint, status] = self.requests.get((endpoint, status), 0) + 1
        s = self.latency.setdefault(endpoint, [0.0, 0])
        s[0] += seconds
        s[1] += 1

    def generation(self, model: str, out: Completion) -> None:
        def add(d: dict, n: int) -> None:
            d[model] = d.get(model, 0) + n
        add(self.prompt_tokens, len(out.prompt_tokens))
        add(self.cached_tokens, int(out.timings.get("cached_tokens", 0)))
        add(self.generated_tokens, len(out.tokens))
        add(self.cancelled, out.finish_reason == "cancelled")

    def render(self, models: dict[str, "ModelSlot"]) -> str:
        lines: list[str] = []

        def family(name: str, kind: str, help_: str, samples) -> None:
            lines.append(f"# HELP {name} {help_}")
            lines.append(f"# TYPE {name} {kind}")
            for labels, value in samples:
                text = ",".join(f'{k}="{_label(str(v))}"' for k, v in labels.items())
                lines.append(f"{name}{{{text}}} {value}" if text else f"{name} {value}")

        family("hotseat_requests_total", "counter", "HTTP requests by endpoint and status.",
               [({"endpoint": e, "status": s}, n) for (e, s), n in sorted(self.requests.items())])
        lat = sorted(self.latency.items())
        lines.append("# HELP hotseat_request_duration_seconds Time from request to the last "
                     "byte of the response.")
        lines.append("# TYPE hotseat_request_duration_seconds summary")
        for e, (total, n) in lat:
            lines.append(f'hotseat_request_duration_seconds_sum{{endpoint="{_label(e)}"}} '
                         f"{total:.6f}")
            lines.append(f'hotseat_request_duration_seconds_count{{endpoint="{_label(e)}"}} {n}')
        for name, d, help_ in (
                ("hotseat_prompt_tokens_total", self.prompt_tokens, "Prompt tokens processed."),
                ("hotseat_cached_prompt_tokens_total", self.cached_tokens,
                 "Prompt tokens whose KV was reused from the previous request."),
                ("hotseat_generated_tokens_total", self.generated_tokens, "Tokens generated."),
                ("hotseat_generations_cancelled_total", self.cancelled,
                 "Generations stopped early: the client went away or the server stopped.")):
            family(name, "counter", help_, [({"model": m}, n) for m, n in sorted(d.items())])
        family("hotseat_models_loaded", "gauge", "Models loaded.", [({}, len(models))])
        family("hotseat_queue_depth", "gauge", "Requests running or waiting, by model.",
               [({"model": m}, s.depth) for m, s in sorted(models.items())])
        return "\n".join(lines) + "\n"


# -- the server ----------------------------------------------------------------------------

@dataclass
class ModelSlot:
    """A served model and its queue."""
    name: str
    n_ctx: int
    created: int
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    depth: int = 0                        # requests holding or waiting for the lock
    closed: bool = False                  # unloaded; requests still queued get a 404


class Server:
    """The routes' handlers and what they share: the engine, the model queues, the metrics."""

    def __init__(self, engine: Engine, api_key: str | None = None,
                 cors_origins: list[str] | tuple[str, ...] = (), max_body: int = MAX_BODY):
        self.engine = engine
        self.api_key = api_key or None
        self.cors_origins = set(cors_origins)
        self.max_body = max_body
        self.models: dict[str, ModelSlot] = {}
        self.metrics = Metrics()
        # tokenizing, loading and generating; the turn below lets one generation run at a time
        self.pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="hotseat-serve")
        # The device's turn, FIFO. Only a model's first waiting request queues for it (the
        # others wait on their model's lock), so models take turns request by request.
        self.turn = asyncio.Lock()
        self._cancels: set[threading.Event] = set()

    def routes(self) -> list[tuple[str, str, Callable]]:
        return [
            ("GET", "/health", self.health),
            ("GET", "/metrics", self.get_metrics),
            ("GET", "/v1/models", self.v1_models),
            ("GET", "/v1/models/{name}", self.v1_model),
            ("POST", "/v1/chat/completions", self.chat_completions),
            ("POST", "/v1/completions", self.completions),
            ("GET", "/api/models", self.api_models),
            ("POST", "/api/models", self.api_load),
            ("DELETE", "/api/models/{name}", self.api_unload),
            ("POST", "/api/models/{name}/pin", self.api_pin),
            ("POST", "/api/models/{name}/unpin", self.api_unpin),
            ("POST", "/api/models/{name}/evict", self.api_evict),
            ("POST", "/api/models/{name}/warm", self.api_warm),
            ("GET", "/api/vram", self.api_vram),
        ]

    def add_model(self, name: str, n_ctx: int | None = None) -> ModelSlot:
        """Serve a model that is loaded on the engine. Without n_ctx, reads the engine's status
        (and so waits for its lock); call it on the event loop's thread."""
        if n_ctx is None:
            n_ctx = next(s["n_ctx"] for s in self.engine.status() if s["name"] == name)
        slot = ModelSlot(name, int(n_ctx), int(time.time()))
        self.models[name] = slot
        return slot

    async def _run(self, fn: Callable, *args, **kw) -> Any:
        """fn(*args, **kw) on a worker thread."""
        return await asyncio.get_running_loop().run_in_executor(
            self.pool, functools.partial(fn, *args, **kw))

    def cancel_all(self) -> None:
        for ev in list(self._cancels):
            ev.set()

    async def on_shutdown(self, _app) -> None:
        self.cancel_all()

    async def close(self, _app=None) -> None:
        self.cancel_all()
        await asyncio.get_running_loop().run_in_executor(None, self.pool.shutdown)

    # -- middleware ---------------------------------------------------------------------------
    async def middleware(self, request: web.Request, handler) -> web.StreamResponse:
        t0 = time.perf_counter()
        resource = request.match_info.route.resource
        endpoint = resource.canonical if resource is not None else "other"
        try:
            resp = await self._dispatch(request, handler)
        except asyncio.CancelledError:
            self.metrics.request(endpoint, 499, time.perf_counter() - t0)   # client gone
            raise
        self.metrics.request(endpoint, resp.status, time.perf_counter() - t0)
        return resp

    async def _dispatch(self, request: web.Request, handler) -> web.StreamResponse:
        from aiohttp import web

        try:
            if request.method == "OPTIONS" and self.cors_origins:
                return self._preflight(request)
            self._check_auth(request)
            return await handler(request)
        except ApiError as exc:
            return _json_response(exc.body(), exc.status)
        except BudgetError as exc:             # the arbiter's refusal, wherever it came from
            return _json_response(_over_budget(exc).body(), 409)
        except web.HTTPException as exc:       # aiohttp's own 404, 405, 413
            code = {404: "not_found", 405: "method_not_allowed",
                    413: "request_too_large"}.get(exc.status)
            message = f"the request body is larger than {self.max_body} bytes" \
                if exc.status == 413 else f"{exc.reason}: {request.method} {request.path}"
            headers = {"Allow": exc.headers["Allow"]} if "Allow" in exc.headers else None
            return _json_response(ApiError(exc.status, message, None, code).body(), exc.status,
                                  headers)
        except Exception as exc:
            log.exception("%s %s failed", request.method, request.path)
            return _json_response(ApiError(500, f"internal error: {exc}").body(), 500)

    def _check_auth(self, request: web.Request) -> None:
        if self.api_key is None or not request.path.startswith(("/v1/", "/api/")):
            return
        given = request.headers.get("Authorization", "")
        scheme, _, token = given.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(),
                                                                 self.api_key.encode()):
            raise ApiError(401, "missing or wrong API key (Authorization: Bearer KEY)",
                           None, "invalid_api_key")

    def _cors_origin(self, request: web.Request) -> str | None:
        origin = request.headers.get("Origin")
        if "*" in self.cors_origins:
            return "*"
        return origin if origin in self.cors_origins else None

    def _preflight(self, request: web.Request) -> web.Response:
        from aiohttp import web

        headers = {"Access-Control-Allow-Methods": "GET, POST, DELETE, OPTIONS",
                   "Access-Control-Allow-Headers":
                       request.headers.get("Access-Control-Request-Headers",
                                           "Authorization, Content-Type"),
                   "Access-Control-Max-Age": "600"}
        return web.Response(status=204, headers=headers)

    async def on_prepare(self, request: web.Request, resp: web.StreamResponse) -> None:
        if not self.cors_origins:
            return
        origin = self._cors_origin(request)
        if origin is not None:
            resp.headers["Access-Control-Allow-Origin"] = origin
            resp.headers["Vary"] = "Origin"

    # -- helpers ------------------------------------------------------------------------------
    async def _body(self, request: web.Request, empty: Any = None) -> Any:
        """The JSON body; `empty` (when not None) stands for a missing one."""
        if request.content_length is not None and request.content_length > self.max_body:
            raise ApiError(413, f"the request body is larger than {self.max_body} bytes", None,
                           "request_too_large")
        raw = await request.read()             # aiohttp raises 413 past client_max_size
        if empty is not None and not raw.strip():
            return empty
        try:
            return json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, ValueError, RecursionError) as exc:
            raise _bad(f"the request body is not valid JSON ({exc})", None,
                       "invalid_json") from None

    def _slot(self, name: str) -> ModelSlot:
        if not name and len(self.models) == 1:
            return next(iter(self.models.values()))
        if not name:
            raise _bad("model is required", "model", "missing_required_parameter")
        slot = self.models.get(name)
        if slot is None:
            raise ApiError(404, f"the model {name!r} does not exist; loaded: "
                                f"{', '.join(self.models) or 'none'}", "model", "model_not_found")
        return slot

    def _named(self, name: str) -> ModelSlot:
        """The slot of a model named in a management route's path."""
        slot = self.models.get(name)
        if slot is None:
            raise ApiError(404, f"the model {name!r} does not exist; loaded: "
                                f"{', '.join(self.models) or 'none'}", "name", "model_not_found")
        return slot

    def _model_card(self, slot: ModelSlot) -> dict:
        return {"id": slot.name, "object": "model", "created": slot.created,
                "owned_by": "hotseat"}

    # -- plain routes -------------------------------------------------------------------------
    async def health(self, request: web.Request) -> web.Response:
        return _json_response({"status": "ok"})

    async def get_metrics(self, request: web.Request) -> web.Response:
        from aiohttp import web

        return web.Response(text=self.metrics.render(self.models),
                            content_type="text/plain", charset="utf-8",
                            headers={"X-Content-Type-Options": "nosniff"})

    async def v1_models(self, request: web.Request) -> web.Response:
        return _json_response({"object": "list",
                               "data": [self._model_card(s) for s in self.models.values()]})

    async def v1_model(self, request: web.Request) -> web.Response:
        return _json_response(self._model_card(self._slot(request.match_info["name"])))

    # -- management ---------------------------------------------------------------------------
    async def _model_entries(self) -> list[dict]:
        status = await self._run(self.engine.status)    # waits for the engine's lock
        return [_entry(s) for s in status if s["name"] in self.models]

    async def api_models(self, request: web.Request) -> web.Response:
        return _json_response({"models": await self._model_entries()})

    async def api_load(self, request: web.Request) -> web.Response:
        from ..formats.bundled import resolve
        from ..formats.gguf_file import ModelFileError
        from ..residency.model import PlacementError

        body = await self._body(request)
        if not isinstance(body, dict):
            raise _bad("the request body must be a JSON object", None, "invalid_type")
        path, name = body.get("path"), body.get("name")
        if not isinstance(path, str) or not path:
            raise _bad("path must be a GGUF file path or a bundled model name", "path",
                       "invalid_type" if path is not None else "missing_required_parameter")
        if name is not None and (not isinstance(name, str) or not name or "/" in name
                                 or name != name.strip()):
            raise _bad("name must be a non-empty string without '/' or surrounding spaces",
                       "name", "invalid_value")
        cpu_moe = body.get("cpu_moe", 0)
        if isinstance(cpu_moe, bool) or not isinstance(cpu_moe, (int, float)) \
                or not math.isfinite(cpu_moe) or cpu_moe < 0:
            raise _bad("cpu_moe must be a number >= 0 (layers of experts kept in host memory)",
                       "cpu_moe", "invalid_value")
        try:
            resolved = resolve(path)
            name = name or os.path.splitext(os.path.basename(resolved))[0]
            if name in self.models:
                raise ApiError(409, f"a model named {name!r} is already loaded", "name",
                               "model_exists")
            name = await self._run(self.engine.load, resolved, name, cpu_moe=cpu_moe)
        except PlacementError as exc:
            raise _bad(str(exc), "cpu_moe", "invalid_value") from None
        except ModelFileError as exc:
            raise _bad(str(exc), "path", "invalid_model_file") from None
        except OSError as exc:
            raise _bad(f"{path}: {exc.strerror or exc}", "path", "invalid_model_file") from None
        except ValueError as exc:           # the engine already holds that name
            raise ApiError(409, str(exc), "name", "model_exists") from None
        status = next(s for s in await self._run(self.engine.status) if s["name"] == name)
        self.add_model(name, status["n_ctx"])
        return _json_response(_entry(status), 201)

    async def api_unload(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        slot = self.models.get(name)
        if slot is None:
            raise ApiError(404, f"the model {name!r} does not exist", "name", "model_not_found")
        del self.models[name]                 # new requests get a 404 from here on
        async with slot.lock:                 # requests already queued finish first
            slot.closed = True
            await self._run(self.engine.unload, name)
        return _json_response({"name": name, "unloaded": True})

    async def _queued(self, name: str, fn: Callable[[], Any]) -> tuple[Any, dict]:
        """Run fn() on a worker thread in the model's queue, behind its generations and at
        the device's turn; returns fn's result and the model's entry after it."""
        slot = self._named(name)
        slot.depth += 1
        try:
            async with slot.lock, self.turn:
                if slot.closed:
                    raise ApiError(404, f"the model {name!r} was unloaded", "name",
                                   "model_not_found")

                def work() -> tuple[Any, dict]:
                    out = fn()
                    return out, next(_entry(s) for s in self.engine.status()
                                     if s["name"] == name)
                try:
                    return await self._run(work)
                except KeyError:                # unloaded on the engine behind our back
                    raise ApiError(404, f"the model {name!r} was unloaded", "name",
                                   "model_not_found") from None
        finally:
            slot.depth -= 1

    async def api_pin(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        _, entry = await self._queued(name, lambda: self.engine.pin(name))
        return _json_response(entry)

    async def api_unpin(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        _, entry = await self._queued(name, lambda: self.engine.unpin(name))
        return _json_response(entry)

    async def api_evict(self, request: web.Request) -> web.Response:
        name = self._named(request.match_info["name"]).name
        body = await self._body(request, empty={})
        if not isinstance(body, dict):
            raise _bad("the request body must be a JSON object", None, "invalid_type")
        full = _boolean(body, "full", None)    # None: the server's eviction mode
        info, entry = await self._queued(name, lambda: self.engine.evict(name, full=full))
        return _json_response({**entry, "transfer": info})

    async def api_warm(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]

        def warm() -> dict:
            # Engine.warm answers its last transfer even when there was nothing to restore
            was_warm = any(s["name"] == name and s["state"] == "warm"
                           for s in self.engine.status())
            info = self.engine.warm(name)
            return {"op": None, "seconds": 0.0, "bytes": 0} if was_warm else info
        info, entry = await self._queued(name, warm)
        return _json_response({**entry, "transfer": info})

    async def api_vram(self, request: web.Request) -> web.Response:
        return _json_response(await self._run(self.engine.vram))

    # -- generation ---------------------------------------------------------------------------
    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=True)

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=False)

    async def _prompt_ids(self, slot: ModelSlot, req: GenRequest) -> list[int]:
        param = "messages" if req.messages is not None else "prompt"
        if isinstance(req.prompt, list):
            ids = req.prompt
            n_vocab = self.engine.tokenizer(slot.name).n_vocab
            if max(ids) >= n_vocab:
                raise _bad(f"token id {max(ids)} is outside the vocabulary ({n_vocab})",
                           "prompt", "invalid_value")
        else:
            try:
                ids = await self._run(self.engine.prompt_tokens, slot.name, prompt=req.prompt,
                                      messages=req.messages)
            except KeyError:
                raise ApiError(404, f"the model {slot.name!r} was unloaded", "model",
                               "model_not_found") from None
            except Exception as exc:          # a chat template refusing the conversation
                if type(exc).__module__.startswith("jinja2") or isinstance(exc, ValueError):
                    raise _bad(f"cannot format the {param}: {exc}", param) from None
                raise
        if not ids:
            raise _bad(f"the {param} is empty", param, "invalid_value")
        if len(ids) >= slot.n_ctx:
            raise _bad(f"the {param} has {len(ids)} tokens; the context of {slot.name!r} holds "
                       f"{slot.n_ctx} (prompt and completion together)", param,
                       "context_length_exceeded")
        return ids

    async def _generate(self, request: web.Request, chat: bool) -> web.StreamResponse:
        req = parse_request(await self._body(request), chat)
        slot = self._slot(req.model)
        ids = await self._prompt_ids(slot, req)
        room = slot.n_ctx - len(ids)
        headers = {}
        max_tokens = room if req.max_tokens is None else req.max_tokens
        if max_tokens > room:
            max_tokens = room
            headers[MAX_TOKENS_HEADER] = str(room)
        meta = {"id": ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex,
                "created": int(time.time()), "model": slot.name,
                "system_fingerprint": "hotseat"}

        slot.depth += 1
        try:
            async with slot.lock, self.turn:
                if slot.closed:
                    raise ApiError(404, f"the model {slot.name!r} was unloaded", "model",
                                   "model_not_found")
                if _gone(request):             # gave up while queued: nobody to answer
                    return _json_response({}, 499)
                if req.stream:
                    # the headers go out before the generation: warm the model first, so
                    # that a budget refusal is still a 409
                    await self._run(self.engine.warm, slot.name)
                    return await self._stream(request, slot, req, ids, max_tokens, meta,
                                              headers, chat)
                out = await self._complete(request, slot, req, ids, max_tokens, None)
        finally:
            slot.depth -= 1
        text = out.text
        if chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": text},
                      "logprobs": None, "finish_reason": FINISH[out.finish_reason]}
            obj = "chat.completion"
        else:
            choice = {"index": 0, "text": text, "logprobs": None,
                      "finish_reason": FINISH[out.finish_reason]}
            obj = "text_completion"
        return _json_response({**meta, "object": obj, "choices": [choice],
                               "usage": _usage(out)}, headers=headers)

    async def _complete(self, request: web.Request, slot: ModelSlot, req: GenRequest,
                        ids: list[int], max_tokens: int,
                        on_text: Callable[[str], None] | None,
                        cancel: threading.Event | None = None) -> Completion:
        """Run one generation on a worker thread; cancel it if the client goes away."""
        cancel = cancel or threading.Event()
        self._cancels.add(cancel)
        fut = asyncio.ensure_future(self._run(
            self.engine.generate, slot.name, tokens=ids, max_tokens=max_tokens,
            sampling=req.sampling, stop=req.stop, on_text=on_text, cancel=cancel))
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
            out = fut.result()
        except ValueError as exc:           # the engine's word for bad input
            raise _bad(str(exc)) from None
        except BudgetError as exc:          # a cold model that pinned models leave no room for
            raise _over_budget(exc) from None
        except Exception as exc:
            log.exception("generation on %s failed", slot.name)
            raise ApiError(500, f"generation failed: {exc}", None, "engine_error") from None
        self.metrics.generation(slot.name, out)
        return out

    async def _stream(self, request: web.Request, slot: ModelSlot, req: GenRequest,
                      ids: list[int], max_tokens: int, meta: dict, headers: dict,
                      chat: bool) -> web.StreamResponse:
        from aiohttp import web

        loop = asyncio.get_running_loop()
        pieces: asyncio.Queue = asyncio.Queue()
        cancel = threading.Event()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                           "Cache-Control": "no-cache", **headers})
        await resp.prepare(request)
        obj = "chat.completion.chunk" if chat else "text_completion"
        extra = {"usage": None} if req.include_usage else {}

        def chunk(delta: str | None, finish: str | None, first: bool = False) -> dict:
            if chat:
                d = {"role": "assistant", "content": ""} if first else \
                    {} if delta is None else {"content": delta}
                choice = {"index": 0, "delta": d, "logprobs": None, "finish_reason": finish}
            else:
                choice = {"index": 0, "text": delta or "", "logprobs": None,
                          "finish_reason": finish}
            return {**meta, "object": obj, "choices": [choice], **extra}

        async def send(obj_: dict | str) -> None:
            data = obj_ if isinstance(obj_, str) else json.dumps(obj_, ensure_ascii=False)
            await resp.write(f"data: {data}\n\n".encode())

        async def pump() -> None:
            """Write text pieces as they come, up to the None left after the generation."""
            try:
                while (piece := await pieces.get()) is not None:
                    await send(chunk(piece, None))
            except ConnectionError:            # the client went away: stop generating
                cancel.set()
                raise

        def on_text(piece: str) -> None:      # on the worker thread
            loop.call_soon_threadsafe(pieces.put_nowait, piece)

        writer = None
        try:
            if chat:
                await send(chunk(None, None, first=True))
            writer = asyncio.ensure_future(pump())
            try:
                out = await self._complete(request, slot, req, ids, max_tokens, on_text, cancel)
            finally:
                # the worker scheduled its pieces before its result, so None comes after them
                pieces.put_nowait(None)
            await writer
            await send(chunk(None, FINISH[out.finish_reason]))
            if req.include_usage:
                await send({**meta, "object": obj, "choices": [], "usage": _usage(out)})
            await send("[DONE]")
            await resp.write_eof()
        except ApiError as exc:                # the headers are sent: report in the stream
            try:
                if writer is not None:
                    await writer
                await send(exc.body())
                await send("[DONE]")
                await resp.write_eof()
            except ConnectionError:
                pass
        except ConnectionError:                # the client went away mid-stream
            cancel.set()
        finally:
            if writer is not None and not writer.done():
                writer.cancel()
        return resp


def _over_budget(exc: BudgetError) -> ApiError:
    from ..residency.arbiter import PinnedError

    code = "model_pinned" if isinstance(exc, PinnedError) else "budget_exceeded"
    return ApiError(409, str(exc), None, code)


def _entry(s: dict) -> dict:
    """A model's /api/models entry, from its engine status."""
    return {"name": s["name"], "path": s["path"], "arch": s["arch"], "n_ctx": s["n_ctx"],
            "state": s["state"], "pinned": s["pinned"], "device_bytes": s["device_bytes"],
            "device_bytes_total": sum(s["device_bytes"].values()),
            "host_shadow_bytes": s["host_shadow_bytes"],
            "pinned_host_bytes": s.get("pinned_host_bytes", 0), "warm_bytes": s["warm_bytes"],
            "cpu_moe": s["cpu_moe"], "host_weight_bytes": s["host_weight_bytes"],
            "cached_tokens": s["cached_tokens"]}


def _gone(request: web.Request) -> bool:
    t = request.transport
    return t is None or t.is_closing()


def _usage(out: Completion) -> dict:
    p, c = len(out.prompt_tokens), len(out.tokens)
    return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c,
            "prompt_tokens_details": {"cached_tokens": int(out.timings.get("cached_tokens", 0))}}


def make_app(engine: Engine, model_names: list[str], *, api_key: str | None = None,
             cors_origins: list[str] | tuple[str, ...] = (),
             max_body: int = MAX_BODY) -> web.Application:
    """The aiohttp app serving model_names, which are already loaded on engine."""
    from aiohttp import web

    server = Server(engine, api_key, cors_origins, max_body)
    for name in model_names:
        server.add_model(name)

    @web.middleware
    async def middleware(request: web.Request, handler) -> web.StreamResponse:
        return await server.middleware(request, handler)

    app = web.Application(middlewares=[middleware], client_max_size=max_body)
    for method, path, handler in server.routes():
        app.router.add_route(method, path, handler)
    app.on_response_prepare.append(server.on_prepare)
    app.on_shutdown.append(server.on_shutdown)
    app.on_cleanup.append(server.close)
    app["hotseat.server"] = server
    return app


# -- command line --------------------------------------------------------------------------

def add_parser(subparsers, model_help: str) -> argparse.ArgumentParser:
    s = subparsers.add_parser("serve", help="serve the OpenAI API over HTTP")
    s.add_argument("--model", "-m", action="append", help=f"{model_help}; repeat to serve several")
    s.add_argument("--host", default=DEFAULT_HOST, help=f"address (default {DEFAULT_HOST})")
    s.add_argument("--port", type=int, default=DEFAULT_PORT,
                   help=f"port (default {DEFAULT_PORT}; 0 picks a free one)")
    s.add_argument("--api-key", default=os.environ.get("HOTSEAT_API_KEY"),
                   help="require 'Authorization: Bearer KEY' on /v1 and /api "
                        "(default: $HOTSEAT_API_KEY)")
    s.add_argument("--cors-origin", action="append", metavar="ORIGIN",
                   help="allow browser requests from ORIGIN, or * (repeatable)")
    s.add_argument("--ctx", type=int, default=2048, help="context size (default 2048)")
    s.add_argument("--budget-mib", type=int, metavar="N",
                   help="VRAM budget for all models together, in MiB (default: the device's "
                        "memory less a margin)")
    s.add_argument("--evict-kv", action="store_true",
                   help="full eviction (KV to host too) instead of weights-only")
    from ..cli import add_cpu_moe_argument
    add_cpu_moe_argument(s)
    s.set_defaults(func=cmd_serve)
    return s


def cmd_serve(args) -> int:
    from ..api import Engine
    from ..formats.bundled import resolve

    if not 0 <= args.port <= 65535:
        raise ValueError(f"--port must be between 0 and 65535, got {args.port}")
    if args.ctx < 16:
        raise ValueError(f"--ctx must be at least 16, got {args.ctx}")
    if args.budget_mib is not None and args.budget_mib <= 0:
        raise ValueError(f"--budget-mib must be positive, got {args.budget_mib}")
    paths = [resolve(m) for m in (args.model or [None])]
    logging.basicConfig(level=logging.WARNING, format="hotseat: %(levelname)s: %(message)s")
    budget = None if args.budget_mib is None else args.budget_mib << 20
    eng = Engine(n_ctx=args.ctx, budget_bytes=budget, full_release=args.evict_kv,
                 flash_attn=args.flash_attn)
    try:
        names = [eng.load(p, cpu_moe=args.cpu_moe) for p in paths]
        return asyncio.run(_serve(eng, names, args))
    finally:
        eng.close()


async def _serve(eng: Engine, names: list[str], args) -> int:
    from aiohttp import web

    app = make_app(eng, names, api_key=args.api_key, cors_origins=args.cors_origin or ())
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=5)
    await runner.setup()
    site = web.TCPSite(runner, args.host, args.port)
    try:
        await site.start()
    except OSError as exc:
        await runner.cleanup()
        why = os.strerror(exc.errno) if exc.errno else str(exc)
        raise ValueError(f"cannot listen on {args.host}:{args.port}: {why}") from None
    port = runner.addresses[0][1] if runner.addresses else args.port
    host = f"[{args.host}]" if ":" in args.host else args.host
    print(f"hotseat serving {', '.join(names)} on http://{host}:{port} "
          f"(device: {eng.device_name})", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            loop.add_signal_handler(sig, stop.set)
        except (NotImplementedError, RuntimeError):   # not on this platform or thread
            pass
    try:
        await stop.wait()
    finally:
        app["hotseat.server"].cancel_all()
        await runner.cleanup()
    return 0
