"""The engine facade with real models: residency through the arbiter, end to end."""
from __future__ import annotations

import pytest

from engine.api import Engine
from engine.facade import Request
from engine.residency.arbiter import BudgetError
from engine.text.sampling import SamplingParams
from tests.conftest import load_reference

pytestmark = pytest.mark.gpu
GREEDY = SamplingParams(temperature=0.0)


@pytest.fixture(scope="module")
def ref():
    return load_reference("smollm2-135m-instruct-q4_1.json")["prompts"]["plain"]


def test_budget_for_one_model_swaps_and_keeps_answers(smollm2_path, ref):
    with Engine(n_ctx=256) as probe:
        probe.load(smollm2_path, name="probe")
        warm = probe.status()[0]["warm_bytes"]
    with Engine(n_ctx=256, budget_bytes=int(1.5 * warm)) as eng:
        a = eng.load(smollm2_path, name="a")
        b = eng.load(smollm2_path, name="b")          # loading b releases a (LRU)
        states = {s["name"]: s["state"] for s in eng.status()}
        assert states == {"a": "cold", "b": "warm"}
        cold_a = next(s for s in eng.status() if s["name"] == "a")
        assert sum(cold_a["device_bytes"].values()) < 1 << 20
        assert cold_a["host_shadow_bytes"] > 0
        want = ref["greedy_ids"][:6]
        for name in (a, b, a, b):
            out = eng.generate(Request(name, tokens=ref["prompt_ids"], max_tokens=6,
                                       sampling=GREEDY))
            assert out.tokens == want
        # the second turn of each model reused its prompt cache across the swap
        assert out.timings["cached_tokens"] == len(ref["prompt_ids"]) - 1
        assert all(total <= eng.arbiter.budget for *_, total in eng.arbiter.ledger)


def test_pin_evict_and_over_budget_error(smollm2_path, ref):
    with Engine(n_ctx=256) as probe:
        probe.load(smollm2_path, name="probe")
        warm = probe.status()[0]["warm_bytes"]
    with Engine(n_ctx=256, budget_bytes=int(1.5 * warm)) as eng:
        eng.load(smollm2_path, name="a")
        eng.pin("a")
        with pytest.raises(BudgetError, match="pinned models: a"):
            eng.load(smollm2_path, name="b")
        assert [s["name"] for s in eng.status()] == ["a"]
        with pytest.raises(BudgetError, match="pinned"):
            eng.evict("a")
        eng.unpin("a")
        eng.evict("a", full=False)
        s = eng.status()[0]
        assert s["state"] == "cold" and s["device_bytes"].get("weights", 0) == 0
        assert s["device_bytes"]["kv"] > 0                  # weights-only keeps the KV
        out = eng.generate(Request("a", tokens=ref["prompt_ids"], max_tokens=3, sampling=GREEDY))
        assert out.tokens == ref["greedy_ids"][:3] and eng.status()[0]["state"] == "warm"


def test_two_architectures_in_one_process(smollm2_path, gemma3_path):
    """SmolLM2 (llama) and Gemma 3 (gemma3) loaded side by side, each greedy as llama.cpp."""
    smol = load_reference("smollm2-135m-instruct-q4_1.json")["prompts"]["plain"]
    gem = load_reference("gemma3-270m-q4_k_m.json")["prompts"]["plain"]
    with Engine(n_ctx=256) as eng:
        a = eng.load(smollm2_path, name="smollm2")
        b = eng.load(gemma3_path, name="gemma3")
        assert {s["arch"] for s in eng.status()} == {"llama", "gemma3"}
        assert eng.prompt_tokens(b, prompt=gem["text"]) == gem["prompt_ids"]
        for name, ref in ((a, smol), (b, gem), (a, smol)):
            out = eng.generate(Request(name, prompt=ref["text"], max_tokens=8, sampling=GREEDY))
            assert out.tokens == ref["greedy_ids"][:8], name


