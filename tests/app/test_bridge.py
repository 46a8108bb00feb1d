"""EngineBridge on the fake engine: jobs on the worker thread, results as signals."""
from __future__ import annotations

import json
import socket
import threading
import time
import urllib.error
import urllib.request

import pytest

from app.bridge import EngineBridge
from tests.helpers.fake_engine import MODEL_BYTES
from tests.helpers.signals import Recorder, until

# engine/server/app.py keys its aiohttp app with a string; not this package's to change
pytestmark = pytest.mark.filterwarnings("ignore:It is recommended to use web.AppKey")


def load(qtbot, bridge, path: str, **kw) -> str:
    n = len(bridge.rec.loaded)
    bridge.load(path, **kw)
    until(qtbot, lambda: len(bridge.rec.loaded) > n)
    name = bridge.rec.loaded[-1][1]
    until(qtbot, lambda: bridge.rec.model(name))
    return name


def test_load_reports_progress_then_models_changed(qtbot, bridge, models):
    rec = bridge.rec
    bridge.load(models["a"])
    until(qtbot, lambda: rec.model("a"))
    assert rec.loaded == [(models["a"], "a")]
    total = MODEL_BYTES["weights"]
    assert rec.progress[-1] == (models["a"], total, total)
    done = [d for _, d, _ in rec.progress]
    assert done == sorted(done) and len(done) == 4
    m = rec.model("a")
    assert (m["name"], m["state"], m["arch"]) == ("a", "warm", "llama")
    assert m["quant"] == "Q8_0" and m["file_bytes"] > 0         # added by app.modelinfo
    assert m["device_bytes"] == MODEL_BYTES


def test_jobs_run_on_the_worker_thread(qtbot, bridge, models):
    threads = []
    original = bridge.fake.load

    def spy(*a, **kw):
        threads.append(threading.current_thread())
        return original(*a, **kw)

    bridge.fake.load = spy
    load(qtbot, bridge, models["a"])
    assert threads and threads[0] is not threading.main_thread()


def test_load_does_not_block_the_caller(qtbot, make_bridge, models):
    bridge = make_bridge(load_delay_s=0.2)               # 0.8 s in all
    t0 = time.monotonic()
    bridge.load(models["a"])
    assert time.monotonic() - t0 < 0.1
    until(qtbot, lambda: bridge.rec.loaded)


def test_bad_files_fail_with_one_line(qtbot, bridge, models, tmp_path):
    rec = bridge.rec
    for i, key in enumerate(("bad", "text")):
        bridge.load(models[key])
        until(qtbot, lambda: len(rec.failed) > i)
        path, summary, details = rec.failed[-1]
        assert path == models[key] and "\n" not in details
        assert summary == "This is not a GGUF model file"        # by the error's reason
        assert "not a GGUF file" in details and path in details
    bridge.load(str(tmp_path / "missing.gguf"))
    until(qtbot, lambda: len(rec.failed) == 3)
    assert rec.failed[-1][1] == "The file was not found (moved or deleted?)"
    assert "missing.gguf" in rec.failed[-1][2]
    assert bridge.fake.models == {} and rec.loaded == []


def test_loading_the_same_name_twice_fails(qtbot, bridge, models):
    load(qtbot, bridge, models["a"])
    bridge.load(models["a"])
    until(qtbot, lambda: bridge.rec.failed)
    assert bridge.rec.failed[0][1] == "A model with this name is already loaded"
    assert "already loaded" in bridge.rec.failed[0][2]


def test_pin_unpin_evict_warm_unload(qtbot, bridge, models):
    rec = bridge.rec
    load(qtbot, bridge, models["a"])
    bridge.pin("a")
    until(qtbot, lambda: rec.model("a")["pinned"])
    bridge.evict("a")                                    # the engine refuses; no crash
    until(qtbot, lambda: rec.errors)
    assert "pinned" in rec.errors[0]
    bridge.set_pinned("a", False)
    until(qtbot, lambda: not rec.model("a")["pinned"])
    bridge.evict("a")
    until(qtbot, lambda: rec.model("a")["state"] == "cold")
    assert rec.model("a")["device_bytes"] == {}          # full release by default
    bridge.warm("a")
    until(qtbot, lambda: rec.model("a")["state"] == "warm")
    bridge.unload("a")
    until(qtbot, lambda: rec.names() == [])
    assert [c[0] for c in bridge.fake.calls] == ["load", "pin", "evict", "unpin", "evict",
                                                 "warm", "unload"]


