"""The OpenAI-compatible API under /v1: models, chat completions and completions, streamed
(server-sent events) or not, with usage and cached prompt tokens.

Generation runs on a worker thread, never on the event loop; a client that goes away cancels
its generation.
"""
from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import math
import re
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Awaitable, Callable

from ..facade import EngineFault, Request
from ..residency.arbiter import BudgetError
from ..text.constrain import ConstraintError
from ..text.sampling import BAN, SamplingError, SamplingParams
from ..vision.prompt import MARKER
from . import logprobs, media
from .errors import (
    ApiError,
    bad,
    boolean,
    device_fault,
    integer,
    json_response,
    number,
    over_budget,
    show,
)
from .chat_tools import CALL_TOKENS, ToolRequest, ToolStream, parse_tools, tool_message
from .metrics import CLIENT_GONE_STATUS
from .slots import queued
from .structured import parse_constraint

if TYPE_CHECKING:
    from aiohttp import web

    from ..facade import Completion
    from .slots import ModelSlot

log = logging.getLogger("hotseat.serve")

MAX_STOP = 16                            # stop strings per request
COMPLETIONS_DEFAULT_MAX_TOKENS = 16      # OpenAI's default for /v1/completions
POLL_S = 0.25                            # how often a waiting request checks its client
CHAT_ROLES = {"system": "system", "developer": "system", "user": "user",
              "assistant": "assistant", "tool": "tool"}
FINISH = {"stop": "stop", "length": "length", "cancelled": "stop"}
MAX_TOKENS_HEADER = "X-Hotseat-Max-Tokens"   # set when the client gave no max_tokens and
                                             # the room left (or a call's bound) limits it
MAX_TEMPERATURE = 2.0                    # OpenAI's range: [0, 2]


# -- requests ------------------------------------------------------------------------------

def _text_content(content: Any, i: int, images: list | None = None) -> str:
    """A message's content: a string, or a list of parts: {"type": "text", "text": ...}, and
    where `images` collects them, {"type": "image_url", "image_url": {"url": a data URL}}
    (the image's bytes go to `images`, the media marker into the text at its place)."""
    param = f"messages[{i}].content"
    if isinstance(content, str):
        return media.marked(content, param) if images is not None else content
    if isinstance(content, list):
        texts = []
        for j, part in enumerate(content):
            kind = part.get("type") if isinstance(part, dict) else None
            if kind == "text" and isinstance(part.get("text"), str):
                texts.append(media.marked(part["text"], f"{param}[{j}].text")
                             if images is not None else part["text"])
            elif kind == "image_url" and images is not None:
                url = part.get("image_url")
                url = url.get("url") if isinstance(url, dict) else url
                at = f"{param}[{j}].image_url"
                images.append((media.from_url(url, at), at))
                texts.append(MARKER)
            else:
                what = "text and image_url" if images is not None else "text"
                raise bad(f"{param}: only {what} parts are supported", param, "invalid_type")
        return "".join(texts)
    raise bad(f"{param} must be a string or a list of text parts", param, "invalid_type")


def parse_messages(v: Any, images: list | None = None) -> list[dict]:
    """The chat's messages, checked; with `images`, the images of user messages are
    collected there in order (engine/server/media.py)."""
    if v is None:
        raise bad("messages is required", "messages", "missing_required_parameter")
    if not isinstance(v, list) or not v:
        raise bad("messages must be a non-empty list", "messages", "invalid_type")
    out = []
    for i, m in enumerate(v):
        if not isinstance(m, dict):
            raise bad(f"messages[{i}] must be an object", f"messages[{i}]", "invalid_type")
        role = m.get("role")
        if role not in CHAT_ROLES:
            raise bad(f"messages[{i}].role must be one of {', '.join(sorted(CHAT_ROLES))}, "
                       f"got {show(role)}", f"messages[{i}].role", "invalid_value")
        if role == "tool" or (role == "assistant" and m.get("tool_calls")):
            msg = tool_message(m, i, role)      # chat_tools.py: calls and their results
            content = m.get("content")
            msg["content"] = None if content is None and role == "assistant" else \
                _text_content(content, i)
            out.append(msg)
            continue
        out.append({"role": CHAT_ROLES[role],
                    "content": _text_content(m.get("content"), i,
                                             images if role == "user" else None)})
    return out