def test_releases_run_on_the_engine_thread_and_status_answers_meanwhile(smollm2_path, ref):
    import threading
    import time

    with Engine(n_ctx=256) as eng:
        eng.load(smollm2_path, name="a")
        ask = Request("a", tokens=ref["prompt_ids"], max_tokens=40, sampling=GREEDY)
        alone = eng.generate(ask)                 # the answer of the request on its own
        seen = []
        model = eng.models["a"].model
        release = model.release
        model.release = lambda full=True, **kw: (seen.append(threading.current_thread()),
                                                 release(full=full, **kw))[1]
        done = threading.Event()
        out = {}

        def request():   # its tokens at 20 ms at least, as on a slow device (a GPU's 40
            out["c"] = eng.generate(ask, on_text=lambda piece: time.sleep(0.02))  # are over
            done.set()                                     # before the status is asked)
        began = threading.Event()
        real_run = model.run
        model.run = lambda *a, **kw: (began.set(), real_run(*a, **kw))[1]
        t = threading.Thread(target=request)
        t.start()
        assert began.wait(60)                                # the request has begun
        t0 = time.perf_counter()
        states = eng.status()                                 # not queued behind the request
        asked = time.perf_counter() - t0
        vram = eng.vram()
        assert states[0]["state"] == "warm" and vram["granted_bytes"] > 0
        assert not done.is_set() and asked < 0.5, asked
        # a load of a second model that must evict "a" waits for the request to finish
        eng.arbiter.budget = eng.arbiter.held("a") + eng.models["a"].model.warm_bytes() // 2
        eng.load(smollm2_path, name="b")
        assert done.is_set()
        t.join()
        assert out["c"].tokens == alone.tokens
        # llama.cpp's: all it has with ggml's rounding, else up to its near-tie at step 20
        n = len(ref["greedy_ids"]) if model.paths.numerics == "ggml" else 16
        assert alone.tokens[:n] == ref["greedy_ids"][:n]
        assert seen and all(th is eng.thread._thread for th in seen)


def test_vram_agrees_with_the_drivers_memory_budget(smollm2_path):
    """Where the driver reports VK_EXT_memory_budget, the device usage it reports moves
    with what the engine allocates (lavapipe has no such extension)."""
    with Engine(n_ctx=256) as eng:
        if eng.dev.memory_budget() is None:
            pytest.skip(f"{eng.dev.name} does not report VK_EXT_memory_budget")
        eng.dev.allocator.spare_limit = 0
        before = eng.vram()
        eng.load(smollm2_path, name="a")
        warm = eng.vram()
        eng.evict("a", full=True)
        cold = eng.vram()
        grown = warm["driver_usage_bytes"] - before["driver_usage_bytes"]
        ours = warm["allocated_bytes"] - before["allocated_bytes"]
        assert ours > 0 and abs(grown - ours) <= max(0.05 * ours, 8 << 20), (grown, ours)
        assert abs(cold["driver_usage_bytes"] - before["driver_usage_bytes"]) <= 8 << 20
        assert warm["driver_budget_bytes"] >= warm["allocated_bytes"]


def test_set_flash_attn_runs_on_the_engine_thread(smollm2_path, ref):
    with Engine(n_ctx=256) as eng:
        eng.load(smollm2_path, name="a")
        with pytest.raises(ValueError, match="flash attention must be one of"):
            eng.set_flash_attn("sometimes")
        eng.set_flash_attn("on")
        assert eng.flash_attn == "on"
        assert len(eng.generate(Request("a", tokens=ref["prompt_ids"], max_tokens=3,
                                        sampling=GREEDY)).tokens) == 3
        eng.set_flash_attn("off")
        out = eng.generate(Request("a", tokens=ref["prompt_ids"], max_tokens=3, sampling=GREEDY))
        assert out.tokens == ref["greedy_ids"][:3]