def test_unknown_model_is_an_error_message(qtbot, bridge):
    bridge.pin("nope")
    until(qtbot, lambda: bridge.rec.errors)
    assert bridge.rec.errors == ["no model named 'nope' is loaded"]


def test_load_with_a_name_and_pin(qtbot, bridge, models):
    name = load(qtbot, bridge, models["a"], name="alpha", pin=True)
    assert name == "alpha" and bridge.rec.model("alpha")["pinned"] is True


def test_refresh_emits_status_and_vram(qtbot, bridge, models):
    load(qtbot, bridge, models["a"])
    n = len(bridge.rec.vram)
    bridge.refresh()
    until(qtbot, lambda: len(bridge.rec.vram) > n)
    v = bridge.rec.vram[-1]
    assert v["budget_bytes"] == bridge.fake.budget
    assert v["granted_bytes"] == sum(MODEL_BYTES.values())


def test_refreshes_do_not_pile_up(qtbot, make_bridge, models):
    bridge = make_bridge(load_delay_s=0.1)
    calls = []
    original = bridge.fake.status
    bridge.fake.status = lambda: calls.append(1) or original()
    bridge.load(models["a"])
    for _ in range(20):                                  # while the worker is busy loading
        bridge.refresh()
    until(qtbot, lambda: bridge.rec.loaded)
    qtbot.wait(100)
    assert len(calls) <= 2                               # the load's own, and one refresh


def test_budget_and_release_mode_reach_the_engine(qtbot, make_bridge):
    bridge = make_bridge(budget_bytes=512 << 20, full_release=False)
    fake = bridge.fake
    assert fake.budget == 512 << 20 and fake.full_release is False
    bridge.set_budget_bytes(256 << 20)
    until(qtbot, lambda: bridge.rec.vram[-1]["budget_bytes"] == 256 << 20)
    bridge.set_full_release(True)
    until(qtbot, lambda: fake.full_release is True)
    bridge.set_budget_bytes(None)                        # back to the engine's own choice
    until(qtbot, lambda: bridge.rec.vram[-1]["budget_bytes"] == fake.default_budget())
    bridge.set_host_budget_bytes(64 << 20)
    until(qtbot, lambda: fake.host_budget == 64 << 20)
    assert [c for c in fake.calls if c[0].startswith("set_")] == [
        ("set_budget", 256 << 20), ("set_full_release", True), ("set_budget", None),
        ("set_host_budget", 64 << 20)]


def test_flash_attn_reaches_the_engine(qtbot, make_bridge):
    bridge = make_bridge(flash_attn="on")
    until(qtbot, lambda: bridge.rec.devices)
    assert bridge.fake.flash_attn == "on"
    bridge.set_flash_attn("off")
    until(qtbot, lambda: bridge.fake.flash_attn == "off")
    assert ("set_flash_attn", "off") in bridge.fake.calls


def test_engine_that_cannot_open_reports_and_keeps_answering(qtbot):
    def broken(**kw):
        raise RuntimeError("no Vulkan device")

    b = EngineBridge(engine_factory=broken)
    rec = Recorder(b)
    try:
        b.start()
        until(qtbot, lambda: rec.errors)
        assert rec.errors[0] == "The GPU could not be opened"
        assert "no Vulkan device" in rec.error_details[0]
        b.load("/x/a.gguf")
        until(qtbot, lambda: rec.failed)
        assert rec.failed[0][1] == "The GPU could not be opened"
        assert "no Vulkan device" in rec.failed[0][2]
        b.set_endpoint(True)
        until(qtbot, lambda: rec.endpoint)
        assert rec.endpoint[0][0] is False
    finally:
        b.close()


def test_close_closes_the_engine_and_ignores_later_calls(qtbot, bridge, models):
    fake = bridge.fake
    bridge.close()
    assert fake.closed
    bridge.load(models["a"])                             # ignored, no error
    assert ("load", models["a"]) not in fake.calls


