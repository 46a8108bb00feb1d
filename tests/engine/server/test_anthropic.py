"""Anthropic's Messages API against a real `hotseat serve` (a separate process, the bundled
SmolLM2), driven by the official `anthropic` client: answers equal the same server's chat
completions, streamed and not, stop sequences, a tool round trip, count_tokens, and errors
in the API's shape."""
from __future__ import annotations

import json
import urllib.error
import urllib.request

import anthropic
import jsonschema
import openai
import pytest

from tests.helpers.served import served

pytestmark = pytest.mark.gpu

KEY = "test-key"
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
WEATHER = {"name": "get_weather", "description": "The current weather in a city",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string"}},
                            "required": ["city"]}}
T0 = {"temperature": 0}        # the client's own signature no longer takes sampling settings
USE_TOOL = [{"role": "user", "content": "Use the get_weather tool to find the weather in Paris."}]


@pytest.fixture(scope="module")
def base(smollm2_path):
    with served("--ctx", "1024", "--api-key", KEY, "-m", smollm2_path) as url:
        yield url


@pytest.fixture(scope="module")
def client(base) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=base, api_key=KEY, max_retries=0, timeout=600)


@pytest.fixture(scope="module")
def oai(base) -> openai.OpenAI:
    return openai.OpenAI(base_url=base + "/v1", api_key=KEY, max_retries=0, timeout=600)


@pytest.fixture(scope="module")
def model(oai) -> str:
    return oai.models.list().data[0].id


def test_a_message_is_the_chat_answer(client, oai, model):
    m = client.messages.create(model=model, max_tokens=12, extra_body=T0,
                               system="Answer in one short sentence.", messages=QUESTION)
    ref = oai.chat.completions.create(model=model, max_tokens=12, extra_body=T0, messages=[
        {"role": "system", "content": "Answer in one short sentence."}, *QUESTION])
    assert m.type == "message" and m.role == "assistant" and m.id.startswith("msg_")
    assert [b.type for b in m.content] == ["text"]
    assert m.content[0].text == ref.choices[0].message.content
    assert m.stop_reason == {"length": "max_tokens", "stop": "end_turn"}[
        ref.choices[0].finish_reason]
    assert m.usage.input_tokens + m.usage.cache_read_input_tokens == ref.usage.prompt_tokens
    assert m.usage.output_tokens == ref.usage.completion_tokens


def test_the_stream_gives_the_same_message(client, model):
    kw = dict(model=model, max_tokens=12, extra_body=T0, messages=QUESTION)
    whole = client.messages.create(**kw)
    with client.messages.stream(**kw) as s:
        kinds = [e.type for e in s]
        final = s.get_final_message()
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert "content_block_start" in kinds and "content_block_stop" in kinds
    assert final.content[0].text == whole.content[0].text
    assert final.stop_reason == whole.stop_reason
    assert final.usage.output_tokens == whole.usage.output_tokens


def test_a_stop_sequence_is_named(client, model):
    whole = client.messages.create(model=model, max_tokens=12, extra_body=T0,
                                   messages=QUESTION).content[0].text
    word = whole.split()[2]
    m = client.messages.create(model=model, max_tokens=12, extra_body=T0, messages=QUESTION,
                               stop_sequences=[word, "zzz-never"])
    assert m.stop_reason == "stop_sequence" and m.stop_sequence == word
    assert whole.startswith(m.content[0].text) and word not in m.content[0].text


def test_a_tool_round_trip(client, model):
    """tool_use with the server's own id and valid input; the result back as a tool_result
    block; then an answer in words."""
    m = client.messages.create(model=model, max_tokens=64, extra_body=T0, messages=USE_TOOL,
                               tools=[WEATHER], tool_choice={"type": "any"})
    assert m.stop_reason == "tool_use"
    uses = [b for b in m.content if b.type == "tool_use"]
    assert len(uses) >= 1 and uses[0].name == "get_weather" and uses[0].id.startswith("toolu_")
    jsonschema.validate(uses[0].input, WEATHER["input_schema"])
    with client.messages.stream(model=model, max_tokens=64, extra_body=T0, messages=USE_TOOL,
                                tools=[WEATHER], tool_choice={"type": "any"}) as s:
        streamed = s.get_final_message()
    assert streamed.stop_reason == "tool_use"
    assert [(b.name, b.input) for b in streamed.content if b.type == "tool_use"] == \
        [(b.name, b.input) for b in uses]
    msgs = USE_TOOL + [
        {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in m.content]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": u.id,
                                      "content": "18 C, clear"} for u in uses]}]
    final = client.messages.create(model=model, max_tokens=128, extra_body=T0, messages=msgs,
                                   tools=[WEATHER], tool_choice={"type": "none"})
    assert final.stop_reason == "end_turn"
    assert [b.type for b in final.content] == ["text"] and final.content[0].text.strip()


def test_a_named_tool_without_parallel_calls(client, model):
    m = client.messages.create(
        model=model, max_tokens=64, extra_body={"temperature": 1.0}, messages=USE_TOOL,
        tools=[WEATHER], tool_choice={"type": "tool", "name": "get_weather",
                                      "disable_parallel_tool_use": True})
    assert m.stop_reason == "tool_use"
    assert [b.name for b in m.content if b.type == "tool_use"] == ["get_weather"]


def test_count_tokens(client, model, oai):
    n = client.messages.count_tokens(model=model, messages=QUESTION)
    ref = oai.chat.completions.create(model=model, max_tokens=1, messages=QUESTION)
    assert n.input_tokens == ref.usage.prompt_tokens


@pytest.mark.parametrize("body,words", [
    ({"messages": QUESTION}, "max_tokens is required"),
    ({"max_tokens": 8, "messages": [{"role": "system", "content": "x"}]}, "messages[0].role"),
    ({"max_tokens": 8, "messages": [{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                     "data": "aGk="}}]}]}, "images"),
    ({"max_tokens": 8, "messages": QUESTION, "temperature": 1.5}, "temperature"),
    ({"max_tokens": 8, "messages": QUESTION, "tools": [{"type": "web_search_20250305",
                                                        "name": "web_search"}]}, "tools[0]"),
    ({"max_tokens": 10 ** 6, "messages": QUESTION}, "max_tokens is too large"),
    ({"max_tokens": 8, "messages": QUESTION, "tool_choice": {"type": "sometimes"}},
     "tool_choice"),
])
def test_errors_have_the_apis_shape(base, model, body, words):
    req = urllib.request.Request(base + "/v1/messages", method="POST",
                                 data=json.dumps({"model": model, **body}).encode(),
                                 headers={"Content-Type": "application/json", "x-api-key": KEY,
                                          "anthropic-version": "2023-06-01"})
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=60)
    assert e.value.code == 400
    got = json.loads(e.value.read())
    assert got["type"] == "error" and got["error"]["type"] == "invalid_request_error"
    assert words in got["error"]["message"]


def test_unknown_model_and_wrong_key(base, model):
    with pytest.raises(anthropic.NotFoundError) as e:
        anthropic.Anthropic(base_url=base, api_key=KEY, max_retries=0).messages.create(
            model="nope", max_tokens=4, messages=QUESTION)
    assert e.value.response.json()["error"]["type"] == "not_found_error"
    with pytest.raises(anthropic.AuthenticationError) as e:
        anthropic.Anthropic(base_url=base, api_key="wrong", max_retries=0).messages.create(
            model=model, max_tokens=4, messages=QUESTION)
    assert json.loads(e.value.response.text)["error"]["type"] == "authentication_error"
