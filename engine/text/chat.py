"""Chat templates: messages -> prompt text -> token ids, as llama.cpp's server does it.

A GGUF's `tokenizer.chat_template` is Jinja rendered the way HuggingFace and llama.cpp do:
a sandboxed environment with trim_blocks and lstrip_blocks, `raise_exception`,
`strftime_now`, HF's `tojson`, and `bos_token`/`eos_token` as strings. A file without a
template gets one of llama.cpp's built-in formats: `gemma` for Gemma vocabularies (the one
llama.cpp detects from `<start_of_turn>`), `chatml` otherwise (llama.cpp's default).
"""
from __future__ import annotations

import json
from datetime import datetime

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

from ..formats.gguf_file import GGUFFile
from .tokenizer import Tokenizer

BUILTIN_TEMPLATES = ("chatml", "gemma")


class _IgnoreGenerationTags(jinja2.ext.Extension):
    """HF's `{% generation %}...{% endgeneration %}` marks training spans: render the body."""

    tags = {"generation"}

    def parse(self, parser):
        parser.stream.skip(1)
        return parser.parse_statements(("name:endgeneration",), drop_needle=True)


def _raise_exception(message: str):
    raise jinja2.exceptions.TemplateError(message)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _tojson(x, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    # HF's version: non-ASCII kept, no HTML escaping (jinja's own tojson escapes < > &)
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def _c_trim(s: str) -> str:
    return s.strip(" \t\n\v\f\r")       # llama-chat.cpp's trim(): C isspace only


class ChatTemplate:
    """One chat format: a Jinja template source or the name of a llama.cpp built-in."""

    def __init__(self, source: str | None = None, *, builtin: str | None = None,
                 bos_token: str = "", eos_token: str = ""):
        if (source is None) == (builtin is None):
            raise ValueError("give either a Jinja template source or a built-in name")
        if builtin is not None and builtin not in BUILTIN_TEMPLATES:
            raise ValueError(f"unknown built-in chat template {builtin!r} "
                             f"(known: {', '.join(BUILTIN_TEMPLATES)})")
        self.source = source
        self.builtin = builtin
        self.bos_token = bos_token
        self.eos_token = eos_token
        self._template = None
        if source is not None:
            env = ImmutableSandboxedEnvironment(
                trim_blocks=True, lstrip_blocks=True,
                extensions=[_IgnoreGenerationTags, jinja2.ext.loopcontrols])
            env.filters["tojson"] = _tojson
            env.globals["raise_exception"] = _raise_exception
            env.globals["strftime_now"] = _strftime_now
            try:
                self._template = env.from_string(source)
            except jinja2.TemplateSyntaxError as exc:
                raise ValueError(f"bad chat template: line {exc.lineno}: {exc.message}") from None

    @classmethod
    def from_gguf(cls, g: GGUFFile) -> "ChatTemplate":
        """The file's `tokenizer.chat_template`, or the built-in format llama.cpp would use."""
        tokens = g.get("tokenizer.ggml.tokens") or []

        def token(key: str) -> str:
            i = g.get(key)
            return tokens[i] if isinstance(i, int) and 0 <= i < len(tokens) else ""

        bos, eos = token("tokenizer.ggml.bos_token_id"), token("tokenizer.ggml.eos_token_id")
        source = g.get("tokenizer.chat_template")
        if source:
            return cls(str(source), bos_token=bos, eos_token=eos)
        arch = str(g.get("general.architecture") or "")
        gemma = arch.startswith("gemma") or "<start_of_turn>" in tokens
        return cls(builtin="gemma" if gemma else "chatml", bos_token=bos, eos_token=eos)

    def render(self, messages: list[dict], add_generation_prompt: bool = True, **extra) -> str:
        """The prompt text; raises ValueError when the template rejects the conversation."""
        for m in messages:
            if not isinstance(m, dict) or "role" not in m:
                raise ValueError(f"a message is a dict with a 'role': {m!r}")
        if self.builtin == "chatml":
            return _chatml(messages, add_generation_prompt)
        if self.builtin == "gemma":
            return _gemma(messages, add_generation_prompt)
        try:
            return self._template.render(
                messages=messages, add_generation_prompt=add_generation_prompt,
                bos_token=self.bos_token, eos_token=self.eos_token, **extra)
        except jinja2.TemplateError as exc:
            raise ValueError(f"chat template failed: {exc}") from None
        except (TypeError, AttributeError, KeyError, IndexError) as exc:
            raise ValueError(f"chat template failed: {type(exc).__name__}: {exc}") from None

    def tokenize(self, tokenizer: Tokenizer, messages: list[dict],
                 add_generation_prompt: bool = True, **extra) -> list[int]:
        """The prompt's token ids, as llama-server feeds them to the model.

        llama-server renders, strips a leading BOS text when the vocabulary adds BOS itself
        (and a trailing EOS when it adds EOS), then tokenizes with add_special=True and
        parse_special=True: exactly one BOS either way, and the template's control tokens
        (<|im_start|>, <start_of_turn>) become their ids. For templates that do not print
        BOS this equals llama-cpp-python's create_chat_completion (add_bos=False,
        special=True) whenever the vocabulary does not add BOS, as for SmolLM2.
        """
        text = self.prompt_text(tokenizer, messages, add_generation_prompt, **extra)
        return tokenizer.encode(text, add_special=True, parse_special=True)

    def prompt_text(self, tokenizer: Tokenizer, messages: list[dict],
                    add_generation_prompt: bool = True, **extra) -> str:
        """The rendered text that tokenize() encodes (a leading BOS and a trailing EOS text
        stripped where the vocabulary adds them itself)."""
        text = self.render(messages, add_generation_prompt, **extra)
        if tokenizer.add_bos and self.bos_token and text.startswith(self.bos_token):
            text = text[len(self.bos_token):]
        if tokenizer.add_eos and self.eos_token and text.endswith(self.eos_token):
            text = text[:-len(self.eos_token)]
        return text


def _chatml(messages: list[dict], add_ass: bool) -> str:
    out = [f"<|im_start|>{m['role']}\n{m.get('content') or ''}<|im_end|>\n" for m in messages]
    if add_ass:
        out.append("<|im_start|>assistant\n")
    return "".join(out)


def _gemma(messages: list[dict], add_ass: bool) -> str:
    """llama.cpp's LLM_CHAT_TEMPLATE_GEMMA: system text joins the next user turn."""
    out = []
    system = ""
    for m in messages:
        role = m["role"]
        if role == "system":
            system += _c_trim(m.get("content") or "")
            continue
        role = "model" if role == "assistant" else role
        out.append(f"<start_of_turn>{role}\n")
        if system and role != "model":
            out.append(system + "\n\n")
            system = ""
        out.append(_c_trim(m.get("content") or "") + "<end_of_turn>\n")
    if add_ass:
        out.append("<start_of_turn>model\n")
    return "".join(out)
