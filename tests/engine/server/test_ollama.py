"""Ollama's API against a real `hotseat serve` (a separate process, the bundled SmolLM2),
driven by the official `ollama` Python client and by raw HTTP. The answers are checked
against the same server's /v1 routes, whose own tests hold them to the engine. Generation is
slow on lavapipe, so every request generates a few tokens at most."""
from __future__ import annotations

import http.client
import json
import os
import time
import urllib.error
import urllib.request
from datetime import datetime, timedelta, timezone

import jsonschema
import numpy as np
import ollama
import openai
import pytest

from tests.helpers.served import served

pytestmark = pytest.mark.gpu

KEY = "test-key"
N_CTX = 256
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
GREEDY = {"temperature": 0, "repeat_penalty": 1.0}     # as /v1's greedy: no penalty either
TIMINGS = ("total_duration", "load_duration", "prompt_eval_count", "prompt_eval_duration",
           "eval_count", "eval_duration")


@pytest.fixture(scope="module")
def base(smollm2_path):
    """`hotseat serve` on a free port, with an API key."""
    with served("--ctx", str(N_CTX), "--api-key", KEY, "-m", smollm2_path) as url:
        yield url


@pytest.fixture(scope="module")
def client(base) -> ollama.Client:
    return ollama.Client(host=base, headers={"Authorization": f"Bearer {KEY}"}, timeout=300)


@pytest.fixture(scope="module")
def oai(base) -> openai.OpenAI:
    return openai.OpenAI(base_url=base + "/v1", api_key=KEY, max_retries=0, timeout=300)


@pytest.fixture(scope="module")
def name(oai) -> str:
    (model,) = oai.models.list().data
    return model.id


@pytest.fixture(scope="module")
def chat_ref(oai, name):
    """/v1's greedy answer to QUESTION, 6 tokens."""
    return oai.chat.completions.create(model=name, messages=QUESTION, temperature=0,
                                       max_tokens=6)


def call(base: str, method: str, path: str, body=None, key: str | None = KEY,
         raw: bytes | None = None):
    """(status, headers, body text) of one plain HTTP request."""
    data = raw if raw is not None else None if body is None else json.dumps(body).encode()
    h = {"Content-Type": "application/json"}
    if key is not None:
        h["Authorization"] = f"Bearer {key}"
    req = urllib.request.Request(base + path, data=data, method=method, headers=h)
    try:
        with urllib.request.urlopen(req, timeout=300) as resp:
            return resp.status, resp.headers, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers, exc.read().decode()


def ollama_error(got: int, status: int, text: str) -> str:
    """The message of an error in Ollama's shape, {"error": "..."}."""
    assert got == status, text
    body = json.loads(text)
    assert set(body) == {"error"} and isinstance(body["error"], str) and body["error"], body
    return body["error"]


def check_timings(final) -> None:
    for key in TIMINGS:
        assert isinstance(final[key], int) and final[key] >= 0, (key, final[key])
    assert final["prompt_eval_count"] > 0 and final["eval_count"] > 0
    assert final["prompt_eval_duration"] > 0 and final["eval_duration"] > 0
    assert final["total_duration"] >= final["prompt_eval_duration"] + final["eval_duration"]


# -- models ----------------------------------------------------------------------------------

def test_version(base):
    got, hdrs, text = call(base, "GET", "/api/version")
    assert got == 200 and hdrs["Content-Type"].startswith("application/json")
    version = json.loads(text)["version"]
    assert [int(p) for p in version.split(".")] >= [0, 5, 0]


def test_list(client, name, smollm2_path):
    (m,) = client.list().models
    assert m.model == f"{name}:latest"
    assert m.size == os.path.getsize(smollm2_path)
    assert len(m.digest) == 64 and int(m.digest, 16) >= 0
    assert m.details.format == "gguf" and m.details.family == "llama"
    assert m.details.families == ["llama"]
    assert m.details.parameter_size == "135M" and m.details.quantization_level == "Q4_1"
    assert abs(m.modified_at.timestamp() - os.path.getmtime(smollm2_path)) < 1


