"""The same answer on every path: for each prompt stored from llama.cpp, the greedy tokens of
a fresh run, of a run whose prompt minus its last token is cached (that token then goes
through the one-token graph), of runs in the narrower passes a loaded machine picks (for the
shorter prompts: lavapipe takes minutes for a long one in passes of 2), and of a run after
the model went cold and came back are the same. Where the device follows ggml's
rounding (lavapipe), a token's bits do not depend on the pass that computes it, so the
logits after the prompt are the same bits on every path too."""
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
    exact = model.paths.numerics == "ggml" and model.paths.decode_matmul == "mul_mat"
    for case in cases(model.name):
        prompt = case["prompt_ids"]
        model.cache_tokens = []
        fresh, top = run(model, prompt, 0)
        answers = {"fresh": (fresh, top)}
        # the same prompt again: all but its last token cached
        answers["cached"] = run(model, prompt, len(prompt) - 1)
        if len(prompt) > 1:     # after the prompt minus its last token, the prompt
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
