"""Anthropic's Messages API, POST /v1/messages (and /v1/messages/count_tokens), as Ollama and
LM Studio serve it, so that clients and agents written for it run on a local model.

    request                                   becomes (openai.py's GenRequest)
    system (text or text blocks)              a system message
    messages: text, tool_use, tool_result     chat messages, assistant tool_calls, role tool
    tools [{name, description, input_schema}] function tools
    tool_choice auto | any | tool | none      auto | required | a named function | none
      disable_parallel_tool_use               parallel_tool_calls: false
    max_tokens (required), stop_sequences, temperature, top_p, top_k, stream

The answer is a message of content blocks (text, tool_use with the server's own ids) with
stop_reason end_turn, max_tokens, stop_sequence or tool_use; streamed, the API's events
(message_start, content_block_start/delta/stop, message_delta, message_stop). Errors have
the API's shape, {"type": "error", "error": {"type": ..., "message": ...}}. Images,
documents, server tools and extended thinking are refused with a message saying so.
Nothing is stored; calls run the way chat completions run them (chat_tools.py).
"""
from __future__ import annotations

import json
import secrets
import threading
from typing import TYPE_CHECKING, Any

from .chat_tools import ToolStream
from .errors import ApiError, bad, integer, json_response, show
from .metrics import CLIENT_GONE_STATUS
from .openai import GenRequest, _gone, parse_request
from .slots import queued

if TYPE_CHECKING:
    from aiohttp import web

    from ..facade import Completion
    from .slots import ModelSlot

PATHS = ("/v1/messages", "/v1/messages/count_tokens")
ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error",
               403: "permission_error", 404: "not_found_error", 413: "request_too_large",
               429: "rate_limit_error", 503: "overloaded_error"}
STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "cancelled": "end_turn"}


def is_anthropic_path(path: str) -> bool:
    return path in PATHS


def error_body(err: ApiError) -> dict:
    return {"type": "error", "error": {"type": ERROR_TYPES.get(err.status, "api_error"),
                                       "message": err.message}}


def _tool_id() -> str:
    return "toolu_" + secrets.token_hex(12)


# -- requests ------------------------------------------------------------------------------

def _text(blocks: Any, param: str) -> str:
    """Text, or a list of text blocks, as one string."""
    if isinstance(blocks, str):
        return blocks
    if not isinstance(blocks, list):
        raise bad(f"{param} must be a string or a list of text blocks", param, "invalid_type")
    out = []
    for k, b in enumerate(blocks):
        if not isinstance(b, dict) or b.get("type") != "text" or not isinstance(b.get("text"),
                                                                                str):
            kind = b.get("type") if isinstance(b, dict) else b
            raise bad(f"{param}[{k}]: only text blocks are supported here, got {show(kind)}",
                      f"{param}[{k}]", "invalid_value")
        out.append(b["text"])
    return "".join(out)


def _blocks(m: dict, i: int) -> list[dict]:
    content = m.get("content")
    p = f"messages[{i}].content"
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if not isinstance(content, list):
        raise bad(f"{p} must be a string or a list of content blocks", p, "invalid_type")
    for k, b in enumerate(content):
        if not isinstance(b, dict):
            raise bad(f"{p}[{k}] must be an object", f"{p}[{k}]", "invalid_type")
    return content


def chat_messages(body: dict) -> list[dict]:
    """system and messages as OpenAI's chat messages."""
    msgs: list[dict] = []
    if body.get("system") is not None:
        msgs.append({"role": "system", "content": _text(body["system"], "system")})
    raw = body.get("messages")
    if not isinstance(raw, list) or not raw:
        raise bad("messages must be a non-empty list", "messages", "invalid_type")
    for i, m in enumerate(raw):
        p = f"messages[{i}]"
        role = m.get("role") if isinstance(m, dict) else None
        if role not in ("user", "assistant"):
            raise bad(f"{p}.role must be user or assistant, got {show(role)}", f"{p}.role",
                      "invalid_value")
        text, calls, blocks = [], [], _blocks(m, i)
        for k, b in enumerate(blocks):
            kind, bp = b.get("type"), f"{p}.content[{k}]"
            if kind == "text" and isinstance(b.get("text"), str):
                text.append(b["text"])
            elif kind == "tool_use" and role == "assistant":
                if not isinstance(b.get("id"), str) or not isinstance(b.get("name"), str) \
                        or not isinstance(b.get("input", {}), dict):
                    raise bad(f"{bp}: a tool_use block has an id, a name and an input object",
                              bp, "invalid_value")
                calls.append({"id": b["id"], "type": "function", "function": {
                    "name": b["name"],
                    "arguments": json.dumps(b.get("input", {}), ensure_ascii=False)}})
            elif kind == "tool_result" and role == "user":
                if not isinstance(b.get("tool_use_id"), str):
                    raise bad(f"{bp}.tool_use_id is required", f"{bp}.tool_use_id",
                              "missing_required_parameter")
                out = _text(b.get("content", ""), f"{bp}.content")
                if b.get("is_error"):
                    out = "Error: " + out
                msgs.append({"role": "tool", "tool_call_id": b["tool_use_id"], "content": out})
            elif kind in ("thinking", "redacted_thinking"):
                continue                           # nothing of it goes back to the model
            else:
                what = "images and documents are not supported (Hotseat runs text models)" \
                    if kind in ("image", "document") else \
                    f"{show(kind)} blocks are not supported in a {role} message"
                raise bad(f"{bp}: {what}", bp, "invalid_value")
        if calls:
            msgs.append({"role": "assistant", "content": "".join(text) or None,
                         "tool_calls": calls})
        elif text or role == "assistant" or not any(
                b.get("type") == "tool_result" for b in blocks):
            msgs.append({"role": role, "content": "".join(text)})
    return msgs