def parse_prompt(v: Any) -> str | list[int]:
    """A completions prompt: a string, a list of one string, or a list of token ids."""
    if v is None:
        raise bad("prompt is required", "prompt", "missing_required_parameter")
    if isinstance(v, str):
        return v
    if isinstance(v, list) and len(v) == 1 and isinstance(v[0], str):
        return v[0]
    if isinstance(v, list) and v and all(isinstance(t, int) and not isinstance(t, bool)
                                         and t >= 0 for t in v):
        return list(v)
    if isinstance(v, list) and len(v) > 1 and all(isinstance(t, str) for t in v):
        raise bad("only one prompt per request is supported", "prompt", "invalid_value")
    raise bad("prompt must be a string or a list of token ids", "prompt", "invalid_type")


def parse_stop(v: Any) -> list[str]:
    if v is None:
        return []
    if isinstance(v, str):
        v = [v]
    if not isinstance(v, list) or not all(isinstance(s, str) for s in v):
        raise bad("stop must be a string or a list of strings", "stop", "invalid_type")
    if len(v) > MAX_STOP:
        raise bad(f"at most {MAX_STOP} stop strings, got {len(v)}", "stop", "invalid_value")
    return [s for s in v if s]


def parse_logit_bias(v: Any) -> list[tuple[int | str, float]]:
    """logit_bias as llama.cpp's server takes it: OpenAI's object of token id (a string key)
    to bias, or a list of [id or text, bias] pairs; a key that is not a number is text,
    whose tokens all get the bias. A bias of -100 (OpenAI's ban) or false bans the token."""
    if v is None:
        return []
    if isinstance(v, dict):
        pairs = list(v.items())
    elif isinstance(v, list) and all(isinstance(p, list) and len(p) == 2 for p in v):
        pairs = [tuple(p) for p in v]
    else:
        raise bad("logit_bias must be an object of token ids to biases (or a list of [token, "
                  "bias] pairs)", "logit_bias", "invalid_type")
    out: list[tuple[int | str, float]] = []
    for key, bias in pairs:
        if bias is False:
            bias = BAN
        elif isinstance(bias, bool) or not isinstance(bias, (int, float)) \
                or not math.isfinite(bias) or not -100 <= bias <= 100:
            raise bad(f"logit_bias[{show(key)}] must be a number between -100 and 100 or "
                      f"false, got {show(bias)}", "logit_bias", "invalid_value")
        elif bias <= -100:
            bias = BAN
        if isinstance(key, str) and re.fullmatch(r"-?[0-9]+", key.strip()):
            key = int(key)
        if isinstance(key, bool) or not isinstance(key, (int, str)) or key == "" \
                or (isinstance(key, int) and key < 0):
            raise bad(f"logit_bias: {show(key)} is neither a token id nor text", "logit_bias",
                      "invalid_value")
        out.append((key, float(bias)))
    return out


@dataclass
class GenRequest:
    """A validated /v1 generation request."""
    model: str
    messages: list[dict] | None
    prompt: str | list[int] | None
    max_tokens: int | None                # None: the client gave none
    sampling: Any                         # SamplingParams
    stop: list[str]
    stream: bool
    include_usage: bool
    logit_bias: list[tuple[int | str, float]]   # token id or text (tokenized), bias or BAN
    max_tokens_param: str = "max_tokens"  # or max_completion_tokens: the name the client used
    logprobs: int | None = None           # alternatives per token (logprobs.py); None: none
    tools: ToolRequest | None = None      # tools, tool_choice, tool messages (chat_tools.py)
    constraint: Any = None                # a text.constrain.Grammar (structured.py)
    # the images' (bytes, parameter), one per media marker of the messages (media.py), and
    # once the prompt is made, the decoded Images
    images: list = field(default_factory=list)
    decoded: list = field(default_factory=list)

    def engine_request(self, name: str, ids: list[int], max_tokens: int,
                       wait: float | None = None) -> Request:
        """What the engine runs for it: the prompt's tokens, and where a call is due, the
        call grammar, its markers kept and its sampling (ToolRequest.sampling)."""
        tools = self.tools
        constraint = self.constraint if self.constraint is not None or tools is None \
            else tools.constraint
        return Request(name, tokens=ids, max_tokens=max_tokens,
                       sampling=self.sampling if tools is None else tools.sampling(self.sampling),
                       stop=self.stop, logprobs=self.logprobs, constraint=constraint,
                       preserved_tokens=tools.preserved if tools is not None else (),
                       images=self.decoded, wait=wait)


