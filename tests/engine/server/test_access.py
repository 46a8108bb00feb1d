"""Who may use the endpoint: the Host names it answers to, browser origins, JSON bodies, and
`hotseat serve` refusing a network-facing bind without a key. Against the real server on the
bundled model, over raw HTTP as a hostile web page would send it; nothing here generates."""
from __future__ import annotations

import http.client
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time

import pytest

from engine.api import Engine
from engine.server.access import allowed_host_names, host_name
from engine.server.app import make_app
from engine.server.serve import check_exposure, is_loopback
from tests.conftest import ROOT
from tests.engine.server.test_serve import ServerThread, assert_error

pytestmark = pytest.mark.gpu

ORIGIN = "http://ui.example"
EVIL = "http://evil.example"
ALLOWED = "hotseat.test"
SERVING = re.compile(r"^hotseat serving (.+) on http://(\S+):(\d+) \(device: .+\)$")


@pytest.fixture(scope="module")
def engine(smollm2_path):
    eng = Engine(n_ctx=128)
    eng.load(smollm2_path, name="m")
    yield eng
    eng.close()


@pytest.fixture(scope="module")
def port(engine) -> int:
    """An app without a key, one allowed origin and one extra Host name."""
    srv = ServerThread([make_app(engine, ["m"], cors_origins=[ORIGIN], allow_hosts=[ALLOWED])])
    yield srv.ports[0]
    srv.close()


