"""Tool calling for the OpenAI routes: `tools`, `tool_choice` and `parallel_tool_calls`
checked, assistant `tool_calls` and `role: tool` messages taken, the prompt rendered through
the model's chat template (engine/text/toolcalls.py picks the call syntax), and the model's
text turned back into `message.tool_calls`, whole or as streamed deltas.

/v1/chat/completions and /v1/responses share it; the latter writes its tools flat
({"type": "function", "name": ...}), which parse_tools(flat=True) reads.
"""
from __future__ import annotations

import dataclasses
import re
import secrets
from dataclasses import dataclass, field
from typing import Any

from ..text.sampling import SamplingParams
from ..text.toolcalls import (
    Family,
    Generic,
    Parsed,
    ToolCall,
    family_of,
    prepare_messages,
    template_caps,
    tool_constraint,
)
from .errors import bad, boolean, show

NAME = re.compile(r"[A-Za-z0-9_\-.]{1,64}")
CHOICES = ("none", "auto", "required")
# The most tokens an answer that must be a call may take, whatever room the context leaves:
# a string argument has no end of its own, and a call still open here ends with
# finish_reason "length" and no content, as one cut by max_tokens does.
CALL_TOKENS = 4096


def call_id() -> str:
    """A call's id: made here, unique per call. An id the model writes is never passed on:
    a small model copies the last call's, and an agent then takes two calls for one."""
    return "call_" + secrets.token_hex(12)


# -- requests ------------------------------------------------------------------------------

def _tool(t: Any, i: int, flat: bool) -> dict:
    """One tool, as {"type": "function", "function": {...}} whatever shape it came in."""
    p = f"tools[{i}]"
    if not isinstance(t, dict):
        raise bad(f"{p} must be an object", p, "invalid_type")
    if t.get("type") != "function":
        raise bad(f"{p}.type must be 'function' (only function tools are supported), got "
                  f"{show(t.get('type'))}", f"{p}.type", "invalid_value")
    if flat:
        f, fp = t, p
    else:
        f, fp = t.get("function"), f"{p}.function"
        if not isinstance(f, dict):
            raise bad(f"{fp} must be an object", fp, "invalid_type")
    name = f.get("name")
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise bad(f"{fp}.name must be 1 to 64 letters, digits, '_', '-' or '.', got "
                  f"{show(name)}", f"{fp}.name", "invalid_value")
    desc = f.get("description")
    if desc is not None and not isinstance(desc, str):
        raise bad(f"{fp}.description must be a string", f"{fp}.description", "invalid_type")
    params = f.get("parameters")
    if params is not None and not isinstance(params, dict):
        raise bad(f"{fp}.parameters must be a JSON schema object", f"{fp}.parameters",
                  "invalid_type")
    if params is not None and params.get("type", "object") != "object":
        raise bad(f"{fp}.parameters must describe an object", f"{fp}.parameters",
                  "invalid_value")
    fn = {"name": name}
    if desc is not None:
        fn["description"] = desc
    fn["parameters"] = params if params is not None else {"type": "object", "properties": {}}
    return {"type": "function", "function": fn}


def parse_tools(body: dict, flat: bool = False, has_tool_messages: bool = False):
    """The request's tools, tool_choice and parallel_tool_calls as a ToolRequest, or None
    when it has none of them (and no tool messages)."""
    raw = body.get("tools")
    if raw is not None and not isinstance(raw, list):
        raise bad("tools must be a list of tools", "tools", "invalid_type")
    tools = [_tool(t, i, flat) for i, t in enumerate(raw or [])]
    names = [t["function"]["name"] for t in tools]
    for n in names:
        if names.count(n) > 1:
            raise bad(f"tools: the function name {n!r} is used twice", "tools", "invalid_value")
    choice = body.get("tool_choice")
    named = None
    if choice is None:
        choice = "auto" if tools else "none"
    elif isinstance(choice, str):
        if choice not in CHOICES:
            raise bad(f"tool_choice must be one of {', '.join(CHOICES)} or a named function, "
                      f"got {show(choice)}", "tool_choice", "invalid_value")
    elif isinstance(choice, dict) and choice.get("type") == "function":
        f = choice if flat or "function" not in choice else choice["function"]
        named = f.get("name") if isinstance(f, dict) else None
        if not isinstance(named, str):
            raise bad("tool_choice names a function: {\"type\": \"function\", \"function\": "
                      "{\"name\": ...}}", "tool_choice", "invalid_value")
        if named not in names:
            raise bad(f"tool_choice names {named!r}, which is not among the tools",
                      "tool_choice", "invalid_value")
        choice = "required"
    else:
        raise bad("tool_choice must be 'none', 'auto', 'required' or {\"type\": \"function\", "
                  "...}", "tool_choice", "invalid_value")
    if choice != "none" and not tools:
        raise bad("tool_choice is only allowed when tools are specified", "tool_choice",
                  "invalid_value")
    parallel = boolean(body, "parallel_tool_calls", True)
    if not tools and not has_tool_messages and body.get("tool_choice") is None:
        return None
    return ToolRequest(tools, choice, named, parallel)


