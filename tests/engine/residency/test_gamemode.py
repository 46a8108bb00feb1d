"""Game mode (engine/residency/gamemode.py): the policy against scripted budget readings, then
the watcher in an Engine whose driver budget is faked (lavapipe has none), on SmolLM2: warm,
another program "allocates", the engine is cold within 1 s and says why, and comes back with
the same answer once the budget allows it."""
from __future__ import annotations

import threading
import time

import pytest

from engine.facade import Request
from engine.residency.gamemode import GameMode, GameWatch, GaveUp, Reading

MiB = 1 << 20
GiB = 1 << 30
HEAP = 24 * GiB
MODEL = 5 * GiB


def reading(others: int, own: int, heap: int = HEAP) -> Reading:
    """What VK_EXT_memory_budget reports with `others` bytes used by other programs and
    `own` by this process: the budget is what others leave, the usage our own."""
    return Reading(heap - others, own)


# -- the policy -------------------------------------------------------------------------------

def test_default_margin_is_3_percent_of_the_heap_and_at_least_512_mib():
    assert GameMode(HEAP).margin == int(HEAP * 0.03)
    assert GameMode(4 * GiB).margin == 512 * MiB
    assert GameMode(140 * GiB).margin == int(140 * GiB * 0.03)
    assert GameMode(HEAP).resume_margin == 2 * GameMode(HEAP).margin


def test_fits_while_others_leave_the_margin_free_then_release():
    gm = GameMode(HEAP)
    m = gm.margin
    assert gm.check(reading(0, MODEL), MODEL) == "fits"
    # others grow up to the margin's edge: still fits
    edge = HEAP - MODEL - m
    assert gm.check(reading(edge, MODEL), MODEL) == "fits"
    assert gm.check(reading(edge + 1, MODEL), MODEL) == "release"
    assert gm.given_up


def test_nothing_held_is_never_released():
    gm = GameMode(HEAP)
    assert gm.check(reading(HEAP, 0), 0) == "fits"
    assert not gm.given_up


def test_coming_back_needs_the_budget_not_time():
    """After a release, others' usage unchanged: the model may not come back, however often
    it asks; it may once others shrank so far that twice the margin stays free."""
    gm = GameMode(HEAP)
    m = gm.margin
    others = HEAP - MODEL - m // 2            # half the margin left free: release
    assert gm.check(reading(others, MODEL), MODEL) == "release"
    cold = reading(others, 0)                 # released: own usage 0
    for _ in range(100):
        assert not gm.may_come_back(cold, MODEL)
    # others shrink to where one margin is free after the upload: still not (hysteresis)
    assert not gm.may_come_back(reading(HEAP - MODEL - m, 0), MODEL)
    assert not gm.may_come_back(reading(HEAP - MODEL - 2 * m + 1, 0), MODEL)
    assert gm.may_come_back(reading(HEAP - MODEL - 2 * m, 0), MODEL)
    assert not gm.given_up
    # back and warm with one margin free: fits again, no flapping at the edge it came at
    assert gm.check(reading(HEAP - MODEL - m, MODEL), MODEL) == "fits"