def test_generate_runs_on_the_worker(qtbot, bridge, models):
    load(qtbot, bridge, models["a"])
    bridge.generate("a", "hi", 2)
    until(qtbot, lambda: bridge.rec.generated)
    assert bridge.rec.generated == [("a", " ok ok")]


def get(url: str | urllib.request.Request, timeout: float = 5.0):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.status, json.loads(r.read())


def free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def test_endpoint_serves_health_and_models_then_stops(qtbot, make_bridge, models):
    bridge = make_bridge(port=0)                         # 0: a free port
    rec = bridge.rec
    load(qtbot, bridge, models["a"])
    bridge.set_endpoint(True)
    until(qtbot, lambda: rec.endpoint, timeout=10000)
    running, url = rec.endpoint[-1]
    assert running and url.startswith("http://127.0.0.1:")
    assert get(url + "/health") == (200, {"status": "ok", "faults": 0, "last_fault": None})
    load(qtbot, bridge, models["b"])                     # loaded while serving: served too
    until(qtbot, lambda: len(get(url + "/v1/models")[1]["data"]) == 2)
    assert sorted(m["id"] for m in get(url + "/v1/models")[1]["data"]) == ["a", "b"]
    bridge.unload("b")
    until(qtbot, lambda: [m["id"] for m in get(url + "/v1/models")[1]["data"]] == ["a"])
    bridge.set_endpoint(False)
    until(qtbot, lambda: len(rec.endpoint) == 2, timeout=10000)
    assert rec.endpoint[-1] == (False, "")
    with pytest.raises(urllib.error.URLError):
        get(url + "/health", timeout=2)


def test_a_load_that_ends_while_the_endpoint_starts_is_served(qtbot, make_bridge, models,
                                                               monkeypatch):
    """The load lane tells the endpoint about a model only once the endpoint is there; a
    load finishing while it starts is picked up when it has started."""
    from app.bridge.endpoint import Endpoint

    bridge = make_bridge(port=0)
    start = Endpoint.start

    def start_during_a_load(ep):
        bridge.fake.load(models["b"])      # after the endpoint's list, before it is running
        return start(ep)
    monkeypatch.setattr(Endpoint, "start", start_during_a_load)
    bridge.set_endpoint(True)
    until(qtbot, lambda: bridge.rec.endpoint, timeout=10000)
    url = bridge.rec.endpoint[-1][1]
    until(qtbot, lambda: [m["id"] for m in get(url + "/v1/models")[1]["data"]] == ["b"])


def test_endpoint_on_a_taken_port_reports(qtbot, make_bridge):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    try:
        bridge = make_bridge(port=s.getsockname()[1])
        bridge.set_endpoint(True)
        until(qtbot, lambda: bridge.rec.endpoint and bridge.rec.errors, timeout=10000)
        running, why = bridge.rec.endpoint[-1]
        assert running is False and "cannot listen" in why
        assert "cannot listen" in bridge.rec.errors[-1]
    finally:
        s.close()


def test_port_change_moves_a_running_endpoint(qtbot, make_bridge):
    bridge = make_bridge(port=0)
    rec = bridge.rec
    bridge.set_endpoint(True)
    until(qtbot, lambda: rec.endpoint, timeout=10000)
    port = free_port()
    bridge.set_port(port)
    until(qtbot, lambda: len(rec.endpoint) == 3, timeout=10000)   # stopped, started
    assert rec.endpoint[1:] == [(False, ""), (True, f"http://127.0.0.1:{port}")]
    assert get(rec.endpoint[-1][1] + "/health")[0] == 200


