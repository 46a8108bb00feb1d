"""The same answer on every path: for each prompt stored from llama.cpp, the greedy tokens of
a fresh run, of a run whose prompt minus its last token is cached (that token then goes
through the one-token graph; after a run of the whole prompt, and for the shorter prompts
after one of the prompt minus that token), of runs in the narrower passes a loaded machine
picks (for the shorter prompts: lavapipe takes minutes for a long one in passes of 2), and
of a run after the model went cold and came back are the same. Where the device follows
ggml's rounding (lavapipe), a token's bits do not depend on the pass that computes it, so
the logits after the prompt are the same bits on every path too."""
from __future__ import annotations

import json

import numpy as np
import pytest

from engine.residency.loop import Timings, generate
from engine.residency.model import Model
from tests.conftest import LLAMACPP

pytestmark = [pytest.mark.gpu, pytest.mark.slow]

N_NEW = 3           # greedy tokens compared after each prompt
NARROW = 20         # prompts up to this long also run in passes of 2 and of 3 tokens
PREFIX = 64         # ... and up to this long after the prompt minus its last token (the
                    # 300-token cases' prefix, again in the narrower passes a slow machine
                    # picks, took a minute on lavapipe; the GPU-paths test below cuts
                    # SmolLM2's 314-token case so)


def cases(model: str) -> list[dict]:
    return json.loads((LLAMACPP / f"llamacpp_{model}.json").read_text())["cases"]


@pytest.fixture(scope="module", params=["smollm2", "gemma3"])
def model(request, dev, kc):
    path = request.getfixturevalue(f"{request.param}_path")
    m = Model(dev, kc, path, n_ctx=512, name=request.param)
    yield m
    m.close()


def run(m: Model, prompt: list[int], cached: int) -> tuple[list[int], list]:
    """The greedy tokens after prompt and, for each, the log-probabilities of the best 20
    (the log-softmax of the logits it was picked from), with `cached` tokens of the prompt
    reused from the cache."""
    t = Timings()
    lp: list = []
    tokens = list(generate(m, prompt, N_NEW, timings=t, logprobs=lp))
    assert t.cached_tokens == cached
    return tokens, lp


def narrow_passes(m: Model, width: int):
    """Model.next_chunk as a machine that measured itself slow picks it: passes of `width`
    tokens (never a pass of one, as there)."""
    def next_chunk(remaining: int) -> int:
        if remaining <= width:
            return remaining
        return width + 1 if remaining - width == 1 else width
    return next_chunk


def test_greedy_answer_does_not_depend_on_the_path(model, monkeypatch):
    exact = model.paths.steps_match_prompts
    for case in cases(model.name):
        prompt = case["prompt_ids"]
        model.cache_tokens = []
        fresh, top = run(model, prompt, 0)
        answers = {"fresh": (fresh, top)}
        # the same prompt again: all but its last token cached
        answers["cached"] = run(model, prompt, len(prompt) - 1)
        if 1 < len(prompt) <= PREFIX:   # after the prompt minus its last token, the prompt
            model.cache_tokens = []
            list(generate(model, prompt[:-1], 1))
            answers["prefix cached"] = run(model, prompt, len(prompt) - 1)
        for width in (2, 3) if len(prompt) <= NARROW else ():
            with monkeypatch.context() as mp:
                mp.setattr(model, "next_chunk", narrow_passes(model, width))
                model.cache_tokens = []
                answers[f"passes of {width}"] = run(model, prompt, 0)
        # cold (weights and KV in host memory only) and back
        model.release(full=True)
        model.restore()
        answers["restored"] = run(model, prompt, len(prompt) - 1)
        for path, (tokens, got) in answers.items():
            assert tokens == fresh, (case["name"], path)
            assert [step[0] for step in got] == tokens
            if exact:
                assert got == top, (case["name"], path)
            else:
                assert np.abs(np.array([s[1] for s in got]) -
                              np.array([s[1] for s in top])).max() < 0.05, (case["name"], path)


def test_a_gpus_paths_cut_a_prompt_anywhere_with_the_same_bits(dev, kc, smollm2_path,
                                                                  monkeypatch):
    """A GPU's paths (device numerics; decode's products on mul_mat_vec(q), its attention
    on attn_decode) round otherwise than a prompt's wider passes. A prompt's one-token pass
    (its prefix cached) takes the wider pass's kernels (Builder.prompt), so the answer's
    log-probabilities are the fresh run's bit for bit however the prompt was cut."""
    m = Model(dev, kc, smollm2_path, n_ctx=512, name="gpu-paths")
    try:
        m.tuning.matvec, m.tuning.ggml_numerics = True, False
        assert m.paths.decode_matmul in ("mul_mat_vec", "mul_mat_vecq")
        assert m.paths.decode_attention == "attn_decode"
        for case in [c for c in cases("smollm2") if len(c["prompt_ids"]) > 1][:3]:
            prompt = case["prompt_ids"]
            m.cache_tokens = []
            fresh = run(m, prompt, 0)
            assert run(m, prompt, len(prompt) - 1) == fresh, case["name"]
            m.cache_tokens = []
            list(generate(m, prompt[:-1], 1))
            assert run(m, prompt, len(prompt) - 1) == fresh, case["name"]
            with monkeypatch.context() as mp:
                mp.setattr(m, "next_chunk", narrow_passes(m, 3))
                m.cache_tokens = []
                assert run(m, prompt, 0) == fresh, case["name"]
            # the next turn of a conversation: the answer's tokens, whose KV decode steps
            # wrote, are computed again by the prompt (Model.reusable)
            turn = prompt + fresh[0][:2] + prompt[:3]
            m.cache_tokens = []
            again = run(m, turn, 0)
            m.cache_tokens = []
            run(m, prompt, 0)
            assert run(m, turn, len(prompt)) == again, case["name"]
        # a decode step's own kernels do differ: the same token as a prompt's pass of one
        # and as a decode step
        pos = len(prompt)
        as_prompt = m.eval([fresh[0][0]], pos, greedy=False, prompt=True)
        as_step = m.eval([fresh[0][0]], pos, greedy=False)
        assert not np.array_equal(as_prompt, as_step)
        assert np.abs(as_prompt - as_step).max() < 0.1
    finally:
        m.close()
