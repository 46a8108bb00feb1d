"""The HTTP server on the real engine and the embedded model, driven by the official openai
client and by raw HTTP. Generation is slow on lavapipe, so few requests generate and each
generates only a few tokens.

Why this module is long: every route shares one real engine and server (module fixtures),
which start once for all of them."""
from __future__ import annotations

import asyncio
import http.client
import json
import re
import threading
import time
import urllib.error
import urllib.request

import openai
import pytest

from engine.api import Engine
from engine.facade import Request
from engine.server.app import MAX_BODY, SERVER_KEY, make_app
from engine.server.openai import MAX_TOKENS_HEADER
from engine.text.sampling import SamplingParams

pytestmark = pytest.mark.gpu

KEY = "test-key"
ORIGIN = "http://ui.example"
N_CTX = 512
MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]
PROMPT = "The capital of France is"
GREEDY = SamplingParams(temperature=0.0)


class ServerThread:
    """aiohttp apps served from an event loop on a background thread, one port each."""

    def __init__(self, apps: list):
        self.loop = asyncio.new_event_loop()
        self.runners: list = []
        self.ports: list[int] = []
        ready = threading.Event()
        self.thread = threading.Thread(target=self._main, args=(apps, ready), daemon=True)
        self.thread.start()
        if not ready.wait(60) or len(self.ports) != len(apps):
            raise RuntimeError("the test server did not start")

    def _main(self, apps, ready) -> None:
        from aiohttp import web

        async def start() -> None:
            for app in apps:
                runner = web.AppRunner(app, shutdown_timeout=2)
                await runner.setup()
                site = web.TCPSite(runner, "127.0.0.1", 0)
                await site.start()
                self.runners.append(runner)
                self.ports.append(runner.addresses[0][1])

        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_until_complete(start())
        finally:
            ready.set()
        self.loop.run_forever()

    def close(self) -> None:
        async def stop() -> None:
            for r in self.runners:
                await r.cleanup()

        asyncio.run_coroutine_threadsafe(stop(), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(30)
        self.loop.close()


@pytest.fixture(scope="module")
def engine(smollm2_path):
    eng = Engine(n_ctx=N_CTX)
    eng.load(smollm2_path)
    yield eng
    eng.close()


@pytest.fixture(scope="module")
def name(engine) -> str:
    return engine.status()[0]["name"]


@pytest.fixture(scope="module")
def server(engine, name):
    """Two apps on one engine: the main one with an API key and CORS, and an open one."""
    srv = ServerThread([make_app(engine, [name], api_key=KEY, cors_origins=[ORIGIN]),
                        make_app(engine, [name])])
    yield srv
    srv.close()


@pytest.fixture(scope="module")
def base(server) -> str:
    return f"http://127.0.0.1:{server.ports[0]}"


@pytest.fixture(scope="module")
def open_base(server) -> str:
    return f"http://127.0.0.1:{server.ports[1]}"


@pytest.fixture(scope="module")
def client(base) -> openai.OpenAI:
    return openai.OpenAI(base_url=base + "/v1", api_key=KEY, max_retries=0, timeout=300)


@pytest.fixture(scope="module")
def chat_ref(engine, name):
    """The engine's own greedy answer to MESSAGES, 8 tokens."""
    out = engine.generate(Request(name, messages=MESSAGES, max_tokens=8, sampling=GREEDY))
    assert out.text
    return out


@pytest.fixture(scope="module")
def completion_ref(engine, name):
    return engine.generate(Request(name, prompt=PROMPT, max_tokens=4, sampling=GREEDY))


def request(base: str, method: str, path: str, body=None, *, raw: bytes | None = None,
            key: str | None = KEY, headers: dict | None = None):
    """(status, headers, parsed JSON or text) of one plain HTTP request."""
    data = raw if raw is not None else None if body is None else json.dumps(body).encode()
    h = {"Content-Type": "application/json", **(headers or {})}
    if key is not None:
        h["Authorization"] = f"Bearer {key}"
    req = urllib.request.Request(base + path, data=data, method=method, headers=h)
    try:
        with urllib.request.urlopen(req, timeout=300) as resp:
            status, hdrs, text = resp.status, resp.headers, resp.read().decode()
    except urllib.error.HTTPError as exc:
        status, hdrs, text = exc.code, exc.headers, exc.read().decode()
    ctype = hdrs.get("Content-Type", "")
    return status, hdrs, json.loads(text) if "json" in ctype and text else text


def assert_error(status: int, got: int, body, param: str | None = "",
                 code: str | None = "") -> dict:
    assert got == status, body
    assert isinstance(body, dict) and set(body) == {"error"}, body
    err = body["error"]
    assert set(err) == {"message", "type", "param", "code"}, err
    assert isinstance(err["message"], str) and err["message"]
    assert err["type"] == ("server_error" if status >= 500 else "invalid_request_error")
    if param != "":
        assert err["param"] == param, err
    if code != "":
        assert err["code"] == code, err
    return err


def metric(base: str, line_start: str) -> float:
    _, _, text = request(base, "GET", "/metrics", key=None)
    for line in text.splitlines():
        if line.startswith(line_start):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


# -- the openai client --------------------------------------------------------------------

def test_models_list(client, name):
    models = client.models.list()
    assert [m.id for m in models.data] == [name]
    assert models.data[0].object == "model"
    assert client.models.retrieve(name).id == name


def test_chat_greedy_matches_engine(client, name, chat_ref):
    resp = client.chat.completions.create(model=name, messages=MESSAGES, temperature=0,
                                          max_tokens=8)
    assert resp.object == "chat.completion"
    assert resp.id.startswith("chatcmpl-")
    choice = resp.choices[0]
    assert choice.message.role == "assistant"
    assert choice.message.content == chat_ref.text
    assert choice.finish_reason == {"length": "length", "stop": "stop"}[chat_ref.finish_reason]
    u = resp.usage
    assert u.prompt_tokens == len(chat_ref.prompt_tokens)
    assert u.completion_tokens == len(chat_ref.tokens)
    assert u.total_tokens == u.prompt_tokens + u.completion_tokens
    # the engine just ran this very prompt, so all but its last token come from the cache
    assert 0 < u.prompt_tokens_details.cached_tokens < u.prompt_tokens


def test_chat_stream_with_usage(client, name, chat_ref):
    stream = client.chat.completions.create(
        model=name, messages=MESSAGES, temperature=0, max_completion_tokens=8, stream=True,
        stream_options={"include_usage": True})
    chunks = list(stream)
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    assert len({c.id for c in chunks}) == 1
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == chat_ref.text
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] in ("stop", "length") and not any(finishes[:-1])
    usage = chunks[-1].usage
    assert chunks[-1].choices == []
    assert usage.prompt_tokens == len(chat_ref.prompt_tokens)
    assert usage.completion_tokens == len(chat_ref.tokens)
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    assert usage.prompt_tokens_details.cached_tokens > 0           # a repeated prompt


