"""A hybrid gated delta-net model (tests/data/synth's tiny qwen35moe and qwen3next) through the
engine facade: its recurrent bytes in the status breakdown and the /api/models entry, and a
conversation that keeps going while another model (a tiny llama) takes the device in turns."""
from __future__ import annotations

import pytest

from engine.api import Engine
from engine.facade import Request
from engine.text.sampling import SamplingParams
from tests.helpers import synth_reference as sr

pytestmark = pytest.mark.gpu
GREEDY = SamplingParams(temperature=0.0)
CYCLES = 5
OTHER = "llama-bf16"


def turns(n_vocab: int, seed: int) -> list[list[int]]:
    """CYCLES user turns of a few token ids each."""
    import numpy as np

    rng = np.random.default_rng(seed)
    return [rng.integers(1, n_vocab, size=int(rng.integers(3, 9))).tolist()
            for _ in range(CYCLES)]


def converse(eng: Engine, name: str, user: list[int], prompt: list[int]) -> tuple:
    """One turn: the conversation so far, the user's tokens, the model's answer appended."""
    prompt = prompt + user
    out = eng.generate(Request(name, tokens=prompt, max_tokens=6, sampling=GREEDY))
    return prompt + out.tokens, out.tokens, out.timings["cached_tokens"]


def solo(path: str, user_turns) -> list[tuple]:
    with Engine(n_ctx=256) as eng:
        name = eng.load(path, name="solo")
        prompt, got = [], []
        for user in user_turns:
            prompt, toks, cached = converse(eng, name, user, prompt)
            got.append((toks, cached))
        return got


@pytest.mark.parametrize("case", ["qwen35moe-f16", "qwen3next-f16"])
def test_status_shows_recurrent_bytes(case):
    from engine.arch import qwen35
    from engine.formats.gguf_file import GGUFFile
    from engine.server.manage import _entry

    path = str(sr.DATA / f"{case}.gguf")
    with GGUFFile(path) as g:
        cfg = qwen35.Config.from_gguf(g)
    with Engine(n_ctx=256) as eng:
        eng.load(path, name="h")
        s = eng.status()[0]
        assert s["device_bytes"]["recurrent"] == cfg.recurrent_bytes() > 0
        assert _entry(s)["device_bytes"]["recurrent"] == cfg.recurrent_bytes()
        eng.evict("h", full=False)               # weights only: the states stay on the device
        s = eng.status()[0]
        assert s["device_bytes"]["recurrent"] == cfg.recurrent_bytes()
        assert s["host_shadow_bytes"] >= cfg.recurrent_bytes()


@pytest.mark.parametrize("full", [False, True], ids=["weights-only", "full"])
@pytest.mark.parametrize("case", ["qwen35moe-f16", "qwen3next-f16"])
def test_swaps_with_another_model_keep_the_conversation(case, full):
    """The hybrid and a llama take turns for CYCLES cycles under a budget that holds one of
    them: each of the hybrid's answers (and the prompt it reused) is the one of a solo run,
    and under full eviction the cold hybrid holds no device bytes."""
    hyb_path, other_path = str(sr.DATA / f"{case}.gguf"), str(sr.DATA / f"{OTHER}.gguf")
    user, user_o = turns(400, 1), turns(400, 2)
    want = solo(hyb_path, user)
    assert all(cached > 0 for _, cached in want[1:])     # later turns reuse the state
    with Engine(n_ctx=256) as probe:
        probe.load(hyb_path, name="h")
        probe.load(other_path, name="o")
        warm = {s["name"]: s["warm_bytes"] for s in probe.status()}
        weights = {s["name"]: s["device_bytes"]["weights"] for s in probe.status()}
    # both warm do not fit; the hybrid without its weights beside the other does
    budget = warm["h"] + warm["o"] - weights["h"] // 2
    with Engine(n_ctx=256, budget_bytes=budget, full_release=full) as eng:
        h = eng.load(hyb_path, name="hyb")
        o = eng.load(other_path, name="other")
        prompt, prompt_o, got = [], [], []
        for k in range(CYCLES):
            prompt, toks, cached = converse(eng, h, user[k], prompt)
            got.append((toks, cached))
            prompt_o, _, _ = converse(eng, o, user_o[k], prompt_o)
            states = {s["name"]: s for s in eng.status()}
            assert states["hyb"]["state"] == "cold" and states["other"]["state"] == "warm"
            cold = states["hyb"]["device_bytes"]
            if full:
                assert sum(cold.values()) == 0
            else:
                assert cold.get("weights", 0) == 0 and cold["recurrent"] > 0
    assert got == want