# -- busy state and activity (item 4) ---------------------------------------------------------
def test_a_warm_during_a_generation_shows_queued_then_runs(qtbot, make_bridge, models):
    bridge = make_bridge()
    busy = []
    bridge.busy_changed.connect(lambda b: busy.append(b))
    load(qtbot, bridge, models["a"])
    load(qtbot, bridge, models["b"])
    bridge.evict("b")
    until(qtbot, lambda: bridge.rec.model("b")["state"] == "cold")
    bridge.fake.token_delay_s = 0.02
    rid = bridge.chat("a", [{"role": "user", "content": "hi"}], max_tokens=40)
    until(qtbot, lambda: any(b.get("a", "").startswith("generating") for b in busy))
    bridge.warm("b")                                     # waits for the generation
    until(qtbot, lambda: busy and busy[-1].get("b") == "queued: warm")
    until(qtbot, lambda: any("tok/s" in b.get("a", "") for b in busy), timeout=5000)
    rate = next(b["a"] for b in busy if "tok/s" in b.get("a", ""))
    assert float(rate.split("· ")[1].split()[0]) > 1
    until(qtbot, lambda: bridge.rec.model("b")["state"] == "warm", timeout=5000)
    until(qtbot, lambda: busy[-1] == {})
    assert rid > 0


def test_status_answers_while_a_generation_runs(qtbot, make_bridge, models):
    bridge = make_bridge()
    load(qtbot, bridge, models["a"])
    bridge.fake.token_delay_s = 0.05
    bridge.chat("a", [{"role": "user", "content": "hi"}], max_tokens=40)   # 2 s
    until(qtbot, lambda: bridge.activity.generating())
    n = len(bridge.rec.vram)
    bridge.refresh()
    until(qtbot, lambda: len(bridge.rec.vram) > n, timeout=1000)
    assert bridge.activity.generating()


def test_pin_is_not_stuck_behind_a_load(qtbot, make_bridge, models):
    bridge = make_bridge()
    load(qtbot, bridge, models["a"])
    bridge.fake.load_delay_s = 0.5                       # b's upload: 2 s
    bridge.load(models["b"])
    until(qtbot, lambda: bridge.activity.ops())
    qtbot.wait(600)
    # the fake's upload holds its device lock like the engine thread; the parse does not
    bridge.set_pinned("a", True)
    until(qtbot, lambda: bridge.rec.model("a").get("pinned"), timeout=5000)


def test_activity_log_entries(qtbot, bridge, models):
    lines = []
    bridge.log_entry.connect(lines.append)
    load(qtbot, bridge, models["a"])
    bridge.chat("a", [{"role": "user", "content": "hi"}], max_tokens=3)
    until(qtbot, lambda: any("Chat: 3 tokens from a" in x for x in lines))
    assert any(x.split(" ", 1)[1].startswith("Loaded a in") for x in lines)
    assert lines[0][2] == ":" and lines[0][5] == ":"        # HH:MM:SS first


# -- chat (item 8) ----------------------------------------------------------------------------
def test_chat_streams_on_a_worker_thread(qtbot, bridge, models):
    load(qtbot, bridge, models["a"])
    threads, deltas, done = [], [], []
    original = bridge.fake.generate

    def spy(*a, **kw):
        threads.append(threading.current_thread())
        return original(*a, **kw)

    bridge.fake.generate = spy
    bridge.chat_delta.connect(lambda rid, t: deltas.append((rid, t)))
    bridge.chat_done.connect(lambda rid, info: done.append((rid, info)))
    rid = bridge.chat("a", [{"role": "user", "content": "hi"}], max_tokens=4)
    until(qtbot, lambda: done)
    assert threads[0] is not threading.main_thread()
    assert deltas == [(rid, " ok")] * 4
    assert done[0][0] == rid and done[0][1]["text"] == " ok" * 4
    assert done[0][1]["tokens"] == 4 and done[0][1]["error"] == ""


def test_chat_can_be_cancelled(qtbot, bridge, models):
    load(qtbot, bridge, models["a"])
    bridge.fake.token_delay_s = 0.02
    done = []
    bridge.chat_done.connect(lambda rid, info: done.append(info))
    rid = bridge.chat("a", [{"role": "user", "content": "hi"}], max_tokens=500)
    until(qtbot, lambda: bridge.activity.generating())
    bridge.cancel_chat(rid)
    until(qtbot, lambda: done, timeout=3000)
    assert done[0]["finish_reason"] == "cancelled" and done[0]["tokens"] < 500


