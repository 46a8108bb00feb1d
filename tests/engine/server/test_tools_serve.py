"""Tool calling and /v1/responses over HTTP with the official openai client.

Two servers: one over an engine that answers a scripted text (a model that calls tools, in
the generic format a template without tools gets), which shows the calls' shape whole and
streamed; and one over the real engine and SmolLM2, whose answers must be the engine's own
for the prompt the tools make (SmolLM2 rarely calls a tool: where it does, the call parses).
Generation is slow on lavapipe: the real-model tests ask for a few tokens each."""
from __future__ import annotations

import json
import re

import openai
import pytest

from engine.facade import Request
from engine.server.app import make_app
from engine.server.chat_tools import parse_tools
from engine.server.openai import parse_request
from engine.text.sampling import SamplingParams
from tests.engine.server.test_serve import ServerThread, assert_error, request
from tests.helpers.fake_engine import FakeCompletion, FakeEngine, FakeTokenizer

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "The time in a time zone",
    "parameters": {"type": "object", "properties": {"zone": {"type": "string"}}}}}
ASK = [{"role": "user", "content": "What is the weather in Paris and the time in Tokyo?"}]
TWO_CALLS = ('{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}, '
             '"id": "call_w1"}, {"name": "get_time", "arguments": {"zone": "Asia/Tokyo"}, '
             '"id": "call_t2"}]}')


SEEN_IDS: set[str] = set()


def assert_server_ids(ids: list[str]) -> None:
    """The server makes every call's id, unique across answers: the ids the model wrote
    (call_w1, call_t2) never reach the client."""
    assert all(re.fullmatch(r"call_[0-9a-f]{24}", i) for i in ids), ids
    assert len(set(ids)) == len(ids) and not SEEN_IDS & set(ids)
    SEEN_IDS.update(ids)


class ScriptTokenizer(FakeTokenizer):
    add_bos = add_eos = False


class ScriptedEngine(FakeEngine):
    """Answers `script`, four characters a piece, and keeps the prompts it was given."""

    script = ""
    finish = "stop"

    def tokenizer(self, name=None):
        self._get(name)
        return ScriptTokenizer()

    def generate(self, request, on_text=None, cancel=None):
        self.calls.append(("generate", request.name))
        text = self.script
        for i in range(0, len(text), 4):
            if on_text is not None:
                on_text(text[i:i + 4])
        out = FakeCompletion(list(request.tokens or [1]), text)
        out.finish_reason = self.finish
        return out


@pytest.fixture(scope="module")
def scripted(smollm2_path):
    eng = ScriptedEngine()
    eng.load(smollm2_path, name="m")
    srv = ServerThread([make_app(eng, ["m"])])
    yield eng, f"http://127.0.0.1:{srv.ports[0]}"
    srv.close()


@pytest.fixture
def fake(scripted):
    eng, base = scripted
    return eng, openai.OpenAI(base_url=base + "/v1", api_key="x", max_retries=0, timeout=60)


def test_calls_come_back_as_tool_calls(fake):
    eng, client = fake
    eng.script = TWO_CALLS
    r = client.chat.completions.create(model="m", messages=ASK, tools=[WEATHER, TIME])
    c = r.choices[0]
    assert c.finish_reason == "tool_calls" and c.message.content is None
    calls = c.message.tool_calls
    assert [(t.type, t.function.name, json.loads(t.function.arguments)) for t in calls] \
        == [("function", "get_weather", {"city": "Paris"}),
            ("function", "get_time", {"zone": "Asia/Tokyo"})]
    assert_server_ids([t.id for t in calls])
    # parallel_tool_calls=false keeps one
    r = client.chat.completions.create(model="m", messages=ASK, tools=[WEATHER, TIME],
                                       parallel_tool_calls=False, tool_choice="required")
    assert [t.function.name for t in r.choices[0].message.tool_calls] == ["get_weather"]
    # tool_choice none: the text is content, nothing is parsed
    r = client.chat.completions.create(model="m", messages=ASK, tools=[WEATHER],
                                       tool_choice="none")
    assert r.choices[0].message.content == TWO_CALLS and not r.choices[0].message.tool_calls
    assert r.choices[0].finish_reason == "stop"