def send(port: int, method: str, path: str, body: bytes | None = None,
         headers: dict | None = None, host: str | None = None):
    """(status, headers, parsed JSON or text) of one request, its headers exactly these."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    h = dict(headers or {})
    h["Host"] = host if host is not None else f"127.0.0.1:{port}"
    try:
        conn.request(method, path, body=body, headers=h)
        resp = conn.getresponse()
        text = resp.read().decode()
        ctype = resp.getheader("Content-Type", "")
        return resp.status, resp.headers, json.loads(text) if "json" in ctype and text else text
    finally:
        conn.close()


def names(engine) -> list[str]:
    return [s["name"] for s in engine.status()]


# -- Host ---------------------------------------------------------------------------------

def test_only_the_servers_own_host_names_are_answered(port, engine):
    for host in (f"127.0.0.1:{port}", f"localhost:{port}", f"[::1]:{port}", "LOCALHOST",
                 f"localhost.:{port}", f"{ALLOWED}:{port}", ALLOWED.upper()):
        got, _, body = send(port, "GET", "/v1/models", host=host)
        assert got == 200 and body["data"][0]["id"] == "m", (host, body)
    # a DNS-rebinding page reaches 127.0.0.1 under its own name; an address that is not
    # this server's is refused too on a loopback bind
    for host in (f"attacker.example:{port}", "attacker.example", f"192.0.2.7:{port}",
                 "localhost.attacker.example", f"{ALLOWED}.evil:{port}", ""):
        for method, path, body in (("GET", "/health", None), ("GET", "/v1/models", None),
                                   ("POST", "/api/models", b'{"path": "smollm2", "name": "x"}')):
            got, _, out = send(port, method, path, body, {"Content-Type": "application/json"},
                               host=host)
            err = assert_error(403, got, out, None, "host_not_allowed")
            assert "--allow-host" in err["message"]
    assert names(engine) == ["m"]


# -- Origin -------------------------------------------------------------------------------

def test_a_cross_site_text_plain_post_is_refused(port, engine):
    """What a page sends without a preflight: refused on every route, before any work."""
    plain = {"Origin": EVIL, "Content-Type": "text/plain"}
    for path, body in (("/api/models", {"path": "smollm2", "name": "x"}),
                       ("/api/models/m/evict", {}), ("/api/models/m/pin", None),
                       ("/v1/completions", {"model": "m", "prompt": "hi", "max_tokens": 1}),
                       ("/v1/chat/completions",
                        {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1})):
        raw = None if body is None else json.dumps(body).encode()
        got, hdrs, out = send(port, "POST", path, raw, plain)
        err = assert_error(403, got, out, None, "origin_not_allowed")
        assert EVIL in err["message"] and "--cors-origin" in err["message"]
        assert "Access-Control-Allow-Origin" not in hdrs
    for path in ("/v1/models", "/api/models", "/api/vram", "/health", "/metrics"):
        got, _, out = send(port, "GET", path, headers={"Origin": EVIL})
        assert_error(403, got, out, None, "origin_not_allowed")
    got, _, out = send(port, "DELETE", "/api/models/m", headers={"Origin": EVIL})
    assert_error(403, got, out, None, "origin_not_allowed")
    # sandboxed frames and file:// pages send "null"; a preflight from the page is refused
    got, _, out = send(port, "GET", "/v1/models", headers={"Origin": "null"})
    assert_error(403, got, out, None, "origin_not_allowed")
    got, _, out = send(port, "OPTIONS", "/v1/completions", headers={
        "Origin": EVIL, "Access-Control-Request-Method": "POST"})
    assert_error(403, got, out, None, "origin_not_allowed")
    models = {s["name"]: s for s in engine.status()}
    assert list(models) == ["m"] and models["m"]["state"] == "warm"
    assert models["m"]["pinned"] is False


def test_the_allowed_origin_and_clients_without_one_pass(port):
    got, hdrs, out = send(port, "GET", "/v1/models", headers={"Origin": ORIGIN})
    assert got == 200 and hdrs["Access-Control-Allow-Origin"] == ORIGIN
    got, hdrs, _ = send(port, "OPTIONS", "/v1/completions", headers={
        "Origin": ORIGIN, "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "content-type"})
    assert got == 204 and hdrs["Access-Control-Allow-Origin"] == ORIGIN
    got, _, out = send(port, "GET", "/v1/models")               # curl, the openai client
    assert got == 200 and out["data"][0]["id"] == "m"


# -- body type ----------------------------------------------------------------------------

def test_post_bodies_must_be_json(port, engine):
    body = b'{"path": "smollm2", "name": "x"}'
    for ctype in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data",
                  "application/jsonx", None):
        headers = {} if ctype is None else {"Content-Type": ctype}
        got, _, out = send(port, "POST", "/api/models", body, headers)
        err = assert_error(415, got, out, None, "unsupported_media_type")
        assert "application/json" in err["message"]
    got, _, out = send(port, "POST", "/api/models/m/evict", b"{}", {"Content-Type": "text/plain"})
    assert_error(415, got, out, None, "unsupported_media_type")
    assert names(engine) == ["m"] and engine.status()[0]["state"] == "warm"
    # JSON with a charset passes the check (and then fails on its path, a 400)
    got, _, out = send(port, "POST", "/api/models", b'{"path": "/no/such/file.gguf"}',
                       {"Content-Type": "application/json; charset=utf-8"})
    assert_error(400, got, out, "path", "invalid_model_file")
    # a route that reads no body takes an empty POST without a type
    got, _, out = send(port, "POST", "/api/models/m/warm")
    assert got == 200 and out["name"] == "m"


# -- hotseat serve on the network ---------------------------------------------------------

def test_exposure_rules():
    assert all(map(is_loopback, ("127.0.0.1", "127.8.9.1", "::1", "[::1]", "localhost")))
    assert not any(map(is_loopback, ("0.0.0.0", "::", "192.168.1.5", "myhost.lan")))
    assert check_exposure("127.0.0.1", None, False) is None
    assert check_exposure("0.0.0.0", "key", False) is None
    with pytest.raises(ValueError, match="--api-key .*--insecure-no-key"):
        check_exposure("0.0.0.0", None, False)
    with pytest.raises(ValueError):
        check_exposure("myhost.lan", "", False)
    assert "without an API key" in check_exposure("::", None, True)
    assert host_name("[::1]:8080") == host_name("::1") == "[::1]"
    assert host_name("Box.LAN.:80") == "box.lan"
    assert allowed_host_names("0.0.0.0", ["box.lan"]) == {"127.0.0.1", "localhost", "[::1]",
                                                          "box.lan"}
    assert "192.168.1.5" in allowed_host_names("192.168.1.5")


def hotseat_serve(*args: str) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k != "HOTSEAT_API_KEY"}
    env["PYTHONPATH"] = str(ROOT)
    return subprocess.Popen([sys.executable, "-m", "engine.cli", "serve", "--port", "0",
                             "--ctx", "64", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=ROOT, env=env)


def test_a_network_bind_needs_a_key():
    t0 = time.monotonic()
    proc = hotseat_serve("--host", "0.0.0.0")
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 2 and out == ""
    (line,) = err.strip().splitlines()
    assert line.startswith("hotseat: error: --host 0.0.0.0 is reachable from other machines")
    assert "--api-key" in line and "--insecure-no-key" in line
    assert time.monotonic() - t0 < 60                  # refused before loading anything


def test_insecure_no_key_warns_and_answers_addresses_and_allowed_names():
    proc = hotseat_serve("--host", "0.0.0.0", "--insecure-no-key", "--allow-host", "box.lan")
    watchdog = threading.Timer(180, proc.kill)
    watchdog.start()
    try:
        line = proc.stdout.readline().strip()
    finally:
        watchdog.cancel()
    try:
        m = SERVING.match(line)
        assert m is not None, (line, proc.stderr.read() if proc.poll() is not None else "")
        assert m.group(2) == "0.0.0.0"
        port = int(m.group(3))
        for host in (f"127.0.0.1:{port}", f"box.lan:{port}", f"192.0.2.7:{port}",
                     f"[2001:db8::1]:{port}", f"localhost:{port}"):
            got, _, body = send(port, "GET", "/v1/models", host=host)
            assert got == 200, (host, body)          # any address: it cannot be rebound
        got, _, body = send(port, "GET", "/v1/models", host=f"attacker.example:{port}")
        assert_error(403, got, body, None, "host_not_allowed")
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            rc = proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise
    err = proc.stderr.read()
    assert rc == 0, err
    assert err.startswith("hotseat: warning: serving on 0.0.0.0 without an API key"), err
