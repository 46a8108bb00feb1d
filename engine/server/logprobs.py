"""logprobs in /v1: the request's parameters, and the engine's per-token entries
(engine.facade.TokenLogprob: the log-softmax of the model's own logits before sampling, as
llama-server reports them) in OpenAI's two shapes:

- chat: `logprobs: true`, `top_logprobs: 0..20`; choices[].logprobs.content[] of
  {token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]};
- completions (the legacy shape): `logprobs: 0..20` alternatives; choices[].logprobs of
  {tokens, token_logprobs, top_logprobs: [{token: logprob}], text_offset}.

Streamed, each chunk carries the entries of the tokens whose text it brings.
"""
from __future__ import annotations

from typing import Any

from .errors import bad, integer, show

MAX_TOP = 20                     # OpenAI's most top_logprobs (the engine's TOP_LOGPROBS)


def parse(body: dict, chat: bool) -> int | None:
    """How many alternatives per token the request wants (0..20), None for no logprobs."""
    if chat:
        v = body.get("logprobs")
        if v is not None and not isinstance(v, bool):
            raise bad(f"logprobs must be true or false, got {show(v)}", "logprobs",
                      "invalid_type")
        top = integer(body, "top_logprobs", None, lo=0)
        if top is not None and top > MAX_TOP:
            raise bad(f"top_logprobs must be at most {MAX_TOP}, got {top}", "top_logprobs",
                      "invalid_value")
        if top is not None and not v:
            raise bad("top_logprobs is only allowed when logprobs is true", "top_logprobs",
                      "invalid_value")
        return (top or 0) if v else None
    if body.get("top_logprobs") is not None:
        raise bad("top_logprobs is a chat parameter; completions take logprobs (0 to "
                  f"{MAX_TOP})", "top_logprobs", "unsupported_parameter")
    v = body.get("logprobs")
    if v is None or v is False:
        return None
    k = integer(body, "logprobs", None, lo=0)
    if k > MAX_TOP:
        raise bad(f"logprobs must be at most {MAX_TOP}, got {k}", "logprobs", "invalid_value")
    return k


class Formatter:
    """Entries to JSON for one model's tokenizer; `offset` follows the completion's text for
    the legacy text_offset across streamed chunks."""

    def __init__(self, tokenizer):
        self.tok = tokenizer
        self.offset = 0

    def _piece(self, i: int) -> tuple[str, list[int]]:
        raw = self.tok.piece(i)
        return raw.decode("utf-8", errors="replace"), list(raw)

    def chat(self, entries) -> dict[str, Any]:
        content = []
        for e in entries:
            text, raw = self._piece(e.id)
            top = []
            for i, lp in e.top:
                t, r = self._piece(i)
                top.append({"token": t, "logprob": lp, "bytes": r})
            content.append({"token": text, "logprob": e.logprob, "bytes": raw,
                            "top_logprobs": top})
        return {"content": content, "refusal": None}

    def completion(self, entries) -> dict[str, Any]:
        tokens, lps, tops, offsets = [], [], [], []
        for e in entries:
            text, _ = self._piece(e.id)
            tokens.append(text)
            lps.append(e.logprob)
            tops.append({self._piece(i)[0]: lp for i, lp in e.top})
            offsets.append(self.offset)
            self.offset += len(text)
        return {"tokens": tokens, "token_logprobs": lps, "top_logprobs": tops,
                "text_offset": offsets}

    def format(self, entries, chat: bool) -> dict[str, Any]:
        return self.chat(entries) if chat else self.completion(entries)