def test_show(client, name):
    for asked in ("smollm2", "smollm2:latest", f"{name}:latest", "SMOLLM2:135m"):
        info = client.show(asked)
        assert info.details.family == "llama"
        assert info.modelinfo["general.architecture"] == "llama"
        assert info.modelinfo["llama.context_length"] == 8192     # trained; served at N_CTX
        assert info.modelinfo["general.parameter_count"] > 100_000_000
        assert "completion" in info.capabilities
        assert "<|im_start|>" in info.template
        assert f"num_ctx {N_CTX}" in info.parameters


# -- chat and generate -----------------------------------------------------------------------

def test_chat_matches_v1(client, chat_ref):
    resp = client.chat(model="smollm2", messages=QUESTION, options={**GREEDY, "num_predict": 6})
    assert resp.model == "smollm2"                   # the name the client asked for
    assert resp.message.role == "assistant"
    assert resp.message.content == chat_ref.choices[0].message.content
    assert resp.done and resp.done_reason == chat_ref.choices[0].finish_reason
    assert resp.prompt_eval_count == chat_ref.usage.prompt_tokens
    assert resp.eval_count == chat_ref.usage.completion_tokens
    check_timings(resp)


def test_chat_streamed(client, chat_ref):
    parts = list(client.chat(model="smollm2:latest", messages=QUESTION, stream=True,
                             options={**GREEDY, "num_predict": 6}))
    *pieces, final = parts
    assert pieces and not any(p.done for p in pieces) and final.done
    assert all(p.message.role == "assistant" and p.message.content for p in pieces)
    assert "".join(p.message.content for p in pieces) == chat_ref.choices[0].message.content
    assert final.message.content == "" and final.done_reason == "length"
    assert final.eval_count == 6
    check_timings(final)


def test_generate_is_one_user_turn(client, oai, name):
    prompt = "Name a colour."
    ref = oai.chat.completions.create(model=name, messages=[{"role": "user", "content": prompt}],
                                      temperature=0, max_tokens=4)
    resp = client.generate(model="smollm2", prompt=prompt, options={**GREEDY, "num_predict": 4})
    assert resp.response == ref.choices[0].message.content
    assert resp.prompt_eval_count == ref.usage.prompt_tokens
    # context: the prompt's tokens and the answer's, to send back for a follow-up
    assert len(resp.context) == resp.prompt_eval_count + resp.eval_count
    check_timings(resp)


def test_generate_raw_and_system(client, oai, name):
    prompt = "The capital of France is"
    ref = oai.completions.create(model=name, prompt=prompt, temperature=0, max_tokens=3)
    resp = client.generate(model="smollm2", prompt=prompt, raw=True,
                           options={**GREEDY, "num_predict": 3})
    assert resp.response == ref.choices[0].text
    assert resp.prompt_eval_count == ref.usage.prompt_tokens
    assert resp.context is None                      # as Ollama: none with raw
    ref = oai.chat.completions.create(
        model=name, temperature=0, max_tokens=3,
        messages=[{"role": "system", "content": "Answer in French."},
                  {"role": "user", "content": "Hello"}])
    resp = client.generate(model="smollm2", prompt="Hello", system="Answer in French.",
                           options={**GREEDY, "num_predict": 3})
    assert resp.response == ref.choices[0].message.content


def test_ndjson_lines(base, client):
    """The raw stream: one JSON object per line, the last with the timings."""
    body = {"model": "smollm2", "prompt": "Count: one, two,", "raw": True,
            "options": {**GREEDY, "num_predict": 5}}
    got, hdrs, text = call(base, "POST", "/api/generate", body)
    assert got == 200 and hdrs["Content-Type"] == "application/x-ndjson"
    assert text.endswith("\n")
    lines = [json.loads(line) for line in text.splitlines()]
    *pieces, final = lines
    for p in pieces:
        assert set(p) == {"model", "created_at", "response", "done"} and p["done"] is False
        datetime.fromisoformat(p["created_at"].replace("Z", "+00:00"))
    assert final["done"] is True and final["response"] == ""
    assert final["done_reason"] == "length" and final["eval_count"] == 5
    check_timings(final)
    whole = client.generate(model="smollm2", prompt=body["prompt"], raw=True,
                            options=body["options"])
    assert "".join(p["response"] for p in pieces) == whole.response


