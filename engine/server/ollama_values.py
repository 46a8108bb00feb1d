"""Ollama's request values and what its listings tell of a model, as ollama.py reads and
writes them: model names, keep_alive, options, messages, format, and a GGUF file's facts
(size, time, parameter count, metadata). Below ollama.py, which imports it."""
from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import re
from datetime import datetime, timezone
from typing import Any, Iterable

from ..text.sampling import SamplingError, SamplingParams
from ..vision.prompt import MARKER
from . import media
from .errors import bad, integer, number, show

# Ollama's defaults for what a request leaves out (its Modelfile documentation)
OLLAMA_SAMPLING = SamplingParams(temperature=0.8, top_k=40, top_p=0.9, min_p=0.0,
                                 repeat_penalty=1.1, repeat_last_n=64)
ROLES = ("system", "user", "assistant", "tool")


# -- names ---------------------------------------------------------------------------------

def _words(name: str) -> list[str]:
    return [w for w in re.split(r"[^0-9a-z]+", name.lower()) if w]


def ollama_name(name: str) -> str:
    """A loaded model's name as Ollama lists it: with a tag."""
    return name if ":" in name else f"{name}:latest"


def match_names(asked: str, loaded: Iterable[str]) -> list[str]:
    """The loaded models a client's model name means (one, none, or several to choose from)."""
    loaded = list(loaded)
    if asked in loaded:
        return [asked]
    base = asked.rsplit("/", 1)[-1]              # "library/smollm2", "hf.co/user/x"
    base = base[:-len(":latest")] if base.endswith(":latest") else base
    exact = [n for n in loaded if n.lower() == base.lower()]
    if exact:
        return exact
    words = _words(base)
    if not words:
        return []
    return [n for n in loaded if _has_words(_words(n), words)]


def _has_words(have: list[str], words: list[str]) -> bool:
    """Whether each word is one of `have`'s or a run of them written together ("gemma3" in
    gemma-3-270m), the first at the start."""
    runs = {"".join(have[i:j]) for i in range(len(have))
            for j in range(i + 1, min(i + 4, len(have) + 1))}
    first = {"".join(have[:j]) for j in range(1, min(4, len(have) + 1))}
    return words[0] in first and all(w in runs for w in words)


# -- request values ------------------------------------------------------------------------

_DURATION = re.compile(r"([0-9]*\.?[0-9]+)(ns|us|µs|ms|s|m|h)")
_UNIT_S = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_keep_alive(v: Any) -> float | None:
    """keep_alive in seconds: None when absent, 0 to go cold after the answer, math.inf for
    no idle eviction (any negative value). A number is seconds; a string is a number or a
    Go duration ("5m", "1h30m", "-1s")."""
    if v is None or v == "":
        return None
    if isinstance(v, bool):
        raise bad(f"keep_alive must be a number of seconds or a duration such as \"5m\", got "
                  f"{show(v)}", "keep_alive", "invalid_type")
    if isinstance(v, str):
        text = v.strip()
        try:
            v = float(text)
        except ValueError:
            sign, body = (-1.0, text[1:]) if text.startswith("-") else (1.0, text.lstrip("+"))
            parts = _DURATION.findall(body)
            if not body or "".join(a + u for a, u in parts) != body:
                raise bad(f"keep_alive must be a number of seconds or a duration such as "
                          f"\"5m\" or \"1h30m\", got {show(text)}", "keep_alive",
                          "invalid_value") from None
            v = sign * sum(float(a) * _UNIT_S[u] for a, u in parts)
    if not isinstance(v, (int, float)) or math.isnan(v):
        raise bad(f"keep_alive must be a number of seconds or a duration such as \"5m\", got "
                  f"{show(v)}", "keep_alive", "invalid_type")
    return math.inf if v < 0 else float(v)


@dataclasses.dataclass
class Options:
    """A request's options, checked."""
    sampling: SamplingParams
    num_predict: int                      # <= 0: until the context is full
    stop: list[str]
    num_ctx: int | None
    ignored: list[str]