def tool_message(m: dict, i: int, role: str) -> dict:
    """An assistant message with tool_calls, or a role: tool message, checked."""
    p = f"messages[{i}]"
    if role == "tool":
        tid = m.get("tool_call_id")
        if not isinstance(tid, str) or not tid:
            raise bad(f"{p}.tool_call_id is required for a tool message", f"{p}.tool_call_id",
                      "missing_required_parameter")
        out = {"role": "tool", "tool_call_id": tid}
        if isinstance(m.get("name"), str):
            out["name"] = m["name"]
        return out
    calls = m.get("tool_calls")
    if not isinstance(calls, list) or not calls:
        raise bad(f"{p}.tool_calls must be a non-empty list", f"{p}.tool_calls", "invalid_type")
    out = []
    for k, c in enumerate(calls):
        cp = f"{p}.tool_calls[{k}]"
        f = c.get("function") if isinstance(c, dict) else None
        if not isinstance(f, dict) or not isinstance(f.get("name"), str) \
                or not isinstance(f.get("arguments", ""), (str, dict)):
            raise bad(f"{cp} must be {{\"id\", \"type\": \"function\", \"function\": "
                      f"{{\"name\", \"arguments\"}}}}", cp, "invalid_value")
        out.append({"id": str(c.get("id") or call_id()), "type": "function",
                    "function": {"name": f["name"], "arguments": f.get("arguments", "")}})
    return {"role": "assistant", "tool_calls": out}


@dataclass
class ToolRequest:
    tools: list[dict]
    choice: str                           # none, auto, required (a named one is required)
    named: str | None
    parallel: bool
    family: Family | None = None          # set by prompt()
    preserved: tuple[int, ...] = ()
    grammar: str | None = None            # the call grammar, where a call is due (or a
                                          # call begun under auto: lazy, from its marker)
    constraint: Any = None                # its decoding constraint (None: unavailable)

    @property
    def parses(self) -> bool:
        return self.choice != "none" and bool(self.tools)

    def prompt(self, engine, name: str, messages: list[dict], images=()) -> list[int]:
        """The prompt's token ids, the tools rendered (on a worker thread: it renders), an
        image at each media marker of the messages."""
        template = engine.chat_template(name)
        tok = engine.tokenizer(name)
        caps = _caps(template)
        self.family = family_of(template.source, caps["tools"])
        generic = isinstance(self.family, Generic) and self.parses
        msgs = prepare_messages(messages, self.tools if self.parses else None, caps, generic)
        extra = {"tools": self.tools} if self.tools and caps["tools"] else {}
        ids = engine.prompt_tokens(name, messages=msgs, images=images, template_args=extra)
        if self.parses:
            self.preserved = tuple(i for i in (_marker_id(tok, m) for m in self.family.markers)
                                   if i is not None)
        if self.parses and (self.choice == "required" or generic):
            # a call is due: decoding keeps to the call grammar (the generic format's
            # answers are always JSON, a call or a reply, as llama.cpp constrains them)
            tools = [t for t in self.tools if self.named in (None, t["function"]["name"])]
            parallel = self.parallel and self.named is None
            token_of = lambda m: _marker_id(tok, m)      # noqa: E731
            self.grammar = self.family.grammar(tools, parallel, token_of) \
                if self.choice == "required" else \
                self.family.grammar(tools, parallel, token_of, required=False)
            self.constraint = tool_constraint(tok, self.grammar)
        elif self.parses and self.family.trigger is not None:
            # auto: the answer is free, but a call the model starts (its marker is one
            # token) keeps to the call grammar from that token on
            start = _marker_id(tok, self.family.trigger)
            if start is not None:
                token_of = lambda m: _marker_id(tok, m)      # noqa: E731
                self.grammar = self.family.grammar(self.tools, self.parallel, token_of)
                self.constraint = tool_constraint(tok, self.grammar, (start,))
        return ids

    def limit(self, max_tokens: int) -> int:
        """The completion's token budget: bounded by CALL_TOKENS where a call is due."""
        return min(max_tokens, CALL_TOKENS) if self.choice == "required" else max_tokens

    def sampling(self, s: SamplingParams) -> SamplingParams:
        """The sampling of an answer held to the call grammar: without repetition penalties,
        since a call repeats its own keys, quotes and brackets by design. With Ollama's
        default repeat_penalty 1.1, SmolLM2 left a string argument open until max_tokens
        ('"city": "London, UK}}}]}  # Use JSON format...')."""
        if self.constraint is None or self.constraint.triggers:     # free text: as asked
            return s
        return dataclasses.replace(s, repeat_penalty=1.0, frequency_penalty=0.0,
                                   presence_penalty=0.0)

    def parse(self, text: str, partial: bool = False) -> Parsed:
        if not self.parses or self.family is None:
            return Parsed(text)
        p = self.family.parse(text, partial)
        if not self.parallel and len(p.calls) > 1:
            p.calls = p.calls[:1]
        return p

    def final(self, text: str, cut: bool = False) -> Parsed:
        """The parse of a whole answer. cut: it ended at max_tokens, and a call it was
        writing is not one: only the text before it is content (never the call's raw text)."""
        p = self.parse(text)
        if cut and not p.calls:
            p = self.parse(text, partial=True)
            p.calls = []
        return p

    def message(self, text: str, cut: bool = False) -> tuple[dict, bool]:
        """The assistant message of a whole answer, and whether it calls tools."""
        p = self.final(text, cut)
        msg: dict = {"role": "assistant", "content": p.content or None}
        if p.reasoning:
            msg["reasoning_content"] = p.reasoning
        if p.calls:
            msg["tool_calls"] = [openai_call(c) for c in p.calls]
        elif msg["content"] is None:
            msg["content"] = ""
        return msg, bool(p.calls)