@pytest.mark.parametrize("script,content", [
    ('{"tool_calls": [{"name": "get_weather", "arguments": {"ci', ""),    # a call, cut
    ('{"tool_call": {"name": "get_wea', ""),
    ('{"response": "It is sunny in Par', "It is sunny in Par"),          # a reply, cut
])
def test_a_call_cut_short_never_reaches_the_client_as_content(fake, script, content):
    """At max_tokens mid-call: finish_reason "length", and the content is the text before
    the call (none here), never the call's raw JSON; in the answer, its stream and
    /v1/responses alike. A reply cut short keeps what it wrote."""
    eng, client = fake
    eng.script, eng.finish = script, "length"
    try:
        r = client.chat.completions.create(model="m", messages=ASK, tools=[WEATHER])
        c = r.choices[0]
        assert c.finish_reason == "length" and not c.message.tool_calls
        assert (c.message.content or "") == content
        chunks = list(client.chat.completions.create(model="m", messages=ASK, tools=[WEATHER],
                                                     stream=True))
        assert "".join(ch.choices[0].delta.content or "" for ch in chunks) == content
        assert chunks[-1].choices[0].finish_reason == "length"
        flat = [{"type": "function", **WEATHER["function"]}]
        for stream in (False, True):
            got = client.responses.create(model="m", input="weather?", tools=flat,
                                          stream=stream)
            if stream:
                got = [e for e in got if e.type == "response.incomplete"][0].response
            assert got.status == "incomplete"
            assert [o.type for o in got.output] == ["message"]
            assert got.output[0].content[0].text == content
    finally:
        eng.finish = "stop"


def test_streamed_calls_have_openai_chunk_shape(fake):
    eng, client = fake
    eng.script = TWO_CALLS
    chunks = list(client.chat.completions.create(model="m", messages=ASK,
                                                 tools=[WEATHER, TIME], stream=True))
    calls: dict[int, dict] = {}
    for ch in chunks[:-1]:
        for d in ch.choices[0].delta.tool_calls or []:
            if d.id is not None:                      # the first delta of a call
                assert d.index not in calls and d.type == "function" and d.function.name
                calls[d.index] = {"id": d.id, "name": d.function.name, "args": ""}
            calls[d.index]["args"] += d.function.arguments or ""
        assert ch.choices[0].finish_reason is None
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    assert [(c["name"], json.loads(c["args"])) for c in calls.values()] == \
        [("get_weather", {"city": "Paris"}), ("get_time", {"zone": "Asia/Tokyo"})]
    assert_server_ids([c["id"] for c in calls.values()])
    assert not any(ch.choices[0].delta.content for ch in chunks)   # the JSON is not content


def test_plain_answers_stream_as_content(fake):
    eng, client = fake
    eng.script = '{"response": "It is sunny in Paris."}'
    r = client.chat.completions.create(model="m", messages=ASK, tools=[WEATHER])
    assert r.choices[0].message.content == "It is sunny in Paris."
    assert r.choices[0].finish_reason == "stop" and not r.choices[0].message.tool_calls
    eng.script = "No JSON here, just text."
    chunks = list(client.chat.completions.create(model="m", messages=ASK, tools=[WEATHER],
                                                 stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == eng.script
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_tool_results_go_back_in(fake):
    eng, client = fake
    eng.script = '{"response": "18 C"}'
    msgs = ASK + [{"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_w1", "type": "function",
         "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_w1", "content": "18 C, clear"}]
    r = client.chat.completions.create(model="m", messages=msgs, tools=[WEATHER])
    assert r.choices[0].message.content == "18 C"
    # without tools, a conversation with tool messages is still taken
    r = client.chat.completions.create(model="m", messages=msgs)
    assert r.choices[0].message.content == eng.script


def test_responses_function_calls_and_events(fake):
    eng, client = fake
    eng.script = TWO_CALLS
    flat = [{"type": "function", **t["function"]} for t in (WEATHER, TIME)]
    r = client.responses.create(model="m", input="weather?", tools=flat)
    assert r.status == "completed" and r.object == "response"
    assert [(o.type, o.name, json.loads(o.arguments)) for o in r.output] == [
        ("function_call", "get_weather", {"city": "Paris"}),
        ("function_call", "get_time", {"zone": "Asia/Tokyo"})]
    assert_server_ids([o.call_id for o in r.output])
    events = list(client.responses.create(model="m", input="weather?", tools=flat,
                                          stream=True))
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] == "response.completed"
    assert kinds.count("response.output_item.added") == 2
    assert kinds.count("response.function_call_arguments.done") == 2
    assert [e.sequence_number for e in events] == list(range(len(events)))
    args = {}
    for e in events:
        if e.type == "response.function_call_arguments.delta":
            args[e.output_index] = args.get(e.output_index, "") + e.delta
    assert [json.loads(a) for a in args.values()] == [{"city": "Paris"},
                                                      {"zone": "Asia/Tokyo"}]
    final = events[-1].response
    assert [o.arguments for o in final.output] == list(args.values())
    # a function_call and its output given back as input
    eng.script = '{"response": "18 C in Paris"}'
    r = client.responses.create(model="m", tools=flat, input=[
        {"role": "user", "content": "weather?"},
        {"type": "function_call", "call_id": "call_w1", "name": "get_weather",
         "arguments": '{"city": "Paris"}'},
        {"type": "function_call_output", "call_id": "call_w1", "output": "18 C"}])
    assert r.output_text == "18 C in Paris"


BAD_CHAT = [
    ({"tools": {"type": "function"}}, "tools"),
    ({"tools": [{"type": "retrieval"}]}, "tools[0].type"),
    ({"tools": [{"type": "function", "function": {"name": "has space"}}]},
     "tools[0].function.name"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": "x"}}]},
     "tools[0].function.parameters"),
    ({"tools": [WEATHER], "tool_choice": "sometimes"}, "tool_choice"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function",
                                          "function": {"name": "nope"}}}, "tool_choice"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": [WEATHER], "parallel_tool_calls": "yes"}, "parallel_tool_calls"),
    ({"messages": [{"role": "tool", "content": "x"}]}, "messages[0].tool_call_id"),
    ({"messages": [{"role": "assistant", "tool_calls": [{"function": 3}]}]},
     "messages[0].tool_calls[0]"),
]


