"""Tool calls of real models over HTTP, as a client sees them: SmolLM2 (a chat model whose
template knows no tools, so the generic JSON format) and Gemma 3 270M (a base model, the
same format). A call that is due must close inside an ordinary budget (max_tokens 64), at
temperature 0 and when sampled, with arguments valid against the function's schema and ids
the server made; the stream gives the same answer; a tool loop ends in text."""
from __future__ import annotations

import json

import jsonschema
import openai
import pytest

from engine.server.app import make_app
from tests.engine.server.test_serve import ServerThread
from tests.engine.server.test_tools_serve import WEATHER, assert_server_ids

pytestmark = pytest.mark.gpu

TIME = {"type": "function", "function": {
    "name": "get_time", "description": "The time in a time zone",
    "parameters": {"type": "object", "properties": {
        "zone": {"type": "string", "enum": ["Europe/Paris", "Asia/Tokyo", "UTC"]}},
        "required": ["zone"]}}}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in (WEATHER, TIME)}
REQUIRED = "required"
NAMED = {"type": "function", "function": {"name": "get_weather"}}
SAMPLED_RUNS = 20


@pytest.fixture(scope="module")
def client(smollm2_path, gemma3_path):
    from engine.api import Engine

    eng = Engine(n_ctx=1024)
    eng.load(smollm2_path, name="smol")
    eng.load(gemma3_path, name="gemma")
    srv = ServerThread([make_app(eng, ["smol", "gemma"])])
    yield openai.OpenAI(base_url=f"http://127.0.0.1:{srv.ports[0]}/v1", api_key="x",
                        max_retries=0, timeout=600)
    srv.close()
    eng.close()


def assert_called(choice, calls, names=("get_weather",)) -> None:
    """A finished call, or several: known names, arguments valid against their schema."""
    assert choice.finish_reason == "tool_calls", (choice.finish_reason, choice.message)
    assert calls and not choice.message.content
    for c in calls:
        assert c.type == "function" and c.function.name in names
        jsonschema.validate(json.loads(c.function.arguments), SCHEMAS[c.function.name])
    assert_server_ids([c.id for c in calls])


def streamed(client, **kw):
    """A streamed answer put back together: (finish_reason, content, [(id, name, args)])."""
    calls: dict[int, list] = {}
    content, finish = "", None
    for chunk in client.chat.completions.create(stream=True, **kw):
        ch = chunk.choices[0]
        content += ch.delta.content or ""
        for d in ch.delta.tool_calls or []:
            c = calls.setdefault(d.index, [None, "", ""])
            c[0] = d.id or c[0]
            c[1] += (d.function.name or "") if d.function else ""
            c[2] += (d.function.arguments or "") if d.function else ""
        finish = ch.finish_reason or finish
    return finish, content, [tuple(calls[i]) for i in sorted(calls)]


@pytest.mark.parametrize("model", ["smol", "gemma"])
@pytest.mark.parametrize("choice", [REQUIRED, NAMED], ids=["required", "named"])
def test_a_forced_call_closes_within_64_tokens(client, model, choice):
    """Gemma 3 270M, a base model, repeats a call for as long as parallel calls let it:
    after its second identical call, closing the list leads opening a third by 0.075 in
    log-probability (lavapipe on a GPU's decode paths), a near-tie a GPU's rounding takes
    the other way (a third call and the cut at 64). Its case asks for one call, which is what this test is about:
    the call closes. SmolLM2 keeps parallel calls on, as the sampled test does."""
    kw = dict(model=model, messages=ASK, tools=[WEATHER], tool_choice=choice,
              max_tokens=64, temperature=0)
    if model == "gemma":
        kw["parallel_tool_calls"] = False
    r = client.chat.completions.create(**kw)
    calls = r.choices[0].message.tool_calls
    assert_called(r.choices[0], calls)
    assert r.usage.completion_tokens < 64
    assert model != "gemma" or len(calls) == 1
    # streamed: the same calls (under ids of their own), the same end
    finish, content, got = streamed(client, **kw)
    assert finish == "tool_calls" and content == ""
    assert [(n, a) for _, n, a in got] == [(c.function.name, c.function.arguments)
                                           for c in calls]
    assert_server_ids([i for i, _, _ in got])


@pytest.mark.parametrize("choice", [REQUIRED, NAMED], ids=["required", "named"])
def test_a_forced_call_closes_when_sampled(client, choice):
    """At temperature 1, twenty seeds of twenty: with free whitespace, keys of the model's
    own and a model-written id in the grammar, most runs used to end at max_tokens."""
    ends = []
    for seed in range(SAMPLED_RUNS):
        r = client.chat.completions.create(model="smol", messages=ASK, tools=[WEATHER, TIME],
                                           tool_choice=choice, max_tokens=64, temperature=1.0,
                                           seed=seed)
        ends.append(r.choices[0].finish_reason)
        names = ("get_weather",) if choice is NAMED else ("get_weather", "get_time")
        assert_called(r.choices[0], r.choices[0].message.tool_calls, names)
    assert ends == ["tool_calls"] * SAMPLED_RUNS


def test_auto_calls_when_the_prompt_asks_for_the_tool(client):
    ask = [{"role": "user", "content": "Use the get_weather tool to find the weather in Paris."}]
    r = client.chat.completions.create(model="smol", messages=ask, tools=[WEATHER],
                                       max_tokens=64, temperature=0)
    assert_called(r.choices[0], r.choices[0].message.tool_calls)
    assert json.loads(r.choices[0].message.tool_calls[0].function.arguments) == {"city": "Paris"}


def test_a_tool_loop_ends_in_text(client):
    """Call, the tool's result back under the call's id, then an answer in words."""
    r = client.chat.completions.create(model="smol", messages=ASK, tools=[WEATHER],
                                       tool_choice=REQUIRED, max_tokens=64, temperature=0)
    call = r.choices[0].message.tool_calls[0]
    msgs = ASK + [r.choices[0].message.model_dump(exclude_none=True),
                  {"role": "tool", "tool_call_id": call.id, "content": "18 C, clear"}]
    final = client.chat.completions.create(model="smol", messages=msgs, tools=[WEATHER],
                                           tool_choice="none", max_tokens=128, temperature=0)
    assert final.choices[0].finish_reason == "stop"
    assert final.choices[0].message.content.strip() and not final.choices[0].message.tool_calls
