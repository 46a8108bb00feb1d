"""The endpoint left on: a client that leaves during its prompt, a device fault during one,
values that cannot work, logit_bias and the penalties, load errors that reveal nothing, idle
connections, memory over load/unload cycles, and a fuzz of bad requests and files. Against the real server on the
bundled model over HTTP; generations are a few tokens each.

HOTSEAT_LEAK_CYCLES sets the measured load/unload cycles of the memory test (default 10,
after 20 of warm-up; the issue's 50 take about 20 s more here)."""
from __future__ import annotations

import http.client
import json
import os
import random
import socket
import struct
import threading
import time
import warnings

import pytest

import engine.residency.model as model_module
from engine.facade import Request
from engine.gpu import vk
from engine.api import Engine
from engine.server.app import make_app
from engine.text.sampling import BAN, SamplingParams
from tests.engine.formats.test_gguf_file import Layout, write_valid
from tests.engine.server.test_access import SERVING, hotseat_serve
from tests.engine.server.test_serve import ServerThread, assert_error, metric, request

pytestmark = pytest.mark.gpu

N_CTX = 512
PROMPT = "The capital of France is"
GREEDY = SamplingParams(temperature=0.0)
CHUNK = 16                               # the prefill chunk in the cancellation test
LONG = 16 * CHUNK                        # its prompt: 16 chunks
PASS_S = 0.1                             # ... each taking this long at least
LEAK_WARMUP = 20
LEAK_CYCLES = int(os.environ.get("HOTSEAT_LEAK_CYCLES", "10"))


@pytest.fixture(scope="module")
def engine(smollm2_path):
    eng = Engine(n_ctx=N_CTX)
    eng.load(smollm2_path, name="m")
    yield eng
    eng.close()


@pytest.fixture(scope="module")
def server(engine):
    """The default app, and one whose idle connections close after a second."""
    srv = ServerThread([make_app(engine, ["m"]), make_app(engine, ["m"], keepalive_s=1.0)])
    yield srv
    srv.close()


@pytest.fixture(scope="module")
def base(server) -> str:
    return f"http://127.0.0.1:{server.ports[0]}"


@pytest.fixture(scope="module")
def ref(engine):
    """The engine's own greedy answer to PROMPT, 2 tokens."""
    out = engine.generate(Request("m", prompt=PROMPT, max_tokens=2, sampling=GREEDY))
    assert out.tokens
    return out


def post(base: str, path: str, body) -> tuple[int, object]:
    got, _, out = request(base, "POST", path, body, key=None)
    return got, out


def completion(**kw) -> dict:
    return {"model": "m", "prompt": PROMPT, "max_tokens": 2, "temperature": 0, **kw}


def answers_correctly(base: str, ref) -> None:
    got, out = post(base, "/v1/completions", completion())
    assert got == 200, out
    assert out["choices"][0]["text"] == ref.text


# -- a client that leaves during its prompt -----------------------------------------------

def test_a_client_that_leaves_during_the_prompt_frees_the_engine(base, engine, ref,
                                                                 monkeypatch):
    """Prefill passes are sized to about 0.5 s on the device at hand (Model.next_chunk), and
    the client is looked at between them: a client that leaves frees the model within 1 s,
    and its request is counted as a 499."""
    monkeypatch.setattr(model_module.Model, "chunk", CHUNK)   # on every device
    model = engine.models["m"].model
    runs: list[tuple[float, float, int, int]] = []     # (start, end, position, tokens)
    real_run = model.run

    def timed_run(tokens, pos0, greedy, **kw):
        t0 = time.monotonic()
        try:
            return real_run(tokens, pos0, greedy, **kw)
        finally:
            # each pass lasts PASS_S at least, as on a slow device: on a fast GPU the whole
            # prompt is otherwise over before the client's leaving is seen
            time.sleep(max(0.0, t0 + PASS_S - time.monotonic()))
            runs.append((t0, time.monotonic(), pos0, len(tokens)))

    monkeypatch.setattr(model, "run", timed_run)
    cancelled = 'hotseat_generations_cancelled_total{model="m"}'
    status = 'hotseat_requests_total{endpoint="/v1/completions",status="%d"}'
    before = metric(base, cancelled)
    before_200, before_499 = metric(base, status % 200), metric(base, status % 499)
    prompt = [random.Random(5).randrange(300, 20000) for _ in range(LONG)]
    port = int(base.rsplit(":", 1)[1])
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
    conn.request("POST", "/v1/completions", json.dumps(completion(prompt=prompt, max_tokens=4)),
                 {"Content-Type": "application/json"})
    deadline = time.monotonic() + 120
    while len(runs) < 3:                               # three passes done, the next running
        assert time.monotonic() < deadline, "the prompt did not start"
        time.sleep(0.01)
    conn.sock.shutdown(socket.SHUT_RDWR)
    conn.close()
    left = time.monotonic()
    n_before = len(runs)                               # passes finished before it left
    answers_correctly(base, ref)                       # queued behind the abandoned prompt
    assert metric(base, cancelled) == before + 1
    # the one that left is a 499 (nginx's "client closed request"), the one answered a 200
    assert (metric(base, status % 499), metric(base, status % 200)) == (before_499 + 1,
                                                                      before_200 + 1)
    # the abandoned prompt's passes: up to the next request's first (at position 0)
    nxt = next(i for i in range(1, len(runs)) if runs[i][2] == 0)
    abandoned = runs[:nxt]
    assert nxt >= n_before and abandoned[-1][2] + abandoned[-1][3] < LONG, \
        "the whole prompt ran"
    freed = abandoned[-1][1] - left
    assert freed < 1.0, (freed, runs)
    assert max(r[1] - r[0] for r in abandoned) < 1.0, runs   # passes of about 0.5 s