def parse_options(v: Any) -> Options:
    if v is None:
        v = {}
    if not isinstance(v, dict):
        raise bad("options must be an object", "options", "invalid_type")
    o = {f"options.{k}": x for k, x in v.items()}   # error messages name options.KEY
    d = OLLAMA_SAMPLING
    for key, off in (("mirostat", 0), ("typical_p", 1.0), ("tfs_z", 1.0)):
        if v.get(key) not in (None, off):
            raise bad(f"options.{key} is not supported (only {off}, off)", f"options.{key}",
                      "unsupported_parameter")
    seed = integer(o, "options.seed", None)
    try:
        sampling = SamplingParams(
            temperature=number(o, "options.temperature", d.temperature, 0.0),
            top_k=integer(o, "options.top_k", d.top_k, lo=0),
            top_p=number(o, "options.top_p", d.top_p, 0.0, 1.0, lo_open=True),
            min_p=number(o, "options.min_p", d.min_p, 0.0, 1.0),
            repeat_penalty=number(o, "options.repeat_penalty", d.repeat_penalty, 0.0,
                                  lo_open=True),
            repeat_last_n=integer(o, "options.repeat_last_n", d.repeat_last_n, lo=-1),
            presence_penalty=number(o, "options.presence_penalty", 0.0),
            frequency_penalty=number(o, "options.frequency_penalty", 0.0),
            seed=None if seed is None or seed < 0 else seed % (1 << 64),   # -1: random
        )
    except SamplingError as exc:
        raise bad(str(exc), f"options.{exc.param}", "invalid_value") from None
    stop = v.get("stop")
    if isinstance(stop, str):
        stop = [stop]
    if stop is not None and (not isinstance(stop, list)
                             or not all(isinstance(s, str) for s in stop)):
        raise bad("options.stop must be a list of strings", "options.stop", "invalid_type")
    known = {"temperature", "top_k", "top_p", "min_p", "repeat_penalty", "repeat_last_n",
             "presence_penalty", "frequency_penalty", "seed", "stop", "num_predict",
             "num_ctx", "mirostat", "typical_p", "tfs_z"}
    # how Ollama loads a model (num_gpu, num_thread, use_mmap...), and unknown ones
    ignored = sorted(k for k in v if k not in known)
    return Options(sampling, integer(o, "options.num_predict", -1),
                   [s for s in stop or () if s], integer(o, "options.num_ctx", None, lo=1),
                   ignored)


def parse_format(v: Any) -> dict | None:
    """format as a JSON schema: "json" asks for a JSON object, else a schema object."""
    if v is None or v == "":
        return None
    if v == "json":
        return {"type": "object"}
    if isinstance(v, dict):
        return v
    raise bad(f'format must be "json" or a JSON schema object, got {show(v)}', "format",
              "invalid_value")


def parse_chat_messages(v: Any) -> list[dict]:
    """Ollama's messages as the OpenAI routes hold them. An assistant's tool_calls carry
    their arguments as objects and no ids; a role "tool" message (its `tool_name` optional)
    answers the calls before it in order, so each gets the id of the call it answers. The
    ids are made from the call's place (call_<message>_<call>), not drawn: the same
    conversation is the same prompt on every turn, so its answer and its prompt cache
    hold."""
    if v is None:
        return []
    if not isinstance(v, list):
        raise bad("messages must be a list", "messages", "invalid_type")
    out: list[dict] = []
    pending: list[str] = []                     # ids of calls not yet answered, in order
    for i, m in enumerate(v):
        p = f"messages[{i}]"
        if not isinstance(m, dict):
            raise bad(f"{p} must be an object", p, "invalid_type")
        role = m.get("role")
        if role not in ROLES:
            raise bad(f"{p}.role must be one of {', '.join(ROLES)}, got {show(role)}",
                      f"{p}.role", "invalid_value")
        content = m.get("content", "")
        if content is None:
            content = ""
        if not isinstance(content, str):
            raise bad(f"{p}.content must be a string", f"{p}.content", "invalid_type")
        images = parse_images(m.get("images"), f"{p}.images")
        msg: dict = {"role": role, "content": with_images(content, images, f"{p}.content")}
        if images:
            msg["images"] = images
        if role == "assistant" and m.get("tool_calls"):
            msg["tool_calls"] = [_call(c, f"{p}.tool_calls[{k}]", f"call_{i}_{k}")
                                 for k, c in enumerate(_list(m["tool_calls"], p))]
            pending = [c["id"] for c in msg["tool_calls"]]
        elif role == "tool":
            msg["tool_call_id"] = pending.pop(0) if pending else f"call_{i}"
            name = m.get("tool_name", m.get("name"))
            if isinstance(name, str) and name:
                msg["name"] = name
        out.append(msg)
    return out


def parse_images(v: Any, param: str) -> list[tuple[bytes, str]]:
    """Ollama's images (base64 strings) as (bytes, parameter) pairs; their places in the
    text are media markers before it, as Ollama puts a message's images before its text."""
    if v is None:
        return []
    if not isinstance(v, list):
        raise bad(f"{param} must be a list of base64 strings", param, "invalid_type")
    return [(media.from_base64(b, f"{param}[{i}]"), f"{param}[{i}]") for i, b in enumerate(v)]


