"""Structured output over HTTP: a real `hotseat serve` (SmolLM2) driven by the official openai
client; every answer parses and validates with jsonschema. Few, short generations: lavapipe
decodes a few tokens a second."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

import jsonschema
import openai
import pydantic
import pytest

from engine.tools.serveproc import ServeProcess

pytestmark = [pytest.mark.gpu, pytest.mark.slow]

SCHEMAS = Path(__file__).parent.parent.parent / "data" / "schemas"
ASK = [{"role": "user", "content": "Give me an example as JSON."}]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with ServeProcess(["smollm2"], ctx=512,
                      arena_dir=str(tmp_path_factory.mktemp("arena"))) as s:
        s.wait_ready()
        yield s


@pytest.fixture(scope="module")
def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0,
                         timeout=600)


@pytest.fixture(scope="module")
def model(server) -> str:
    return server.names[0]


def schema(name: str) -> dict:
    return json.loads((SCHEMAS / f"{name}.json").read_text())


@pytest.mark.parametrize("name", ["nested", "enums", "arrays", "numbers"])
def test_chat_json_schema_validates(client, model, name):
    s = schema(name)
    r = client.chat.completions.create(
        model=model, messages=ASK, max_tokens=160, temperature=0.7, seed=7,
        response_format={"type": "json_schema",
                         "json_schema": {"name": name, "schema": s, "strict": True}})
    c = r.choices[0]
    assert c.finish_reason == "stop", c.message.content
    jsonschema.validate(json.loads(c.message.content), s)


def test_chat_json_object_streamed(client, model):
    stream = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "A person as JSON."}],
        max_tokens=120, temperature=0.0, stream=True,
        response_format={"type": "json_object"})
    text, finish = "", None
    for chunk in stream:
        if chunk.choices:
            text += chunk.choices[0].delta.content or ""
            finish = chunk.choices[0].finish_reason or finish
    if finish == "stop":
        assert isinstance(json.loads(text), dict)
    else:                   # greedy may run on past the tokens: still a valid object prefix
        assert finish == "length" and text.startswith("{")


class Pet(pydantic.BaseModel):
    name: str = pydantic.Field(max_length=12)
    kind: Literal["cat", "dog", "fish"]
    age: int = pydantic.Field(ge=0, le=30)


def test_chat_parse_with_a_pydantic_model(client, model):
    r = client.chat.completions.parse(
        model=model, messages=[{"role": "user", "content": "Describe a pet."}],
        max_tokens=60, temperature=0.0, response_format=Pet)
    msg = r.choices[0].message
    assert r.choices[0].finish_reason == "stop", msg.content
    assert isinstance(msg.parsed, Pet)
    assert Pet.model_validate_json(msg.content) == msg.parsed


def test_completions_grammar_and_json_schema(server, client, model):
    r = client.completions.create(model=model, prompt="Is the sky blue? Answer:",
                                  max_tokens=8, temperature=1.0, seed=3,
                                  extra_body={"grammar": 'root ::= " " ("yes" | "no")'})
    assert r.choices[0].text in (" yes", " no")
    assert r.choices[0].finish_reason == "stop"
    s = schema("enums")
    status, _, body = server.request("POST", "/v1/completions", {
        "model": model, "prompt": "A shirt in JSON:", "max_tokens": 60,
        "temperature": 0.0, "json_schema": s})
    assert status == 200, body
    jsonschema.validate(json.loads(body["choices"][0]["text"]), s)


BAD = [
    ("/v1/chat/completions", {"response_format": {"type": "xml"}}, "response_format"),
    ("/v1/chat/completions", {"response_format": "json"}, "response_format"),
    ("/v1/chat/completions", {"response_format": {"type": "json_schema"}},
     "response_format.json_schema"),
    ("/v1/chat/completions",
     {"response_format": {"type": "json_schema",
                          "json_schema": {"name": "x", "schema": {"type": "nope"}}}},
     "response_format.json_schema.schema"),
    ("/v1/completions", {"grammar": 'root ::= "a'}, "grammar"),
    ("/v1/completions", {"grammar": 5}, "grammar"),
    ("/v1/completions", {"json_schema": [1]}, "json_schema"),
    ("/v1/completions", {"grammar": 'root ::= "a"', "json_schema": {"type": "object"}},
     "json_schema"),
]


@pytest.mark.parametrize("path,extra,param", BAD)
def test_bad_structured_requests_are_400_naming_the_parameter(server, model, path, extra,
                                                            param):
    body = {"model": model, "max_tokens": 1, **extra}
    body.update({"messages": ASK} if "chat" in path else {"prompt": "x"})
    status, _, resp = server.request("POST", path, body)
    assert status == 400, resp
    assert resp["error"]["param"] == param, resp