@pytest.mark.parametrize("extra,param", BAD_CHAT)
def test_bad_tools_are_400s_naming_the_parameter(scripted, extra, param):
    _, base = scripted
    got, _, body = request(base, "POST", "/v1/chat/completions",
                           {"model": "m", "messages": ASK, **extra}, key=None)
    assert_error(400, got, body, param)


@pytest.mark.parametrize("body,param", [
    ({"input": "hi", "store": True}, "store"),
    ({"input": "hi", "previous_response_id": "resp_1"}, "previous_response_id"),
    ({"input": "hi", "tools": [{"type": "web_search"}]}, "tools[0].type"),
    ({}, "input"),
    ({"input": [{"type": "image_generation_call"}]}, "input[0].type"),
    ({"input": "hi", "max_output_tokens": 0}, "max_output_tokens"),
    ({"input": "hi", "instructions": 5}, "instructions"),
])
def test_bad_responses_are_400s(scripted, body, param):
    _, base = scripted
    got, _, out = request(base, "POST", "/v1/responses", {"model": "m", **body}, key=None)
    assert_error(400, got, out, param)


def test_tools_only_on_chat(scripted):
    _, base = scripted
    got, _, body = request(base, "POST", "/v1/completions",
                           {"model": "m", "prompt": "x", "tools": [WEATHER]}, key=None)
    assert_error(400, got, body, "tools")


# -- the real engine and SmolLM2 ------------------------------------------------------------

GREEDY = SamplingParams(temperature=0.0)
N = 6                      # tokens per generation


@pytest.fixture(scope="module")
def real(smollm2_path):
    from engine.api import Engine

    eng = Engine(n_ctx=1024)
    eng.load(smollm2_path, name="smol")
    srv = ServerThread([make_app(eng, ["smol"])])
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{srv.ports[0]}/v1", api_key="x",
                           max_retries=0, timeout=600)
    yield eng, client
    srv.close()
    eng.close()


@pytest.fixture(scope="module")
def tool_ref(real):
    """The engine's own greedy answer to the prompt that ASK with tools makes."""
    eng, _ = real
    req = parse_request({"messages": ASK, "tools": [WEATHER]}, chat=True)
    ids = req.tools.prompt(eng, "smol", req.messages)
    constraint = {} if req.tools.constraint is None else {"constraint": req.tools.constraint}
    out = eng.generate(Request("smol", tokens=ids, max_tokens=N, sampling=GREEDY,
                               preserved_tokens=req.tools.preserved, **constraint))
    return req.tools, ids, out