def test_arena_status_through_a_yield(smollm2_path, ref, tmp_path):
    """Engine.arena_status(), the contract the tray shows: cold, holder, then yielded until
    a time by `hotseat yield` from another process; a request that may not wait is refused
    saying how long the yield lasts, one that waits is answered after it."""
    import os
    import subprocess
    import sys
    import time

    from engine.residency.arena import Arena, ArenaBusy

    with Engine(n_ctx=64) as eng:
        assert eng.arena_status() is None
    arena_dir = str(tmp_path / "arena")
    arena = Arena(arena_dir)
    try:
        with Engine(n_ctx=64, arena=arena, arena_label="api test") as eng:
            st = eng.arena_status()
            assert (st["state"], st["until"], st["holder_pid"]) == ("cold", None, None)
            eng.load(smollm2_path, name="a")
            st = eng.arena_status()
            assert (st["state"], st["until"], st["holder_pid"]) == ("holder", None, os.getpid())
            assert st["device_bytes"] > 0 and st["acquisitions"] == 1
            assert [(p["pid"], p["label"], p["state"]) for p in st["processes"]] == \
                [(os.getpid(), "api test", "holder")]
            t0 = time.time()
            r = subprocess.run([sys.executable, "-m", "engine.cli", "yield", "--for", "3"],
                               capture_output=True, text=True, timeout=60,
                               env={**os.environ, "HOTSEAT_ARENA": arena_dir})
            assert r.returncode == 0 and f"process {os.getpid()}" in r.stdout, r
            st = eng.arena_status()
            assert st["state"] == "yielded" and t0 + 3 <= st["until"] <= time.time() + 3
            assert st["holder_pid"] is None and st["device_bytes"] == 0
            assert st["processes"][0]["state"] == "yielded"
            assert eng.status()[0]["state"] == "cold"
            with pytest.raises(ArenaBusy, match="yielded to other programs until") as exc:
                eng.generate(Request("a", tokens=ref["prompt_ids"], max_tokens=2, sampling=GREEDY,
                                     wait=0))
            assert 0 < exc.value.retry_after <= 3
            out = eng.generate(Request("a", tokens=ref["prompt_ids"], max_tokens=3,
                                       sampling=GREEDY))
            assert time.time() >= st["until"] and out.tokens == ref["greedy_ids"][:3]
            assert eng.arena_status()["state"] == "holder"
        assert not arena.held and arena.members() == []
    finally:
        arena.close()


@pytest.mark.parametrize("how", ["greedy", "sampled", "sampled_inf"])
def test_non_finite_logits_end_the_request_clearly_and_the_engine_goes_on(
        smollm2_path, ref, monkeypatch, how):
    """NaN or +inf logits at the third token: the device argmax's 0xFFFFFFFF (greedy) or the
    logits read for sampling end the request with NonFiniteLogits, saying where; the next
    request gives the reference answer."""
    import numpy as np

    from engine.residency.loop import NonFiniteLogits
    from engine.residency.model import Model

    real = Model.run
    third = len(ref["prompt_ids"]) + 1          # the run whose logits choose token 3

    def poisoned(self, tokens, pos0, greedy, logprobs=False, embd=None, prompt=False):
        out = real(self, tokens, pos0, greedy, logprobs, embd, prompt)
        if pos0 == third and not poisoned.off:
            if greedy:
                return 0xFFFFFFFF
            out = out.copy()
            out[17] = np.inf if how == "sampled_inf" else np.nan
        return out
    poisoned.off = False
    monkeypatch.setattr(Model, "run", poisoned)
    sampling = GREEDY if how == "greedy" else SamplingParams(temperature=0.8, seed=3)
    with Engine(n_ctx=256) as eng:
        name = eng.load(smollm2_path)
        with pytest.raises(NonFiniteLogits, match="non-finite logits at token 3 of the answer"):
            eng.generate(Request(name, tokens=ref["prompt_ids"], max_tokens=8, sampling=sampling))
        poisoned.off = True
        out = eng.generate(Request(name, tokens=ref["prompt_ids"], max_tokens=6, sampling=GREEDY))
        assert out.tokens == ref["greedy_ids"][:6]