def test_completions(client, name, completion_ref):
    resp = client.completions.create(model=name, prompt=PROMPT, max_tokens=4, temperature=0)
    assert resp.object == "text_completion"
    assert resp.choices[0].text == completion_ref.text
    assert resp.usage.completion_tokens == len(completion_ref.tokens)
    assert resp.usage.prompt_tokens == len(completion_ref.prompt_tokens)

    chunks = list(client.completions.create(model=name, prompt=PROMPT, max_tokens=4,
                                            temperature=0, stream=True))
    assert "".join(c.choices[0].text for c in chunks) == completion_ref.text
    assert chunks[-1].choices[0].finish_reason in ("stop", "length")


def test_completions_token_prompt(client, name, engine, completion_ref):
    ids = engine.prompt_tokens(name, prompt=PROMPT)
    resp = client.completions.create(model=name, prompt=ids, max_tokens=2, temperature=0)
    assert completion_ref.text.startswith(resp.choices[0].text)
    assert resp.usage.prompt_tokens == len(ids)


def test_two_concurrent_clients(base, name, chat_ref, completion_ref):
    results: dict[str, str] = {}

    def chat() -> None:
        c = openai.OpenAI(base_url=base + "/v1", api_key=KEY, max_retries=0, timeout=300)
        r = c.chat.completions.create(model=name, messages=MESSAGES, temperature=0,
                                      max_tokens=8)
        results["chat"] = r.choices[0].message.content

    def complete() -> None:
        c = openai.OpenAI(base_url=base + "/v1", api_key=KEY, max_retries=0, timeout=300)
        chunks = c.completions.create(model=name, prompt=PROMPT, max_tokens=4, temperature=0,
                                      stream=True)
        results["completion"] = "".join(ch.choices[0].text for ch in chunks)

    threads = [threading.Thread(target=chat), threading.Thread(target=complete)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert results == {"chat": chat_ref.text, "completion": completion_ref.text}


def test_client_sees_auth_and_not_found_errors(base, name):
    bad = openai.OpenAI(base_url=base + "/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()
    good = openai.OpenAI(base_url=base + "/v1", api_key=KEY, max_retries=0)
    with pytest.raises(openai.NotFoundError):
        good.chat.completions.create(model="no-such-model", messages=MESSAGES, max_tokens=1)
    with pytest.raises(openai.BadRequestError):
        good.chat.completions.create(model=name, messages=MESSAGES, max_tokens=1, n=2)


# -- raw HTTP: bad input ------------------------------------------------------------------

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"


def chat_body(**kw) -> dict:
    return {"messages": MESSAGES, "max_tokens": 1, **kw}


BAD = [
    # (path, body or raw bytes, status, param, code)
    (CHAT, b"{not json", 400, None, "invalid_json"),
    (CHAT, b"\xff\xfe", 400, None, "invalid_json"),
    (CHAT, b"", 400, None, "invalid_json"),
    (CHAT, b"[1, 2]", 400, None, "invalid_type"),
    (CHAT, b'"text"', 400, None, "invalid_type"),
    (CHAT, b"[" * 100000 + b"]" * 100000, 400, None, "invalid_json"),
    (CHAT, {"max_tokens": 1}, 400, "messages", "missing_required_parameter"),
    (CHAT, {"messages": "hi"}, 400, "messages", "invalid_type"),
    (CHAT, {"messages": []}, 400, "messages", "invalid_type"),
    (CHAT, {"messages": ["hi"]}, 400, "messages[0]", "invalid_type"),
    (CHAT, {"messages": [{"role": "wizard", "content": "hi"}]}, 400, "messages[0].role",
     "invalid_value"),
    (CHAT, {"messages": [{"role": "user", "content": 5}]}, 400, "messages[0].content",
     "invalid_type"),
    (CHAT, {"messages": [{"role": "user"}]}, 400, "messages[0].content", "invalid_type"),
    (CHAT, {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, 400,
     "messages[0].content[0].image_url", "invalid_type"),
    (CHAT, {"messages": [{"role": "user", "content": [{"type": "audio"}]}]}, 400,
     "messages[0].content", "invalid_type"),
    (CHAT, chat_body(temperature="hot"), 400, "temperature", "invalid_type"),
    (CHAT, chat_body(temperature=-1), 400, "temperature", "invalid_value"),
    (CHAT, chat_body(temperature=2.01), 400, "temperature", "invalid_value"),
    (CHAT, chat_body(temperature=3), 400, "temperature", "invalid_value"),
    (CHAT, chat_body(top_p=1.5), 400, "top_p", "invalid_value"),
    (CHAT, chat_body(top_p=0), 400, "top_p", "invalid_value"),
    (CHAT, chat_body(top_p=-0.5), 400, "top_p", "invalid_value"),
    (CHAT, chat_body(top_k=2.5), 400, "top_k", "invalid_type"),
    (CHAT, chat_body(min_p="0.1"), 400, "min_p", "invalid_type"),
    (CHAT, chat_body(seed="x"), 400, "seed", "invalid_type"),
    (CHAT, chat_body(max_tokens=-1), 400, "max_tokens", "invalid_value"),
    (CHAT, chat_body(max_tokens=0), 400, "max_tokens", "invalid_value"),
    (CHAT, chat_body(max_tokens=N_CTX), 400, "max_tokens", "invalid_value"),
    (CHAT, chat_body(max_completion_tokens=0), 400, "max_completion_tokens", "invalid_value"),
    (CHAT, chat_body(max_completion_tokens=10 ** 6), 400, "max_completion_tokens",
     "invalid_value"),
    (CHAT, chat_body(max_tokens=2.5), 400, "max_tokens", "invalid_type"),
    (CHAT, chat_body(max_tokens="8"), 400, "max_tokens", "invalid_type"),
    (CHAT, chat_body(max_tokens=True), 400, "max_tokens", "invalid_type"),
    (CHAT, chat_body(max_completion_tokens=-5), 400, "max_completion_tokens", "invalid_value"),
    (CHAT, chat_body(n=2), 400, "n", "invalid_value"),
    (CHAT, chat_body(stop=5), 400, "stop", "invalid_type"),
    (CHAT, chat_body(stop=["a", 1]), 400, "stop", "invalid_type"),
    (CHAT, chat_body(stream="yes"), 400, "stream", "invalid_type"),
    (CHAT, chat_body(stream_options=[], stream=True), 400, "stream_options", "invalid_type"),
    (CHAT, chat_body(stream_options={"include_usage": True}), 400, "stream_options",
     "invalid_value"),
    (CHAT, chat_body(stream_options={}, stream=False), 400, "stream_options", "invalid_value"),
    (CHAT, chat_body(frequency_penalty=9), 400, "frequency_penalty", "invalid_value"),
    (CHAT, chat_body(logprobs=True, top_logprobs=21), 400, "top_logprobs", "invalid_value"),
    (CHAT, chat_body(model=5), 400, "model", "invalid_type"),
    (CHAT, chat_body(model="no-such-model"), 404, "model", "model_not_found"),
    (CHAT, {"messages": [{"role": "user", "content": "hello " * 600}]}, 400, "messages",
     "context_length_exceeded"),
    (COMPLETIONS, {"max_tokens": 1}, 400, "prompt", "missing_required_parameter"),
    (COMPLETIONS, {"prompt": 5}, 400, "prompt", "invalid_type"),
    (COMPLETIONS, {"prompt": ["a", "b"]}, 400, "prompt", "invalid_value"),
    (COMPLETIONS, {"prompt": [1, -2]}, 400, "prompt", "invalid_type"),
    (COMPLETIONS, {"prompt": [10 ** 9]}, 400, "prompt", "invalid_value"),
    (COMPLETIONS, {"prompt": "hello " * 600}, 400, "prompt", "context_length_exceeded"),
    (COMPLETIONS, {"prompt": "x", "echo": True}, 400, "echo", "unsupported_parameter"),
    (COMPLETIONS, {"prompt": "x", "max_tokens": 0}, 400, "max_tokens", "invalid_value"),
    (COMPLETIONS, {"prompt": "x", "max_tokens": 10 ** 12}, 400, "max_tokens", "invalid_value"),
    (COMPLETIONS, {"prompt": "x", "temperature": 2.5}, 400, "temperature", "invalid_value"),
    (COMPLETIONS, {"prompt": "x", "top_p": 0.0}, 400, "top_p", "invalid_value"),
    (COMPLETIONS, {"prompt": "x", "stream_options": {"include_usage": True}}, 400,
     "stream_options", "invalid_value"),
]


@pytest.mark.parametrize("path,body,status,param,code", BAD,
                         ids=[f"{i:02d}-{b[4]}-{b[3]}" for i, b in enumerate(BAD)])
def test_bad_input(base, name, path, body, status, param, code):
    if isinstance(body, dict) and "model" not in body and path == COMPLETIONS:
        body = {"model": name, **body}
    raw = body if isinstance(body, bytes) else None
    got, _, resp = request(base, "POST", path, None if raw is not None else body, raw=raw)
    assert_error(status, got, resp, param, code)


def test_unknown_routes_and_methods(base):
    got, _, body = request(base, "GET", "/v1/nothing-here")
    assert_error(404, got, body, None, "not_found")
    got, hdrs, body = request(base, "GET", CHAT)
    assert_error(405, got, body, None, "method_not_allowed")
    assert "POST" in hdrs.get("Allow", "")


def test_oversized_body(base):
    payload = json.dumps(chat_body(pad="x" * (MAX_BODY + 10))).encode()
    got, _, body = request(base, "POST", CHAT, raw=payload)
    assert_error(413, got, body, None, "request_too_large")


def test_max_tokens_past_the_context_is_refused_and_only_a_missing_one_is_clamped(
        base, name, engine, chat_ref):
    """1e12 (a JSON float) is a valid integer, and more than the context holds: a 400 naming
    max_tokens, as OpenAI answers. Exactly the room left is served; no max_tokens at all is
    limited to that room, and said so. A stop string that is the greedy answer's first
    character keeps the served ones to one token."""
    room = N_CTX - len(chat_ref.prompt_tokens)
    raw = json.dumps(chat_body(model=name, temperature=0)) \
        .replace('"max_tokens": 1', '"max_tokens": 1e12').encode()
    got, _, body = request(base, "POST", CHAT, raw=raw)
    err = assert_error(400, got, body, "max_tokens", "invalid_value")
    assert f"at most {room} completion tokens" in err["message"]
    assert "maximum context length" not in err["message"]   # not a reason to trim messages
    got, _, body = request(base, "POST", CHAT, chat_body(model=name, max_tokens=room + 1))
    assert_error(400, got, body, "max_tokens", "invalid_value")

    stop = [chat_ref.text[0]]
    for extra in ({"max_tokens": room}, {"max_tokens": None}):
        got, hdrs, body = request(base, "POST", CHAT,
                                  chat_body(model=name, temperature=0, stop=stop, **extra))
        assert got == 200, body
        assert hdrs.get(MAX_TOKENS_HEADER) == (None if extra["max_tokens"] else str(room))
        assert body["choices"][0]["finish_reason"] == "stop"
        assert body["usage"]["completion_tokens"] <= 1


@pytest.mark.parametrize("path,param", [(CHAT, "messages"), (COMPLETIONS, "prompt")])
def test_context_overflow_is_worded_as_clients_expect(client, name, path, param):
    """litellm maps a 400 whose text holds "this model's maximum context length is" to its
    ContextWindowExceededError, langchain-openai one whose text holds
    "context_length_exceeded" to OpenAIContextOverflowError: their history trimming needs
    both."""
    with pytest.raises(openai.BadRequestError) as raised:
        if path == CHAT:
            client.chat.completions.create(model=name, max_tokens=1, messages=[
                {"role": "user", "content": "hello " * 600}])
        else:
            client.completions.create(model=name, max_tokens=1, prompt="hello " * 600)
    exc = raised.value
    assert exc.status_code == 400 and exc.code == "context_length_exceeded"
    assert exc.param == param
    assert "this model's maximum context length is" in str(exc).lower()       # litellm
    assert "context_length_exceeded" in str(exc)                              # langchain
    m = re.fullmatch(r"This model's maximum context length is (\d+) tokens\. However, your "
                     rf"{param} resulted in (\d+) tokens\. Please reduce the length of the "
                     rf"{param}\. \(context_length_exceeded\)", exc.body["message"])
    assert m, exc.body["message"]
    assert int(m.group(1)) == N_CTX and int(m.group(2)) > N_CTX


def test_normal_request_after_errors(base, name, completion_ref):
    got, hdrs, body = request(base, "POST", COMPLETIONS,
                              {"model": name, "prompt": PROMPT, "max_tokens": 1,
                               "temperature": 0, "stop": None, "top_k": None})
    assert got == 200, body
    assert MAX_TOKENS_HEADER not in hdrs
    assert completion_ref.text.startswith(body["choices"][0]["text"])
    assert body["usage"]["completion_tokens"] == 1


# -- auth, CORS ---------------------------------------------------------------------------

def test_auth(base, open_base, name):
    for key in (None, "wrong", ""):
        for method, path in (("GET", "/v1/models"), ("POST", CHAT), ("GET", "/api/models")):
            got, hdrs, body = request(base, method, path, chat_body(), key=key)
            assert_error(401, got, body, None, "invalid_api_key")
    got, _, body = request(base, "GET", "/v1/models", headers={"Authorization": "Basic " + KEY},
                           key=None)
    assert_error(401, got, body, None, "invalid_api_key")
    assert request(base, "GET", "/health", key=None)[2] == {"status": "ok", "faults": 0, "last_fault": None}
    # without a configured key nothing is asked for
    got, hdrs, body = request(open_base, "GET", "/v1/models", key=None)
    assert got == 200 and body["data"][0]["id"] == name


def test_cors(base, open_base):
    got, hdrs, _ = request(base, "GET", "/v1/models", headers={"Origin": ORIGIN})
    assert got == 200 and hdrs["Access-Control-Allow-Origin"] == ORIGIN
    got, hdrs, body = request(base, "GET", "/v1/models",
                              headers={"Origin": "http://evil.example"})
    assert_error(403, got, body, None, "origin_not_allowed")    # test_access.py has the rest
    assert "Access-Control-Allow-Origin" not in hdrs
    # a preflight carries no credentials and must pass anyway
    got, hdrs, _ = request(base, "OPTIONS", CHAT, key=None, headers={
        "Origin": ORIGIN, "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization, content-type"})
    assert got == 204
    assert hdrs["Access-Control-Allow-Origin"] == ORIGIN
    assert "POST" in hdrs["Access-Control-Allow-Methods"]
    assert "authorization" in hdrs["Access-Control-Allow-Headers"].lower()
    # no --cors-origin: no page is let in
    got, hdrs, body = request(open_base, "GET", "/v1/models", key=None,
                              headers={"Origin": ORIGIN})
    assert_error(403, got, body, None, "origin_not_allowed")
    assert "Access-Control-Allow-Origin" not in hdrs


# -- failures and cancellation ------------------------------------------------------------

def test_engine_failure_is_a_500_and_the_server_survives(base, name, engine, monkeypatch,
                                                         completion_ref):
    def broken(*args, **kw):
        raise RuntimeError("device on fire")

    monkeypatch.setattr(engine, "generate", broken)
    got, _, body = request(base, "POST", COMPLETIONS, {"model": name, "prompt": PROMPT,
                                                       "max_tokens": 1})
    err = assert_error(500, got, body, None, "engine_error")
    assert "device on fire" in err["message"]

    got, _, text = request(base, "POST", COMPLETIONS, {"model": name, "prompt": PROMPT,
                                                       "max_tokens": 1, "stream": True})
    assert got == 200
    events = [json.loads(e[6:]) for e in text.split("\n\n") if e.startswith("data: {")]
    assert "device on fire" in events[-1]["error"]["message"]
    assert text.rstrip().endswith("data: [DONE]")

    monkeypatch.undo()
    got, _, body = request(base, "POST", COMPLETIONS, {"model": name, "prompt": PROMPT,
                                                       "max_tokens": 1, "temperature": 0})
    assert got == 200 and completion_ref.text.startswith(body["choices"][0]["text"])


def test_disconnect_cancels_generation(base, name):
    cancelled = f'hotseat_generations_cancelled_total{{model="{name}"}}'
    gone = 'hotseat_requests_total{endpoint="/v1/chat/completions",status="499"}'
    before, before_gone = metric(base, cancelled), metric(base, gone)
    port = int(base.rsplit(":", 1)[1])
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
    body = {"model": name, "temperature": 0, "stream": True,     # as much as the room holds
            "messages": [{"role": "user", "content": "Write a very long story about a cat."}]}
    conn.request("POST", CHAT, json.dumps(body), {"Authorization": f"Bearer {KEY}",
                                                  "Content-Type": "application/json"})
    resp = conn.getresponse()
    assert resp.status == 200
    assert resp.getheader("Content-Type").startswith("text/event-stream")
    room = int(resp.getheader(MAX_TOKENS_HEADER))
    assert 0 < room < N_CTX
    while b'"content": "' not in (line := resp.readline()) or b'"content": ""' in line:
        assert line, "the stream ended before any text"
    conn.sock.shutdown(2)
    conn.close()
    deadline = time.monotonic() + 240
    while metric(base, cancelled) == before:
        assert time.monotonic() < deadline, "the generation was not cancelled"
        time.sleep(0.5)
    while metric(base, gone) == before_gone:          # its 200 had begun: counted as 499
        assert time.monotonic() < deadline, "the stream that lost its client is not a 499"
        time.sleep(0.1)
    generated = metric(base, f'hotseat_generated_tokens_total{{model="{name}"}}')
    assert generated > 0


# -- health, metrics, management ----------------------------------------------------------

def test_health_and_metrics(base, name):
    got, hdrs, body = request(base, "GET", "/health", key=None)
    assert got == 200 and body == {"status": "ok", "faults": 0, "last_fault": None}
    request(base, "GET", "/v1/models")
    got, hdrs, text = request(base, "GET", "/metrics", key=None)
    assert got == 200 and hdrs["Content-Type"].startswith("text/plain")
    assert re.search(r'^hotseat_requests_total\{endpoint="/v1/models",status="200"\} \d+$',
                     text, re.M)
    assert re.search(r'^hotseat_request_duration_seconds_count\{endpoint="/v1/models"\} \d+$',
                     text, re.M)
    assert re.search(r"^hotseat_models_loaded 1$", text, re.M)
    for family in ("hotseat_requests_total", "hotseat_generated_tokens_total",
                   "hotseat_prompt_tokens_total", "hotseat_request_duration_seconds"):
        assert f"# TYPE {family} " in text
    sample = re.compile(r'[a-z_]+(\{([a-z_]+="([^"\\]|\\.)*",?)*\})? [0-9.e+-]+')
    for line in text.splitlines():         # every sample line is NAME{LABELS} VALUE
        assert line.startswith("#") or sample.fullmatch(line), line


def test_api_models(base, name, smollm2_path):
    got, _, body = request(base, "GET", "/api/models")
    assert got == 200
    (m,) = body["models"]
    assert m["name"] == name and m["path"] == smollm2_path and m["arch"] == "llama"
    assert m["state"] == "warm" and m["pinned"] is False
    assert m["device_bytes"]["weights"] > 0
    assert m["device_bytes_total"] == sum(m["device_bytes"].values())


def test_api_load_errors(base, tmp_path):
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"this is not a gguf file" * 10)
    got, _, body = request(base, "POST", "/api/models", {"path": str(junk)})
    err = assert_error(400, got, body, "path", "invalid_model_file")
    assert "junk.gguf" in err["message"]
    got, _, body = request(base, "POST", "/api/models", {"path": str(tmp_path / "absent.gguf")})
    assert_error(400, got, body, "path", "invalid_model_file")
    got, _, body = request(base, "POST", "/api/models", {})
    assert_error(400, got, body, "path", "missing_required_parameter")
    got, _, body = request(base, "POST", "/api/models", {"path": 3})
    assert_error(400, got, body, "path", "invalid_type")
    got, _, body = request(base, "DELETE", "/api/models/no-such-model")
    assert_error(404, got, body, "name", "model_not_found")


def test_api_load_serve_and_unload(base, name, smollm2_path, server, engine, monkeypatch):
    got, _, body = request(base, "POST", "/api/models", {"path": smollm2_path})
    assert_error(409, got, body, "name", "model_exists")
    got, _, body = request(base, "POST", "/api/models", {"path": smollm2_path, "name": "second"})
    assert got == 201, body
    assert body["name"] == "second" and body["state"] == "warm"
    got, _, body = request(base, "GET", "/v1/models")
    assert [m["id"] for m in body["data"]] == [name, "second"]

    # Two requests for each model, queued while the device's turn is held: the models take
    # turns. The order is read from the engine's calls, not from clocks.
    calls: list[str] = []
    generate = engine.generate

    def recording(request, *args, **kw):
        calls.append(request.name)
        return generate(request, *args, **kw)

    monkeypatch.setattr(engine, "generate", recording)
    app_server = server.runners[0].app[SERVER_KEY]
    asyncio.run_coroutine_threadsafe(app_server.turn.acquire(), server.loop).result(30)
    statuses: list[int] = []
    try:
        threads = [threading.Thread(target=lambda m=m: statuses.append(request(
            base, "POST", COMPLETIONS, {"model": m, "prompt": PROMPT, "max_tokens": 1})[0]))
            for m in (name, name, "second", "second")]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 120
        while (metric(base, f'hotseat_queue_depth{{model="{name}"}}'),
               metric(base, 'hotseat_queue_depth{model="second"}')) != (2, 2):
            assert time.monotonic() < deadline, "the requests did not queue"
            time.sleep(0.2)
    finally:
        server.loop.call_soon_threadsafe(app_server.turn.release)
    for t in threads:
        t.join(300)
    assert statuses == [200] * 4
    assert calls[0] != calls[1] and calls[2:] == calls[:2] and set(calls) == {name, "second"}
    monkeypatch.undo()

    got, _, body = request(base, "DELETE", "/api/models/second")
    assert got == 200 and body == {"name": "second", "unloaded": True}
    got, _, body = request(base, "POST", CHAT, chat_body(model="second"))
    assert_error(404, got, body, "model", "model_not_found")
    got, _, body = request(base, "GET", "/api/models")
    assert [m["name"] for m in body["models"]] == [name]


# -- residency: two models and a VRAM budget for one -------------------------------------

RES_CTX = 256


@pytest.fixture(scope="module")
def res_engine(smollm2_path):
    """The embedded model loaded twice, as a and b, under a budget that holds one warm.
    Weights-only eviction, as `hotseat serve` does by default."""
    with Engine(n_ctx=RES_CTX) as probe:
        probe.load(smollm2_path, name="probe")
        warm = probe.status()[0]["warm_bytes"]
    eng = Engine(n_ctx=RES_CTX, budget_bytes=int(1.5 * warm), full_release=False)
    eng.load(smollm2_path, name="a")
    eng.load(smollm2_path, name="b")           # releases a
    yield eng
    eng.close()


@pytest.fixture(scope="module")
def res_ref(res_engine):
    """The engine's own greedy answer from a (which makes a warm and b cold)."""
    out = res_engine.generate(Request("a", messages=MESSAGES, max_tokens=6, sampling=GREEDY))
    assert out.text
    return out


@pytest.fixture(scope="module")
def res_server(res_engine, res_ref):
    srv = ServerThread([make_app(res_engine, ["a", "b"])])
    yield srv
    srv.close()


@pytest.fixture(scope="module")
def res_base(res_server) -> str:
    return f"http://127.0.0.1:{res_server.ports[0]}"


def models_by_name(base: str) -> dict[str, dict]:
    got, _, body = request(base, "GET", "/api/models", key=None)
    assert got == 200, body
    return {m["name"]: m for m in body["models"]}


def op(base: str, name: str, what: str, body=None):
    """(status, body) of POST /api/models/NAME/WHAT."""
    got, _, out = request(base, "POST", f"/api/models/{name}/{what}", body, key=None)
    return got, out


def test_api_models_reports_residency(res_base, res_engine):
    models = models_by_name(res_base)
    status = {s["name"]: s for s in res_engine.status()}
    assert set(models) == {"a", "b"}
    for name, m in models.items():
        s = status[name]
        for key in ("state", "pinned", "device_bytes", "host_shadow_bytes", "warm_bytes",
                    "n_ctx", "arch"):
            assert m[key] == s[key], key
        assert m["device_bytes_total"] == sum(m["device_bytes"].values())
        assert m["host_shadow_bytes"] > 0 and m["pinned"] is False
    assert models["a"]["state"] == "warm" and models["b"]["state"] == "cold"
    cold = models["b"]["device_bytes"]
    assert "weights" not in cold and cold["kv"] > 0            # weights-only keeps the KV


def test_api_vram(res_base, res_engine):
    got, _, vram = request(res_base, "GET", "/api/vram", key=None)
    assert got == 200, vram
    assert vram["budget_bytes"] == res_engine.arbiter.budget
    assert vram["device"] == res_engine.device_name and vram["heap_bytes"] > 0
    # a warm model holds its warm bytes, a cold one what it kept on the device
    held = sum(m["device_bytes_total"] for m in models_by_name(res_base).values())
    assert vram["granted_bytes"] == held <= vram["budget_bytes"]
    assert vram["allocated_bytes"] >= vram["granted_bytes"]


def test_warm_evict_pin_unpin(res_base):
    got, a = op(res_base, "a", "warm")
    assert got == 200, a
    assert a["state"] == "warm" and a["transfer"]["op"] is None     # it already was
    got, b = op(res_base, "b", "warm")
    assert got == 200, b
    assert b["state"] == "warm" and b["transfer"]["op"] == "restore"
    assert b["transfer"]["bytes"] >= b["device_bytes"]["weights"]
    assert models_by_name(res_base)["a"]["state"] == "cold"        # made room for b

    got, b = op(res_base, "b", "evict", {"full": True})
    assert got == 200, b
    assert b["state"] == "cold" and b["transfer"]["op"] == "release"
    assert b["device_bytes_total"] < 1 << 20 and b["host_shadow_bytes"] > 0

    got, a = op(res_base, "a", "pin")
    assert got == 200, a
    assert a["state"] == "warm" and a["pinned"] is True
    got, a = op(res_base, "a", "unpin")
    assert got == 200 and a["pinned"] is False and a["state"] == "warm"
    got, a = op(res_base, "a", "evict")           # no body: the server's mode, weights-only
    assert got == 200, a
    assert a["state"] == "cold" and "weights" not in a["device_bytes"]
    assert a["device_bytes"]["kv"] > 0


def test_budget_refusals_are_409(res_base):
    got, a = op(res_base, "a", "pin")
    assert got == 200 and a["pinned"] and a["state"] == "warm"
    try:
        got, body = op(res_base, "a", "evict")      # its own code: not a budget matter
        err = assert_error(409, got, body, None, "model_pinned")
        assert "a is pinned" in err["message"]
        # a pinned, a second pin cannot fit: the arbiter's own message
        got, body = op(res_base, "b", "pin")
        err = assert_error(409, got, body, None, "budget_exceeded")
        assert "pinning b" in err["message"] and "pinned models: a" in err["message"]
        got, body = op(res_base, "b", "warm")
        assert_error(409, got, body, None, "budget_exceeded")
        # generating needs b warm: refused before a token, streamed or not
        for stream in (False, True):
            got, _, body = request(res_base, "POST", CHAT, key=None,
                                   body=chat_body(model="b", stream=stream))
            err = assert_error(409, got, body, None, "budget_exceeded")
            assert "making warm b" in err["message"]
        models = models_by_name(res_base)
        assert models["a"]["state"] == "warm" and models["b"]["state"] == "cold"
        assert models["b"]["pinned"] is False
    finally:
        assert op(res_base, "a", "unpin")[0] == 200


def test_management_errors(res_base):
    for what in ("pin", "unpin", "evict", "warm"):
        got, body = op(res_base, "no-such-model", what)
        assert_error(404, got, body, "name", "model_not_found")
    got, body = op(res_base, "a", "evict", {"full": "yes"})
    assert_error(400, got, body, "full", "invalid_type")
    got, _, body = request(res_base, "POST", "/api/models/a/evict", raw=b"[1]", key=None)
    assert_error(400, got, body, None, "invalid_type")
    got, _, body = request(res_base, "GET", "/api/models/a/pin", key=None)
    assert_error(405, got, body, None, "method_not_allowed")


def test_chat_to_a_cold_model_warms_it(res_base, res_ref):
    got, a = op(res_base, "a", "evict", {"full": True})     # the KV goes to host memory
    assert got == 200 and a["state"] == "cold" and a["device_bytes_total"] < 1 << 20
    got, _, body = request(res_base, "POST", CHAT, key=None,
                           body={"model": "a", "messages": MESSAGES, "max_tokens": 6,
                                 "temperature": 0})
    assert got == 200, body
    assert body["choices"][0]["message"]["content"] == res_ref.text
    assert body["usage"]["completion_tokens"] == len(res_ref.tokens)
    # the KV came back from its host shadow: the repeated prompt was reused
    assert body["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
    models = models_by_name(res_base)
    assert models["a"]["state"] == "warm" and models["b"]["state"] == "cold"


def test_management_waits_for_the_models_queue(res_base, res_server, res_engine, monkeypatch,
                                               res_ref):
    """An evict sent while a's generation is queued runs after it, in order."""
    calls: list[str] = []
    generate, evict = res_engine.generate, res_engine.evict

    def recording_generate(*args, **kw):
        calls.append("generate")
        return generate(*args, **kw)

    def recording_evict(*args, **kw):
        calls.append("evict")
        return evict(*args, **kw)

    monkeypatch.setattr(res_engine, "generate", recording_generate)
    monkeypatch.setattr(res_engine, "evict", recording_evict)
    app_server = res_server.runners[0].app[SERVER_KEY]
    depth = 'hotseat_queue_depth{model="a"}'
    results: dict[str, tuple] = {}

    def wait_depth(n: int) -> None:
        deadline = time.monotonic() + 120
        while metric(res_base, depth) != n:
            assert time.monotonic() < deadline, "the requests did not queue"
            time.sleep(0.1)

    asyncio.run_coroutine_threadsafe(app_server.turn.acquire(), res_server.loop).result(30)
    try:
        chat = threading.Thread(target=lambda: results.update(chat=request(
            res_base, "POST", CHAT, key=None, body={"model": "a", "messages": MESSAGES,
                                                    "max_tokens": 1, "temperature": 0})))
        chat.start()
        wait_depth(1)
        ev = threading.Thread(target=lambda: results.update(evict=op(res_base, "a", "evict")))
        ev.start()
        wait_depth(2)
        assert calls == []
    finally:
        res_server.loop.call_soon_threadsafe(app_server.turn.release)
    chat.join(300)
    ev.join(300)
    assert calls == ["generate", "evict"]
    got, _, body = results["chat"]
    assert got == 200 and res_ref.text.startswith(body["choices"][0]["message"]["content"])
    got, a = results["evict"]
    assert got == 200 and a["state"] == "cold"


def test_health_and_metrics_do_not_wait_for_the_engine(res_base, res_engine):
    """While the engine thread is busy (as during a generation) the probes answer."""
    busy, go = threading.Event(), threading.Event()

    def hold():
        busy.set()
        go.wait(60)
    t = threading.Thread(target=res_engine.thread.run, args=(hold,))
    t.start()
    try:
        assert busy.wait(30)
        for path in ("/health", "/metrics"):
            req = urllib.request.Request(res_base + path)
            with urllib.request.urlopen(req, timeout=30) as resp:
                assert resp.status == 200
    finally:
        go.set()
        t.join()