def with_images(text: str, images: list, param: str) -> str:
    """A message's text with its images' media markers before it (none: the text)."""
    return MARKER * len(images) + media.marked(text, param) if images else text


def _list(v: Any, p: str) -> list:
    if not isinstance(v, list):
        raise bad(f"{p}.tool_calls must be a list", f"{p}.tool_calls", "invalid_type")
    return v


def _call(c: Any, p: str, made: str) -> dict:
    f = c.get("function") if isinstance(c, dict) else None
    if not isinstance(f, dict) or not isinstance(f.get("name"), str) \
            or not isinstance(f.get("arguments", {}), (dict, str)):
        raise bad(f"{p} must be {{\"function\": {{\"name\": ..., \"arguments\": {{...}}}}}}", p,
                  "invalid_value")
    args = f.get("arguments", {})
    cid = c.get("id")
    return {"id": cid if isinstance(cid, str) and cid else made, "type": "function",
            "function": {"name": f["name"],
                         "arguments": args if isinstance(args, str) else
                         json.dumps(args, ensure_ascii=False)}}


def model_name(body: dict) -> str:
    model = body.get("model", body.get("name"))     # older clients say "name"
    if model is None or model == "":
        raise bad("model is required", "model", "missing_required_parameter")
    if not isinstance(model, str):
        raise bad("model must be a string", "model", "invalid_type")
    return model


def json_object(body: Any) -> dict:
    if not isinstance(body, dict):
        raise bad("the request body must be a JSON object", None, "invalid_type")
    return body


def refuse_unserved(body: dict) -> None:
    """What neither /api/chat nor /api/generate serves."""
    if body.get("think") not in (None, False):
        raise bad("think is not supported: the models Hotseat runs here do not think "
                  "apart from their answer", "think", "unsupported_parameter")
    if body.get("logprobs") not in (None, False) or body.get("top_logprobs") not in (None, 0):
        raise bad("logprobs are not supported on Ollama's API in this build", "logprobs",
                  "unsupported_parameter")


def ns(seconds: float) -> int:
    return max(0, int(round(seconds * 1e9)))


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat().replace("+00:00", "Z")


def file_time(path: str) -> str:
    try:
        t = os.stat(path).st_mtime
    except OSError:
        t = 0.0
    return datetime.fromtimestamp(t, timezone.utc).isoformat().replace("+00:00", "Z")


def human_count(n: int) -> str:
    for unit, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= scale:
            v = n / scale
            return f"{v:.1f}{unit}" if v < 100 and unit in "TB" else f"{v:.0f}{unit}"
    return str(n)


def quant_name(file_type: Any) -> str:
    if file_type is None:
        return "unknown"
    try:
        from gguf import LlamaFileType
        name = LlamaFileType(int(file_type)).name
    except (ImportError, ValueError):
        return str(file_type)
    return name.removeprefix("MOSTLY_").removeprefix("ALL_")


@dataclasses.dataclass
class FileFacts:
    """What /api/tags and /api/show tell of a GGUF file, read once."""
    size: int
    modified_at: str
    digest: str
    parameters: int
    info: dict                            # the scalar metadata
    template: str


def read_facts(path: str, verbose: bool = False) -> tuple[FileFacts, dict]:
    """The file's facts, and with verbose its array metadata too (the vocabulary...)."""
    from ..formats.gguf_file import GGUFFile

    st = os.stat(path)
    with GGUFFile(path) as g:
        params = sum(t.n_elements for t in g.tensors.values())
        info = {k: v for k, v in g.metadata.items() if isinstance(v, (str, int, float, bool))}
        arrays = {k: v for k, v in g.metadata.items() if k not in info} if verbose else {}
        template = g.get("tokenizer.chat_template") or ""
    # not the file's hash, which would read gigabytes: an id of its path, size and time
    digest = hashlib.sha256(f"{os.path.abspath(path)}\0{st.st_size}\0{st.st_mtime_ns}"
                            .encode()).hexdigest()
    info.setdefault("general.parameter_count", params)
    return FileFacts(st.st_size, file_time(path), digest, params, info,
                     template if isinstance(template, str) else ""), arrays


def shorten(v: list[float], dims: int) -> list[float]:
    """The first dims values, normalized again (Ollama's `dimensions`)."""
    if dims > len(v):
        raise bad(f"dimensions must be at most the model's {len(v)}, got {dims}",
                  "dimensions", "invalid_value")
    v = v[:dims]
    norm = math.sqrt(sum(x * x for x in v)) or 1.0
    return [x / norm for x in v]