# -- a device fault during a prompt -------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("point,kind", [("submit", "timeout"), ("wait", "timeout"),
                                        ("submit", "out_of_memory"), ("wait", "out_of_memory")])
def test_a_device_fault_during_a_prompt_leaves_later_answers_right(base, engine, ref,
                                                                   monkeypatch, point, kind):
    """The issue's reproduction, with the fault injected rather than waited for: a timeout
    or a refused submit in the 3rd chunk of a long prompt. The engine resets the model from
    its host copy and, since nothing of the answer has gone out yet, runs the request again:
    it is answered right. The next answers are the clean run's, an evict and the restore
    after it work, the server lives on, and /health tells of the recovered fault."""
    monkeypatch.setattr(model_module.Model, "chunk", CHUNK)   # on every device
    long_text = "The quick brown fox jumps over the lazy dog. " * 8
    body = {"model": "m", "max_tokens": 2, "temperature": 0,
            "messages": [{"role": "user", "content": long_text}]}
    got, clean = post(base, "/v1/chat/completions", body)
    assert got == 200, clean
    answers_correctly(base, ref)                  # another prompt: nothing of it is cached
    faults = request(base, "GET", "/health", key=None)[2].get("faults", 0)
    vk.inject(point, kind, nth=3)
    try:
        got, out = post(base, "/v1/chat/completions", body)
    finally:
        vk.clear_faults()
    assert got == 200 and out["choices"] == clean["choices"], out
    got, again = post(base, "/v1/chat/completions", body)
    assert got == 200 and again["choices"] == clean["choices"], again
    answers_correctly(base, ref)
    got, out = post(base, "/api/models/m/evict", {})
    assert got == 200, out
    answers_correctly(base, ref)
    got, again = post(base, "/v1/chat/completions", body)
    assert got == 200 and again["choices"] == clean["choices"], again
    health = request(base, "GET", "/health", key=None)[2]
    assert health["status"] == "recovered" and health["faults"] == faults + 1, health
    assert kind in health["last_fault"]["error"], health


# -- values that cannot work --------------------------------------------------------------

@pytest.mark.parametrize("key, value", [("repeat_penalty", 0), ("repeat_penalty", -0.5),
                                        ("repeat_penalty", 1e-400), ("repeat_last_n", -2),
                                        ("temperature", -1), ("top_k", -1)])
def test_degenerate_values_are_refused_by_name(base, key, value):
    got, out = post(base, "/v1/completions", completion(**{key: value}))
    err = assert_error(400, got, out, key, "invalid_value")
    assert key in err["message"]


def test_a_tiny_temperature_is_greedy_without_warnings(base, ref):
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        for t in ("1e-320", "1e-7"):
            raw = json.dumps(completion()).replace('"temperature": 0', f'"temperature": {t}')
            got, _, out = request(base, "POST", "/v1/completions", raw=raw.encode(), key=None)
            assert got == 200, out
            assert out["choices"][0]["text"] == ref.text, t
    assert not [w for w in seen if issubclass(w.category, RuntimeWarning)], seen