def parse_request(body: Any, chat: bool) -> GenRequest:
    if not isinstance(body, dict):
        raise bad("the request body must be a JSON object", None, "invalid_type")
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise bad("model must be a string", "model", "invalid_type")
    images: list = []
    messages = parse_messages(body.get("messages"), images) if chat else None
    prompt = None if chat else parse_prompt(body.get("prompt"))

    n = integer(body, "n", 1)
    if n != 1:
        raise bad("only n=1 is supported", "n", "invalid_value")
    best_of = integer(body, "best_of", 1)
    if best_of != 1:
        raise bad("only best_of=1 is supported", "best_of", "invalid_value")
    if body.get("echo") not in (None, False, 0):
        raise bad("echo is not supported", "echo", "unsupported_parameter")
    n_logprobs = logprobs.parse(body, chat)
    tools = None
    if chat:
        tools = parse_tools(body, has_tool_messages=any(
            m["role"] == "tool" or m.get("tool_calls") for m in messages))
    elif body.get("tools"):
        raise bad("tools are only taken by /v1/chat/completions", "tools",
                  "unsupported_parameter")
    constraint = parse_constraint(body, chat)
    if body.get("suffix") not in (None, ""):
        raise bad("suffix is not supported", "suffix", "unsupported_parameter")

    key = "max_completion_tokens" if body.get("max_completion_tokens") is not None \
        else "max_tokens"
    max_tokens = integer(body, key, None, lo=1)

    d = SamplingParams()
    seed = integer(body, "seed", None)
    try:
        sampling = SamplingParams(
            temperature=number(body, "temperature", d.temperature, 0.0, MAX_TEMPERATURE),
            top_k=integer(body, "top_k", d.top_k, lo=0),
            top_p=number(body, "top_p", d.top_p, 0.0, 1.0, lo_open=True),
            min_p=number(body, "min_p", d.min_p, 0.0, 1.0),
            repeat_penalty=number(body, "repeat_penalty", d.repeat_penalty, 0.0),
            repeat_last_n=integer(body, "repeat_last_n", d.repeat_last_n, lo=-1),
            seed=None if seed is None else seed % (1 << 64),
            # OpenAI's range; llama.cpp applies them over the last repeat_last_n tokens
            frequency_penalty=number(body, "frequency_penalty", 0.0, -2.0, 2.0),
            presence_penalty=number(body, "presence_penalty", 0.0, -2.0, 2.0),
        )
    except SamplingError as exc:
        raise bad(str(exc), exc.param, "invalid_value") from None
    logit_bias = parse_logit_bias(body.get("logit_bias"))

    stream = boolean(body, "stream", False)
    opts = body.get("stream_options")
    if opts is not None and not isinstance(opts, dict):
        raise bad("stream_options must be an object", "stream_options", "invalid_type")
    if opts is not None and not stream:
        raise bad("the stream_options parameter is only allowed when stream is true",
                  "stream_options", "invalid_value")
    include_usage = boolean(opts or {}, "include_usage", False)
    return GenRequest(model or "", messages, prompt, max_tokens, sampling,
                      parse_stop(body.get("stop")), stream, include_usage, logit_bias, key,
                      logprobs=n_logprobs, tools=tools, constraint=constraint,
                      images=images)

# -- routes --------------------------------------------------------------------------------

