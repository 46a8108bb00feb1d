"""Ollama's API under /api, on the same port as /v1, so that apps that speak only Ollama's
API (Open WebUI, Continue, the `ollama` Python client...) can use Hotseat's models.

    GET  /api/version /api/tags /api/ps         POST /api/show /api/chat /api/generate
    POST /api/embed /api/embeddings             DELETE /api/delete (unloads)
    POST /api/pull /api/push /api/create /api/copy, /api/blobs/...: 501, said why

Hotseat's own management routes (/api/models, /api/vram, /api/arena; manage.py) live beside
these without a clash, and keep OpenAI's error shape; these answer `{"error": "..."}` with
the status Ollama gives (400 bad input, 404 unknown model, 501 not served here, ...).

What maps to what:
- Model names: a loaded model is listed as "NAME:latest"; a client's name matches a loaded
  model exactly, without ":latest", case-insensitively, or when its words (split at ":",
  "-", ".", "_") all appear among one model's, the first word first (words written
  together count: "gemma3" finds gemma-3-270m): "smollm2" and "smollm2:135m" both find
  "SmolLM2-135M-Instruct.Q4_1". A name that matches several is a 404 naming them.
- Prompts: /api/chat formats the messages with the model's own chat template (the GGUF's
  Jinja template, not Ollama's Go templates: `template` is refused), dropping the oldest
  messages after the system ones when the conversation does not fit the context, as Ollama
  does (`truncate: false` refuses instead). /api/generate formats `system` + `prompt` the
  same way as one user turn, or sends the prompt as it is with `raw: true`. `context` (the
  tokens a previous /api/generate returned) is put before the new prompt.
- options: temperature, top_k, top_p, min_p, seed, num_predict (<= 0: until the context is
  full), stop, repeat_penalty, repeat_last_n, presence_penalty, frequency_penalty. Absent
  ones take Ollama's defaults (ollama_values.OLLAMA_SAMPLING). num_ctx can narrow the
  window of a request but not widen the context the model was loaded with (--ctx): a
  larger one is capped, and the window used is sent back in X-Hotseat-Num-Ctx. Options
  that set how Ollama loads a model (num_gpu, num_thread, use_mmap...) and unknown ones are
  ignored, as Ollama ignores unknown ones, and named in X-Hotseat-Ignored-Options;
  mirostat, typical_p and tfs_z other than off are refused.
- keep_alive (seconds as a number, or a duration such as "5m", "1h30m"): 0 makes the model
  cold right after the answer (its weights leave VRAM; it stays loaded in host memory and
  listed in /api/tags, and warms again at its next request); a duration becomes the model's
  own idle time for Hotseat's idle eviction (the engine's set_idle_evict), from its last
  request; a negative one (-1) means no idle eviction for it. The model is not pinned: as
  in Ollama, another model that needs the room may still make it cold. Absent, the model
  keeps what the last request set (nothing by default: `hotseat serve` has no idle
  eviction). An empty prompt (or no messages) only loads the model (done_reason "load"),
  or, with keep_alive 0, makes it cold ("unload").
- Timings, in nanoseconds: total_duration from the request's arrival to the end,
  load_duration the warming of a cold model, prompt_eval_count the prompt's tokens (cached
  ones included) and prompt_eval_duration their prefill, eval_count the generated tokens and
  eval_duration the decode steps (the first token comes out of the prefill).
- /api/delete unloads the model (the GGUF file is never touched); POST /api/models loads it
  again. /api/pull, /api/push, /api/create, /api/copy and blobs are 501: Hotseat serves the
  GGUF files it is given and keeps no model store.
- `format` ("json" or a JSON schema) constrains decoding as /v1's response_format does
  (engine/text/constrain.py); /api/embed and /api/embeddings are the engine's embeddings
  (pooled, normalized hidden states), as /v1/embeddings serves them.
- `tools` on /api/chat go through the same call grammar and parsers as /v1's
  (chat_tools.py); calls come back as `message.tool_calls` in Ollama's shape (arguments an
  object, an id the server made), whole, in the line before the last when streamed. Role
  "tool" messages answer the assistant's calls before them in order.
- think and logprobs are refused, saying so; images (base64) go before their message's text.

Streaming is the default, as in Ollama: one JSON object per line (application/x-ndjson), the
last with "done": true, the timings and done_reason; an error after the first line is sent
as a last line `{"error": "..."}`.
"""
from __future__ import annotations