# -- logit_bias, frequency_penalty, presence_penalty --------------------------------------

def test_logit_bias_bans_and_boosts(base, engine, ref):
    banned = engine.generate(Request("m", prompt=PROMPT, max_tokens=2, sampling=SamplingParams(
        temperature=0, logit_bias={ref.tokens[0]: BAN})))
    assert ref.tokens[0] not in banned.tokens and banned.text != ref.text
    for ban in (-100, False):                          # OpenAI's ban, and llama.cpp's
        got, out = post(base, "/v1/completions", completion(logit_bias={str(ref.tokens[0]): ban}))
        assert got == 200, out
        assert out["choices"][0]["text"] == banned.text
    # text keys are tokenized, as llama.cpp's server does, and every token gets the bias
    ids = engine.tokenizer("m").encode(" banana", add_special=False, parse_special=False)
    got, out = post(base, "/v1/completions", completion(logit_bias=[[" banana", 30], [5, -2]]))
    assert got == 200, out
    boosted = engine.generate(Request("m", prompt=PROMPT, max_tokens=2, sampling=SamplingParams(
        temperature=0, logit_bias={**{i: 30.0 for i in ids}, 5: -2.0})))
    assert set(boosted.tokens) <= set(ids)
    assert out["choices"][0]["text"] == boosted.text


def test_frequency_and_presence_penalties_match_the_engine(base, engine):
    # negative values reward what the prompt already said: here, " Paris" again
    prompt = "The capital of France is Paris. The capital of France is"
    params = dict(frequency_penalty=-2.0, presence_penalty=-0.5, repeat_last_n=32)
    got, out = post(base, "/v1/completions", completion(prompt=prompt, **params))
    assert got == 200, out
    want = engine.generate(Request("m", prompt=prompt, max_tokens=2,
                                   sampling=SamplingParams(temperature=0, **params)))
    assert out["choices"][0]["text"] == want.text
    assert out["usage"]["completion_tokens"] == len(want.tokens)
    plain = engine.generate(Request("m", prompt=prompt, max_tokens=2, sampling=GREEDY))
    assert want.tokens != plain.tokens                 # the penalties did something


@pytest.mark.parametrize("bias, code", [
    ({"5": "x"}, "invalid_value"), ({"5": 101}, "invalid_value"), ({"5": True}, "invalid_value"),
    ({"-1": 1}, "invalid_value"), ({"99999999": 1}, "invalid_value"), ({"": 1}, "invalid_value"),
    ([[1, 2, 3]], "invalid_type"), ("5", "invalid_type"), ([[None, 1]], "invalid_value")])
def test_bad_logit_bias(base, bias, code):
    got, out = post(base, "/v1/completions", completion(logit_bias=bias))
    assert_error(400, got, out, "logit_bias", code)


def test_banning_every_token_is_refused(base, engine):
    n = engine.tokenizer("m").n_vocab
    got, out = post(base, "/v1/completions", completion(logit_bias={str(i): False
                                                                    for i in range(n)}))
    assert_error(400, got, out, "logit_bias", "invalid_value")


# -- load errors --------------------------------------------------------------------------

def test_a_nul_in_a_load_path_is_a_400_and_409_is_for_names(base, smollm2_path):
    got, out = post(base, "/api/models", {"path": smollm2_path + "\u0000.gguf"})
    assert_error(400, got, out, "path", "invalid_value")
    got, out = post(base, "/api/models", {"path": "smollm2", "name": "x\u0000y"})
    assert_error(400, got, out, "name", "invalid_value")
    got, out = post(base, "/api/models", {"path": smollm2_path, "name": "m"})
    assert_error(409, got, out, "name", "model_exists")


def test_a_load_error_does_not_echo_the_file(base, tmp_path):
    secret = tmp_path / "shadow"
    secret.write_text("root:$6$s3cr3t-hash:19000:0:99999:7:::\n")
    got, out = post(base, "/api/models", {"path": str(secret)})
    err = assert_error(400, got, out, "path", "invalid_model_file")
    assert "not a GGUF file" in err["message"] and str(secret) in err["message"]
    assert "root" not in err["message"].replace(str(secret), "")


# -- idle connections ---------------------------------------------------------------------