def openai_call(c: ToolCall) -> dict:
    return {"id": call_id(), "type": "function",
            "function": {"name": c.name, "arguments": c.arguments}}


_CAPS: dict[int, tuple[Any, dict]] = {}


def _caps(template) -> dict[str, bool]:
    """template_caps, once per template object (a model keeps its template)."""
    got = _CAPS.get(id(template))
    if got is None or got[0] is not template:
        got = _CAPS[id(template)] = (template, template_caps(template))
    return got[1]


def _marker_id(tok, marker: str) -> int | None:
    """The marker's token id when the vocabulary has it as one control token."""
    try:
        ids = tok.encode(marker, add_special=False, parse_special=True)
    except Exception:
        return None
    return ids[0] if len(ids) == 1 else None


# -- streaming --------------------------------------------------------------------------------

@dataclass
class ToolStream:
    """The text of a streamed answer in, OpenAI chat deltas out: content as it is known not
    to start a call, each call's id and name once, then its arguments piece by piece."""
    req: ToolRequest
    text: str = ""
    content: str = ""
    calls: list[list] = field(default_factory=list)     # [id, name, arguments sent]
    reasoning: str = ""
    parsed: Parsed | None = None                        # the whole answer's, after finish()

    def feed(self, piece: str) -> list[dict]:
        self.text += piece
        return self._diff(self.req.parse(self.text, partial=True))

    def finish(self, cut: bool = False) -> tuple[list[dict], bool]:
        """The last deltas, from the parse of the whole text, and whether it called tools
        (cut: ToolRequest.final's)."""
        p = self.parsed = self.req.final(self.text, cut)
        return self._diff(p), bool(p.calls)

    def _diff(self, p: Parsed) -> list[dict]:
        out = []
        if p.reasoning.startswith(self.reasoning) and len(p.reasoning) > len(self.reasoning):
            out.append({"reasoning_content": p.reasoning[len(self.reasoning):]})
            self.reasoning = p.reasoning
        if p.content.startswith(self.content) and len(p.content) > len(self.content):
            out.append({"content": p.content[len(self.content):]})
            self.content = p.content
        for i, c in enumerate(p.calls):
            if i >= len(self.calls):
                if not c.name:
                    break
                cid = call_id()
                self.calls.append([cid, c.name, ""])
                out.append({"tool_calls": [{"index": i, "id": cid, "type": "function",
                                            "function": {"name": c.name, "arguments": ""}}]})
            sent = self.calls[i][2]
            if c.arguments.startswith(sent) and len(c.arguments) > len(sent):
                out.append({"tool_calls": [{"index": i, "function": {
                    "arguments": c.arguments[len(sent):]}}]})
                self.calls[i][2] = c.arguments
        return out
