"""Structured output in /v1: the request fields that constrain decoding, made into a Grammar.

- `response_format` (chat and completions): `{"type": "text"}` (none),
  `{"type": "json_object"}` (any JSON object; llama-server's `"schema"` beside it is taken
  too), `{"type": "json_schema", "json_schema": {"name": .., "schema": {..}, "strict": ..}}`.
  The output always follows the schema, strict or not: there is no looser mode to fall to.
- in /v1/completions, llama-server's `grammar` (GBNF, or llguidance's Lark) and
  `json_schema` (a schema object).

At most one of them per request. A bad one is a 400 naming its parameter.
"""
from __future__ import annotations

from typing import Any

from ..text.constrain import ConstraintError, Grammar
from .errors import bad

FORMATS = ("text", "json_object", "json_schema")


def parse_constraint(body: dict, chat: bool) -> Grammar | None:
    """The grammar a request asks for, or None."""
    given = [k for k in ("response_format",) + (() if chat else ("grammar", "json_schema"))
             if body.get(k) is not None]
    fmt = body.get("response_format")
    if fmt is not None and isinstance(fmt, dict) and fmt.get("type") == "text":
        given.remove("response_format")
    if len(given) > 1:
        raise bad(f"{' and '.join(given)} cannot be used together: give one", given[1],
                  "invalid_value")
    try:
        if fmt is not None and "response_format" in given:
            return _response_format(fmt)
        if body.get("grammar") is not None and "grammar" in given:
            return Grammar.gbnf(body["grammar"], "grammar")
        if body.get("json_schema") is not None and "json_schema" in given:
            return Grammar.json_schema(body["json_schema"], "json_schema")
    except ConstraintError as exc:
        raise bad(str(exc), exc.param, "invalid_value") from None
    if fmt is not None and not isinstance(fmt, dict):
        raise bad("response_format must be an object", "response_format", "invalid_type")
    return None


def _response_format(fmt: Any) -> Grammar:
    if not isinstance(fmt, dict):
        raise bad("response_format must be an object", "response_format", "invalid_type")
    kind = fmt.get("type")
    if kind == "json_object":
        if fmt.get("schema") is not None:                # llama-server's extension
            return Grammar.json_schema(fmt["schema"], "response_format.schema")
        return Grammar.json_object("response_format")
    if kind == "json_schema":
        spec = fmt.get("json_schema")
        if not isinstance(spec, dict):
            raise bad('response_format {"type": "json_schema"} needs a "json_schema" object '
                      'with a "schema"', "response_format.json_schema", "invalid_value")
        if "strict" in spec and not isinstance(spec["strict"], bool) \
                and spec["strict"] is not None:
            raise bad("response_format.json_schema.strict must be a boolean",
                      "response_format.json_schema.strict", "invalid_type")
        schema = spec.get("schema")
        if schema is None:           # OpenAI's own default: any JSON object
            return Grammar.json_object("response_format.json_schema")
        return Grammar.json_schema(schema, "response_format.json_schema.schema")
    raise bad(f"response_format type {kind!r} is not supported: use one of "
              f"{', '.join(FORMATS)}", "response_format", "unsupported_parameter")
