"""The host budget: every model's shadows in RAM together stay under it, the least recently
used KV shadows moving to disk first and a pinned model's never; a model whose KV is on disk
comes back with its prompt cache and answers as a fresh run does; the status and /api/vram
show the tiers."""
from __future__ import annotations

import os

import pytest

from engine.api import Engine
from engine.facade import Request
from engine.text.sampling import SamplingParams

pytestmark = pytest.mark.gpu

GREEDY = SamplingParams(temperature=0.0)
PROMPTS = {"a": "The capital of France is", "b": "Water boils at a temperature of",
           "c": "The largest planet in the solar system is", "d": "Bread is made from"}


def ask(eng: Engine, name: str):
    return eng.generate(Request(name, prompt=PROMPTS[name], max_tokens=8, sampling=GREEDY))


def by_name(eng: Engine) -> dict[str, dict]:
    return {s["name"]: s for s in eng.status()}


@pytest.fixture(scope="module")
def fresh(smollm2_path) -> dict[str, list[int]]:
    """Each prompt's answer from a fresh engine with the one model."""
    out = {}
    with Engine(n_ctx=256, prompt_cache=False) as eng:
        for name in PROMPTS:
            eng.load(smollm2_path, name=name)
            out[name] = ask(eng, name).tokens
            eng.unload(name)
    return out


def test_the_least_recently_used_go_to_disk_and_come_back(smollm2_path, fresh, tmp_path,
                                                          monkeypatch):
    monkeypatch.setenv("HOTSEAT_CACHE_DIR", str(tmp_path / "cache"))
    with Engine(n_ctx=256, prompt_cache=False) as probe:
        probe.load(smollm2_path, name="probe")
        warm = by_name(probe)["probe"]["warm_bytes"]
        # a model's weight copy in RAM, warm or cold: a discrete GPU's (copies from host
        # memory); none where the device reads the file's pages (lavapipe)
        copy = by_name(probe)["probe"]["ram_bytes"]
    kv = 512 << 10                            # RAM for one KV shadow of these prompts
    budget = 3 * copy + kv                    # and the weight copies of a, d and one more
    # a pinned and warm, and one other warm at a time
    with Engine(n_ctx=256, budget_bytes=2 * warm + warm // 2, full_release=True,
                host_budget_bytes=budget) as eng:
        for name in PROMPTS:
            eng.load(smollm2_path, name=name)
        eng.pin("a")
        for name in PROMPTS:                  # b, c, d take turns: each release a KV shadow
            assert ask(eng, name).tokens == fresh[name]
        s = by_name(eng)
        assert s["a"]["state"] == s["d"]["state"] == "warm"
        # c, the most recently released, in RAM; b, older, on disk
        assert s["c"]["ram_bytes"] > 0 and s["c"]["disk_bytes"] == 0
        assert s["b"]["ram_bytes"] == 0 and s["b"]["disk_bytes"] > 0
        vram = eng.vram()
        assert vram["host_budget_bytes"] == budget
        assert vram["host_used_bytes"] == sum(m["ram_bytes"] for m in s.values()) <= budget
        assert vram["host_disk_bytes"] == s["b"]["disk_bytes"]
        # everything released (what the arena or game mode does), the pinned one too, under
        # room for one KV shadow besides two weight copies: the pinned one's shadow stays in
        # RAM; the others' go to disk, the least recently used first
        eng.set_host_budget(2 * copy + kv)
        eng.device_job(lambda dev: eng.arbiter.release_all())
        s = by_name(eng)
        assert s["a"]["ram_bytes"] > 0 and s["a"]["disk_bytes"] == 0
        assert all(s[n]["ram_bytes"] == 0 and s[n]["disk_bytes"] > 0 for n in "bcd")
        spills = [e for e in os.listdir(tmp_path / "cache") if e.endswith(".spill")]
        assert len(spills) == 3
        # b comes back from disk: its prompt cache too, and the same answer
        again = ask(eng, "b")
        assert again.tokens == fresh["b"]
        assert again.timings["cached_tokens"] == len(again.prompt_tokens) - 1
        assert by_name(eng)["b"]["disk_bytes"] == 0
        for name in "acd":                    # and every other answer stays the fresh one
            assert ask(eng, name).tokens == fresh[name]
    # the spill files go with their models
    assert not [e for e in os.listdir(tmp_path / "cache") if e.endswith(".spill")]


def test_a_spill_file_that_is_gone_costs_only_the_prompt_cache(smollm2_path, fresh, tmp_path,
                                                              monkeypatch):
    monkeypatch.setenv("HOTSEAT_CACHE_DIR", str(tmp_path / "cache"))
    with Engine(n_ctx=256, full_release=True, host_budget_bytes=0) as eng:
        eng.load(smollm2_path, name="a")
        ask(eng, "a")
        eng.evict("a", full=True)
        s = by_name(eng)["a"]
        assert s["ram_bytes"] == 0 and s["disk_bytes"] > 0
        for e in (tmp_path / "cache").glob("*.spill"):
            e.unlink()
        again = ask(eng, "a")
    assert again.tokens == fresh["a"] and again.timings["cached_tokens"] == 0