def test_no_flapping_when_others_hover_at_the_edge():
    """Others' usage oscillating by less than a margin around the release point: one
    release, and no return while it oscillates, whatever the model asks."""
    gm = GameMode(HEAP)
    m = gm.margin
    edge = HEAP - MODEL - m
    events = []
    own = MODEL
    for i in range(200):
        others = edge + (m // 4 if i % 2 else -m // 4)
        if own:
            if gm.check(reading(others, own), own) == "release":
                events.append("release")
                own = 0
        elif gm.may_come_back(reading(others, own), MODEL):
            events.append("back")
            own = MODEL
    assert events == ["release"]


def test_a_fresh_upload_keeps_one_margin_free():
    gm = GameMode(HEAP)
    m = gm.margin
    assert gm.may_come_back(reading(HEAP - MODEL - m, 0), MODEL)
    assert not gm.may_come_back(reading(HEAP - MODEL - m + 1, 0), MODEL)


def test_margin_from_the_environment_and_the_off_switch():
    gm = GameMode.from_env(HEAP, {"HOTSEAT_GAME_MARGIN_MIB": "100"})
    assert gm.enabled and gm.margin == 100 * MiB
    assert gm.check(reading(HEAP - MODEL - 99 * MiB, MODEL), MODEL) == "release"
    gm = GameMode.from_env(HEAP, {"HOTSEAT_GAME_MARGIN_MIB": "100"})
    assert gm.check(reading(HEAP - MODEL - 101 * MiB, MODEL), MODEL) == "fits"
    assert GameMode.from_env(HEAP, {}).margin == GameMode(HEAP).margin
    for off in ("0", "off", "false", "no", "OFF"):
        gm = GameMode.from_env(HEAP, {"HOTSEAT_GAME_MODE": off})
        assert not gm.enabled
        assert gm.check(reading(HEAP, MODEL), MODEL) == "fits"
        assert gm.may_come_back(reading(HEAP, 0), MODEL)
    with pytest.raises(ValueError, match="HOTSEAT_GAME_MARGIN_MIB"):
        GameMode.from_env(HEAP, {"HOTSEAT_GAME_MARGIN_MIB": "lots"})
    with pytest.raises(ValueError, match="HOTSEAT_GAME_MARGIN_MIB"):
        GameMode.from_env(HEAP, {"HOTSEAT_GAME_MARGIN_MIB": "-1"})


# -- the watcher, without an engine --------------------------------------------------------------

class Fake:
    """A device budget scripted by the test and an engine thread that releases."""

    def __init__(self):
        self.others = 0
        self.own = MODEL
        self.released = 0
        self.events: list[tuple[str, dict]] = []

    def read(self):
        return HEAP - self.others, self.own

    def release(self):
        self.released += 1
        self.own = 0
        return ["m"]


def watch(fake: Fake, gm: GameMode) -> GameWatch:
    return GameWatch(gm, read=fake.read, held=lambda: fake.own, warm_need=lambda: MODEL,
                     release=fake.release, run=lambda fn: fn(),
                     emit=lambda e, i: fake.events.append((e, i)))


def test_watch_releases_once_and_gates_until_the_budget_allows():
    fake, gm = Fake(), GameMode(HEAP)
    w = watch(fake, gm)
    assert w.poll() == "fits" and w.status() is None
    fake.others = HEAP - MODEL - 100 * MiB
    assert w.poll() == "release" and fake.released == 1
    st = w.status()
    assert st["kind"] == "released" and st["free_bytes"] == 100 * MiB
    assert st["need_bytes"] == MODEL and st["models"] == ["m"]
    assert "another program" in st["reason"] and "100 MiB was left free" in st["reason"]
    assert [e for e, _ in fake.events] == ["gave_up"]
    assert w.poll() == "idle"                     # nothing held: nothing read, no release
    with pytest.raises(GaveUp, match="needs 5.0 GiB") as exc:
        w.gate("m", MODEL)
    assert exc.value.code == "gpu_given_up"
    assert w.status()["checked"]["free_bytes"] == MODEL + 100 * MiB
    fake.others = 0
    w.gate("m", MODEL)                            # passes: the record is lifted
    assert w.status() is None and [e for e, _ in fake.events] == ["gave_up", "came_back"]


def test_watch_point_releases_and_ends_the_request():
    """A give-up asked for while a job runs: the job's next safe point releases and raises;
    the queued release then finds nothing to do."""
    fake, gm = Fake(), GameMode(HEAP)
    queued = []
    w = GameWatch(gm, read=fake.read, held=lambda: fake.own, warm_need=lambda: MODEL,
                  release=fake.release, run=queued.append, emit=lambda e, i: None)
    fake.others = HEAP
    assert w.poll() == "release" and fake.released == 0 and len(queued) == 1
    with pytest.raises(GaveUp, match="the request was stopped"):
        w.point()
    assert fake.released == 1
    assert queued[0]() is None and fake.released == 1
    w.point()                                     # nothing pending: no error


def test_watch_thread_polls_and_stops():
    fake, gm = Fake(), GameMode(HEAP)
    w = watch(fake, gm)
    w.poll_s = 0.01
    done = threading.Event()
    w._emit = lambda e, i: done.set()
    w.start()
    try:
        fake.others = HEAP
        assert done.wait(2.0) and fake.released == 1
    finally:
        w.stop()
    assert not w._thread.is_alive()


# -- the watcher in an Engine, on SmolLM2 with a faked driver budget ----------------------------

class GameOnTheSide:
    """VK_EXT_memory_budget as a driver would report it with another program using `others`
    bytes: the budget is the heap less them, the usage this process's own device memory."""

    def __init__(self, monkeypatch):
        from engine.gpu import vk

        self.others = 0
        self.reads = 0

        def memory_budget(dev):
            self.reads += 1
            return dev.device_heap_bytes - self.others, dev.allocator.reserved_bytes()
        monkeypatch.setattr(vk.Device, "memory_budget", memory_budget)

    def take(self, eng, leave: int) -> float:
        """The other program allocates all but `leave` bytes of what the engine does not
        hold; when it did (time.monotonic())."""
        self.others = eng.dev.device_heap_bytes - eng.dev.allocator.reserved_bytes() - leave
        return time.monotonic()

    def end(self) -> None:
        self.others = 0


@pytest.fixture(scope="module")
def ref():
    from tests.conftest import load_reference

    return load_reference("smollm2-135m-instruct-q4_1.json")["prompts"]["plain"]


def greedy():
    from engine.text.sampling import SamplingParams

    return SamplingParams(temperature=0.0)


def cold_within(eng, t0: float, limit: float = 1.0) -> float:
    """Seconds from t0 until every model is cold and the engine holds no device memory (then
    also until game mode's record has the release's figures: it is shown from its start)."""
    while time.monotonic() - t0 < limit + 2.0:
        if all(s["state"] == "cold" for s in eng.status()) \
                and eng.dev.allocator.reserved_bytes() == 0:
            took = time.monotonic() - t0
            while (eng.arena_status() or {}).get("gave_up", {}).get("release_s") is None:
                assert time.monotonic() - t0 < limit + 2.0, "no release recorded"
                time.sleep(0.001)
            return took
        time.sleep(0.005)
    pytest.fail(f"still warm {limit + 2.0:.1f} s after the other program's allocation")


@pytest.mark.gpu
def test_engine_gives_up_when_idle_and_comes_back_with_the_same_answer(smollm2_path, ref,
                                                                        monkeypatch):
    from engine.api import Engine

    game = GameOnTheSide(monkeypatch)
    with Engine(n_ctx=128, arena=None) as eng:
        assert eng._game is not None and eng.vram()["game_mode"]["watching"]
        eng.load(smollm2_path, name="a")
        before = eng.generate(Request("a", tokens=ref["prompt_ids"], max_tokens=6,
                                      sampling=greedy()))
        assert before.tokens == ref["greedy_ids"][:6]          # llama.cpp's answer
        assert eng.arena_status() is None
        held = eng.dev.allocator.reserved_bytes()
        t0 = game.take(eng, leave=100 << 20)
        took = cold_within(eng, t0)
        assert took < 1.0, took
        st = eng.arena_status()
        assert st["enabled"] is False and st["state"] == "cold"
        rec = st["gave_up"]
        assert rec["kind"] == "released" and rec["models"] == ["a"]
        assert rec["free_bytes"] < eng.game.margin and rec["held_bytes"] >= held
        assert rec["need_bytes"] == eng.status()[0]["warm_bytes"]
        assert "another program is using the GPU's memory" in rec["reason"]
        # the other program still holds it: a request is refused, saying what is free
        with pytest.raises(GaveUp, match=r"MiB of VRAM is free, and a needs") as exc:
            eng.generate(Request("a", tokens=ref["prompt_ids"], max_tokens=6, sampling=greedy()))
        assert exc.value.code == "gpu_given_up"
        assert eng.dev.allocator.reserved_bytes() == 0 and eng.status()[0]["state"] == "cold"
        assert eng.arena_status()["gave_up"]["checked"]["model"] == "a"
        game.end()
        after = eng.generate(Request("a", tokens=ref["prompt_ids"], max_tokens=6,
                                     sampling=greedy()))
        assert after.tokens == before.tokens and after.text == before.text
        assert eng.arena_status() is None and eng.status()[0]["state"] == "warm"
        assert eng._game.releases == 1


@pytest.mark.gpu
def test_a_request_running_ends_at_its_next_safe_point(smollm2_path, ref, monkeypatch,
                                                       tmp_path):
    """With an arena: the request being decoded when the other program allocates ends with
    GaveUp (text so far a prefix of the right answer, nothing wrong), the engine is cold
    and has handed the token over within 1 s, and the next request, once the memory is
    free again, answers as before."""
    from engine.api import Engine
    from engine.residency.arena import Arena

    game = GameOnTheSide(monkeypatch)
    arena = Arena(str(tmp_path / "arena"))
    try:
        with Engine(n_ctx=128, arena=arena, arena_label="game test") as eng:
            eng.load(smollm2_path, name="a")
            full = eng.generate(Request("a", tokens=ref["prompt_ids"], max_tokens=16,
                                        sampling=greedy()))
            assert full.tokens == ref["greedy_ids"][:16]
            pieces: list[str] = []
            started = threading.Event()
            errors: list[BaseException] = []
            ended = []

            def on_text(piece: str) -> None:     # on the engine thread, between tokens:
                pieces.append(piece)             # a token of 50 ms at least, as on a slow
                started.set()                    # device (a GPU's 16 would be over before
                time.sleep(0.05)                 # the watcher's next look)

            def run() -> None:
                try:
                    eng.generate(Request("a", tokens=ref["prompt_ids"], max_tokens=16,
                                         sampling=greedy()), on_text=on_text)
                except BaseException as exc:   # what the test is about
                    errors.append(exc)
                ended.append(time.monotonic())
            worker = threading.Thread(target=run)
            worker.start()
            assert started.wait(60)
            t0 = game.take(eng, leave=100 << 20)
            took = cold_within(eng, t0)
            worker.join(30)
            assert took < 1.0 and ended[0] - t0 < 1.0, (took, ended[0] - t0)
            assert len(errors) == 1 and isinstance(errors[0], GaveUp), errors
            assert "the request was stopped" in str(errors[0])
            text = "".join(pieces)
            assert text and full.text.startswith(text) and len(text) < len(full.text)
            st = eng.arena_status()
            assert st["state"] == "cold" and st["holder_pid"] is None and not arena.held
            assert st["gave_up"]["kind"] == "released" and st["gave_up"]["models"] == ["a"]
            game.end()
            again = eng.generate(Request("a", tokens=ref["prompt_ids"], max_tokens=16,
                                         sampling=greedy()))
            assert again.tokens == full.tokens
            st = eng.arena_status()
            assert st["state"] == "holder" and st["gave_up"] is None
    finally:
        arena.close()


@pytest.mark.gpu
def test_a_load_while_the_memory_is_taken_is_cold_until_it_is_free(smollm2_path, ref,
                                                                   monkeypatch):
    from engine.api import Engine

    game = GameOnTheSide(monkeypatch)
    with Engine(n_ctx=128, arena=None) as eng:
        game.take(eng, leave=300 << 20)         # a model of ~100 MiB, a margin of 512 MiB
        eng.load(smollm2_path, name="a")
        assert eng.status()[0]["state"] == "cold" and eng.dev.allocator.reserved_bytes() == 0
        rec = eng.arena_status()["gave_up"]
        assert rec["kind"] == "refused" and "a needs" in rec["reason"]
        with pytest.raises(GaveUp):
            eng.warm("a")
        game.end()
        out = eng.generate(Request("a", tokens=ref["prompt_ids"], max_tokens=4, sampling=greedy()))
        assert out.tokens == ref["greedy_ids"][:4] and eng.arena_status() is None


@pytest.mark.gpu
def test_off_switch_keeps_the_engine_on_the_gpu(smollm2_path, monkeypatch):
    from engine.api import Engine

    game = GameOnTheSide(monkeypatch)
    monkeypatch.setenv("HOTSEAT_GAME_MODE", "0")
    with Engine(n_ctx=128, arena=None) as eng:
        assert eng._game is None and not eng.vram()["game_mode"]["enabled"]
        eng.load(smollm2_path, name="a")
        game.take(eng, leave=0)
        time.sleep(0.6)
        assert eng.status()[0]["state"] == "warm" and eng.arena_status() is None


@pytest.mark.gpu
def test_over_http_a_503_that_says_why_and_api_arena(smollm2_path, ref, monkeypatch):
    import json
    import urllib.error
    import urllib.request

    from engine.api import Engine
    from engine.server.app import make_app
    from tests.engine.server.test_serve import ServerThread

    game = GameOnTheSide(monkeypatch)

    def call(base: str, path: str, body: dict | None = None):
        req = urllib.request.Request(base + path, method="POST" if body else "GET",
                                     data=None if body is None else json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=120) as resp:
                return resp.status, resp.headers, json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            return exc.code, exc.headers, json.loads(exc.read())

    body = {"model": "a", "prompt": ref["prompt_ids"], "max_tokens": 4, "temperature": 0}
    with Engine(n_ctx=128, arena=None) as eng:
        eng.load(smollm2_path, name="a")
        srv = ServerThread([make_app(eng, ["a"])])
        try:
            base = f"http://127.0.0.1:{srv.ports[0]}"
            status, _, first = call(base, "/v1/completions", body)
            assert status == 200
            assert call(base, "/api/arena")[2] == {"enabled": False}
            cold_within(eng, game.take(eng, leave=50 << 20))
            status, _, arena = call(base, "/api/arena")
            assert status == 200 and arena["enabled"] is False
            assert arena["gave_up"]["kind"] == "released"
            assert call(base, "/api/models")[2]["arena"]["gave_up"]["models"] == ["a"]
            status, headers, err = call(base, "/v1/completions", body)
            assert status == 503 and headers["Retry-After"] == "5"
            assert err["error"]["code"] == "gpu_given_up"
            assert "another program is using the GPU's memory" in err["error"]["message"]
            game.end()
            status, _, again = call(base, "/v1/completions", body)
            assert status == 200
            assert again["choices"][0]["text"] == first["choices"][0]["text"]
        finally:
            srv.close()
