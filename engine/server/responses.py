"""OpenAI's Responses API, /v1/responses, without state (as llama-server serves it): `input`
as text or items (messages, function_call, function_call_output), `instructions`, function
`tools` and `tool_choice`, `max_output_tokens`, `temperature`, `top_p`, and `stream` with
the API's event sequence (response.created ... response.output_text.delta ...
response.function_call_arguments.delta ... response.completed).

Nothing is stored: `store: true` and `previous_response_id` are refused with a 400. A request
becomes a chat request (openai.py's GenRequest) and runs the way chat completions do.
"""
from __future__ import annotations

import json
import secrets
import threading
import time
from typing import TYPE_CHECKING, Any

from .chat_tools import ToolStream, call_id
from .errors import ApiError, bad, integer, json_response, show
from .metrics import CLIENT_GONE_STATUS
from .openai import CHAT_ROLES, GenRequest, _gone, parse_request
from .slots import queued

if TYPE_CHECKING:
    from aiohttp import web

    from ..facade import Completion
    from .slots import ModelSlot

# Responses parameters that map onto chat ones; the rest of a chat request's are not taken
PASSED = ("model", "temperature", "top_p", "parallel_tool_calls", "stream")
IGNORED = ("metadata", "user", "reasoning", "truncation", "include", "service_tier",
           "safety_identifier", "prompt_cache_key", "background")


def _id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(16)}"


# -- requests ------------------------------------------------------------------------------

def _item_text(content: Any, param: str) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        out = []
        for k, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") not in (
                    "input_text", "output_text", "text") or not isinstance(part.get("text"), str):
                raise bad(f"{param}[{k}]: only input_text and output_text parts are supported",
                          f"{param}[{k}]", "invalid_type")
            out.append(part["text"])
        return "".join(out)
    raise bad(f"{param} must be a string or a list of text parts", param, "invalid_type")


def _item_content(content: Any, param: str):
    """A user message's content: its text, or where it holds images (input_image, with an
    image_url: a data URL), chat's parts: text and image_url (openai.py takes them)."""
    if not isinstance(content, list) or not any(
            isinstance(p, dict) and p.get("type") == "input_image" for p in content):
        return _item_text(content, param)
    parts = []
    for k, part in enumerate(content):
        if isinstance(part, dict) and part.get("type") == "input_image":
            if part.get("image_url") is None:
                raise bad(f"{param}[{k}]: an input_image needs an image_url (a data URL); "
                          "file ids are not kept here", f"{param}[{k}]", "invalid_value")
            parts.append({"type": "image_url", "image_url": {"url": part["image_url"]}})
        else:
            parts.append({"type": "text", "text": _item_text([part], param)})
    return parts


def input_messages(v: Any, instructions: Any) -> list[dict]:
    """`input` (and `instructions`) as chat messages, OpenAI's chat shape."""
    msgs: list[dict] = []
    if instructions is not None:
        if not isinstance(instructions, str):
            raise bad("instructions must be a string", "instructions", "invalid_type")
        msgs.append({"role": "system", "content": instructions})
    if v is None:
        raise bad("input is required", "input", "missing_required_parameter")
    if isinstance(v, str):
        return msgs + [{"role": "user", "content": v}]
    if not isinstance(v, list) or not v:
        raise bad("input must be a string or a non-empty list of items", "input",
                  "invalid_type")
    for i, item in enumerate(v):
        p = f"input[{i}]"
        if not isinstance(item, dict):
            raise bad(f"{p} must be an object", p, "invalid_type")
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in CHAT_ROLES or role == "tool":
                raise bad(f"{p}.role must be one of user, assistant, system, developer, got "
                          f"{show(role)}", f"{p}.role", "invalid_value")
            content = _item_content(item.get("content"), f"{p}.content") \
                if role == "user" else _item_text(item.get("content"), f"{p}.content")
            msgs.append({"role": role, "content": content})
        elif kind == "function_call":
            name, args = item.get("name"), item.get("arguments")
            cid = item.get("call_id")
            if not isinstance(name, str) or not isinstance(args, str) \
                    or not isinstance(cid, str):
                raise bad(f"{p}: a function_call has a name, arguments (a JSON string) and a "
                          "call_id", p, "invalid_value")
            call = {"id": cid, "type": "function",
                    "function": {"name": name, "arguments": args}}
            last = msgs[-1] if msgs else None
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)   # one turn, several calls
            else:
                msgs.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            cid, out = item.get("call_id"), item.get("output")
            if not isinstance(cid, str):
                raise bad(f"{p}.call_id is required", f"{p}.call_id",
                          "missing_required_parameter")
            msgs.append({"role": "tool", "tool_call_id": cid,
                         "content": out if isinstance(out, str) else
                         _item_text(out, f"{p}.output")})
        elif kind == "reasoning":
            continue                                  # nothing of it goes back to the model
        else:
            raise bad(f"{p}.type {show(kind)} is not supported (message, function_call, "
                      "function_call_output)", f"{p}.type", "invalid_value")
    return msgs


