"""Tool calls: tools into the prompt through the chat template, calls parsed back out of the
model's text, and the grammar of a call for constrained decoding.

The family of a model's call syntax is read from its chat template, as llama.cpp's
common/chat.cpp picks its handler from the template source:

    gpt-oss   <|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{args}
    gemma4    <|tool_call>call:NAME{key:<|"|>text<|"|>,n:1}<tool_call|>
    mistral   [TOOL_CALLS][{"name": .., "arguments": {..}, "id": ..}]   (v0.3, Nemo)
              [TOOL_CALLS]NAME[ARGS]{..}  or  [TOOL_CALLS]NAME[CALL_ID]ID[ARGS]{..}
    hermes    <tool_call>{"name": .., "arguments": {..}}</tool_call>    (Hermes, Qwen 2.5/3)
    llama3    {"name": .., "parameters": {..}}, optionally after <|python_tag|>
    generic   a template that knows nothing of tools: llama.cpp's generic format, the tools
              described in the system message and the answer one JSON object,
              {"tool_call": {"name", "arguments"}} / {"tool_calls": [...]} / {"response": ..}

Text before a call stays content; a call that does not parse stays content too. Parsing
works on partial text as well (streaming): then text that may be the start of a call marker
is held back, and a call's arguments are given as far as they are written.

Why this module is long: six call syntaxes, one class each, over the same JSON scanning and
the same Family contract (parse, partial parse, grammar); side by side, their differences
are what a reader comes for.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Callable

from .constrain import JSON_OPTIONS, Grammar

TokenOf = Callable[[str], "int | None"]     # a marker's token id, None when it is plain text


@dataclass
class ToolCall:
    name: str
    arguments: str                 # JSON text (as far as written while `done` is False)
    id: str | None = None          # the id the model wrote (Mistral), else None
    done: bool = True


@dataclass
class Parsed:
    content: str
    calls: list[ToolCall] = field(default_factory=list)
    reasoning: str = ""


# -- JSON scanning -------------------------------------------------------------------------

_WS = " \t\n\r"


def _skip_ws(text: str, i: int) -> int:
    while i < len(text) and text[i] in _WS:
        i += 1
    return i


def json_end(text: str, start: int) -> int | None:
    """Where the JSON object or array starting at text[start] ends (one past its close), or
    None when the text ends first. Only brackets and strings are tracked: whether the value is
    valid JSON is json.loads' business."""
    depth, i, n = 0, start, len(text)
    in_str = False
    while i < n:
        c = text[i]
        if in_str:
            if c == "\\":
                i += 1
            elif c == '"':
                in_str = False
        elif c == '"':
            in_str = True
        elif c in "{[":
            depth += 1
        elif c in "}]":
            depth -= 1
            if depth == 0:
                return i + 1
            if depth < 0:
                return i       # a closing bracket of nothing: the value was not an object
        i += 1
    return None


def _load(text: str):
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return None


def _args_text(value) -> str | None:
    """A call's arguments as JSON text: an object as it is, a string holding an object's
    JSON (some models write it that way) as that string."""
    if isinstance(value, dict):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, str) and isinstance(_load(value), dict):
        return value
    return None


def _held(text: str, markers: tuple[str, ...]) -> int:
    """How many characters at the end of text may be the start of one of the markers."""
    best = 0
    for m in markers:
        for k in range(min(len(m) - 1, len(text)), best, -1):
            if text.endswith(m[:k]):
                best = k
                break
    return best


# -- families --------------------------------------------------------------------------------

class Family:
    """One call syntax: its markers, its parser and the grammar of its calls."""

    name = ""
    markers: tuple[str, ...] = ()   # control-token texts kept in the output (and held back)
    trigger: str | None = None      # the marker that starts a call and nothing else: where it
                                    # is one token, a call under tool_choice "auto" is held
                                    # to the grammar from it on (a lazy grammar)

    def parse(self, text: str, partial: bool = False) -> Parsed:
        raise NotImplementedError

    def grammar(self, tools: list[dict], parallel: bool, token_of: TokenOf) -> str:
        """A Lark grammar (llguidance's dialect) of one call, or several when parallel, of
        the given tools (already narrowed to the named one), arguments valid against each
        function's parameters schema."""
        raise NotImplementedError


def _params(tool: dict) -> dict:
    p = tool["function"].get("parameters")
    return p if isinstance(p, dict) and p else {"type": "object"}


def _lit(s: str) -> str:
    return json.dumps(s, ensure_ascii=False)