import json
import logging
import math
import os
import threading
import time
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Callable, Iterable

from ..text.constrain import ConstraintError, Grammar
from . import media
from .chat_tools import ToolRequest, ToolStream, call_id, parse_tools
from .errors import ApiError, bad, boolean, integer, json_response
from .metrics import CLIENT_GONE_STATUS
from .ollama_values import (
    FileFacts,
    human_count,
    json_object,
    match_names,
    model_name,
    now_iso,
    ns,
    ollama_name,
    parse_chat_messages,
    parse_images,
    with_images,
    parse_format,
    parse_keep_alive,
    parse_options,
    quant_name,
    read_facts,
    refuse_unserved,
    shorten,
)
from .slots import queued

if TYPE_CHECKING:
    from aiohttp import web

    from ..facade import Completion
    from .slots import ModelSlot

log = logging.getLogger("hotseat.serve")

OLLAMA_VERSION = "0.12.0"      # the Ollama release whose API these routes follow (clients
                               # compare it to decide what they may send)
NDJSON = "application/x-ndjson"
NUM_CTX_HEADER = "X-Hotseat-Num-Ctx"
IGNORED_HEADER = "X-Hotseat-Ignored-Options"
FOREVER = timedelta(days=365 * 200)   # expires_at of a model with no idle eviction
NO_STORE = ("Hotseat serves the GGUF files it is given and keeps no model store: start it with "
            "`hotseat serve -m FILE.gguf`, or load a file into a running server with POST "
            "/api/models {\"path\": \"FILE.gguf\"}; GET /api/tags lists what is loaded")
PATHS = frozenset({"/api/version", "/api/tags", "/api/ps", "/api/show", "/api/chat",
                   "/api/generate", "/api/embed", "/api/embeddings", "/api/pull", "/api/push",
                   "/api/create", "/api/copy", "/api/delete"})


def is_ollama_path(path: str) -> bool:
    """Whether a request's path is one of Ollama's routes, whose errors take its shape."""
    return path in PATHS or path.startswith("/api/blobs/")


def error_body(err: ApiError) -> dict:
    """Ollama's error shape."""
    return {"error": err.message}


def not_in_build(what: str) -> ApiError:
    return ApiError(501, f"{what} is not available in this build of Hotseat", None,
                    "not_implemented")


# -- what the engine gives -----------------------------------------------------------------

def format_constraint(schema: dict) -> Grammar:
    """The grammar of Ollama's `format` (a JSON schema; "json" is {"type": "object"}, any
    JSON object), for generate's `constraint`; a schema that cannot be used is a 400."""
    try:
        if schema == {"type": "object"}:
            return Grammar.json_object(param="format")
        return Grammar.json_schema(schema, param="format")
    except ConstraintError as exc:
        raise bad(str(exc), "format", "invalid_value") from None


def embed_token_lists(engine, name: str, inputs: list[list[int]]) -> list[list[float]]:
    """One normalized embedding per input (token ids), from the engine's `embed`."""
    return [[float(x) for x in vec] for vec in engine.embed(name, inputs).vectors]


# -- routes --------------------------------------------------------------------------------