def _tools(body: dict) -> list[dict] | None:
    raw = body.get("tools")
    if raw is None:
        return None
    if not isinstance(raw, list):
        raise bad("tools must be a list of tools", "tools", "invalid_type")
    out = []
    for i, t in enumerate(raw):
        if not isinstance(t, dict) or t.get("type", "custom") != "custom":
            kind = t.get("type") if isinstance(t, dict) else t
            raise bad(f"tools[{i}]: only custom tools (name, input_schema) are supported, "
                      f"got {show(kind)}", f"tools[{i}].type", "invalid_value")
        f = {"name": t.get("name"), "parameters": t.get("input_schema")}
        if t.get("description") is not None:
            f["description"] = t["description"]
        out.append({"type": "function", "function": f})
    return out


def _choice(body: dict) -> tuple[Any, bool | None]:
    """tool_choice as the chat API's, and parallel_tool_calls where it says."""
    c = body.get("tool_choice")
    if c is None:
        return None, None
    if not isinstance(c, dict) or c.get("type") not in ("auto", "any", "tool", "none"):
        raise bad("tool_choice must be {\"type\": \"auto\" | \"any\" | \"tool\" | \"none\"}",
                  "tool_choice", "invalid_value")
    parallel = None if c.get("disable_parallel_tool_use") is None else \
        not c["disable_parallel_tool_use"]
    kind = c["type"]
    if kind == "tool":
        if not isinstance(c.get("name"), str):
            raise bad("tool_choice {\"type\": \"tool\"} needs a name", "tool_choice.name",
                      "missing_required_parameter")
        return {"type": "function", "function": {"name": c["name"]}}, parallel
    return {"any": "required"}.get(kind, kind), parallel


def parse_messages_request(body: Any, count_only: bool = False) -> GenRequest:
    if not isinstance(body, dict):
        raise bad("the request body must be a JSON object", None, "invalid_type")
    if not isinstance(body.get("model"), str) or not body["model"]:
        raise bad("model is required", "model", "missing_required_parameter")
    thinking = body.get("thinking")
    if isinstance(thinking, dict) and thinking.get("type") == "enabled":
        raise bad("extended thinking is not supported", "thinking", "unsupported_parameter")
    chat: dict = {"model": body["model"], "messages": chat_messages(body)}
    if not count_only:
        chat["max_tokens"] = integer(body, "max_tokens", None, lo=1)
        if chat["max_tokens"] is None:
            raise bad("max_tokens is required", "max_tokens", "missing_required_parameter")
    for key in ("temperature", "top_p", "top_k", "stream"):
        if key in body:
            chat[key] = body[key]
    if "temperature" in body and isinstance(body["temperature"], (int, float)) \
            and not 0 <= body["temperature"] <= 1:
        raise bad(f"temperature must be between 0 and 1, got {show(body['temperature'])}",
                  "temperature", "invalid_value")
    if body.get("stop_sequences") is not None:
        chat["stop"] = body["stop_sequences"]
    tools = _tools(body)
    if tools is not None:
        chat["tools"] = tools
    choice, parallel = _choice(body)
    if choice is not None:
        chat["tool_choice"] = choice
    if parallel is not None:
        chat["parallel_tool_calls"] = parallel
    return parse_request(chat, chat=True)


# -- responses -------------------------------------------------------------------------------

def _usage(out: Completion) -> dict:
    cached = int(out.timings.get("cached_tokens", 0))
    return {"input_tokens": len(out.prompt_tokens) - cached, "output_tokens": len(out.tokens),
            "cache_read_input_tokens": cached, "cache_creation_input_tokens": 0}


