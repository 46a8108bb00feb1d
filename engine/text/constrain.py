"""Constrained decoding: the tokens a grammar allows next, as a mask over the vocabulary.

A `Grammar` is what a request asks for (a JSON schema, any JSON object, a Lark grammar or a
GBNF one), checked when it is made, with no model in sight, so that a bad one is a 400 naming
its parameter. A `Constraint` is that grammar running over one model's vocabulary: `apply()`
masks the logits of the next step (disallowed tokens -inf), `advance()` takes the chosen token
and starts the next mask on a worker thread, so that it is computed while the device runs the
forward pass of that token.

The masks come from llguidance (its Earley parser over a token trie; about 0.1 ms a token on
SmolLM2's 49k vocabulary here, see the README for the figures beside outlines-core and
xgrammar). The vocabulary is Hotseat's own Tokenizer: each token's exact bytes, byte-fallback
tokens as their one byte, control tokens marked with a leading 0xff so that no grammar text
can match them. The end-of-generation tokens are allowed exactly when the grammar is complete.
"""
from __future__ import annotations

import json
import threading
import time
import weakref
from concurrent.futures import Future, ThreadPoolExecutor

import llguidance
import numpy as np

from .sampling import apply_mask
from .tokenizer import Tokenizer

# JSON without free whitespace: with it, a model sampled at temperature 1 can pad an object
# with newlines until max_tokens runs out. Separators as json.dumps writes them. A schema's
# own "x-guidance" options override these.
JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
SPECIAL_MARK = b"\xff"          # llguidance's marker of a special token's bytes

_pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="hotseat-mask")


class ConstraintError(ValueError):
    """A grammar or schema that cannot be used; `param` names the request parameter."""

    def __init__(self, param: str, message: str):
        super().__init__(message)
        self.param = param


class Grammar:
    """A checked grammar in llguidance's form. `param` is the request parameter it came from,
    named in errors; `kind` is one of json_schema, json_object, lark, gbnf."""

    def __init__(self, kind: str, text: str, param: str, triggers: frozenset[int] = frozenset()):
        self.kind, self.text, self.param = kind, text, param
        self.triggers = triggers          # lazy: the grammar starts at one of these tokens
        bad, msgs = llguidance.LLMatcher.validate_grammar_with_warnings(text)
        if bad:
            raise ConstraintError(param, f"{param}: {_first_line(msgs[0])}")

    def __repr__(self) -> str:
        return f"Grammar({self.kind}, from {self.param})"

    @classmethod
    def json_schema(cls, schema, param: str = "json_schema") -> "Grammar":
        if isinstance(schema, str):
            try:
                schema = json.loads(schema)
            except ValueError as exc:
                raise ConstraintError(param, f"{param} is not valid JSON: {exc}") from None
        if not isinstance(schema, dict):
            raise ConstraintError(param, f"{param} must be a JSON object (a JSON schema), "
                                         f"got {type(schema).__name__}")
        try:
            text = llguidance.LLMatcher.grammar_from_json_schema(schema, defaults=JSON_OPTIONS)
        except (ValueError, TypeError) as exc:
            raise ConstraintError(param, f"{param}: {exc}") from None
        return cls("json_schema", text, param)

    @classmethod
    def json_object(cls, param: str = "response_format") -> "Grammar":
        """Any JSON object (OpenAI's json_object mode)."""
        text = llguidance.LLMatcher.grammar_from_json_schema({"type": "object"},
                                                             defaults=JSON_OPTIONS)
        return cls("json_object", text, param)

    @classmethod
    def lark(cls, text: str, param: str = "grammar",
             triggers: frozenset[int] = frozenset()) -> "Grammar":
        """llguidance's Lark dialect: it may embed a JSON schema (`%json {...}`) and special
        tokens (`<|im_end|>`), which tool calls need. triggers: a lazy grammar (as
        llama.cpp's lazy grammars): the text is free until one of these tokens is chosen,
        and from it (the grammar's first token) on, the grammar holds."""
        if not isinstance(text, str) or not text.strip():
            raise ConstraintError(param, f"{param} must be a non-empty grammar string")
        return cls("lark", llguidance.LLMatcher.grammar_from_lark(text), param,
                   frozenset(triggers))

    @classmethod
    def gbnf(cls, text: str, param: str = "grammar") -> "Grammar":
        """llama.cpp's GBNF (as llama-server's `grammar` field takes it), through
        llguidance's converter; a Lark grammar is taken as it is."""
        if not isinstance(text, str) or not text.strip():
            raise ConstraintError(param, f"{param} must be a non-empty grammar string")
        try:
            lark = llguidance.gbnf_to_lark.any_to_lark(text)
        except Exception as exc:       # the converter raises bare Exceptions on bad input
            raise ConstraintError(param, f"{param} is not a valid GBNF grammar: "
                                         f"{_first_line(str(exc))}") from None
        return cls("gbnf", llguidance.LLMatcher.grammar_from_lark(lark), param)


def _first_line(msg: str) -> str:
    return msg.strip().splitlines()[0] if msg.strip() else "invalid grammar"


# -- the vocabulary ------------------------------------------------------------------------
_vocabs: "weakref.WeakKeyDictionary[Tokenizer, dict]" = weakref.WeakKeyDictionary()
_vocabs_lock = threading.Lock()