class OllamaRoutes:
    """Ollama's handlers (a mixin of Server: it uses the engine, the model slots, the
    device's turn, the worker pool and OpenAIRoutes' generation)."""

    _facts: dict

    # -- names and facts ----------------------------------------------------------------------
    def _ollama_slot(self, asked: str) -> ModelSlot:
        hits = match_names(asked, self.models)
        if len(hits) == 1:
            return self.models[hits[0]]
        if hits:
            raise ApiError(404, f"model {asked!r} matches several loaded models: "
                                f"{', '.join(map(ollama_name, hits))}; name one", "model",
                           "model_not_found")
        raise ApiError(404, f"model {asked!r} not found; loaded: "
                            f"{', '.join(map(ollama_name, self.models)) or 'none'}. {NO_STORE}",
                       "model", "model_not_found")

    async def _file_facts(self, path: str) -> FileFacts:
        cache = self.__dict__.setdefault("_facts", {})
        try:
            key = (path, os.stat(path).st_mtime_ns)
        except OSError as exc:
            raise ApiError(500, f"{path}: {exc.strerror or exc}") from None
        if key not in cache:
            cache[key] = (await self._run(read_facts, path))[0]
        return cache[key]

    async def _status_of(self, names: Iterable[str] | None = None) -> list[dict]:
        wanted = set(self.models if names is None else names)
        return [s for s in await self._run(self.engine.status) if s["name"] in wanted]

    def _details(self, s: dict, facts: FileFacts) -> dict:
        size_label = facts.info.get("general.size_label")
        return {"parent_model": "", "format": "gguf", "family": s["arch"],
                "families": [s["arch"]],
                "parameter_size": size_label if isinstance(size_label, str) and size_label
                else human_count(facts.parameters),
                "quantization_level": quant_name(s.get("file_type"))}

    # -- plain routes -------------------------------------------------------------------------
    async def ollama_version(self, request: web.Request) -> web.Response:
        return json_response({"version": OLLAMA_VERSION})

    async def ollama_tags(self, request: web.Request) -> web.Response:
        models = []
        for s in await self._status_of():
            facts = await self._file_facts(s["path"])
            models.append({"name": ollama_name(s["name"]), "model": ollama_name(s["name"]),
                           "modified_at": facts.modified_at, "size": facts.size,
                           "digest": facts.digest, "details": self._details(s, facts)})
        return json_response({"models": models})

    async def ollama_ps(self, request: web.Request) -> web.Response:
        """The warm models: those whose weights are in VRAM (a cold one is loaded in host
        memory, but must be warmed before it answers)."""
        models = []
        now = datetime.now(timezone.utc)
        for s in await self._status_of():
            if s["state"] != "warm":
                continue
            facts = await self._file_facts(s["path"])
            idle_evict = s.get("idle_evict_s") or 0.0
            expires = now + (timedelta(seconds=max(0.0, idle_evict - s.get("idle_s", 0.0)))
                             if idle_evict else FOREVER)
            vram = sum(s["device_bytes"].values())
            models.append({"name": ollama_name(s["name"]), "model": ollama_name(s["name"]),
                           "size": vram + s.get("host_weight_bytes", 0),
                           "digest": facts.digest, "details": self._details(s, facts),
                           "expires_at": expires.isoformat().replace("+00:00", "Z"),
                           "size_vram": vram, "context_length": s["n_ctx"]})
        return json_response({"models": models})

    async def ollama_show(self, request: web.Request) -> web.Response:
        body = json_object(await self._body(request))
        slot = self._ollama_slot(model_name(body))
        verbose = boolean(body, "verbose", False)
        (s,) = await self._status_of([slot.name])
        facts = await self._file_facts(s["path"])
        info = dict(facts.info)
        if verbose:
            info.update((await self._run(read_facts, s["path"], True))[1])
        caps = ["completion", "embedding"]
        return json_response({
            "modelfile": f"# Hotseat serves this GGUF file as it is\nFROM {s['path']}\n"
                         f"PARAMETER num_ctx {s['n_ctx']}\n",
            "parameters": f"num_ctx {s['n_ctx']}",
            "template": facts.template,
            "details": self._details(s, facts),
            "model_info": info,
            "capabilities": caps,
            "modified_at": facts.modified_at})

    async def ollama_no_store(self, request: web.Request) -> web.Response:
        what = request.path.removeprefix("/api/").split("/")[0]
        raise ApiError(501, f"/api/{what} has no meaning here: {NO_STORE}", None,
                       "not_implemented")

    async def ollama_delete(self, request: web.Request) -> web.Response:
        """Unloads the model: it leaves /api/tags and frees its memory; the file stays."""
        from aiohttp import web

        body = json_object(await self._body(request))
        slot = self._ollama_slot(model_name(body))
        del self.models[slot.name]            # new requests get a 404 from here on
        async with slot.lock:                 # requests already queued finish first
            slot.closed = True
            await self._run(self.engine.unload, slot.name)
        return web.Response(status=200)

    # -- generation ---------------------------------------------------------------------------
    async def ollama_chat(self, request: web.Request) -> web.StreamResponse:
        return await self._ollama_generate(request, chat=True)

    async def ollama_generate(self, request: web.Request) -> web.StreamResponse:
        return await self._ollama_generate(request, chat=False)

    async def _ollama_generate(self, request: web.Request, chat: bool) -> web.StreamResponse:
        from .openai import GenRequest
        from .turns import check_yield, parse_wait

        t0 = time.perf_counter()
        body = json_object(await self._body(request))
        asked = model_name(body)
        refuse_unserved(body)
        tools = None
        if chat:
            messages = parse_chat_messages(body.get("messages"))
            tools = parse_tools(body, has_tool_messages=any(
                m["role"] == "tool" or m.get("tool_calls") for m in messages))
            empty = not messages
            truncate = boolean(body, "truncate", True)
        else:
            if body.get("tools"):
                raise bad("tools are taken on /api/chat (as in Ollama), not /api/generate",
                          "tools", "unsupported_parameter")
            prompt = body.get("prompt") or ""
            system = body.get("system") or ""
            for key, v in (("prompt", prompt), ("system", system)):
                if not isinstance(v, str):
                    raise bad(f"{key} must be a string", key, "invalid_type")
            raw = boolean(body, "raw", False)
            if body.get("template"):
                raise bad("template is not supported: Hotseat formats prompts with the model's "
                          "own chat template (the GGUF's); send raw: true with a prompt you "
                          "formatted yourself", "template", "unsupported_parameter")
            if body.get("suffix"):
                raise bad("suffix (fill-in-the-middle) is not supported", "suffix",
                          "unsupported_parameter")
            if raw and system:
                raise bad("system has no effect with raw: true (raw sends the prompt as it "
                          "is, without the template that holds the system prompt)", "system",
                          "invalid_value")
            context = body.get("context") or []
            if not isinstance(context, list) or not all(
                    isinstance(t, int) and not isinstance(t, bool) and t >= 0
                    for t in context):
                raise bad("context must be a list of token ids", "context", "invalid_type")
            images = parse_images(body.get("images"), "images")
            prompt = with_images(prompt, images, "prompt")
            empty = not prompt and not context
        stream = boolean(body, "stream", True)
        keep_alive = parse_keep_alive(body.get("keep_alive"))
        opts = parse_options(body.get("options"))
        schema = parse_format(body.get("format"))
        wait = parse_wait(request)
        slot = self._ollama_slot(asked)
        check_yield(self.engine, wait)
        constraint = None if schema is None else format_constraint(schema)
        if tools is not None and tools.parses and constraint is not None:
            raise bad("format and tools cannot be used together: a tool call has its own "
                      "grammar", "format", "invalid_value")

        if empty:                             # Ollama's load / unload request
            return await self._load_or_unload(slot, asked, chat, keep_alive, wait)

        window = slot.n_ctx if opts.num_ctx is None else min(opts.num_ctx, slot.n_ctx)
        if chat:
            ids, decoded = await self._chat_ids(slot, messages, window, truncate, tools)
        else:
            ids, decoded = await self._generate_ids(slot, prompt, system, raw, context,
                                                    window, images)
        room = slot.room(len(ids), window=window)     # num_predict is cut to it, as Ollama does
        max_tokens = room if opts.num_predict <= 0 else min(opts.num_predict, room)
        if tools is not None:
            max_tokens = tools.limit(max_tokens)
        headers = {}
        if opts.num_ctx is not None:
            headers[NUM_CTX_HEADER] = str(window)
        if opts.ignored:
            headers[IGNORED_HEADER] = ", ".join(opts.ignored)
        req = GenRequest(model=slot.name, messages=None, prompt=None, max_tokens=max_tokens,
                         sampling=opts.sampling, stop=opts.stop, stream=stream,
                         include_usage=False, logit_bias=[], constraint=constraint,
                         tools=tools, decoded=decoded)
        head = {"model": asked}

        def piece_obj(text: str, calls: list[dict] | None = None) -> dict:
            msg = {"role": "assistant", "content": text}
            if calls:
                msg["tool_calls"] = calls
            return {**head, "created_at": now_iso(),
                    **({"message": msg} if chat else {"response": text}), "done": False}

        def final_obj(out: Completion, load_s: float, text: str,
                      calls: list[dict] | None = None) -> dict:
            t = out.timings
            obj = {**piece_obj(text, calls), "done": True,
                   "done_reason": "length" if out.finish_reason == "length" else "stop"}
            if not chat and not raw:
                obj["context"] = list(out.prompt_tokens) + list(out.tokens)
            obj.update(total_duration=ns(time.perf_counter() - t0), load_duration=ns(load_s),
                       prompt_eval_count=len(out.prompt_tokens),
                       prompt_eval_duration=ns(t.get("prefill_s", 0.0)),
                       eval_count=len(out.tokens), eval_duration=ns(t.get("decode_s", 0.0)))
            return obj

        async with queued(slot, self.turn, asked):
            if _gone(request):
                return json_response({}, CLIENT_GONE_STATUS)
            t_load = time.perf_counter()
            await self._run(self.engine.warm, slot.name,
                            **({} if wait is None else {"wait": wait}))
            load_s = time.perf_counter() - t_load
            if stream:
                return await self._ollama_stream(request, slot, req, ids, max_tokens,
                                                  headers, piece_obj, final_obj, load_s,
                                                  keep_alive, tools)
            out = await self._complete(request, slot, req, ids, max_tokens, None,
                                       wait=wait)
            if not (out.finish_reason == "cancelled" and _gone(request)):
                await self._keep_alive(slot, keep_alive, headers)
        if out.finish_reason == "cancelled" and _gone(request):
            return json_response({}, CLIENT_GONE_STATUS)
        if tools is None or not tools.parses:
            return json_response(final_obj(out, load_s, out.text), headers=headers)
        p = tools.final(out.text, out.finish_reason == "length")
        return json_response(final_obj(out, load_s, p.content, ollama_calls(p.calls)),
                             headers=headers)

    async def _chat_ids(self, slot: ModelSlot, messages: list[dict], window: int,
                        truncate: bool, tools: ToolRequest | None = None):
        """The conversation's tokens (the tools rendered, where there are some) and the
        images of the messages kept; the oldest messages after the system ones are dropped
        (the last one never) until it fits the window with room for one token."""
        decoded: dict[int, list] = {}

        def tokens(msgs: list[dict]) -> tuple[list[int], list]:
            images = [im for m in msgs for im in decoded.get(id(m), ())]
            msgs = [{k: v for k, v in m.items() if k != "images"} for m in msgs]
            if tools is not None:
                return tools.prompt(self.engine, slot.name, msgs, images), images
            return self.engine.prompt_tokens(slot.name, messages=msgs, images=images), images

        def work() -> tuple[tuple[list[int], list], int]:
            decoded.update((id(m), media.decode(m["images"])) for m in messages if "images" in m)
            system = [m for m in messages if m["role"] == "system"]
            rest = [m for m in messages if m["role"] != "system"]
            out = tokens(messages)
            dropped = 0
            while truncate and len(out[0]) >= window and dropped < len(rest) - 1:
                dropped += 1
                out = tokens(system + rest[dropped:])
            return out, dropped
        (ids, images), _ = await self._tokens(slot, work, "messages")
        if len(ids) >= window:
            raise bad(f"the messages are {len(ids)} tokens; the context window of "
                      f"{slot.name!r} holds {window}" +
                      ("" if truncate else " (truncate is false)"), "messages",
                      "context_length_exceeded")
        return ids, images

    async def _generate_ids(self, slot: ModelSlot, prompt: str, system: str, raw: bool,
                            context: list[int], window: int, images: list):
        """The prompt's tokens after the context's, and its images decoded."""
        def work() -> tuple[list[int], list]:
            decoded = media.decode(images)
            tok = self.engine.tokenizer(slot.name)
            if context and max(context) >= tok.n_vocab:
                raise ValueError(f"token id {max(context)} is outside the vocabulary "
                                 f"({tok.n_vocab})")
            turn = None if raw else ([{"role": "system", "content": system}] if system else
                                     []) + [{"role": "user", "content": prompt}]
            ids = self.engine.prompt_tokens(slot.name, prompt=prompt, messages=turn,
                                            images=decoded) if prompt else []
            if context and ids and ids[0] == tok.bos_id:
                ids = ids[1:]                 # the context already begins the sequence
            return list(context) + list(ids), decoded
        ids, decoded = await self._tokens(slot, work, "prompt")
        if not ids:
            raise bad("the prompt is empty", "prompt", "invalid_value")
        if len(ids) >= window:
            raise bad(f"the prompt is {len(ids)} tokens; the context window of {slot.name!r} "
                      f"holds {window}", "prompt", "context_length_exceeded")
        return ids, decoded

    async def _tokens(self, slot: ModelSlot, work: Callable, param: str):
        try:
            return await self._run(work)
        except KeyError:
            raise ApiError(404, f"model {slot.name!r} was unloaded", "model",
                           "model_not_found") from None
        except Exception as exc:              # a chat template refusing the conversation
            if type(exc).__module__.startswith("jinja2") or isinstance(exc, ValueError):
                raise bad(f"cannot format the {param}: {exc}", param) from None
            raise

    async def _keep_alive(self, slot: ModelSlot, keep_alive: float | None,
                          headers: dict | None = None) -> None:
        """Apply a request's keep_alive after its answer (in the model's queue)."""
        from ..residency.arbiter import PinnedError

        if keep_alive is None:
            return
        try:
            if keep_alive == 0:
                await self._run(self.engine.evict, slot.name)
            else:
                self.engine.set_idle_evict(0.0 if keep_alive == math.inf else keep_alive,
                                           name=slot.name)
        except PinnedError:                   # the user's pin wins over a client's keep_alive
            if headers is not None:
                headers["X-Hotseat-Keep-Alive"] = "pinned: the model stays warm"
        except KeyError:                      # unloaded meanwhile
            pass
        except Exception:                     # the answer stands; the next use retries
            log.warning("keep_alive on %s failed", slot.name, exc_info=True)

    async def _load_or_unload(self, slot: ModelSlot, asked: str, chat: bool,
                              keep_alive: float | None, wait: float | None) -> web.Response:
        """An empty prompt: warm the model (done_reason "load"), or with keep_alive 0 make it
        cold ("unload"; a pinned model is a 409)."""
        from ..residency.arbiter import PinnedError

        t0 = time.perf_counter()
        async with queued(slot, self.turn, asked):
            if keep_alive == 0:
                try:
                    await self._run(self.engine.evict, slot.name)
                except PinnedError as exc:
                    raise ApiError(409, str(exc), "keep_alive", "model_pinned") from None
                reason = "unload"
            else:
                await self._run(self.engine.warm, slot.name,
                                **({} if wait is None else {"wait": wait}))
                await self._keep_alive(slot, keep_alive)
                reason = "load"
        out = {"model": asked, "created_at": now_iso(),
               **({"message": {"role": "assistant", "content": ""}} if chat
                  else {"response": ""}), "done": True, "done_reason": reason}
        if reason == "load":
            out["load_duration"] = out["total_duration"] = ns(time.perf_counter() - t0)
        return json_response(out)

    async def _ollama_stream(self, request: web.Request, slot: ModelSlot, req, ids: list[int],
                             max_tokens: int, headers: dict, piece_obj: Callable,
                             final_obj: Callable, load_s: float,
                             keep_alive: float | None,
                             tools: ToolRequest | None = None) -> web.StreamResponse:
        """Pieces of text as they come. With tools, content streams as it is known not to
        start a call, and the calls come whole in one line before the last, as Ollama
        sends them."""
        from aiohttp import web

        cancel = threading.Event()
        resp = web.StreamResponse(headers={"Content-Type": NDJSON, "Cache-Control": "no-cache",
                                           **headers})
        await resp.prepare(request)

        async def send(obj: dict) -> None:
            await resp.write((json.dumps(obj, ensure_ascii=False) + "\n").encode())

        parsing = ToolStream(tools) if tools is not None and tools.parses else None

        async def write(piece: str, _entries) -> None:
            if parsing is None:
                await send(piece_obj(piece))
                return
            for d in parsing.feed(piece):
                if d.get("content"):
                    await send(piece_obj(d["content"]))

        async def report(exc: ApiError) -> None:
            await send(error_body(exc))

        async with self._stream_body(request, resp, cancel, report):
            out = await self._pumped(request, slot, req, ids, max_tokens, write, cancel)
            if out.finish_reason == "cancelled" and _gone(request):
                self._left.add(id(request))
                return resp
            await self._keep_alive(slot, keep_alive)
            if parsing is not None:
                rest, _ = parsing.finish(out.finish_reason == "length")
                text = "".join(d.get("content", "") for d in rest)
                calls = parsing.parsed.calls
                if text or calls:
                    await send(piece_obj(text, ollama_calls(calls)))
            await send(final_obj(out, load_s, ""))
            await resp.write_eof()
        return resp

    # -- embeddings ---------------------------------------------------------------------------
    async def ollama_embed(self, request: web.Request) -> web.Response:
        t0 = time.perf_counter()
        body = json_object(await self._body(request))
        asked = model_name(body)
        inp = body.get("input", "")
        texts = [inp] if isinstance(inp, str) else inp
        if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
            raise bad("input must be a string or a list of strings", "input", "invalid_type")
        texts = [t for t in texts if t] if isinstance(inp, str) else texts
        truncate = boolean(body, "truncate", True)
        dims = integer(body, "dimensions", None, lo=1)
        parse_options(body.get("options"))
        keep_alive = parse_keep_alive(body.get("keep_alive"))
        slot = self._ollama_slot(asked)
        vectors, n_tokens, load_s = await self._ollama_embed(request, slot, texts, truncate,
                                                       keep_alive)
        if dims is not None:
            vectors = [shorten(v, dims) for v in vectors]
        return json_response({"model": asked, "embeddings": vectors,
                              "total_duration": ns(time.perf_counter() - t0),
                              "load_duration": ns(load_s), "prompt_eval_count": n_tokens})

    async def ollama_embeddings(self, request: web.Request) -> web.Response:
        """The older route: one prompt, "embedding" (normalized, unlike Ollama's)."""
        body = json_object(await self._body(request))
        asked = model_name(body)
        prompt = body.get("prompt") or ""
        if not isinstance(prompt, str):
            raise bad("prompt must be a string", "prompt", "invalid_type")
        parse_options(body.get("options"))
        keep_alive = parse_keep_alive(body.get("keep_alive"))
        slot = self._ollama_slot(asked)
        vectors, _, _ = await self._ollama_embed(request, slot, [prompt] if prompt else [], True,
                                          keep_alive)
        return json_response({"embedding": vectors[0] if vectors else []})

    async def _ollama_embed(self, request: web.Request, slot: ModelSlot, texts: list[str],
                     truncate: bool, keep_alive: float | None
                     ) -> tuple[list[list[float]], int, float]:
        def tokens() -> list[list[int]]:
            tok = self.engine.tokenizer(slot.name)
            return [tok.encode(t, add_special=True, parse_special=False) for t in texts]
        lists = (await self._tokens(slot, lambda: (tokens(), None), "input"))[0]
        for i, ids in enumerate(lists):
            if len(ids) > slot.n_ctx:
                if not truncate:
                    raise bad(f"input[{i}] is {len(ids)} tokens; the context of {slot.name!r} "
                              f"holds {slot.n_ctx} (truncate is false)", "input",
                              "context_length_exceeded")
                lists[i] = ids[:slot.n_ctx]
        async with queued(slot, self.turn):
            t = time.perf_counter()
            await self._run(self.engine.warm, slot.name)
            load_s = time.perf_counter() - t
            vectors = await self._run(embed_token_lists, self.engine, slot.name, lists) \
                if lists else []
            await self._keep_alive(slot, keep_alive)
        return vectors, sum(map(len, lists)), load_s