def parse_responses_request(body: Any) -> tuple[GenRequest, dict]:
    """The request as a chat GenRequest, and the echo of its settings for the response."""
    if not isinstance(body, dict):
        raise bad("the request body must be a JSON object", None, "invalid_type")
    if body.get("previous_response_id") is not None:
        raise bad("previous_response_id is not supported: this server keeps no responses; "
                  "send the whole conversation in input", "previous_response_id",
                  "unsupported_parameter")
    if body.get("store") not in (None, False):
        raise bad("store is not supported: this server keeps no responses (send store: "
                  "false or leave it out)", "store", "unsupported_parameter")
    if body.get("conversation") is not None:
        raise bad("conversation is not supported", "conversation", "unsupported_parameter")
    text = body.get("text")
    fmt = (text or {}).get("format") if isinstance(text, dict) else None
    if text is not None and (not isinstance(text, dict) or
                             (fmt is not None and (not isinstance(fmt, dict)
                                                   or fmt.get("type") != "text"))):
        raise bad('only text {"format": {"type": "text"}} is supported', "text",
                  "unsupported_parameter")
    for key in ("top_logprobs",):
        if body.get(key) not in (None, 0):
            raise bad(f"{key} is not supported", key, "unsupported_parameter")
    messages = input_messages(body.get("input"), body.get("instructions"))
    max_out = integer(body, "max_output_tokens", None, lo=1)
    tools = body.get("tools")
    if tools is not None:
        if not isinstance(tools, list):
            raise bad("tools must be a list of tools", "tools", "invalid_type")
        for i, t in enumerate(tools):
            if not isinstance(t, dict) or t.get("type") != "function":
                raise bad(f"tools[{i}]: only function tools are supported, got "
                          f"{show(t.get('type') if isinstance(t, dict) else t)}",
                          f"tools[{i}].type", "invalid_value")
        # the chat shape: {"type": "function", "function": {...}}
        tools = [{"type": "function", "function": {k: v for k, v in t.items() if k != "type"}}
                 for t in tools]
    choice = body.get("tool_choice")
    if isinstance(choice, dict) and choice.get("type") == "function" and "name" in choice:
        choice = {"type": "function", "function": {"name": choice["name"]}}
    chat = {k: body[k] for k in PASSED if k in body}
    chat["messages"] = messages
    if tools is not None:
        chat["tools"] = tools
    if choice is not None:
        chat["tool_choice"] = choice
    if max_out is not None:
        chat["max_tokens"] = max_out
    req = parse_request(chat, chat=True)
    req.max_tokens_param = "max_output_tokens"
    echo = {"instructions": body.get("instructions"), "max_output_tokens": max_out,
            "temperature": req.sampling.temperature, "top_p": req.sampling.top_p,
            "tools": body.get("tools") or [], "tool_choice": body.get("tool_choice", "auto"),
            "parallel_tool_calls": body.get("parallel_tool_calls", True),
            "metadata": body.get("metadata") or {}, "store": False,
            "previous_response_id": None, "text": {"format": {"type": "text"}},
            "truncation": "disabled", "reasoning": {"effort": None, "summary": None},
            "user": body.get("user")}
    return req, echo


# -- responses -------------------------------------------------------------------------------

def message_item(text: str, status: str = "completed", item_id: str | None = None) -> dict:
    return {"type": "message", "id": item_id or _id("msg"), "status": status,
            "role": "assistant",
            "content": [{"type": "output_text", "text": text, "annotations": [],
                         "logprobs": []}] if status == "completed" else []}


def call_item(name: str, arguments: str, cid: str, status: str = "completed",
              item_id: str | None = None) -> dict:
    return {"type": "function_call", "id": item_id or _id("fc"), "call_id": cid,
            "name": name, "arguments": arguments, "status": status}