class MessagesRoutes:
    """POST /v1/messages and /v1/messages/count_tokens (a mixin of Server)."""

    async def messages_count_tokens(self, request: web.Request) -> web.Response:
        req = parse_messages_request(await self._body(request), count_only=True)
        ids = await self._prompt_ids(self._slot(req.model), req)
        return json_response({"input_tokens": len(ids)})

    async def messages(self, request: web.Request) -> web.StreamResponse:
        from .turns import check_yield, parse_wait

        req = parse_messages_request(await self._body(request))
        wait = parse_wait(request)
        slot = self._slot(req.model)
        check_yield(self.engine, wait)
        ids = await self._prompt_ids(slot, req)
        max_tokens = slot.room(len(ids), req.max_tokens, "max_tokens", "messages")
        if req.tools is not None:
            max_tokens = req.tools.limit(max_tokens)
        base = {"id": "msg_" + secrets.token_hex(12), "type": "message", "role": "assistant",
                "model": slot.name}
        async with queued(slot, self.turn):
            if _gone(request):
                return json_response({}, CLIENT_GONE_STATUS)
            if req.stream:
                await self._run(self.engine.warm, slot.name,
                                **({} if wait is None else {"wait": wait}))
                return await self._messages_stream(request, slot, req, ids, max_tokens, base)
            out = await self._complete(request, slot, req, ids, max_tokens, None, wait=wait)
        if out.finish_reason == "cancelled" and _gone(request):
            return json_response({}, CLIENT_GONE_STATUS)
        content: list[dict] = []
        text, calls = out.text, []
        if req.tools is not None:
            p = req.tools.final(out.text, out.finish_reason == "length")
            text, calls = p.content, p.calls
        if text:
            content.append({"type": "text", "text": text})
        content += [{"type": "tool_use", "id": _tool_id(), "name": c.name,
                     "input": json.loads(c.arguments)} for c in calls]
        reason, seq = self._stop(slot, req, out, bool(calls))
        return json_response({**base, "content": content, "stop_reason": reason,
                              "stop_sequence": seq, "usage": _usage(out)})

    def _stop(self, slot: ModelSlot, req: GenRequest, out: Completion,
              called: bool) -> tuple[str, str | None]:
        """stop_reason and stop_sequence. A stop string's tokens are among the generated
        ones (the text is cut before it), so the whole decode shows which one it was."""
        if called:
            return "tool_use", None
        if out.finish_reason == "stop" and req.stop:
            whole = self.engine.tokenizer(slot.name).decode(out.tokens)
            for s in req.stop:
                if whole.startswith(out.text) and whole.startswith(s, len(out.text)):
                    return "stop_sequence", s
        return STOP_REASONS.get(out.finish_reason, "end_turn"), None

    async def _messages_stream(self, request: web.Request, slot: ModelSlot, req: GenRequest,
                               ids: list[int], max_tokens: int,
                               base: dict) -> web.StreamResponse:
        from aiohttp import web

        cancel = threading.Event()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                           "Cache-Control": "no-cache"})
        await resp.prepare(request)
        tools = ToolStream(req.tools) if req.tools is not None else None
        block: dict = {"index": -1, "type": None}        # the content block being written

        async def event(kind: str, **data) -> None:
            await resp.write(f"event: {kind}\ndata: "
                             f"{json.dumps({'type': kind, **data}, ensure_ascii=False)}\n\n"
                             .encode())

        async def close_block() -> None:
            if block["type"] is not None:
                await event("content_block_stop", index=block["index"])
                block["type"] = None

        async def open_block(kind: str, content_block: dict) -> None:
            await close_block()
            block["index"] += 1
            block["type"] = kind
            await event("content_block_start", index=block["index"],
                        content_block=content_block)

        async def apply(delta: dict) -> None:
            if delta.get("content"):
                if block["type"] != "text":
                    await open_block("text", {"type": "text", "text": ""})
                await event("content_block_delta", index=block["index"],
                            delta={"type": "text_delta", "text": delta["content"]})
            for tc in delta.get("tool_calls", ()):
                if "id" in tc:                              # a new call
                    await open_block("tool_use", {"type": "tool_use", "id": _tool_id(),
                                                  "name": tc["function"]["name"], "input": {}})
                args = tc["function"].get("arguments", "")
                if args and block["type"] == "tool_use":
                    await event("content_block_delta", index=block["index"],
                                delta={"type": "input_json_delta", "partial_json": args})

        async def write(piece: str, _entries) -> None:
            for delta in (tools.feed(piece) if tools else [{"content": piece}]):
                await apply(delta)

        async def report(exc: ApiError) -> None:
            await event("error", error=error_body(exc)["error"])

        async with self._stream_body(request, resp, cancel, report):
            await event("message_start", message={
                **base, "content": [], "stop_reason": None, "stop_sequence": None,
                "usage": {"input_tokens": len(ids), "output_tokens": 0}})
            out = await self._pumped(request, slot, req, ids, max_tokens, write, cancel)
            if out.finish_reason == "cancelled" and _gone(request):
                self._left.add(id(request))
                return resp
            called = False
            if tools is not None:
                rest, called = tools.finish(out.finish_reason == "length")
                for delta in rest:
                    await apply(delta)
            await close_block()
            reason, seq = self._stop(slot, req, out, called)
            await event("message_delta", delta={"stop_reason": reason, "stop_sequence": seq},
                        usage=_usage(out))
            await event("message_stop")
            await resp.write_eof()
        return resp
