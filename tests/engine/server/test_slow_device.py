"""A real `hotseat serve` on a slow device: lavapipe with its two cores kept busy on purpose
by two busy-loop processes, as a loaded user machine is.

The sequence that once broke the server: a short greedy completion, a long chat prompt
(its passes took longer than the fixed fence deadline there was, and the timeout left the
next submit one fence late: every later answer wrong, an evict a segfault), the short
completion again, an evict. Now the long prompt answers 200, the next answer is the first
one, the evict answers 200 and the process lives on. Then a client that leaves during a
long prompt frees the model within 1 s (the passes are sized to the device's speed).

CI runs 24 copies of the sentence; HOTSEAT_STRESS=1 runs the issue's 150 (minutes).
"""
from __future__ import annotations

import http.client
import json
import multiprocessing
import os
import socket
import time
import urllib.parse

import pytest

from engine.tools.serveproc import ServeProcess

pytestmark = [pytest.mark.gpu, pytest.mark.slow]

SENTENCE = "The quick brown fox jumps over the lazy dog. "
COPIES = 150 if os.environ.get("HOTSEAT_STRESS") else 24
Q = {"prompt": "The capital of France is", "max_tokens": 8, "temperature": 0}


def _spin(stop) -> None:
    while not stop.is_set():
        pass


@pytest.fixture(scope="module")
def busy_cpu():
    """Two busy loops, one per core of the CI machine, for as long as the module runs."""
    ctx = multiprocessing.get_context("spawn")
    stop = ctx.Event()
    procs = [ctx.Process(target=_spin, args=(stop,), daemon=True) for _ in range(2)]
    for p in procs:
        p.start()
    yield
    stop.set()
    for p in procs:
        p.join(10)
        if p.is_alive():
            p.kill()


@pytest.fixture(scope="module")
def server(busy_cpu, tmp_path_factory):
    with ServeProcess(["smollm2"], ctx=2048,
                      arena_dir=str(tmp_path_factory.mktemp("arena"))) as s:
        s.wait_ready()
        yield s
        assert s.alive(), s.stderr()[-2000:]


def name(server: ServeProcess) -> str:
    return server.request("GET", "/v1/models")[2]["data"][0]["id"]


def test_a_long_prompt_on_a_loaded_device_leaves_the_server_right(server):
    got, _, first = server.request("POST", "/v1/completions", Q)
    assert got == 200, first
    chat = {"messages": [{"role": "user", "content": SENTENCE * COPIES}], "max_tokens": 4,
            "temperature": 0}
    t0 = time.monotonic()
    got, _, out = server.request("POST", "/v1/chat/completions", chat, timeout=3600)
    took = time.monotonic() - t0
    assert got == 200, out
    prompt_tokens = out["usage"]["prompt_tokens"]
    print(f"\n{prompt_tokens}-token chat prompt on the loaded device: {took:.1f} s")
    got, _, again = server.request("POST", "/v1/completions", Q)
    assert got == 200 and again["choices"][0]["text"] == first["choices"][0]["text"], again
    got, _, ev = server.request("POST", f"/api/models/{name(server)}/evict", {})
    assert got == 200, ev
    got, _, again = server.request("POST", "/v1/completions", Q)
    assert got == 200 and again["choices"][0]["text"] == first["choices"][0]["text"], again
    got, _, health = server.request("GET", "/health")
    assert got == 200 and health["status"] == "ok", health
    assert server.alive()


def test_a_client_that_leaves_frees_the_loaded_device_within_a_second(server):
    """The bound README states, measured here with the CPU loaded: the time from the
    client leaving to the next request's answer, less what that request takes alone."""
    hi = {"prompt": "Hi", "max_tokens": 1, "temperature": 0}
    alone = []
    for _ in range(2):
        t0 = time.monotonic()
        assert server.request("POST", "/v1/completions", hi)[0] == 200
        alone.append(time.monotonic() - t0)
    server.request("POST", f"/api/models/{name(server)}/evict", {})     # nothing cached
    server.request("POST", "/v1/completions", hi)                # warm again
    u = urllib.parse.urlsplit(server.url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=600)
    body = {"messages": [{"role": "user", "content": SENTENCE * 40}], "max_tokens": 4}
    conn.request("POST", "/v1/chat/completions", json.dumps(body).encode(),
                 {"Content-Type": "application/json"})
    time.sleep(3.0)                                   # the prompt's passes are running
    conn.sock.shutdown(socket.SHUT_RDWR)
    conn.close()
    left = time.monotonic()
    got, _, out = server.request("POST", "/v1/completions", hi)   # queued behind it
    answered = time.monotonic() - left
    assert got == 200, out
    freed = answered - min(alone)
    print(f"\nthe model was free {freed:.2f} s after the client left "
          f"(next answer {answered:.2f} s, {min(alone):.2f} s alone)")
    assert freed < 1.0, (answered, alone)