def test_stop_and_seed(client):
    resp = client.generate(model="smollm2", prompt="1, 2, 3, 4,", raw=True,
                           options={**GREEDY, "num_predict": 8, "stop": [","]})
    assert "," not in resp.response and resp.done_reason == "stop"
    runs = [client.generate(model="smollm2", prompt="Once upon a time", raw=True,
                            options={"temperature": 1.0, "seed": 7, "num_predict": 4}).response
            for _ in range(2)]
    assert runs[0] == runs[1]


def test_num_ctx_narrows_and_truncates_the_chat(base):
    turns = [{"role": "user", "content": "Tell me about the history of the city of Paris."},
             {"role": "assistant", "content": "Paris is the capital of France, on the Seine, "
                                              "and has a long history."},
             {"role": "user", "content": "Hi"}]
    full = {"model": "smollm2", "messages": turns, "stream": False,
            "options": {**GREEDY, "num_predict": 1}}
    got, hdrs, text = call(base, "POST", "/api/chat", full)
    assert got == 200 and hdrs.get("X-Hotseat-Num-Ctx") is None
    n_full = json.loads(text)["prompt_eval_count"]
    short = {**full, "options": {**full["options"], "num_ctx": n_full - 5}}
    got, hdrs, text = call(base, "POST", "/api/chat", short)
    assert got == 200 and hdrs["X-Hotseat-Num-Ctx"] == str(n_full - 5)
    assert json.loads(text)["prompt_eval_count"] < n_full - 5       # older turns dropped
    got, _, text = call(base, "POST", "/api/chat", {**short, "truncate": False})
    assert "truncate is false" in ollama_error(got, 400, text)
    # a window larger than the loaded context is capped at it, and says so
    wide = {**full, "options": {**full["options"], "num_ctx": 100_000, "num_gpu": 99}}
    got, hdrs, _ = call(base, "POST", "/api/chat", wide)
    assert got == 200 and hdrs["X-Hotseat-Num-Ctx"] == str(N_CTX)
    assert hdrs["X-Hotseat-Ignored-Options"] == "num_gpu"


def metric(base: str, line_start: str) -> float:
    _, _, text = call(base, "GET", "/metrics", key=None)
    for line in text.splitlines():
        if line.startswith(line_start):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_a_client_that_leaves_cancels_the_stream(base, name):
    cancelled = f'hotseat_generations_cancelled_total{{model="{name}"}}'
    gone = 'hotseat_requests_total{endpoint="/api/chat",status="499"}'
    before, before_gone = metric(base, cancelled), metric(base, gone)
    port = int(base.rsplit(":", 1)[1])
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
    body = {"model": "smollm2", "options": {"temperature": 0},   # until the context is full
            "messages": [{"role": "user", "content": "Write a very long story about a cat."}]}
    conn.request("POST", "/api/chat", json.dumps(body), {"Authorization": f"Bearer {KEY}",
                                                         "Content-Type": "application/json"})
    resp = conn.getresponse()
    assert resp.status == 200
    first = json.loads(resp.readline())
    assert first["done"] is False and first["message"]["content"]
    conn.sock.shutdown(2)
    conn.close()
    deadline = time.monotonic() + 240
    while metric(base, cancelled) == before:
        assert time.monotonic() < deadline, "the generation was not cancelled"
        time.sleep(0.25)
    while metric(base, gone) == before_gone:
        assert time.monotonic() < deadline, "the stream that lost its client is not a 499"
        time.sleep(0.1)


# -- residency -------------------------------------------------------------------------------

