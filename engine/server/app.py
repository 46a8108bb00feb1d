"""The OpenAI-compatible HTTP server, a thin adapter over the engine facade.

    app = make_app(engine, [name])       # an aiohttp Application; run it with web.AppRunner

Routes are listed once in `Server.routes()`. Each model has one FIFO queue (an asyncio.Lock),
so requests to the same model run one at a time, and the head of each queue waits for the
device's turn (one more FIFO lock), so models take turns request by request. Generation runs
on a worker thread, never on the event loop; a client that goes away cancels its generation.

Bad input is always a 4xx with OpenAI's error shape
`{"error": {"message", "type", "param", "code"}}`; an engine failure is a 500 of the same
shape and the server keeps serving. A request the VRAM budget cannot hold (pinned models
fill it, or evicting a pinned model) is a 409 with the engine's message.

Before any route, access.py refuses a Host the server does not answer to, a browser Origin
not allowed with --cors-origin (403) and a body that is not JSON (415), then checks the API
key. Idle keep-alive connections close after KEEPALIVE_S.

The routes live by API: openai.py (/v1), responses.py (/v1/responses), anthropic.py
(/v1/messages, in Anthropic's error shape), manage.py (/api), ollama.py (Ollama's /api), with
access.py (Host, Origin, body type, the API key, CORS), errors.py, metrics.py and slots.py (a
model's queue); this module holds what they share and imports them, never the other way
round.
/health and /metrics never wait for the engine.

This module imports aiohttp: serve.py imports it (through listen.py) only when a server
starts, since cli.py imports serve.py to build its parser and `hotseat tokenize` should not
pay for a web framework.
"""
from __future__ import annotations

import asyncio
import functools
import json
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Callable

from aiohttp import web

from ..facade import EngineFault
from ..residency.loop import NonFiniteLogits
from ..residency.arbiter import BudgetError
from . import anthropic
from .access import Access, WILDCARD_BINDS, allowed_host_names
from .embeddings import EmbeddingRoutes
from .errors import ApiError, bad, device_fault, json_response, over_budget
from .manage import ManagementRoutes
from .metrics import CLIENT_GONE_STATUS, Metrics
from .ollama import OllamaRoutes, error_body, is_ollama_path
from .ollama import routes as ollama_routes
from .openai import OpenAIRoutes
from .responses import ResponsesRoutes
from .slots import ModelSlot
from .turns import ArenaRoutes

if TYPE_CHECKING:
    from ..facade import EngineAPI

log = logging.getLogger("hotseat.serve")

MAX_BODY = 32 << 20                      # bytes of request body; more is a 413 (an image of
                                         # the 20 MiB limit, in base64, fits)
KEEPALIVE_S = 15.0                       # an idle keep-alive connection is closed after this