def test_chat_with_an_unknown_model_reports(qtbot, bridge):
    done = []
    bridge.chat_done.connect(lambda rid, info: done.append(info))
    bridge.chat("nope", [{"role": "user", "content": "hi"}])
    until(qtbot, lambda: done)
    assert "no model named 'nope'" in done[0]["error"]


# -- idle eviction (item 8) -------------------------------------------------------------------
def test_idle_eviction_is_the_engines_and_shows_in_the_log(qtbot, bridge, models):
    load(qtbot, bridge, models["a"])
    load(qtbot, bridge, models["b"], pin=True)
    lines = []
    bridge.log_entry.connect(lines.append)
    bridge.set_idle_evict_s(120)
    until(qtbot, lambda: bridge.fake.idle_s == 120)      # handed to the engine
    # what the engine's idle thread does once the models have been unused for 3 minutes
    assert bridge.fake.evict_idle(now=time.monotonic() + 180) == ["a"]
    until(qtbot, lambda: bridge.rec.model("a")["state"] == "cold")   # refreshed at once
    assert bridge.rec.model("b")["state"] == "warm"
    until(qtbot, lambda: any(x.endswith("Evicted a after 3 min unused") for x in lines))
    # used again: warm, and idle from then on
    bridge.warm("a")
    until(qtbot, lambda: bridge.rec.model("a")["state"] == "warm")
    assert bridge.fake.evict_idle() == []


# -- arena (item 9) ---------------------------------------------------------------------------
def test_arena_status_is_reported(qtbot, bridge):
    got = []
    bridge.arena_changed.connect(got.append)
    bridge.fake.arena_state = {"state": "yielded", "until": 2e9, "holder_pid": 42}
    bridge.refresh()
    until(qtbot, lambda: got)
    assert got[-1] == {"state": "yielded", "until": 2e9, "holder_pid": 42}
    bridge.fake.arena_state = None
    bridge.refresh()
    until(qtbot, lambda: got[-1] == {})


def test_game_mode_giving_up_is_reported_and_logged(qtbot, bridge):
    """Without an arena the engine still reports game mode's record (enabled False); the
    bridge passes it on and logs why, and the return."""
    got, lines = [], []
    bridge.arena_changed.connect(got.append)
    bridge.log_entry.connect(lines.append)
    rec = {"t": 2e9, "free_bytes": 1 << 28, "need_bytes": 1 << 30, "reason": "another "
           "program is using the GPU's memory"}
    bridge.fake.arena_state = {"enabled": False, "state": "cold", "gave_up": rec}
    bridge.fake._emit("gave_up", rec)
    bridge.refresh()
    until(qtbot, lambda: got and got[-1].get("gave_up") == rec)
    until(qtbot, lambda: any(x.endswith("Gave the GPU up to another app: another program is "
                                        "using the GPU's memory") for x in lines))
    bridge.fake.arena_state = None
    bridge.fake._emit("came_back", {"gave_up": rec, "free_bytes": 1 << 33})
    bridge.refresh()
    until(qtbot, lambda: got[-1] == {})
    until(qtbot, lambda: any(x.endswith("Back on the GPU: the other app's memory is free "
                                        "again") for x in lines))


def test_yield_goes_through_the_engine_and_shows_until_when(qtbot, bridge, models):
    load(qtbot, bridge, models["a"])
    load(qtbot, bridge, models["b"], pin=True)
    got, lines = [], []
    bridge.arena_changed.connect(got.append)
    bridge.log_entry.connect(lines.append)
    bridge.yield_gpu(600)
    until(qtbot, lambda: ("yield_gpu", 600.0) in bridge.fake.calls)
    # the fake has no arena: its unpinned models went cold, and the bridge says until when
    until(qtbot, lambda: bridge.rec.model("a")["state"] == "cold")
    assert bridge.rec.model("b")["state"] == "warm"
    until(qtbot, lambda: got and got[-1].get("state") == "yielded")
    assert 590 < got[-1]["until"] - time.time() <= 600
    until_hm = time.strftime("%H:%M", time.localtime(got[-1]["until"]))
    until(qtbot, lambda: any(x.endswith(f"Yielded the GPU until {until_hm}") for x in lines))


