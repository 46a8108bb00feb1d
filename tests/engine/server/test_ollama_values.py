"""Ollama's request values as engine/server/ollama_values.py reads them: model names,
keep_alive, options. No device; the routes themselves are tested over HTTP in test_ollama.py."""
from __future__ import annotations

import math

import pytest

from engine.server.errors import ApiError
from engine.server.ollama_values import (
    OLLAMA_SAMPLING,
    shorten,
    match_names,
    ollama_name,
    parse_format,
    parse_keep_alive,
    parse_options,
)

LOADED = ["SmolLM2-135M-Instruct.Q4_1", "gemma-3-270m-Q4_K_M", "Qwen3-30B-A3B-Q4_K_M"]


@pytest.mark.parametrize("asked,found", [
    ("SmolLM2-135M-Instruct.Q4_1", ["SmolLM2-135M-Instruct.Q4_1"]),
    ("SmolLM2-135M-Instruct.Q4_1:latest", ["SmolLM2-135M-Instruct.Q4_1"]),
    ("smollm2", ["SmolLM2-135M-Instruct.Q4_1"]),
    ("smollm2:latest", ["SmolLM2-135M-Instruct.Q4_1"]),
    ("smollm2:135m", ["SmolLM2-135M-Instruct.Q4_1"]),
    ("library/smollm2", ["SmolLM2-135M-Instruct.Q4_1"]),
    ("gemma3", ["gemma-3-270m-Q4_K_M"]),
    ("gemma3:270m", ["gemma-3-270m-Q4_K_M"]),
    ("qwen3:30b-a3b", ["Qwen3-30B-A3B-Q4_K_M"]),
    ("smollm2:360m", []),          # a word the file does not have
    ("135m", []),                  # not the name's first word
    ("llama3.2", []),
    ("", []),
])
def test_model_names(asked, found):
    assert match_names(asked, LOADED) == found


def test_several_matches_are_all_returned():
    assert match_names("smollm2", ["SmolLM2-135M-Q8_0", "SmolLM2-360M-Q8_0"]) == \
        ["SmolLM2-135M-Q8_0", "SmolLM2-360M-Q8_0"]
    assert match_names("smollm2:360m", ["SmolLM2-135M-Q8_0", "SmolLM2-360M-Q8_0"]) == \
        ["SmolLM2-360M-Q8_0"]
    assert ollama_name("x") == "x:latest" and ollama_name("x:q8") == "x:q8"


@pytest.mark.parametrize("value,seconds", [
    (None, None), ("", None), (0, 0.0), ("0", 0.0), (30, 30.0), (2.5, 2.5), ("300", 300.0),
    ("5m", 300.0), ("1h30m", 5400.0), ("1.5s", 1.5), ("250ms", 0.25), (-1, math.inf),
    ("-1", math.inf), ("-1m", math.inf),
])
def test_keep_alive(value, seconds):
    assert parse_keep_alive(value) == seconds


@pytest.mark.parametrize("value", ["soon", "5 minutes", "m", "5x", True, [1], {"s": 1}])
def test_bad_keep_alive_names_it(value):
    with pytest.raises(ApiError) as exc:
        parse_keep_alive(value)
    assert exc.value.status == 400 and exc.value.param == "keep_alive"


def test_options():
    o = parse_options(None)
    assert o.sampling == OLLAMA_SAMPLING and o.num_predict == -1 and o.stop == []
    assert o.num_ctx is None and o.ignored == []
    o = parse_options({"temperature": 0, "top_k": 5, "top_p": 0.5, "min_p": 0.1, "seed": 42,
                       "repeat_penalty": 1.0, "repeat_last_n": -1, "num_predict": 7,
                       "stop": ["\n", ""], "num_ctx": 1024, "num_gpu": 99, "whatever": 1,
                       "mirostat": 0, "typical_p": 1.0})
    s = o.sampling
    assert (s.temperature, s.top_k, s.top_p, s.min_p, s.seed, s.repeat_penalty,
            s.repeat_last_n) == (0.0, 5, 0.5, 0.1, 42, 1.0, -1)
    assert o.num_predict == 7 and o.stop == ["\n"] and o.num_ctx == 1024
    assert o.ignored == ["num_gpu", "whatever"]
    assert parse_options({"seed": -1}).sampling.seed is None      # Ollama's "random"
    assert parse_options({"stop": "###"}).stop == ["###"]


@pytest.mark.parametrize("options,param", [
    ({"temperature": "hot"}, "options.temperature"),
    ({"temperature": -1}, "options.temperature"),
    ({"top_p": 0}, "options.top_p"),
    ({"top_k": 1.5}, "options.top_k"),
    ({"repeat_penalty": 0}, "options.repeat_penalty"),
    ({"num_ctx": 0}, "options.num_ctx"),
    ({"stop": [1]}, "options.stop"),
    ({"mirostat": 2}, "options.mirostat"),
    ({"typical_p": 0.5}, "options.typical_p"),
    ([], "options"),
])
def test_bad_options_name_the_option(options, param):
    with pytest.raises(ApiError) as exc:
        parse_options(options)
    assert exc.value.status == 400 and exc.value.param == param, exc.value.message


def test_format():
    assert parse_format(None) is None and parse_format("") is None
    assert parse_format("json") == {"type": "object"}
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    assert parse_format(schema) is schema
    with pytest.raises(ApiError):
        parse_format("yaml")


def test_dimensions_shorten_and_normalize():
    v = shorten([0.6, 0.0, 0.8, 0.0], 3)
    assert v == pytest.approx([0.6, 0.0, 0.8])
    v = shorten([3.0, 4.0, 12.0], 2)
    assert v == pytest.approx([0.6, 0.8])
    with pytest.raises(ApiError):
        shorten([1.0], 2)