def usage(out: Completion) -> dict:
    p, c = len(out.prompt_tokens), len(out.tokens)
    return {"input_tokens": p,
            "input_tokens_details": {"cached_tokens": int(out.timings.get("cached_tokens", 0))},
            "output_tokens": c, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": p + c}


class ResponsesRoutes:
    """POST /v1/responses (a mixin of Server, beside OpenAIRoutes)."""

    async def responses(self, request: web.Request) -> web.StreamResponse:
        from .turns import check_yield, parse_wait

        req, echo = parse_responses_request(await self._body(request))
        wait = parse_wait(request)
        slot = self._slot(req.model)
        check_yield(self.engine, wait)
        ids = await self._prompt_ids(slot, req)
        max_tokens = slot.room(len(ids), req.max_tokens, "max_output_tokens", "input")
        if req.tools is not None:
            max_tokens = req.tools.limit(max_tokens)
        base = {"id": _id("resp"), "object": "response", "created_at": int(time.time()),
                "model": slot.name, "error": None, "incomplete_details": None, **echo}
        async with queued(slot, self.turn):
            if _gone(request):
                return json_response({}, CLIENT_GONE_STATUS)
            if req.stream:
                await self._run(self.engine.warm, slot.name,
                                **({} if wait is None else {"wait": wait}))
                return await self._responses_stream(request, slot, req, ids, max_tokens,
                                                    base)
            out = await self._complete(request, slot, req, ids, max_tokens, None,
                                       wait=wait)
        if out.finish_reason == "cancelled" and _gone(request):
            return json_response({}, CLIENT_GONE_STATUS)
        output = []
        if req.tools is not None:
            p = req.tools.final(out.text, out.finish_reason == "length")
            if p.content or not p.calls:        # an empty answer is an empty message
                output.append(message_item(p.content))
            output += [call_item(c.name, c.arguments, call_id()) for c in p.calls]
        else:
            output.append(message_item(out.text))
        return json_response(_final(base, out, output))

    async def _responses_stream(self, request: web.Request, slot: ModelSlot, req: GenRequest,
                                ids: list[int], max_tokens: int,
                                base: dict) -> web.StreamResponse:
        from aiohttp import web

        cancel = threading.Event()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                           "Cache-Control": "no-cache"})
        await resp.prepare(request)
        seq = 0
        output: list[dict] = []            # finished items
        open_item: dict | None = None      # the item being written
        tools = ToolStream(req.tools) if req.tools is not None else None

        async def event(kind: str, **data) -> None:
            nonlocal seq
            obj = {"type": kind, "sequence_number": seq, **data}
            seq += 1
            await resp.write(f"event: {kind}\ndata: "
                             f"{json.dumps(obj, ensure_ascii=False)}\n\n".encode())

        async def close_item() -> None:
            nonlocal open_item
            if open_item is None:
                return
            item, n = open_item, len(output)
            if item["type"] == "message":
                text = item.pop("_text")
                part = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
                await event("response.output_text.done", item_id=item["id"], output_index=n,
                            content_index=0, text=text, logprobs=[])
                await event("response.content_part.done", item_id=item["id"], output_index=n,
                            content_index=0, part=part)
                item = {**item, "status": "completed", "content": [part]}
            else:
                await event("response.function_call_arguments.done", item_id=item["id"],
                            output_index=n, name=item["name"], arguments=item["arguments"])
                item = {**item, "status": "completed"}
            await event("response.output_item.done", output_index=n, item=item)
            output.append(item)
            open_item = None

        async def apply(delta: dict) -> None:
            nonlocal open_item
            n = len(output)
            if "content" in delta:
                if open_item is not None and open_item["type"] != "message":
                    await close_item()
                    n = len(output)
                if open_item is None:
                    open_item = {**message_item("", "in_progress"), "_text": ""}
                    shown = {k: v for k, v in open_item.items() if k != "_text"}
                    await event("response.output_item.added", output_index=n, item=shown)
                    await event("response.content_part.added", item_id=open_item["id"],
                                output_index=n, content_index=0,
                                part={"type": "output_text", "text": "", "annotations": [],
                                      "logprobs": []})
                open_item["_text"] += delta["content"]
                await event("response.output_text.delta", item_id=open_item["id"],
                            output_index=n, content_index=0, delta=delta["content"],
                            logprobs=[])
            for tc in delta.get("tool_calls", ()):
                if "id" in tc:                  # a new call
                    await close_item()
                    n = len(output)
                    open_item = call_item(tc["function"]["name"], "", tc["id"], "in_progress")
                    await event("response.output_item.added", output_index=n,
                                item=dict(open_item))
                args = tc["function"].get("arguments", "")
                if args and open_item is not None:
                    open_item["arguments"] += args
                    await event("response.function_call_arguments.delta",
                                item_id=open_item["id"], output_index=n, delta=args)

        async def write(piece: str, _entries) -> None:
            for delta in (tools.feed(piece) if tools else [{"content": piece}]):
                await apply(delta)

        async def report(exc: ApiError) -> None:
            await event("error", code=exc.code, message=exc.message, param=exc.param)

        async with self._stream_body(request, resp, cancel, report):
            await event("response.created",
                        response={**base, "status": "in_progress", "output": [], "usage": None})
            await event("response.in_progress",
                        response={**base, "status": "in_progress", "output": [], "usage": None})
            out = await self._pumped(request, slot, req, ids, max_tokens, write, cancel)
            if out.finish_reason == "cancelled" and _gone(request):
                self._left.add(id(request))
                return resp
            if tools is not None:
                for delta in tools.finish(out.finish_reason == "length")[0]:
                    await apply(delta)
            if open_item is None and not output:   # an empty answer is an empty message
                await apply({"content": ""})
            await close_item()
            final = _final(base, out, output)
            await event("response.incomplete" if final["status"] == "incomplete"
                        else "response.completed", response=final)
            await resp.write_eof()
        return resp


def _final(base: dict, out: Completion, output: list[dict]) -> dict:
    incomplete = out.finish_reason == "length" and not any(
        o["type"] == "function_call" for o in output)
    return {**base, "status": "incomplete" if incomplete else "completed",
            "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
            "output": output, "usage": usage(out)}