def ollama_calls(calls) -> list[dict]:
    """Calls in Ollama's shape: arguments as an object; the id is the server's."""
    return [{"id": call_id(), "function": {"index": i, "name": c.name,
                                           "arguments": json.loads(c.arguments)}}
            for i, c in enumerate(calls)]


def _gone(request: web.Request) -> bool:
    t = request.transport
    return t is None or t.is_closing()


def routes(server) -> list[tuple[str, str, Callable]]:
    """Ollama's routes on a Server."""
    s = server
    return [
        ("GET", "/api/version", s.ollama_version),
        ("GET", "/api/tags", s.ollama_tags),
        ("GET", "/api/ps", s.ollama_ps),
        ("POST", "/api/show", s.ollama_show),
        ("POST", "/api/chat", s.ollama_chat),
        ("POST", "/api/generate", s.ollama_generate),
        ("POST", "/api/embed", s.ollama_embed),
        ("POST", "/api/embeddings", s.ollama_embeddings),
        ("DELETE", "/api/delete", s.ollama_delete),
        ("POST", "/api/pull", s.ollama_no_store),
        ("POST", "/api/push", s.ollama_no_store),
        ("POST", "/api/create", s.ollama_no_store),
        ("POST", "/api/copy", s.ollama_no_store),
        ("HEAD", "/api/blobs/{digest}", s.ollama_no_store),
        ("POST", "/api/blobs/{digest}", s.ollama_no_store),
    ]