def test_ps_and_keep_alive(client, base, name):
    """keep_alive 0 makes the model cold (not in ps); an empty prompt loads it; a duration
    is its idle time; -1 keeps it warm."""
    unload = client.generate(model="smollm2", prompt="", keep_alive=0)
    assert unload.done and unload.done_reason == "unload"
    assert client.ps().models == []
    state = json.loads(call(base, "GET", "/api/models")[2])["models"][0]["state"]
    assert state == "cold"                           # still loaded, still in /api/tags
    assert [m.model for m in client.list().models] == [f"{name}:latest"]

    load = client.chat(model="smollm2", messages=[], keep_alive="1s")
    assert load.done_reason == "load" and load.message.content == ""
    (m,) = client.ps().models
    assert m.model == f"{name}:latest" and m.size_vram > 0 and m.size >= m.size_vram
    assert m.context_length == N_CTX
    assert m.expires_at < datetime.now(timezone.utc) + timedelta(seconds=5)
    deadline = time.monotonic() + 30
    while client.ps().models and time.monotonic() < deadline:
        time.sleep(0.25)
    assert client.ps().models == []                  # the idle eviction took it

    resp = client.generate(model="smollm2", prompt="Hi", keep_alive=-1,
                           options={"num_predict": 1})
    again = client.generate(model="smollm2", prompt="Hi", options={"num_predict": 1})
    assert resp.load_duration > again.load_duration  # it was cold, then warm
    (m,) = client.ps().models
    assert m.expires_at > datetime.now(timezone.utc) + timedelta(days=365)
    time.sleep(1.5)
    assert len(client.ps().models) == 1


def test_keep_alive_zero_after_an_answer(client):
    resp = client.chat(model="smollm2", messages=QUESTION, keep_alive=0,
                       options={"num_predict": 1})
    assert resp.done and resp.eval_count == 1
    assert client.ps().models == []
    client.generate(model="smollm2", prompt="", keep_alive=-1)      # warm again
    assert len(client.ps().models) == 1


def test_a_pin_wins_over_keep_alive_zero(base, client, name):
    assert call(base, "POST", f"/api/models/{name}/pin")[0] == 200
    try:
        got, _, text = call(base, "POST", "/api/generate", {"model": "smollm2",
                                                            "keep_alive": 0})
        assert "pinned" in ollama_error(got, 409, text)
        got, hdrs, text = call(base, "POST", "/api/chat", {
            "model": "smollm2", "messages": QUESTION, "keep_alive": 0, "stream": False,
            "options": {"num_predict": 1}})
        assert got == 200 and json.loads(text)["done"], text
        assert hdrs["X-Hotseat-Keep-Alive"].startswith("pinned")
        assert len(client.ps().models) == 1
    finally:
        assert call(base, "POST", f"/api/models/{name}/unpin")[0] == 200


# -- what is not served ----------------------------------------------------------------------

def test_pull_and_the_model_store_are_501(client, base):
    with pytest.raises(ollama.ResponseError) as exc:
        client.pull("llama3.2")
    assert exc.value.status_code == 501 and "hotseat serve -m" in exc.value.error
    for method, path, body in (("POST", "/api/push", {"model": "x"}),
                               ("POST", "/api/create", {"model": "x", "from": "y"}),
                               ("POST", "/api/copy", {"source": "smollm2", "destination": "z"}),
                               ("POST", "/api/blobs/sha256:00", None)):
        got, _, text = call(base, method, path, body)
        assert "GGUF" in ollama_error(got, 501, text)


def test_format_constrains_the_answer_to_the_schema(client):
    """format with a JSON schema: the answer parses and validates (jsonschema), streamed or
    not; "json" gives a JSON object."""
    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12},
                                               "rank": {"type": "integer"}},
              "required": ["city", "rank"], "additionalProperties": False}
    r = client.chat(model="smollm2", messages=QUESTION, format=schema, options=GREEDY | {
        "num_predict": 40})
    assert r.done_reason == "stop"
    jsonschema.validate(json.loads(r.message.content), schema)
    text = "".join(p.response for p in client.generate(
        model="smollm2", prompt="Name a city.", format="json", stream=True,
        options=GREEDY | {"num_predict": 40}))
    assert isinstance(json.loads(text), dict)


WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}
USE_TOOL = [{"role": "user", "content": "Use the get_weather tool to find the weather in Paris."}]


def test_chat_tools_loop_with_the_ollama_client(client):
    """The ollama client's tool loop: a call in Ollama's shape (arguments an object), the
    same streamed, then the tool's result back and an answer in words."""
    r = client.chat(model="smollm2", messages=USE_TOOL, tools=[WEATHER],
                    options={"temperature": 0, "num_predict": 64})
    calls = r.message.tool_calls
    assert r.done_reason == "stop" and not r.message.content, r.message
    assert [(c.function.name, dict(c.function.arguments)) for c in calls] == \
        [("get_weather", {"city": "Paris"})]
    parts = list(client.chat(model="smollm2", messages=USE_TOOL, tools=[WEATHER], stream=True,
                             options={"temperature": 0, "num_predict": 64}))
    streamed = [c for p in parts for c in (p.message.tool_calls or [])]
    assert [(c.function.name, dict(c.function.arguments)) for c in streamed] == \
        [("get_weather", {"city": "Paris"})]
    assert "".join(p.message.content or "" for p in parts) == "" and parts[-1].done
    msgs = USE_TOOL + [r.message, {"role": "tool", "content": "18 C, clear",
                                   "tool_name": "get_weather"}]
    final = client.chat(model="smollm2", messages=msgs,
                        options={"temperature": 0, "num_predict": 128})
    assert final.done_reason == "stop" and final.message.content.strip()
    assert not final.message.tool_calls


def test_tool_results_answer_the_calls_before_them_in_order():
    """Ollama's messages carry no call ids: each tool result takes the id of the call it
    answers, in order (ids made from the call's place), and arguments (objects in Ollama)
    become OpenAI's JSON text."""
    from engine.server.ollama_values import parse_chat_messages

    given = USE_TOOL + [
        {"role": "assistant", "content": "", "tool_calls": [
            {"function": {"name": "get_weather", "arguments": {"city": "Paris"}}},
            {"function": {"name": "get_weather", "arguments": {"city": "Tokyo"}}}]},
        {"role": "tool", "content": "18 C", "tool_name": "get_weather"},
        {"role": "tool", "content": "25 C"}]
    msgs = parse_chat_messages(given)
    assert parse_chat_messages(given) == msgs     # the same prompt on every turn: no drawn ids
    calls = msgs[1]["tool_calls"]
    assert [json.loads(c["function"]["arguments"]) for c in calls] == \
        [{"city": "Paris"}, {"city": "Tokyo"}]
    assert [m["tool_call_id"] for m in msgs[2:]] == [c["id"] for c in calls]
    assert msgs[2]["name"] == "get_weather" and "name" not in msgs[3]


def test_embed_gives_unit_vectors_and_equal_texts_equal_vectors(client):
    r = client.embed(model="smollm2", input=["Paris is in France.", "Paris is in France.",
                                             "Cats sleep a lot."])
    v = np.array(r.embeddings)
    assert v.shape[0] == 3 and np.allclose(np.linalg.norm(v, axis=1), 1, atol=1e-5)
    assert np.array_equal(v[0], v[1]) and not np.allclose(v[0], v[2])
    old = client.embeddings(model="smollm2", prompt="Paris is in France.")
    assert np.allclose(old.embedding, v[0], atol=1e-6)