class _Vocab:
    """What llguidance.TokenizerWrapper reads from a tokenizer."""

    def __init__(self, tok: Tokenizer, n_vocab: int):
        self.tokens = token_bytes(tok, n_vocab)
        eog = sorted(tok.eog_ids)
        self.eos_token_id = eog[0] if eog else (tok.eos_id or 0)
        self.bos_token_id = tok.bos_id
        self.special_token_ids = [i for i, b in enumerate(self.tokens)
                                  if b.startswith(SPECIAL_MARK)]
        self._tok = weakref.ref(tok)     # weak: the cache of vocabularies is keyed on tok

    def __call__(self, text: str) -> list[int]:
        """Token ids whose bytes are exactly `text`'s. llguidance tokenizes the text a
        grammar forces (a key name, the rest of an enum member) and allows its first
        token; the tokenizer's own answer is taken when its bytes match, else (a
        SentencePiece space prefix, a word out of the vocabulary) the longest pieces."""
        tok = self._tok()
        ids = tok.encode(text, add_special=False) if tok is not None else []
        data = text.encode()
        if b"".join(self.tokens[i] for i in ids) == data:
            return ids
        return self._longest(data)

    def _longest(self, data: bytes) -> list[int]:
        if not hasattr(self, "_ids"):
            self._ids: dict[bytes, int] = {}
            for i, b in enumerate(self.tokens):
                if b and not b.startswith(SPECIAL_MARK):
                    self._ids.setdefault(b, i)
            self._longest_piece = max(map(len, self._ids), default=1)
        out, i = [], 0
        while i < len(data):
            for n in range(min(self._longest_piece, len(data) - i), 0, -1):
                t = self._ids.get(data[i:i + n])
                if t is not None:
                    out.append(t)
                    i += n
                    break
            else:
                raise ValueError(f"no token holds the byte {data[i]:#04x}")
        return out


def token_bytes(tok: Tokenizer, n_vocab: int) -> list[bytes]:
    """Each token's bytes as the grammar sees them: the exact text bytes, one byte for a
    byte-fallback token, 0xff + name for a control or unknown token (text that never reaches
    the output), b"" for the padding past the tokenizer's vocabulary."""
    out = []
    for i in range(tok.n_vocab):
        text = tok.piece(i, special=True)
        if tok.piece(i, special=False) != text:      # control and unknown: not text
            text = SPECIAL_MARK + text
        out.append(text)
    out += [b""] * (n_vocab - len(out))
    return out


def vocabulary(tok: Tokenizer, n_vocab: int | None = None) -> llguidance.LLTokenizer:
    """The llguidance tokenizer of `tok` with `n_vocab` entries (the model's logits; at least
    the tokenizer's), built once per tokenizer (0.4 s for SmolLM2's 49k tokens, 3.5 s for
    Gemma 3's 262k, on lavapipe's machine)."""
    n_vocab = max(n_vocab or 0, tok.n_vocab)
    with _vocabs_lock:
        per = _vocabs.setdefault(tok, {})
        if n_vocab not in per:
            wrapped = llguidance.TokenizerWrapper(_Vocab(tok, n_vocab))
            per[n_vocab] = llguidance.LLTokenizer(wrapped, n_vocab=n_vocab,
                                                  eos_token=sorted(tok.eog_ids) or None)
        return per[n_vocab]


# -- a running constraint ------------------------------------------------------------------
class Constraint:
    """One generation's grammar state. Use: `logits = c.apply(logits)` (the allowed tokens
    of this step), sample, `c.advance(token)`; `close()` at the end."""

    def __init__(self, grammar: Grammar, tok: Tokenizer, n_vocab: int | None = None):
        self.grammar = grammar
        self.n_vocab = max(n_vocab or 0, tok.n_vocab)
        self._m = llguidance.LLMatcher(vocabulary(tok, self.n_vocab), grammar.text,
                                       log_level=0)
        if self._m.is_error():
            raise ConstraintError(grammar.param,
                                  f"{grammar.param}: {_first_line(self._m.get_error())}")
        self._bits = np.zeros((self.n_vocab + 31) // 32, dtype=np.int32)
        self.mask_s: list[float] = []     # the time of each mask's computation
        self._pending: Future | None = None
        self.live = not grammar.triggers  # a lazy grammar holds from its trigger on
        if self.live:
            self._start()

    def _compute(self) -> None:
        t0 = time.perf_counter()
        self._m.unsafe_compute_mask_ptr(self._bits.ctypes.data, self._bits.nbytes)  # no GIL
        self.mask_s.append(time.perf_counter() - t0)

    def _start(self) -> None:
        self._pending = _pool.submit(self._compute)

    def allowed(self) -> np.ndarray:
        """bool[n_vocab]: the tokens the grammar allows next (waits for the worker)."""
        if not self.live:
            return np.ones(self.n_vocab, dtype=bool)
        if self._pending is not None:
            self._pending.result()
            self._pending = None
        return np.unpackbits(self._bits.view(np.uint8), bitorder="little")[:self.n_vocab] \
            .view(bool)

    def apply(self, logits: np.ndarray) -> np.ndarray:
        """The logits with every disallowed token at -inf (a new array; before a lazy
        grammar's trigger, the logits themselves)."""
        return apply_mask(logits, self.allowed()) if self.live else logits

    def advance(self, token: int) -> None:
        """Take the chosen token and start computing the next mask."""
        if not self.live:
            if token not in self.grammar.triggers:
                return
            self.live = True
        if self._pending is not None:
            self._pending.result()
            self._pending = None
        if not self._m.consume_token(int(token)):
            raise RuntimeError(f"the grammar refused token {token}: {self._m.get_error()}")
        self._start()

    @property
    def complete(self) -> bool:
        """Whether the text so far is a whole sentence of the grammar (EOS allowed)."""
        return not self.live or self._m.is_accepting()

    @property
    def stopped(self) -> bool:
        """Whether nothing can follow: only end-of-generation is allowed, or nothing."""
        return self.live and self._m.is_stopped()

    def close(self) -> None:
        if self._pending is not None:
            self._pending.result()
            self._pending = None