def _tok(marker: str, token_of: TokenOf) -> str:
    """A marker in a grammar: its special token when it is one, else its text."""
    i = token_of(marker)
    return _lit(marker) if i is None else f"<[{i}]>"


def closed(schema):
    """A schema as OpenAI's strict mode reads it: an object that lists its properties takes
    no others unless it says so (`additionalProperties`). Without this a sampled call adds
    keys of its own ("type", "response", ...) and may never close. Branches of an allOf are
    left open: there each one sees only part of the object."""
    if isinstance(schema, list):
        return [closed(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {}
    for k, v in schema.items():
        if k in ("properties", "patternProperties", "$defs", "definitions",
                 "dependentSchemas") and isinstance(v, dict):
            out[k] = {name: closed(sub) for name, sub in v.items()}
        elif k in ("items", "additionalProperties", "anyOf", "oneOf", "prefixItems",
                   "contains", "not", "if", "then", "else"):
            out[k] = closed(v)
        else:
            out[k] = v
    if "properties" in out and "additionalProperties" not in out \
            and "unevaluatedProperties" not in out:
        out["additionalProperties"] = False
    return out


COMPACT = {**JSON_OPTIONS, "item_separator": ",", "key_separator": ":"}


def _json(schema: dict, options: dict = JSON_OPTIONS) -> str:
    """A `%json` rule of a closed schema, written without free whitespace (the separators
    of `options`, constrain.py's JSON_OPTIONS by default): a call always closes, in as few
    tokens as its content needs."""
    s = closed(schema)
    s["x-guidance"] = {**options, **s.get("x-guidance", {})}
    return "%json " + json.dumps(s, ensure_ascii=False)


def _schema(tool: dict, options: dict = JSON_OPTIONS) -> str:
    return _json(_params(tool), options)


def _calls_rule(n: int, parallel: bool, sep: str = "") -> str:
    alts = " | ".join(f"call_{i}" for i in range(n))
    more = f"({sep} call)*" if parallel else ""
    return f"start: call {more}\ncall: {alts}\n"


class _JsonCallsFamily(Family):
    """Calls as JSON objects {"name": .., ARGS_KEY: {..}} after a start marker."""

    start = ""
    end = ""
    args_keys = ("arguments", "parameters")

    def _call_at(self, text: str, i: int, partial: bool):
        """A call's JSON at text[i:]: (ToolCall, end), (partial ToolCall or None, None)
        when the text ends inside it, or None when it is not a call."""
        j = _skip_ws(text, i)
        if j >= len(text):
            return None, None
        if text[j] != "{":
            return None
        end = json_end(text, j)
        if end is None:
            return (self._partial_call(text, j) if partial else None), None
        obj = _load(text[j:end])
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            return None
        key = next((k for k in self.args_keys if k in obj), None)
        args = "{}" if key is None else _args_text(obj[key])
        if args is None:
            return None
        if key is not None and isinstance(obj[key], dict):
            args = self._raw_args(text, j, end, key) or args
        return ToolCall(obj["name"], args), end

    _HEAD = re.compile(r'\{\s*(?:"type"\s*:\s*"function"\s*,\s*)?"name"\s*:\s*'
                       r'"((?:[^"\\]|\\.)*)"\s*,\s*"(\w+)"\s*:\s*')

    def _raw_args(self, text: str, j: int, end: int, key: str) -> str | None:
        """The arguments' text as the model wrote it (what streaming sent piece by piece)."""
        m = self._HEAD.match(text, j, end)
        if m is None or m.group(2) != key or text[m.end():m.end() + 1] != "{":
            return None
        a_end = json_end(text, m.end())
        if a_end is None or _load(text[m.end():a_end]) is None:
            return None
        return text[m.end():a_end]

    def _partial_call(self, text: str, j: int) -> ToolCall | None:
        m = self._HEAD.match(text, j)
        if m is None or m.group(2) not in self.args_keys:
            return None
        name = _load('"' + m.group(1) + '"')
        rest = text[m.end():]
        if not isinstance(name, str) or not rest.startswith("{"):
            return ToolCall(name, "", done=False) if isinstance(name, str) else None
        a_end = json_end(text, m.end())
        args = rest.rstrip(_WS) if a_end is None else text[m.end():a_end]
        return ToolCall(name, args, done=False)


def _think(text: str, partial: bool) -> tuple[str, str]:
    """Qwen 3's <think>...</think> ahead of the answer: (reasoning, the rest), as llama.cpp
    gives it (reasoning_content). The opening tag may sit in the prompt already."""
    s = text.lstrip()
    if partial and "<think>".startswith(s):
        return "", ""                               # may open a thought: wait
    start = s.startswith("<think>")
    close = s.find("</think>")
    if close < 0:
        if start and partial:                       # still thinking
            body = s[len("<think>"):]
            return body[:len(body) - _held(body, ("</think>",))], ""
        return "", text
    if not start and "<think>" in s[:close]:
        return "", text
    body = s[len("<think>") if start else 0:close]
    return body.strip(), s[close + len("</think>"):].lstrip()


class Hermes(_JsonCallsFamily):
    name = "hermes"
    start, end = "<tool_call>", "</tool_call>"
    markers = ("<tool_call>", "</tool_call>")
    trigger = "<tool_call>"

    def parse(self, text: str, partial: bool = False) -> Parsed:
        reasoning, text = _think(text, partial)
        content, calls, pos = [], [], 0
        while True:
            i = text.find(self.start, pos)
            if i < 0:
                tail = text[pos:]
                if partial:
                    tail = tail[:len(tail) - _held(tail, (self.start,))]
                content.append(tail)
                break
            content.append(text[pos:i])
            close = text.find(self.end, i)
            open_ = close < 0                       # the close tag is not written (yet)
            stop = len(text) if open_ else close
            after = stop if open_ else close + len(self.end)
            got = self._call_at(text[:stop], i + len(self.start), partial and open_)
            if got is not None and got[1] is None and partial and open_:
                if got[0] is not None:              # a call being written
                    calls.append(got[0])
                break
            if got is None or got[1] is None or text[got[1]:stop].strip(_WS):
                if partial and open_:
                    break                           # may still turn out a call: hold it
                content.append(text[i:after])       # not a call: the block stays content
                pos = after
                continue
            calls.append(got[0])
            pos = after
        return Parsed("".join(content).strip() if not partial else "".join(content), calls,
                      reasoning)

    def grammar(self, tools, parallel, token_of):
        rules = [_calls_rule(len(tools), parallel, '"\\n"')]
        s, e = _tok(self.start, token_of), _tok(self.end, token_of)
        for i, t in enumerate(tools):
            head = _lit('\n{"name": ' + json.dumps(t["function"]["name"]) + ', "arguments": ')
            rules.append(f'call_{i}: {s} {head} args_{i} "}}\\n" {e}\n'
                         f'args_{i}: {_schema(t)}\n')
        return "".join(rules)


class Llama3(_JsonCallsFamily):
    """Llama 3.1/3.2/3.3: a JSON call in the text, or several separated by ';'."""

    name = "llama3"
    markers = ("<|python_tag|>",)
    _START = re.compile(r'\{\s*(?:"type"\s*:\s*"function"\s*,\s*)?"name"\s*:')

    def parse(self, text: str, partial: bool = False) -> Parsed:
        body = text
        tag = body.find("<|python_tag|>")
        content = []
        if tag >= 0:
            content.append(body[:tag])
            body = body[tag + len("<|python_tag|>"):]
        pos = 0
        calls: list[ToolCall] = []
        while True:
            m = self._START.search(body, pos)
            if m is None:
                tail = body[pos:]
                if partial:               # a '{' near the end may open a call
                    b = tail.rfind("{")
                    if b >= 0 and "}" not in tail[b:] and len(tail) - b < 64:
                        tail = tail[:b]
                    tail = tail[:len(tail) - _held(tail, self.markers)]
                content.append(tail)
                break
            got = self._call_at(body, m.start(), partial)
            if got is None:
                content.append(body[pos:m.end()])
                pos = m.end()
                continue
            call, end = got
            content.append(body[pos:m.start()] if not calls else
                           body[pos:m.start()].strip(_WS + ";"))
            if end is None:
                if call is not None:
                    calls.append(call)
                break
            calls.append(call)
            pos = end
        out = "".join(content)
        return Parsed(out if partial else out.strip(), calls)

    def grammar(self, tools, parallel, token_of):
        rules = [_calls_rule(len(tools), parallel, '"; "')]
        for i, t in enumerate(tools):
            head = _lit('{"name": ' + json.dumps(t["function"]["name"]) + ', "parameters": ')
            rules.append(f'call_{i}: {head} args_{i} "}}"\nargs_{i}: {_schema(t)}\n')
        return "".join(rules)


class Mistral(_JsonCallsFamily):
    """[TOOL_CALLS] then a JSON list (v0.3, Nemo), or NAME[ARGS]{..} per call (Magistral,
    Ministral 3, Devstral), or NAME[CALL_ID]ID[ARGS]{..} (Mistral Small 3.2)."""

    name = "mistral"
    markers = ("[TOOL_CALLS]", "[ARGS]", "[CALL_ID]")
    trigger = "[TOOL_CALLS]"

    def __init__(self, style: str = "list"):
        self.style = style          # "list", "args" or "call_id": what grammar() writes

    def parse(self, text: str, partial: bool = False) -> Parsed:
        i = text.find("[TOOL_CALLS]")
        if i < 0:
            tail = text[:len(text) - _held(text, self.markers)] if partial else text.strip()
            return Parsed(tail)
        content = text[:i]
        calls: list[ToolCall] = []
        rest = text[i:]
        pos = 0
        while rest.startswith("[TOOL_CALLS]", pos):
            pos = _skip_ws(rest, pos + len("[TOOL_CALLS]"))
            if rest.startswith("[", pos):               # the JSON list
                end = json_end(rest, pos)
                if end is None:
                    if partial:
                        calls += self._partial_list(rest, pos)
                        return Parsed(content, calls)
                    return Parsed(text.strip())
                items = _load(rest[pos:end])
                got = self._list_calls(items)
                if got is None:
                    return Parsed(text if partial else text.strip())
                calls += got
                pos = _skip_ws(rest, end)
                continue
            # NAME[CALL_ID]ID[ARGS]{..} or NAME[ARGS]{..}, several in a row
            while pos < len(rest) and not rest.startswith("[TOOL_CALLS]", pos):
                m = re.compile(r"([A-Za-z0-9_.\-]+)(?:\[CALL_ID\]([A-Za-z0-9]+))?\[ARGS\]"
                               ).match(rest, pos)
                if m is None:
                    if partial and re.fullmatch(r"[A-Za-z0-9_.\-]*(\[[A-Z_]*)?(\][A-Za-z0-9]*"
                                                r"(\[[A-Z_]*)?)?", rest[pos:]):
                        return Parsed(content, calls)
                    return Parsed(text if partial else text.strip())
                a = _skip_ws(rest, m.end())
                end = json_end(rest, a) if rest.startswith("{", a) else None
                if end is None:
                    if partial and (a >= len(rest) or rest[a] == "{"):
                        calls.append(ToolCall(m.group(1), rest[a:].rstrip(_WS), m.group(2),
                                              done=False))
                        return Parsed(content, calls)
                    return Parsed(text if partial else text.strip())
                if not isinstance(_load(rest[a:end]), dict):
                    return Parsed(text if partial else text.strip())
                calls.append(ToolCall(m.group(1), rest[a:end], m.group(2)))
                pos = _skip_ws(rest, end)
        if pos < len(rest) and not partial:             # text after the calls
            content += rest[pos:]
        return Parsed(content if partial else content.strip(), calls)

    @staticmethod
    def _list_calls(items) -> list[ToolCall] | None:
        if not isinstance(items, list) or not items:
            return None
        out = []
        for it in items:
            if not isinstance(it, dict) or not isinstance(it.get("name"), str):
                return None
            args = _args_text(it.get("arguments", {}))
            if args is None:
                return None
            cid = it.get("id")
            out.append(ToolCall(it["name"], args, cid if isinstance(cid, str) else None))
        return out

    def _partial_list(self, rest: str, pos: int) -> list[ToolCall]:
        """Calls of an unfinished list: the finished ones, then the one being written."""
        out, i = [], pos + 1
        while True:
            i = _skip_ws(rest, i)
            if i >= len(rest) or rest[i] != "{":
                return out
            end = json_end(rest, i)
            if end is None:
                c = self._partial_call(rest, i)
                return out + ([c] if c is not None else [])
            got = self._list_calls([_load(rest[i:end])])
            if got is None:
                return out
            out += got
            i = _skip_ws(rest, end)
            if rest.startswith(",", i):
                i += 1

    def grammar(self, tools, parallel, token_of):
        tc = _tok("[TOOL_CALLS]", token_of)
        rules = []
        if self.style == "list":
            more = '(", " call)*' if parallel else ""
            rules.append(f'start: {tc} "[" call {more} "]"\n'
                         f'call: {" | ".join(f"call_{i}" for i in range(len(tools)))}\n')
            for i, t in enumerate(tools):
                head = _lit('{"name": ' + json.dumps(t["function"]["name"]) + ', "arguments": ')
                rules.append(f'call_{i}: {head} args_{i} "}}"\nargs_{i}: {_schema(t)}\n')
            return "".join(rules)
        args = _tok("[ARGS]", token_of)
        rules.append(_calls_rule(len(tools), parallel))
        cid = f' {_tok("[CALL_ID]", token_of)} /[a-zA-Z0-9]{{9}}/' \
            if self.style == "call_id" else ""
        for i, t in enumerate(tools):
            rules.append(f'call_{i}: {tc} {_lit(t["function"]["name"])}{cid} {args} args_{i}\n'
                         f'args_{i}: {_schema(t)}\n')
        return "".join(rules)


class GptOss(Family):
    """Harmony: messages of channels (analysis, commentary, final); a call is a commentary
    message addressed to=functions.NAME, ended by <|call|> (an end-of-generation token)."""

    name = "gpt-oss"
    markers = ("<|channel|>", "<|message|>", "<|start|>", "<|end|>", "<|constrain|>")
    _HEADER = re.compile(r"(?:\s*to=functions\.([^\s<]+))?\s*(?:<\|channel\|>\s*(\w+))?"
                         r"(?:\s*to=functions\.([^\s<]+))?\s*(?:<\|constrain\|>)?\s*(\w+)?\s*$")

    def parse(self, text: str, partial: bool = False) -> Parsed:
        if "<|channel|>" not in text and " to=functions." not in text:
            if partial:
                return Parsed(text[:len(text) - _held(text, self.markers)])
            return Parsed(text.strip())
        content, reasoning, calls = [], [], []
        msgs = text.split("<|start|>")
        for k, msg in enumerate(msgs):
            last = k == len(msgs) - 1
            if k > 0:
                if msg.startswith("assistant"):
                    msg = msg[len("assistant"):]
                elif last and partial and "assistant".startswith(msg):
                    break
            h = msg.find("<|message|>")
            if h < 0:
                if last and partial:
                    break                          # the header is still being written
                content.append(msg)
                continue
            head, body = msg[:h], msg[h + len("<|message|>"):]
            ended = body.find("<|end|>")
            if ended >= 0:
                body = body[:ended]
            m = self._HEADER.match(head)
            if m is None:
                content.append(body)
                continue
            channel = m.group(2) or "commentary"
            to = m.group(1) or m.group(3)
            open_ = last and ended < 0
            if to is not None:
                args = body.strip()
                if open_ and partial:
                    calls.append(ToolCall(to, args.rstrip(_WS), done=False))
                elif isinstance(_load(args), dict):
                    calls.append(ToolCall(to, args))
                else:
                    content.append(body)
            elif channel == "analysis":
                reasoning.append(body)
            else:
                if open_ and partial:
                    body = body[:len(body) - _held(body, self.markers)]
                content.append(body)
        out = "".join(content)
        return Parsed(out if partial else out.strip(), calls, "".join(reasoning))

    def grammar(self, tools, parallel, token_of):
        ch, msg = _tok("<|channel|>", token_of), _tok("<|message|>", token_of)
        con = _tok("<|constrain|>", token_of)
        st, end = _tok("<|start|>", token_of), _tok("<|end|>", token_of)
        # one call per turn: the call ends the generation (<|call|>); analysis may come first
        rules = [f'start: (analysis {st} "assistant")? call\n'
                 f'analysis: {ch} "analysis" {msg} /(?s:.*)/ {end}\n'
                 f'call: {" | ".join(f"call_{i}" for i in range(len(tools)))}\n']
        for i, t in enumerate(tools):
            to = _lit("commentary to=functions." + t["function"]["name"] + " ")
            rules.append(f'call_{i}: {ch} {to} {con} "json" {msg} args_{i}\n'
                         f'args_{i}: {_schema(t, COMPACT)}\n')     # as gpt-oss writes it
        return "".join(rules)


class Gemma4(Family):
    """<|tool_call>call:NAME{key:value,...}<tool_call|>, strings quoted with <|"|>."""

    name = "gemma4"
    markers = ("<|tool_call>", "<tool_call|>", '<|"|>', "<|channel>", "<channel|>")
    trigger = "<|tool_call>"
    Q = '<|"|>'

    def parse(self, text: str, partial: bool = False) -> Parsed:
        reasoning = []
        while True:                                 # thought channels come out of the text
            a = text.find("<|channel>")
            if a < 0:
                break
            b = text.find("<channel|>", a)
            if b < 0:
                text = text[:a] if partial else text
                break
            body = text[a + len("<|channel>"):b]
            reasoning.append(body[len("thought"):].lstrip() if body.startswith("thought")
                             else body)
            text = text[:a] + text[b + len("<channel|>"):]
        content, calls, pos = [], [], 0
        while True:
            i = text.find("<|tool_call>", pos)
            if i < 0:
                tail = text[pos:]
                if partial:
                    tail = tail[:len(tail) - _held(tail, self.markers)]
                content.append(tail)
                break
            content.append(text[pos:i])
            j = i + len("<|tool_call>")
            close = text.find("<tool_call|>", j)
            if close < 0:
                if partial:
                    m = re.match(r"call:([A-Za-z0-9_.\-]+)\{", text[j:])
                    if m:
                        calls.append(ToolCall(m.group(1), "", done=False))
                    break
                content.append(text[i:])
                break
            m = re.match(r"call:([A-Za-z0-9_.\-]+)(\{.*\})\s*$", text[j:close], re.S)
            args = None if m is None else self._to_json(m.group(2))
            if args is None:
                content.append(text[i:close + len("<tool_call|>")])
            else:
                calls.append(ToolCall(m.group(1), args))
            pos = close + len("<tool_call|>")
        out = "".join(content)
        return Parsed(out if partial else out.strip(), calls, "".join(reasoning))

    def _to_json(self, s: str) -> str | None:
        """Gemma 4's argument syntax to JSON: keys bare, strings between <|"|> marks."""
        out, i, n = [], 0, len(s)
        expect_key = []                             # per open {: the next item is a key
        while i < n:
            if s.startswith(self.Q, i):
                j = s.find(self.Q, i + len(self.Q))
                if j < 0:
                    return None
                out.append(json.dumps(s[i + len(self.Q):j], ensure_ascii=False))
                i = j + len(self.Q)
                continue
            c = s[i]
            if c == "{":
                out.append(c)
                expect_key.append(True)
            elif c == "[":
                out.append(c)
                expect_key.append(False)
            elif c in "}]":
                if not expect_key:
                    return None
                expect_key.pop()
                out.append(c)
            elif c == ",":
                out.append(c)
                if expect_key and expect_key[-1] is not False:
                    expect_key[-1] = True
            elif c in _WS:
                pass
            elif expect_key and expect_key[-1] is True:
                j = s.find(":", i)
                if j < 0:
                    return None
                out.append(json.dumps(s[i:j].strip(), ensure_ascii=False) + ":")
                expect_key[-1] = None               # a value comes next
                i = j + 1
                continue
            else:
                m = re.match(r"-?\d+(\.\d+)?([eE][-+]?\d+)?|true|false|null", s[i:])
                if m is None:
                    return None
                out.append(m.group(0))
                i += m.end()
                continue
            i += 1
        text = "".join(out)
        return text if isinstance(_load(text), dict) else None

    def grammar(self, tools, parallel, token_of):
        q = _tok(self.Q, token_of)
        s, e = _tok("<|tool_call>", token_of), _tok("<tool_call|>", token_of)
        # the argument syntax is not JSON: its shape is constrained, not its schema (as
        # llama.cpp does for Gemma 4)
        rules = [_calls_rule(len(tools), parallel),
                 f'gvalue: gstring | gdict | garray | /-?[0-9]+(\\.[0-9]+)?([eE][-+]?[0-9]+)?/'
                 f' | "true" | "false" | "null"\n'
                 f'gstring: {q} /[^<]*/ {q}\n'
                 f'gdict: "{{" (gkv ("," gkv)*)? "}}"\n'
                 f'gkv: /[A-Za-z_][A-Za-z0-9_]*/ ":" gvalue\n'
                 f'garray: "[" (gvalue ("," gvalue)*)? "]"\n']
        for i, t in enumerate(tools):
            rules.append(f'call_{i}: {s} {_lit("call:" + t["function"]["name"])} gdict {e}\n')
        return "".join(rules)


def _partial_string(s: str) -> str:
    """The text of a JSON string whose closing quote is still to come, up to its last whole
    character (an escape cut in the middle waits)."""
    for cut in range(len(s), max(len(s) - 6, -1), -1):
        got = _load('"' + s[:cut] + '"')
        if isinstance(got, str):
            return got
    return ""


class Generic(Family):
    """llama.cpp's generic format for templates without tool support (its
    common_chat_params_init_generic and common_chat_parse_generic)."""

    name = "generic"
    SYSTEM = ("Respond in JSON format, either with `tool_call` (a request to call tools) or "
              "with `response` reply to the user's request")

    def parse(self, text: str, partial: bool = False) -> Parsed:
        body = text.strip()
        fence = re.fullmatch(r"```(?:json)?\s*(.*?)\s*(```)?", body, re.S)
        if fence and body.startswith("```"):
            body = fence.group(1)
            if partial and not fence.group(2):
                return Parsed("")                   # a fenced block still being written
        if not body.startswith("{"):
            return Parsed(text if partial else body)
        end = json_end(body, 0)
        if end is None:
            # a reply as far as it is written (cut by max_tokens, when the text is whole)
            m = re.match(r'\{\s*"response"\s*:\s*"', body)
            if m is not None:
                return Parsed(_partial_string(body[m.end():]))
            return Parsed("") if partial else Parsed(text.strip())
        obj = _load(body[:end])
        if isinstance(obj, dict):
            if isinstance(obj.get("tool_calls"), list):
                calls = [self._call(c) for c in obj["tool_calls"]]
                if calls and None not in calls:
                    return Parsed("", calls)
            elif isinstance(obj.get("tool_call"), dict):
                call = self._call(obj["tool_call"])
                if call is not None:
                    return Parsed("", [call])
            elif "response" in obj:
                r = obj["response"]
                return Parsed(r if isinstance(r, str) else json.dumps(r, indent=2))
        return Parsed(text if partial else text.strip())

    @staticmethod
    def _call(c) -> ToolCall | None:
        if not isinstance(c, dict) or not isinstance(c.get("name"), str):
            return None
        args = _args_text(c.get("arguments", {}))
        if args is None:
            return None
        cid = c.get("id")
        return ToolCall(c["name"], args, cid if isinstance(cid, str) else None)

    @staticmethod
    def schema(tools: list[dict], parallel: bool, required: bool) -> dict:
        """The JSON schema of llama.cpp's generic format, less the call's "id" (the server
        makes ids: one the model wrote would be dropped, so it is not sampled)."""
        calls = []
        for t in tools:
            f = t["function"]
            s = {"type": "object",
                 "properties": {"name": {"type": "string", "const": f["name"]},
                                "arguments": _params(t)},
                 "required": ["name", "arguments"]}
            if f.get("description"):
                s["description"] = f["description"]
            calls.append(s)
        item = calls[0] if len(calls) == 1 else {"anyOf": calls}
        call = {"type": "object",
                "properties": {"tool_calls": {"type": "array", "items": item, "minItems": 1}},
                "required": ["tool_calls"]} if parallel else \
            {"type": "object", "properties": {"tool_call": item}, "required": ["tool_call"]}
        if required:
            return call
        return {"anyOf": [call, {"type": "object",
                                 "properties": {"response": {"type": "string"}},
                                 "required": ["response"]}]}

    def grammar(self, tools, parallel, token_of, required: bool = True):
        """With required=False, a reply ({"response": ...}) is allowed too: llama.cpp
        constrains the generic format's answers always, not only where a call is due."""
        return "start: answer\nanswer: " + _json(self.schema(tools, parallel, required)) + "\n"


# -- choosing the family -------------------------------------------------------------------

def family_of(template_source: str | None, supports_tools: bool = True) -> Family:
    """The call syntax of a chat template, as llama.cpp picks its handler; a template that
    does not render tools gets the generic format."""
    src = template_source or ""
    if "<|channel|>" in src:
        return GptOss()
    if "'<|tool_call>call:'" in src or "<|tool_call>call:" in src:
        return Gemma4()
    if "[TOOL_CALLS]" in src:
        return Mistral("call_id" if "[CALL_ID]" in src else
                       "args" if "[ARGS]" in src else "list")
    if not supports_tools:
        return Generic()
    if "<tool_call>" in src:
        return Hermes()
    if "<|python_tag|>" in src or ("<|start_header_id|>" in src and "ipython" in src):
        return Llama3()
    if "<|start_header_id|>" in src:
        return Llama3()
    return Hermes()                         # tools rendered in a format of its own: the
                                            # commonest one is the best guess


# -- the template ----------------------------------------------------------------------------

_PROBE_TOOL = {"type": "function", "function": {
    "name": "probe_tool_xq", "description": "d",
    "parameters": {"type": "object", "properties": {"arg": {"type": "string"}},
                   "required": ["arg"]}}}


def template_caps(template) -> dict[str, bool]:
    """What a ChatTemplate does with tools (llama.cpp's caps, found by rendering): whether it
    shows the tools, the assistant's tool calls, and object (not string) arguments."""
    if getattr(template, "builtin", None) is not None:
        return {"tools": False, "tool_calls": False, "object_arguments": False}
    user = {"role": "user", "content": "hi"}

    def render(msgs, tools=None) -> str:
        try:
            return template.render(msgs, add_generation_prompt=False,
                                   **({} if tools is None else {"tools": tools}))
        except ValueError:
            return ""
    tools = "probe_tool_xq" in render([user], [_PROBE_TOOL])
    call = {"id": "call00001", "type": "function",
            "function": {"name": "probe_call_xq", "arguments": {"arg": "probe_value_xq"}}}
    msgs = [user, {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "call00001", "content": "r"},
            {"role": "assistant", "content": "ok"}]
    out = render(msgs, [_PROBE_TOOL])
    obj_args = '"arg"' in out and "probe_value_xq" in out
    if "probe_call_xq" not in out:
        call["function"]["arguments"] = json.dumps({"arg": "probe_value_xq"})
        out = render(msgs, [_PROBE_TOOL])
    return {"tools": tools, "tool_calls": "probe_call_xq" in out, "object_arguments": obj_args}


def _add_system(messages: list[dict], text: str) -> list[dict]:
    """minja's add_system: appended to a leading system message, else one is put first."""
    if messages and messages[0].get("role") == "system":
        first = dict(messages[0])
        first["content"] = (first.get("content") or "") + "\n\n" + text
        return [first] + messages[1:]
    return [{"role": "system", "content": text}] + messages


def prepare_messages(messages: list[dict], tools: list[dict] | None, caps: dict[str, bool],
                     generic: bool) -> list[dict]:
    """The messages as the template gets them (llama.cpp's workarounds and minja's
    polyfills): arguments as objects where the template takes them, tool calls and tool
    results written into the text where it knows nothing of them, and for the generic
    format the instruction to answer in JSON and the tools in the system message."""
    out = []
    for m in messages:
        m = dict(m)
        if m.get("tool_calls"):
            if m.get("content") is None:
                m["content"] = ""
            calls = []
            for c in m["tool_calls"]:
                c = {**c, "function": dict(c["function"])}
                args = c["function"].get("arguments")
                if isinstance(args, str) and (caps["object_arguments"]
                                              or not caps["tool_calls"]):
                    parsed = _load(args)
                    if parsed is not None:
                        c["function"]["arguments"] = parsed
                calls.append(c)
            m["tool_calls"] = calls
            if not caps["tool_calls"]:
                obj = {"tool_calls": [{"name": c["function"]["name"],
                                       "arguments": c["function"].get("arguments"),
                                       **({"id": c["id"]} if c.get("id") else {})}
                                      for c in calls]}
                if m["content"]:
                    obj["content"] = m["content"]
                m["content"] = json.dumps(obj, indent=2, ensure_ascii=False)
                del m["tool_calls"]
        elif m.get("role") == "tool" and not caps["tool_calls"]:
            resp = {}
            if m.get("name"):
                resp["tool"] = m["name"]
            resp["content"] = m.get("content")
            if m.get("tool_call_id"):
                resp["tool_call_id"] = m["tool_call_id"]
            m = {"role": "user",
                 "content": json.dumps({"tool_response": resp}, indent=2, ensure_ascii=False)}
        out.append(m)
    if generic and tools:
        out = _add_system(out, Generic.SYSTEM)
    if tools and not caps["tools"] and generic:
        out = _add_system(out, "You can call any of the following tools to satisfy the user's "
                               "requests: " + json.dumps(tools, indent=2, ensure_ascii=False))
    return out


# -- constrained decoding ----------------------------------------------------------------------

def tool_constraint(tokenizer, grammar: str, triggers: tuple[int, ...] = ()):
    """What generate(constraint=...) takes for a call grammar: engine/text/constrain.py's
    Grammar, which binds itself to the tokenizer when the generation starts. The grammar's
    control-token markers are `<[id]>` references of `tokenizer`'s ids. triggers: the
    grammar is lazy, holding from the first of these tokens on."""
    return Grammar.lark(grammar, param="tool_choice", triggers=frozenset(triggers))