def _read_response(sock: socket.socket) -> bytes:
    """One HTTP response off a keep-alive socket: headers, then a body by its length or its
    chunks."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += sock.recv(65536)
    head, _, rest = data.partition(b"\r\n\r\n")
    if b"transfer-encoding: chunked" in head.lower():
        while not rest.endswith(b"0\r\n\r\n"):
            rest += sock.recv(65536)
    else:
        length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                          if line.lower().startswith(b"content-length")))
        while len(rest) < length:
            rest += sock.recv(65536)
    return head + b"\r\n\r\n" + rest


def test_an_idle_connection_is_closed(server):
    port = server.ports[1]                             # keepalive_s=1.0
    body = json.dumps(completion(max_tokens=1, stream=True)).encode()
    for req in (b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
                b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: "
                b"application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)):
        with socket.create_connection(("127.0.0.1", port), timeout=60) as sock:
            sock.sendall(req)
            resp = _read_response(sock)
            assert resp.startswith(b"HTTP/1.1 200"), resp[:200]
            assert b"connection: close" not in resp.split(b"\r\n\r\n")[0].lower()
            t0 = time.monotonic()
            sock.settimeout(30)
            assert sock.recv(1) == b""                 # the server hung up
            assert 0.5 < time.monotonic() - t0 < 10


# -- memory over load/unload cycles -------------------------------------------------------

def test_load_unload_cycles_do_not_grow_memory(smollm2_path):
    """A `hotseat serve` process driven over HTTP: after a warm-up RSS stays flat and the
    device allocations do not change. Before the fix every cycle kept 2 to 4 MiB.

    The warm-up covers the first ~14 cycles, over which lavapipe's and the C allocator's
    pools fill by about 1 MiB a cycle and then stop. After it a leak shows in every cycle,
    so the median cycle is judged; the allocator still takes the odd one-time step of a
    few MiB (a thread's arena), which the looser bound on the sum allows."""
    proc = hotseat_serve("--budget-mib", "1024")
    try:
        line = proc.stdout.readline().strip()
        m = SERVING.match(line)
        assert m is not None, line
        url = f"http://127.0.0.1:{m.group(3)}"

        def rss() -> int:
            with open(f"/proc/{proc.pid}/statm") as f:
                return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

        def cycle() -> None:
            got, out = post(url, "/api/models", {"path": smollm2_path, "name": "cycle"})
            assert got == 201, out
            got, _, out = request(url, "DELETE", "/api/models/cycle", key=None)
            assert got == 200, out

        for _ in range(LEAK_WARMUP):
            cycle()
        rss0, vram0 = rss(), request(url, "GET", "/api/vram", key=None)[2]
        seen = [rss0]
        for _ in range(LEAK_CYCLES):
            cycle()
            seen.append(rss())
        vram = request(url, "GET", "/api/vram", key=None)[2]
        steps = sorted(b - a for a, b in zip(seen, seen[1:]))
        median, grown = steps[len(steps) // 2], seen[-1] - rss0
        assert median <= 64 << 10, \
            f"RSS grew in most cycles: median {median >> 10} KiB, steps {steps}"
        assert grown < (16 << 20) + LEAK_CYCLES * (64 << 10), \
            f"RSS grew {grown / 2**20:.1f} MiB in {LEAK_CYCLES} cycles, steps {steps}"
        for key in ("allocated_bytes", "spare_bytes", "granted_bytes"):
            assert vram[key] == vram0[key], key
        got, _, out = request(url, "GET", "/api/models", key=None)
        assert [e["name"] for e in out["models"]] == [m.group(1)]
    finally:
        proc.terminate()
        proc.wait(60)


# -- fuzz ---------------------------------------------------------------------------------

FUZZ_REQUESTS = [
    # (method, path, raw body)
    ("POST", "/v1/completions", b"{"), ("POST", "/v1/completions", b"null"),
    ("POST", "/v1/completions", b'{"prompt": {}}'), ("POST", "/v1/completions", b"\x00\xff"),
    ("POST", "/v1/completions", b'{"prompt": "x", "max_tokens": "1"}'),
    ("POST", "/v1/completions", b'{"prompt": "x", "max_tokens": 1e400}'),
    ("POST", "/v1/completions", b'{"prompt": "x", "temperature": NaN}'),
    ("POST", "/v1/completions", b'{"prompt": "x", "top_p": Infinity}'),
    ("POST", "/v1/completions", b'{"prompt": "x", "seed": 1.5}'),
    ("POST", "/v1/completions", b'{"prompt": "x", "stop": [[]]}'),
    ("POST", "/v1/completions", b'{"prompt": "x", "logit_bias": {"1": null}}'),
    ("POST", "/v1/completions", b'{"prompt": "x", "stream_options": 1, "stream": true}'),
    ("POST", "/v1/completions", b'{"prompt": [3.5]}'),
    ("POST", "/v1/chat/completions", b'{"messages": [{"role": "user", "content": null}]}'),
    ("POST", "/v1/chat/completions", b'{"messages": [{"role": 1, "content": "x"}]}'),
    ("POST", "/v1/chat/completions", b'{"messages": {"role": "user"}}'),
    ("POST", "/v1/chat/completions", b'{"messages": [[]]}'),
    ("POST", "/api/models", b'{"path": ["smollm2"]}'), ("POST", "/api/models", b'{"path": ""}'),
    ("POST", "/api/models", b'{"path": "smollm2", "name": "a/b"}'),
    ("POST", "/api/models", b'{"path": "smollm2", "name": " m"}'),
    ("POST", "/api/models", b'{"path": "smollm2", "cpu_moe": -1}'),
    ("POST", "/api/models", b'{"path": "smollm2", "cpu_moe": "1"}'),
    ("POST", "/api/models", b'{"path": "/dev/zero"}'), ("POST", "/api/models", b'{"path": "/"}'),
    ("POST", "/api/models/m/evict", b'{"full": 1}'), ("POST", "/api/models/m/evict", b"[]"),
    ("POST", "/api/models/nope/pin", b""), ("DELETE", "/api/models/nope", b""),
    ("GET", "/v1/models/nope", b""), ("PUT", "/v1/completions", b"{}"),
    ("POST", "/v1/models", b"{}"), ("GET", "/api/models/m/../../etc/passwd", b""),
]


def fuzz_status(base: str, method: str, path: str, raw: bytes) -> int:
    got, _, out = request(base, method, path, raw=raw or None, key=None)
    assert 400 <= got < 500, (method, path, raw, got, out)
    assert isinstance(out, dict) and set(out) == {"error"}, out
    return got


def _gguf_cases(tmp_path) -> list[bytes]:
    """Random bytes, with the magic and without, and a small valid GGUF cut at every offset
    of its header, metadata and tensor infos, then every 40 bytes of its tensor data."""
    rng = random.Random(16)
    cases = [rng.randbytes(n) for n in (1, 4, 24, 100, 4096)]
    cases += [b"GGUF" + struct.pack("<I", 3) + rng.randbytes(n) for n in (0, 16, 200, 4096)]
    path = write_valid(tmp_path / "tiny.gguf")
    data, header_end = path.read_bytes(), Layout(path).data_offset
    cases += [data[:n] for n in range(header_end + 1)]
    cases += [data[:n] for n in range(header_end + 1, len(data), 40)]
    cases.append(data)                               # whole, but no model of any architecture
    return cases


def test_fuzz_gives_4xx_and_the_server_keeps_answering(base, engine, ref, tmp_path):
    t0 = time.monotonic()
    for method, path, raw in FUZZ_REQUESTS:
        fuzz_status(base, method, path, raw)
    path = tmp_path / "fuzz.gguf"
    for i, blob in enumerate(_gguf_cases(tmp_path)):
        path.write_bytes(blob)
        got = fuzz_status(base, "POST", "/api/models",
                          json.dumps({"path": str(path), "name": f"f{i}"}).encode())
        assert got == 400, (i, blob[:64])
    assert time.monotonic() - t0 < 120, "the fuzz took too long: something hangs"
    assert [s["name"] for s in engine.status()] == ["m"]
    answers_correctly(base, ref)


def test_concurrent_bad_requests_do_not_disturb_a_generation(base, ref):
    errors: list[int] = []

    def hammer() -> None:
        for method, path, raw in FUZZ_REQUESTS[:12]:
            errors.append(request(base, method, path, raw=raw, key=None)[0])

    threads = [threading.Thread(target=hammer) for _ in range(3)]
    for t in threads:
        t.start()
    answers_correctly(base, ref)
    for t in threads:
        t.join(120)
    assert len(errors) == 36 and all(400 <= e < 500 for e in errors)