@pytest.mark.parametrize("path,body,status,words", [
    ("/api/chat", {"model": "llama3.2", "messages": QUESTION}, 404, "not found"),
    ("/api/chat", {"messages": QUESTION}, 400, "model is required"),
    ("/api/chat", {"model": "smollm2", "messages": [{"role": "user", "content": "x",
                                                     "images": ["aGk="]}]}, 400, "images"),
    ("/api/chat", {"model": "smollm2", "messages": [{"role": "robot", "content": "x"}]},
     400, "messages[0].role"),
    ("/api/chat", {"model": "smollm2", "messages": QUESTION, "think": True}, 400, "think"),
    ("/api/generate", {"model": "smollm2", "prompt": "x",
                       "tools": [{"type": "function", "function": {"name": "f"}}]}, 400, "tools"),
    ("/api/chat", {"model": "smollm2", "messages": QUESTION, "format": "json",
                   "tools": [{"type": "function", "function": {"name": "f"}}]}, 400, "format"),
    ("/api/chat", {"model": "smollm2", "messages": QUESTION,
                   "tools": [{"type": "function", "function": {"name": 5}}]}, 400, "tools[0]"),
    ("/api/chat", {"model": "smollm2", "messages": [
        {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "f",
                                                                          "arguments": 3}}]}]},
     400, "messages[0].tool_calls[0]"),
    ("/api/chat", {"model": "smollm2", "messages": QUESTION,
                   "options": {"temperature": "hot"}}, 400, "options.temperature"),
    ("/api/chat", {"model": "smollm2", "messages": QUESTION,
                   "options": {"mirostat": 2}}, 400, "options.mirostat"),
    ("/api/chat", {"model": "smollm2", "messages": QUESTION, "keep_alive": "soon"},
     400, "keep_alive"),
    ("/api/generate", {"model": "smollm2", "prompt": "x", "template": "{{ .Prompt }}"},
     400, "template"),
    ("/api/generate", {"model": "smollm2", "prompt": "x", "raw": True, "system": "s"},
     400, "system"),
    ("/api/generate", {"model": "smollm2", "prompt": "x", "suffix": "y"}, 400, "suffix"),
    ("/api/generate", {"model": "smollm2", "prompt": "x", "context": [10 ** 9]}, 400,
     "vocabulary"),
    ("/api/generate", {"model": "smollm2", "prompt": "word " * (N_CTX + 10), "raw": True},
     400, "context window"),
    ("/api/show", {"model": "nope"}, 404, "not found"),
])
def test_errors_are_in_ollamas_shape(base, path, body, status, words):
    got, _, text = call(base, "POST", path, body)
    assert words in ollama_error(got, status, text)


def test_transport_errors_are_in_ollamas_shape_and_hotseats_routes_keep_theirs(base):
    got, _, text = call(base, "GET", "/api/tags", key="wrong")
    assert "API key" in ollama_error(got, 401, text)
    got, hdrs, text = call(base, "GET", "/api/chat")
    assert "GET /api/chat" in ollama_error(got, 405, text) and hdrs["Allow"] == "POST"
    got, _, text = call(base, "POST", "/api/chat", raw=b"{nope")
    assert "not valid JSON" in ollama_error(got, 400, text)
    # Hotseat's own management routes beside them: OpenAI's shape, as before
    got, _, text = call(base, "DELETE", "/api/models/nope")
    assert got == 404 and json.loads(text)["error"]["code"] == "model_not_found"
    got, _, text = call(base, "GET", "/api/vram")
    assert got == 200 and json.loads(text)["budget_bytes"] > 0


def test_delete_unloads(client, base, smollm2_path, name):
    got, _, text = call(base, "POST", "/api/models", {"path": smollm2_path, "name": "spare"})
    assert got == 201, text
    assert {m.model for m in client.list().models} == {f"{name}:latest", "spare:latest"}
    with pytest.raises(ollama.ResponseError) as exc:
        client.show("smollm2-spare")                 # matches no model
    assert exc.value.status_code == 404
    assert client.delete("spare:latest").status == "success"
    assert [m.model for m in client.list().models] == [f"{name}:latest"]
    assert os.path.exists(smollm2_path)              # the file is never touched
    with pytest.raises(ollama.ResponseError) as exc:
        client.delete("spare")
    assert exc.value.status_code == 404