@pytest.mark.gpu
def test_real_chat_with_tools_is_the_engines_answer(real, tool_ref):
    eng, client = real
    tools, ids, out = tool_ref
    text = eng.tokenizer("smol").decode(ids, special=True)
    assert "get_weather" in text and "Respond in JSON format" in text   # tools in the prompt
    r = client.chat.completions.create(model="smol", messages=ASK, tools=[WEATHER],
                                       temperature=0, max_tokens=N)
    want, called = tools.message(out.text, out.finish_reason == "length")
    got = r.choices[0].message
    assert r.usage.prompt_tokens == len(ids)
    assert got.content == want["content"]
    assert r.choices[0].finish_reason == ("tool_calls" if called else out.finish_reason)
    for t in got.tool_calls or []:
        assert t.function.name == "get_weather" and isinstance(
            json.loads(t.function.arguments), dict)
    # streamed: the same answer, in pieces
    chunks = list(client.chat.completions.create(model="smol", messages=ASK, tools=[WEATHER],
                                                 temperature=0, max_tokens=N, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == (got.content or "")
    assert chunks[-1].choices[0].finish_reason == r.choices[0].finish_reason


@pytest.mark.gpu
def test_real_tool_round_trip_renders_and_answers(real):
    eng, client = real
    msgs = ASK + [{"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_w1", "type": "function",
         "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_w1", "content": "18 C, clear"}]
    req = parse_request({"messages": msgs, "tools": [WEATHER]}, chat=True)
    text = eng.tokenizer("smol").decode(req.tools.prompt(eng, "smol", req.messages),
                                        special=True)
    assert '"tool_response"' in text and "18 C, clear" in text and '"city": "Paris"' in text
    r = client.chat.completions.create(model="smol", messages=msgs, tools=[WEATHER],
                                       temperature=0, max_tokens=2)
    assert r.choices[0].message.role == "assistant" and r.usage.completion_tokens <= 2


@pytest.mark.gpu
def test_real_responses_text_and_events(real):
    eng, client = real
    instr = "Answer in one short sentence."
    ref = eng.generate(Request("smol", messages=[{"role": "system", "content": instr}] + ASK,
                               max_tokens=N, sampling=GREEDY))
    r = client.responses.create(model="smol", instructions=instr, input=ASK[0]["content"],
                                temperature=0, max_output_tokens=N)
    assert r.output_text == ref.text and r.instructions == instr
    assert r.usage.input_tokens == len(ref.prompt_tokens)
    assert r.usage.output_tokens == len(ref.tokens)
    assert r.status == ("incomplete" if ref.finish_reason == "length" else "completed")
    events = list(client.responses.create(model="smol", instructions=instr,
                                          input=ASK[0]["content"], temperature=0,
                                          max_output_tokens=N, stream=True))
    kinds = [e.type for e in events]
    assert kinds[:4] == ["response.created", "response.in_progress",
                         "response.output_item.added", "response.content_part.added"]
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done",
                          "response.output_item.done",
                          "response.incomplete" if ref.finish_reason == "length"
                          else "response.completed"]
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == ref.text == events[-1].response.output[0].content[0].text


def test_parse_tools_flat_and_nested_agree():
    nested = parse_tools({"tools": [WEATHER], "tool_choice": {
        "type": "function", "function": {"name": "get_weather"}}})
    flat = parse_tools({"tools": [{"type": "function", **WEATHER["function"]}],
                        "tool_choice": {"type": "function", "name": "get_weather"}}, flat=True)
    assert nested.tools == flat.tools and nested.named == flat.named == "get_weather"
    assert nested.choice == flat.choice == "required"


class _HermesModel:
    """What ToolRequest.prompt reads of an engine, for a Qwen-style model whose call markers
    are control tokens: its chat template and a byte-fallback vocabulary."""

    def __init__(self):
        from engine.text.chat import ChatTemplate
        from engine.text.tokenizer import Tokenizer
        from tests.engine.text.test_toolcalls import QWEN_TEMPLATE

        ctl = ["<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>"]
        tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + ctl
        self.tok = Tokenizer(model="llama", pre="default", tokens=tokens,
                             token_types=[2, 3, 3] + [6] * 256 + [3] * len(ctl),
                             scores=[0.0] * len(tokens), merges=None, bos_id=1, eos_id=2,
                             add_space_prefix=False)
        self.template = ChatTemplate(QWEN_TEMPLATE)

    def chat_template(self, name):
        return self.template

    def tokenizer(self, name):
        return self.tok

    def prompt_tokens(self, name, prompt=None, messages=None, images=(), template_args=None):
        return self.template.tokenize(self.tok, messages, **(template_args or {}))


@pytest.mark.parametrize("choice,lazy", [("auto", True), ("required", False)])
def test_a_call_begun_under_auto_keeps_to_the_call_grammar(choice, lazy):
    """Under auto the answer is free until the model writes the call's start marker (one
    token): from it on, the call grammar holds, as when a call is required. Its sampling
    keeps the client's penalties while the text is free."""
    from engine.text.constrain import Constraint

    model = _HermesModel()
    req = parse_request({"messages": ASK, "tools": [WEATHER], "tool_choice": choice,
                         "repeat_penalty": 1.3}, chat=True)
    req.tools.prompt(model, "m", req.messages)
    start = model.tok.token_id("<tool_call>")
    assert req.tools.constraint.triggers == ({start} if lazy else set())
    assert (req.tools.sampling(req.sampling).repeat_penalty == 1.3) == lazy
    c = Constraint(req.tools.constraint, model.tok)

    def ids(text: str) -> list[int]:                # one byte token each
        return [3 + b for b in text.encode()]
    free = ids("Let me look.")
    if lazy:
        for t in free:
            assert c.allowed().all()
            c.advance(t)
    else:
        assert not c.allowed()[free[0]]
    call = '\n{"name": "get_weather", "arguments": {"city": "Paris", "x": 1}}'
    c.advance(start)
    for t in ids(call[:call.index(', "x"')]):
        assert c.allowed()[t]
        c.advance(t)
    assert not c.allowed()[ids(",")[0]] and c.allowed()[ids("}")[0]]     # no other key
    c.close()
