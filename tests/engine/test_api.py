"""The engine facade with real models: residency through the arbiter, end to end."""
from __future__ import annotations

import pytest

from engine.api import Engine
from engine.arbiter import BudgetError
from engine.sampling import SamplingParams
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
            out = eng.generate(name, tokens=ref["prompt_ids"], max_tokens=6, sampling=GREEDY)
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
        out = eng.generate("a", tokens=ref["prompt_ids"], max_tokens=3, sampling=GREEDY)
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
            out = eng.generate(name, prompt=ref["text"], max_tokens=8, sampling=GREEDY)
            assert out.tokens == ref["greedy_ids"][:8], name
