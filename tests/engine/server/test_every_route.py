"""Every route the server lists refuses what test_access.py and test_serve.py check on a few:
a request without the API key (or with a wrong one), a Host the server does not answer to,
and a browser Origin it was not told about. The cases are drawn from `Server.routes()`
itself, so a route added later is checked without touching this file. Against a server on
the fake engine: no route may reach it, which its call log and status show."""
from __future__ import annotations

import json
import re

import pytest

from engine.server.anthropic import ERROR_TYPES, is_anthropic_path
from engine.server.app import Server, make_app
from engine.server.ollama import is_ollama_path
from tests.engine.server.test_access import send
from tests.engine.server.test_serve import ServerThread, assert_error
from tests.helpers.fake_engine import FakeEngine

KEY = "route-key"
MODEL = "m"
ORIGIN = "http://ui.example"
EVIL = "http://evil.example"
OPEN = {"/health", "/metrics"}         # the routes that need no key (README: "stay open")
PARAM = re.compile(r"\{(\w+)\}")


def listed_routes() -> list[tuple[str, str]]:
    """(method, path) of every route a Server serves, read from a Server of its own."""
    server = Server(FakeEngine())
    try:
        return [(method, path) for method, path, _ in server.routes()]
    finally:
        server.pool.shutdown()


ROUTES = listed_routes()


def fill(path: str, name: str = MODEL) -> str:
    """The path with each {parameter} replaced by a model's name."""
    return PARAM.sub(name, path)


def body_for(method: str, name: str, model_path: str) -> bytes | None:
    """One JSON body that every POST or DELETE route could act on: a real model, a prompt, a
    file to load. A route that ran would leave a trace on the engine."""
    if method not in ("POST", "DELETE"):
        return None
    return json.dumps({"model": name, "name": name, "path": model_path, "prompt": "hi",
                       "messages": [{"role": "user", "content": "hi"}], "input": "hi",
                       "max_tokens": 1, "stream": False}).encode()


@pytest.fixture(scope="module")
def served(smollm2_path):
    eng = FakeEngine()
    eng.load(smollm2_path, name=MODEL)
    srv = ServerThread([make_app(eng, [MODEL], api_key=KEY, cors_origins=[ORIGIN])])
    yield eng, srv.ports[0], smollm2_path
    srv.close()
    eng.close()


def snapshot(eng: FakeEngine):
    return list(eng.calls), [(s["name"], s["state"], s["pinned"]) for s in eng.status()]


def assert_refused(status: int, code: str, words: str, method: str, path: str,
                   got: int, body) -> None:
    """The refusal in the route's own error shape: Ollama's or Anthropic's on their routes,
    else OpenAI's."""
    if method == "HEAD":                       # no body comes back
        assert got == status, (method, path, got)
        return
    if is_anthropic_path(path):
        assert got == status and isinstance(body, dict) and body["type"] == "error", \
            (method, path, got, body)
        assert body["error"]["type"] == ERROR_TYPES[status] and words in body["error"]["message"]
    elif is_ollama_path(path):
        assert got == status and isinstance(body, dict) and set(body) == {"error"}, \
            (method, path, got, body)
        assert words in body["error"], body
    else:
        err = assert_error(status, got, body, None, code)
        assert words in err["message"], err


def test_the_routes_are_listed_once_and_filled():
    assert len(ROUTES) == len(set(ROUTES)) and len(ROUTES) >= 20
    assert ("POST", "/v1/chat/completions") in ROUTES and ("GET", "/api/tags") in ROUTES
    for method, path in ROUTES:
        assert "{" not in fill(path) and "}" not in fill(path), path
    assert fill("/api/models/{name}/pin") == f"/api/models/{MODEL}/pin"
    # every route but the open ones lies under /v1 or /api, where the key is asked for
    outside = {path for _, path in ROUTES if not path.startswith(("/v1/", "/api/"))}
    assert outside == OPEN


@pytest.mark.parametrize("method,path", ROUTES, ids=[f"{m} {p}" for m, p in ROUTES])
def test_the_key_is_required(served, method, path):
    eng, port, model_path = served
    before = snapshot(eng)
    url, body = fill(path), body_for(method, MODEL, model_path)
    json_type = {"Content-Type": "application/json"} if body is not None else {}
    if path in OPEN:
        got, _, out = send(port, method, url, body, json_type)
        assert got == 200, out
        return
    for auth in (None, "Bearer wrong", "Bearer ", f"Basic {KEY}", KEY):
        headers = dict(json_type)
        if auth is not None:
            headers["Authorization"] = auth
        got, _, out = send(port, method, url, body, headers)
        assert_refused(401, "invalid_api_key", "API key", method, path, got, out)
    assert snapshot(eng) == before
    # with the key, the same route passes the check (an unknown model: nothing is changed)
    got, _, out = send(port, method, fill(path, "nosuch"), body_for(method, "nosuch", "/no/such"),
                       {**json_type, "Authorization": f"Bearer {KEY}"})
    assert got not in (401, 403), (method, path, got, out)


@pytest.mark.parametrize("method,path", ROUTES, ids=[f"{m} {p}" for m, p in ROUTES])
def test_a_foreign_host_is_refused(served, method, path):
    eng, port, model_path = served
    before = snapshot(eng)
    body = body_for(method, MODEL, model_path)
    headers = {"Authorization": f"Bearer {KEY}"}
    if body is not None:
        headers["Content-Type"] = "application/json"
    for host in (f"attacker.example:{port}", "localhost.attacker.example", f"192.0.2.7:{port}"):
        got, _, out = send(port, method, fill(path), body, headers, host=host)
        assert_refused(403, "host_not_allowed", "--allow-host", method, path, got, out)
    assert snapshot(eng) == before


@pytest.mark.parametrize("method,path", ROUTES, ids=[f"{m} {p}" for m, p in ROUTES])
def test_a_cross_site_origin_is_refused(served, method, path):
    eng, port, model_path = served
    before = snapshot(eng)
    body = body_for(method, MODEL, model_path)
    key = {"Authorization": f"Bearer {KEY}"}
    for origin in (EVIL, "null"):
        # a page's request with JSON (as after a preflight) and without one (text/plain)
        for ctype in ("application/json", "text/plain"):
            headers = {**key, "Origin": origin}
            if body is not None:
                headers["Content-Type"] = ctype
            got, hdrs, out = send(port, method, fill(path), body, headers)
            assert_refused(403, "origin_not_allowed", "--cors-origin", method, path, got, out)
            assert "Access-Control-Allow-Origin" not in hdrs
        # the page's preflight for the route
        got, _, out = send(port, "OPTIONS", fill(path), None, {
            "Origin": origin, "Access-Control-Request-Method": method})
        assert_refused(403, "origin_not_allowed", "--cors-origin", "OPTIONS", path, got, out)
    assert snapshot(eng) == before
    # the allowed origin's preflight passes on the same route
    got, hdrs, _ = send(port, "OPTIONS", fill(path), None, {
        "Origin": ORIGIN, "Access-Control-Request-Method": method})
    assert got == 204 and hdrs["Access-Control-Allow-Origin"] == ORIGIN