def test_a_lower_budget_takes_effect_at_once(smollm2_path, fresh, tmp_path, monkeypatch):
    """Engine.set_host_budget (the tray's setting): the shadows over it go to disk now;
    HOTSEAT_HOST_BUDGET_MIB is the default."""
    monkeypatch.setenv("HOTSEAT_CACHE_DIR", str(tmp_path / "cache"))
    # room for a cold SmolLM2's shadows on every device: a discrete GPU's weight copy (about
    # 100 MiB) and the KV
    monkeypatch.setenv("HOTSEAT_HOST_BUDGET_MIB", "512")
    with Engine(n_ctx=256, full_release=True) as eng:
        assert eng.vram()["host_budget_bytes"] == 512 << 20
        eng.load(smollm2_path, name="a")
        ask(eng, "a")
        eng.evict("a", full=True)
        assert by_name(eng)["a"]["ram_bytes"] > 0
        assert eng.set_host_budget(0) == 0
        s = by_name(eng)["a"]
        assert s["ram_bytes"] == 0 and s["disk_bytes"] > 0
        assert eng.set_host_budget(None) == 512 << 20
        with pytest.raises(ValueError, match="must not be negative"):
            eng.set_host_budget(-1)
        assert ask(eng, "a").tokens == fresh["a"]
    monkeypatch.setenv("HOTSEAT_HOST_BUDGET_MIB", "lots")
    with pytest.raises(ValueError, match="HOTSEAT_HOST_BUDGET_MIB must be a whole number"):
        Engine(n_ctx=256)


def test_weight_copies_go_and_come_back_from_the_file(smollm2_path, fresh, tmp_path,
                                                      monkeypatch):
    """A discrete GPU's path (copies from host memory, no file import): the host-visible
    weight copy is the RAM a model holds, warm or cold; over the budget it goes, and the
    next restore reads the file again."""
    from engine.residency.model import Model

    monkeypatch.setattr(Model, "write_in_place", False)
    monkeypatch.setattr(Model, "pin_host", False)
    monkeypatch.setenv("HOTSEAT_CACHE_DIR", str(tmp_path / "cache"))
    with Engine(n_ctx=256, full_release=True, host_budget_bytes=1 << 40) as eng:
        eng.load(smollm2_path, name="a")
        ask(eng, "a")
        eng.evict("a", full=True)
        assert by_name(eng)["a"]["ram_bytes"] > 90 << 20   # the weights' copy and the KV
        eng.set_host_budget(0)
        s = by_name(eng)["a"]
        assert s["ram_bytes"] == 0 and s["disk_bytes"] > 0
        again = ask(eng, "a")
        assert again.tokens == fresh["a"]
        assert again.timings["cached_tokens"] == len(again.prompt_tokens) - 1
        # the restore read the file again, and the budget holds a warm model's copy too
        assert by_name(eng)["a"]["ram_bytes"] == 0
        eng.set_host_budget(1 << 40)
        eng.evict("a", full=True)
        assert ask(eng, "a").tokens == fresh["a"]
        assert by_name(eng)["a"]["ram_bytes"] > 90 << 20   # made again from the file, kept


@pytest.mark.parametrize("full", [True, False])
def test_recurrent_states_go_to_disk_and_come_back(tmp_path, monkeypatch, full):
    """A gated delta-net hybrid (the synthetic Qwen3.5): its recurrent states and their
    checkpoint, and after a full release its KV, go to disk under a budget of 0; the prompt
    cache comes back with them, and the answer is a fresh run's."""
    from pathlib import Path

    path = str(Path(__file__).resolve().parents[2] / "data" / "synth" / "qwen35-f16.gguf")
    monkeypatch.setenv("HOTSEAT_CACHE_DIR", str(tmp_path / "cache"))
    prompt = "The quick brown fox jumps over the lazy dog"
    with Engine(n_ctx=256, prompt_cache=False) as eng:
        eng.load(path, name="q")
        want = eng.generate(Request("q", prompt=prompt, max_tokens=8, sampling=GREEDY)).tokens
    with Engine(n_ctx=256, full_release=full, host_budget_bytes=1 << 40) as eng:
        eng.load(path, name="q")
        first = eng.generate(Request("q", prompt=prompt, max_tokens=8, sampling=GREEDY))
        assert first.tokens == want
        eng.evict("q", full=full)
        assert by_name(eng)["q"]["ram_bytes"] > 0        # the states (and the KV: full)
        eng.set_host_budget(0)
        s = by_name(eng)["q"]
        assert s["ram_bytes"] == 0 and s["disk_bytes"] > 0
        again = eng.generate(Request("q", prompt=prompt, max_tokens=8, sampling=GREEDY))
        assert again.tokens == want and again.timings["cached_tokens"] > 0
        assert by_name(eng)["q"]["disk_bytes"] == 0
    assert not list((tmp_path / "cache").glob("*.spill"))