class OpenAIRoutes:
    """The /v1 handlers (a mixin of Server: it uses the engine, the model slots, the device's
    turn, the worker pool and the metrics)."""

    def _model_card(self, slot: ModelSlot) -> dict:
        return {"id": slot.name, "object": "model", "created": slot.created,
                "owned_by": "hotseat"}


    async def v1_models(self, request: web.Request) -> web.Response:
        return json_response({"object": "list",
                               "data": [self._model_card(s) for s in self.models.values()]})

    async def v1_model(self, request: web.Request) -> web.Response:
        return json_response(self._model_card(self._slot(request.match_info["name"])))


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
                raise bad(f"token id {max(ids)} is outside the vocabulary ({n_vocab})",
                           "prompt", "invalid_value")
        else:
            if req.images:
                fetched = await media.fetch(req.images, self.fetch_images)
                req.decoded = await self._run(media.decode, fetched)
            try:
                ids = await self._run(req.tools.prompt, self.engine, slot.name, req.messages,
                                      req.decoded) \
                    if req.tools is not None else \
                    await self._run(self.engine.prompt_tokens, slot.name, prompt=req.prompt,
                                    messages=req.messages, images=req.decoded)
            except KeyError:
                raise ApiError(404, f"the model {slot.name!r} was unloaded", "model",
                               "model_not_found") from None
            except Exception as exc:          # a chat template refusing the conversation
                if type(exc).__module__.startswith("jinja2") or isinstance(exc, ValueError):
                    raise bad(f"cannot format the {param}: {exc}", param) from None
                raise
        if not ids:
            raise bad(f"the {param} is empty", param, "invalid_value")
        if len(ids) >= slot.n_ctx:            # no room left for a single completion token
            raise bad(context_overflow(slot.n_ctx, len(ids), param), param,
                      "context_length_exceeded")
        return ids

    def _logit_bias(self, slot: ModelSlot, req: GenRequest) -> None:
        """Resolve the request's logit_bias on the model's vocabulary, into req.sampling."""
        tok = self.engine.tokenizer(slot.name)
        bias: dict[int, float] = {}
        for key, b in req.logit_bias:
            ids = [key] if isinstance(key, int) else \
                tok.encode(key, add_special=False, parse_special=False)
            for i in ids:
                if i >= tok.n_vocab:
                    raise bad(f"logit_bias: token id {i} is outside the vocabulary "
                              f"({tok.n_vocab})", "logit_bias", "invalid_value")
                bias[i] = b                    # a later entry for a token replaces it
        if sum(b == BAN for b in bias.values()) >= tok.n_vocab:
            raise bad("logit_bias bans every token", "logit_bias", "invalid_value")
        try:
            req.sampling = dataclasses.replace(req.sampling, logit_bias=bias)
        except SamplingError as exc:
            raise bad(str(exc), exc.param, "invalid_value") from None

    async def _generate(self, request: web.Request, chat: bool) -> web.StreamResponse:
        from .turns import check_yield, parse_wait

        req = parse_request(await self._body(request), chat)
        wait = parse_wait(request)
        slot = self._slot(req.model)
        check_yield(self.engine, wait)
        if req.logit_bias:
            try:
                self._logit_bias(slot, req)
            except KeyError:
                raise ApiError(404, f"the model {slot.name!r} was unloaded", "model",
                               "model_not_found") from None
        ids = await self._prompt_ids(slot, req)
        room = slot.room(len(ids), req.max_tokens, req.max_tokens_param,
                         "messages" if chat else "prompt")
        headers = {}
        max_tokens = room if req.tools is None else req.tools.limit(room)
        if req.max_tokens is None:            # the server's choice: limited to the room left
            if not chat:
                max_tokens = min(COMPLETIONS_DEFAULT_MAX_TOKENS, max_tokens)
            if max_tokens == room or max_tokens == CALL_TOKENS:
                headers[MAX_TOKENS_HEADER] = str(max_tokens)
        meta = {"id": ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex,
                "created": int(time.time()), "model": slot.name,
                "system_fingerprint": "hotseat"}

        async with queued(slot, self.turn):
            if _gone(request):             # gave up while queued: nobody to answer
                return json_response({}, CLIENT_GONE_STATUS)
            if req.stream:
                # the headers go out before the generation: warm the model first, so
                # that a budget refusal is still a 409
                await self._run(self.engine.warm, slot.name,
                                **({} if wait is None else {"wait": wait}))
                return await self._stream(request, slot, req, ids, max_tokens, meta,
                                          headers, chat)
            out = await self._complete(request, slot, req, ids, max_tokens, None,
                                       wait=wait)
        if out.finish_reason == "cancelled" and _gone(request):
            # left during its prompt or its answer
            return json_response({}, CLIENT_GONE_STATUS)
        text = out.text
        lp = None if req.logprobs is None else \
            logprobs.Formatter(self.engine.tokenizer(slot.name)).format(out.logprobs, chat)
        if chat:
            message, called = {"role": "assistant", "content": text}, False
            if req.tools is not None:
                message, called = req.tools.message(text, out.finish_reason == "length")
            choice = {"index": 0, "message": message, "logprobs": lp,
                      "finish_reason": "tool_calls" if called else FINISH[out.finish_reason]}
            obj = "chat.completion"
        else:
            choice = {"index": 0, "text": text, "logprobs": lp,
                      "finish_reason": FINISH[out.finish_reason]}
            obj = "text_completion"
        return json_response({**meta, "object": obj, "choices": [choice],
                               "usage": _usage(out)}, headers=headers)

    async def _complete(self, request: web.Request, slot: ModelSlot, req: GenRequest,
                        ids: list[int], max_tokens: int,
                        on_text: Callable[[str], None] | None,
                        cancel: threading.Event | None = None,
                        wait: float | None = None) -> Completion:
        """Run one generation on a worker thread; cancel it if the client goes away. wait:
        the most seconds it waits for the GPU (X-Hotseat-Wait)."""
        cancel = cancel or threading.Event()
        self._cancels.add(cancel)
        fut = asyncio.ensure_future(self._run(
            self.engine.generate, req.engine_request(slot.name, ids, max_tokens, wait),
            on_text=on_text, cancel=cancel))
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
        except (SamplingError, ConstraintError) as exc:
            raise bad(str(exc), exc.param, "invalid_value") from None
        except ValueError as exc:           # the engine's word for bad input
            raise bad(str(exc)) from None
        except BudgetError as exc:          # a cold model that pinned models leave no room for
            raise over_budget(exc) from None
        except EngineFault as exc:          # the GPU failed; the engine reset what it touched
            raise device_fault(exc) from None
        except Exception as exc:
            log.exception("generation on %s failed", slot.name)
            raise ApiError(500, f"generation failed: {exc}", None, "engine_error") from None
        self.metrics.generation(slot.name, out)
        return out

    async def _pumped(self, request: web.Request, slot: ModelSlot, req: GenRequest,
                      ids: list[int], max_tokens: int,
                      handle: Callable[[str, list | None], Awaitable[None]],
                      cancel: threading.Event) -> Completion:
        """The generation, its pieces written as they come (every streamed route's one pump):
        on the worker thread each piece is queued with its logprob entries, and on the event
        loop handle(piece, entries) writes it, in order. It returns once the generation and
        every write are done; on an ApiError the pieces before it are written first. A write
        that fails (the client left: ConnectionError) cancels the generation."""
        loop = asyncio.get_running_loop()
        pieces: asyncio.Queue = asyncio.Queue()

        async def pump() -> None:
            try:
                while (piece := await pieces.get()) is not None:
                    await handle(*piece)
            except ConnectionError:
                cancel.set()
                raise

        def on_text(piece: str, entries=None) -> None:      # on the worker thread
            loop.call_soon_threadsafe(pieces.put_nowait, (piece, entries))

        writer = asyncio.ensure_future(pump())
        try:
            try:
                out = await self._complete(request, slot, req, ids, max_tokens, on_text, cancel)
            finally:
                # the worker scheduled its pieces before its result, so None comes after them
                pieces.put_nowait(None)
            await writer
            return out
        except ApiError:
            await writer
            raise
        finally:
            if not writer.done():
                writer.cancel()

    @contextlib.asynccontextmanager
    async def _stream_body(self, request: web.Request, resp: web.StreamResponse,
                           cancel: threading.Event,
                           report: Callable[[ApiError], Awaitable[None]]):
        """The body of a streamed answer, its headers sent (every streamed route's): an
        ApiError is reported in the stream by report(exc), which ends it; a client gone
        (ConnectionError) cancels the generation and is counted as gone."""
        try:
            yield
        except ApiError as exc:
            try:
                await report(exc)
                await resp.write_eof()
            except ConnectionError:
                pass
        except ConnectionError:
            cancel.set()
            self._left.add(id(request))

    async def _stream(self, request: web.Request, slot: ModelSlot, req: GenRequest,
                      ids: list[int], max_tokens: int, meta: dict, headers: dict,
                      chat: bool) -> web.StreamResponse:
        from aiohttp import web

        cancel = threading.Event()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                           "Cache-Control": "no-cache", **headers})
        await resp.prepare(request)
        obj = "chat.completion.chunk" if chat else "text_completion"
        extra = {"usage": None} if req.include_usage else {}
        lp = None if req.logprobs is None else \
            logprobs.Formatter(self.engine.tokenizer(slot.name))
        held: list = []                  # logprob entries of text a tool stream holds back

        tool_stream = ToolStream(req.tools) if chat and req.tools is not None else None

        def chunk(delta: str | dict | None, finish: str | None, first: bool = False,
                  entries=None) -> dict:
            lps = None if not entries else lp.format(entries, chat)
            if chat:
                d = {"role": "assistant", "content": ""} if first else \
                    {} if delta is None else delta if isinstance(delta, dict) else \
                    {"content": delta}
                choice = {"index": 0, "delta": d, "logprobs": lps, "finish_reason": finish}
            else:
                choice = {"index": 0, "text": delta or "", "logprobs": lps,
                          "finish_reason": finish}
            return {**meta, "object": obj, "choices": [choice], **extra}

        async def send(obj_: dict | str) -> None:
            data = obj_ if isinstance(obj_, str) else json.dumps(obj_, ensure_ascii=False)
            await resp.write(f"data: {data}\n\n".encode())

        async def write(text: str, entries) -> None:
            if tool_stream is None:
                await send(chunk(text, None, entries=entries))
                return
            held.extend(entries or ())              # given with the next delta sent
            for delta in tool_stream.feed(text):    # text held while it may be a call
                await send(chunk(delta, None, entries=held[:]))
                held.clear()

        async def report(exc: ApiError) -> None:
            await send(exc.body())
            await send("[DONE]")

        async with self._stream_body(request, resp, cancel, report):
            if chat:
                await send(chunk(None, None, first=True))
            out = await self._pumped(request, slot, req, ids, max_tokens, write, cancel)
            if out.finish_reason == "cancelled" and _gone(request):
                self._left.add(id(request))    # nobody to send the end to
                return resp
            finish = FINISH[out.finish_reason]
            if tool_stream is not None:
                deltas, called = tool_stream.finish(out.finish_reason == "length")
                for delta in deltas:
                    await send(chunk(delta, None))
                finish = "tool_calls" if called else finish
            await send(chunk(None, finish))
            if req.include_usage:
                await send({**meta, "object": obj, "choices": [], "usage": _usage(out)})
            await send("[DONE]")
            await resp.write_eof()
        return resp




def context_overflow(n_ctx: int, n_tokens: int, param: str) -> str:
    """OpenAI's wording, which clients key on to trim their history: litellm's
    ContextWindowExceededError looks for "this model's maximum context length is",
    langchain-openai's OpenAIContextOverflowError for "context_length_exceeded" in str(error).
    The openai package's errors now show the message alone (not the code, as its 1.x did), so
    the code is repeated at the end of the message."""
    return (f"This model's maximum context length is {n_ctx} tokens. However, your {param} "
            f"resulted in {n_tokens} tokens. Please reduce the length of the {param}. "
            "(context_length_exceeded)")


def _gone(request: web.Request) -> bool:
    t = request.transport
    return t is None or t.is_closing()


def _usage(out: Completion) -> dict:
    p, c = len(out.prompt_tokens), len(out.tokens)
    return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c,
            "prompt_tokens_details": {"cached_tokens": int(out.timings.get("cached_tokens", 0))}}