# -- LAN and API key (item 8) -----------------------------------------------------------------
def test_endpoint_with_an_api_key(qtbot, make_bridge, models):
    bridge = make_bridge(port=0, api_key="sekrit")
    load(qtbot, bridge, models["a"])
    bridge.set_endpoint(True)
    until(qtbot, lambda: bridge.rec.endpoint, timeout=10000)
    url = bridge.rec.endpoint[-1][1]
    with pytest.raises(urllib.error.HTTPError) as err:
        get(url + "/v1/models")
    assert err.value.code == 401
    req = urllib.request.Request(url + "/v1/models", headers={"Authorization":
                                                              "Bearer sekrit"})
    with urllib.request.urlopen(req, timeout=5) as r:
        assert r.status == 200
    lan = {"Authorization": "Bearer sekrit", "Host": "192.168.1.20"}   # a LAN client's
    with pytest.raises(urllib.error.HTTPError) as err:
        get(urllib.request.Request(url + "/v1/models", headers=lan))
    assert err.value.code == 403                            # not while on 127.0.0.1 only
    bridge.set_access("0.0.0.0", "sekrit")                  # moves to every address
    until(qtbot, lambda: len(bridge.rec.endpoint) == 3, timeout=10000)
    url = bridge.rec.endpoint[-1][1]
    assert get(urllib.request.Request(url + "/v1/models", headers=lan))[0] == 200


def test_endpoint_requests_show_as_busy(qtbot, make_bridge, models):
    bridge = make_bridge(port=0)
    load(qtbot, bridge, models["a"])
    bridge.set_endpoint(True)
    until(qtbot, lambda: bridge.rec.endpoint, timeout=10000)
    url = bridge.rec.endpoint[-1][1]
    busy = []
    bridge.busy_changed.connect(busy.append)
    bridge.fake.token_delay_s = 0.02
    body = json.dumps({"model": "a", "prompt": "hi", "max_tokens": 30}).encode()
    req = urllib.request.Request(url + "/v1/completions", data=body,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as r:
        assert r.status == 200
    until(qtbot, lambda: any(b.get("a", "").startswith("generating") for b in busy))


def test_endpoint_passes_the_wait_header_to_the_engine(qtbot, make_bridge, models):
    """X-Hotseat-Wait reaches the engine's generate through the tray's wrapper."""
    bridge = make_bridge(port=0)
    load(qtbot, bridge, models["a"])
    bridge.set_endpoint(True)
    until(qtbot, lambda: bridge.rec.endpoint, timeout=10000)
    url = bridge.rec.endpoint[-1][1]
    body = json.dumps({"model": "a", "prompt": "hi", "max_tokens": 3}).encode()
    for wait in ("0", "2.5"):
        req = urllib.request.Request(url + "/v1/completions", data=body,
                                     headers={"Content-Type": "application/json",
                                              "X-Hotseat-Wait": wait})
        with urllib.request.urlopen(req, timeout=10) as r:
            assert r.status == 200
    assert bridge.fake.waits[-2:] == [0.0, 2.5]


# -- shutdown (items 1 and 2) -----------------------------------------------------------------
def test_shutdown_keeps_its_deadline_during_a_long_generation(qtbot, make_bridge, models):
    bridge = make_bridge()
    load(qtbot, bridge, models["a"])
    bridge.fake.token_delay_s = 0.05
    bridge.chat("a", [{"role": "user", "content": "hi"}], max_tokens=1000)   # 50 s
    until(qtbot, lambda: bridge.activity.generating())
    t0 = time.monotonic()
    assert bridge.shutdown(2.0) is True                   # cancelled, then closed
    assert time.monotonic() - t0 < 1.0 and bridge.fake.closed


def test_shutdown_returns_at_the_deadline_when_a_load_holds_the_device(qtbot, make_bridge,
                                                                       models):

    bridge = make_bridge(load_delay_s=1.0)                # a 4 s upload
    bridge.load(models["a"])
    until(qtbot, lambda: bridge.activity.ops())
    t0 = time.monotonic()
    assert bridge.shutdown(0.5) is False
    assert time.monotonic() - t0 < 0.9
    until(qtbot, lambda: bridge.fake.closed, timeout=8000)   # it still closes, later