class Server(OpenAIRoutes, ResponsesRoutes, anthropic.MessagesRoutes, EmbeddingRoutes,
             ManagementRoutes, ArenaRoutes, OllamaRoutes, Access):
    """The routes' handlers and what they share: the engine, the model queues, the metrics."""

    def __init__(self, engine: EngineAPI, api_key: str | None = None,
                 cors_origins: list[str] | tuple[str, ...] = (), max_body: int = MAX_BODY,
                 host: str = "127.0.0.1", allow_hosts: list[str] | tuple[str, ...] = (),
                 fetch_images: bool = False):
        self.engine = engine
        self.fetch_images = fetch_images   # image_url parts may be http(s) URLs (media.py)
        self.api_key = api_key or None
        self.cors_origins = set(cors_origins)
        self.allowed_hosts = allowed_host_names(host, allow_hosts)
        self.any_ip_host = host in WILDCARD_BINDS
        self.max_body = max_body
        self.models: dict[str, ModelSlot] = {}
        self.metrics = Metrics()
        # tokenizing, loading and generating; the turn below lets one generation run at a time
        self.pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="hotseat-serve")
        # The device's turn, FIFO. Only a model's first waiting request queues for it (the
        # others wait on their model's lock), so models take turns request by request.
        self.turn = asyncio.Lock()
        self._cancels: set[threading.Event] = set()
        self._left: set[int] = set()       # ids of requests whose client left mid-answer

    def routes(self) -> list[tuple[str, str, Callable]]:
        return [
            ("GET", "/health", self.health),
            ("GET", "/metrics", self.get_metrics),
            ("GET", "/v1/models", self.v1_models),
            ("GET", "/v1/models/{name}", self.v1_model),
            ("POST", "/v1/chat/completions", self.chat_completions),
            ("POST", "/v1/completions", self.completions),
            ("POST", "/v1/embeddings", self.embeddings),
            ("POST", "/v1/responses", self.responses),
            ("POST", "/v1/messages", self.messages),
            ("POST", "/v1/messages/count_tokens", self.messages_count_tokens),
            ("GET", "/api/models", self.api_models),
            ("POST", "/api/models", self.api_load),
            ("DELETE", "/api/models/{name}", self.api_unload),
            ("POST", "/api/models/{name}/pin", self.api_pin),
            ("POST", "/api/models/{name}/unpin", self.api_unpin),
            ("POST", "/api/models/{name}/evict", self.api_evict),
            ("POST", "/api/models/{name}/warm", self.api_warm),
            ("GET", "/api/vram", self.api_vram),
            ("GET", "/api/arena", self.api_arena),
            *ollama_routes(self),
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
            self._left.discard(id(request))
            self.metrics.request(endpoint, CLIENT_GONE_STATUS, time.perf_counter() - t0)
            raise
        # a client that left is counted as such, whatever status its response had begun with
        status = CLIENT_GONE_STATUS if id(request) in self._left else resp.status
        self._left.discard(id(request))
        self.metrics.request(endpoint, status, time.perf_counter() - t0)
        return resp

    async def _dispatch(self, request: web.Request, handler) -> web.StreamResponse:
        try:
            self._check_access(request)
            if request.method == "OPTIONS" and self.cors_origins:
                return self._preflight(request)
            self._check_auth(request)
            return await handler(request)
        except ApiError as exc:
            return self._error(request, exc)
        except BudgetError as exc:             # the arbiter's refusal, wherever it came from
            return self._error(request, over_budget(exc))  # (503: the GPU's turn did not come)
        except EngineFault as exc:             # evict, warm, load: the GPU failed
            return self._error(request, device_fault(exc))
        except NonFiniteLogits as exc:         # the model's numbers, not the server: say so
            log.warning("%s %s: %s", request.method, request.path, exc)
            return self._error(request, ApiError(500, str(exc), None, exc.code))
        except web.HTTPException as exc:       # aiohttp's own 404, 405, 413
            code = {404: "not_found", 405: "method_not_allowed",
                    413: "request_too_large"}.get(exc.status)
            message = f"the request body is larger than {self.max_body} bytes" \
                if exc.status == 413 else f"{exc.reason}: {request.method} {request.path}"
            err = ApiError(exc.status, message, None, code)
            err.headers = {"Allow": exc.headers["Allow"]} if "Allow" in exc.headers else None
            return self._error(request, err)
        except Exception as exc:
            log.exception("%s %s failed", request.method, request.path)
            return self._error(request, ApiError(500, f"internal error: {exc}"))

    def _error(self, request: web.Request, err: ApiError) -> web.Response:
        """The error response, in Ollama's or Anthropic's shape on their routes, else in
        OpenAI's."""
        body = error_body(err) if is_ollama_path(request.path) else \
            anthropic.error_body(err) if anthropic.is_anthropic_path(request.path) else \
            err.body()
        return json_response(body, err.status, err.headers)

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
            raise bad(f"the request body is not valid JSON ({exc})", None,
                       "invalid_json") from None

    def _slot(self, name: str) -> ModelSlot:
        if not name and len(self.models) == 1:
            return next(iter(self.models.values()))
        if not name:
            raise bad("model is required", "model", "missing_required_parameter")
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

    # -- plain routes -------------------------------------------------------------------------
    async def health(self, request: web.Request) -> web.Response:
        """ok; "recovered" after device faults the engine recovered from (200 both); a
        lost device is a 503: nothing will run until the server restarts."""
        h = self.engine.health()
        return json_response(h, 503 if h["status"] == "device_lost" else 200)

    async def get_metrics(self, request: web.Request) -> web.Response:
        return web.Response(text=self.metrics.render(self.models),
                            content_type="text/plain", charset="utf-8",
                            headers={"X-Content-Type-Options": "nosniff"})


# the key under which an application holds its Server (an AppKey is made at import: aiohttp
# names it after the module that makes it)
SERVER_KEY = web.AppKey("hotseat.server", Server)


def make_app(engine: EngineAPI, model_names: list[str], *, api_key: str | None = None,
             cors_origins: list[str] | tuple[str, ...] = (), max_body: int = MAX_BODY,
             host: str = "127.0.0.1", allow_hosts: list[str] | tuple[str, ...] = (),
             keepalive_s: float = KEEPALIVE_S, fetch_images: bool = False) -> web.Application:
    """The aiohttp app serving model_names, which are already loaded on engine.

    host is the address it is bound to: its name and the loopback names are the Host headers
    it answers to, with allow_hosts; bound to every interface (0.0.0.0, ::) it also answers
    to any IP address. keepalive_s closes idle connections (any AppRunner of the app).
    fetch_images: image_url parts may name http(s) URLs, which the server then fetches."""
    server = Server(engine, api_key, cors_origins, max_body, host, allow_hosts, fetch_images)
    for name in model_names:
        server.add_model(name)

    @web.middleware
    async def middleware(request: web.Request, handler) -> web.StreamResponse:
        return await server.middleware(request, handler)

    app = web.Application(middlewares=[middleware], client_max_size=max_body,
                          handler_args={"keepalive_timeout": keepalive_s})
    for method, path, handler in server.routes():
        app.router.add_route(method, path, handler)
    app.on_response_prepare.append(server.on_prepare)
    app.on_shutdown.append(server.on_shutdown)
    app.on_cleanup.append(server.close)
    app[SERVER_KEY] = server
    return app
