"""engine.text.sampling: llama.cpp's default chain, checked against hand-worked numbers."""
from __future__ import annotations

import warnings

import numpy as np
import pytest

from engine.text.sampling import (
    BAN,
    MIN_TEMPERATURE,
    Sampler,
    SamplingError,
    SamplingParams,
    apply_logit_bias,
    apply_penalties,
    apply_repeat_penalty,
)

# probabilities 0.5, 0.2, 0.15, 0.1, 0.05, deliberately not in id order
PROBS = {3: 0.5, 0: 0.2, 4: 0.15, 1: 0.1, 2: 0.05}
LOGITS = np.log(np.array([PROBS[i] for i in range(5)], dtype=np.float32))


def params(**kw) -> SamplingParams:
    base = dict(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=0)
    base.update(kw)
    return SamplingParams(**base)


def test_defaults_are_llama_cpp_defaults():
    p = SamplingParams()
    assert (p.temperature, p.top_k, p.top_p, p.min_p) == (0.8, 40, 0.95, 0.05)
    assert (p.repeat_penalty, p.repeat_last_n, p.seed) == (1.0, 64, None)


def test_greedy_takes_lowest_id_on_ties():
    logits = np.array([1.0, 3.0, 2.0, 3.0, -1.0], dtype=np.float32)
    for t in (0.0, -1.0):
        s = Sampler(SamplingParams(temperature=t, seed=1))
        assert all(s.sample(logits, []) == 1 for _ in range(20))


def test_top_k_1_is_greedy():
    rng = np.random.default_rng(7)
    for seed in range(30):
        logits = rng.normal(size=1000).astype(np.float32)
        logits[rng.integers(1000)] = logits.max()            # a tie for first place
        top1 = Sampler(SamplingParams(temperature=0.8, top_k=1, seed=seed))
        greedy = Sampler(SamplingParams(temperature=0.0))
        assert top1.sample(logits, []) == greedy.sample(logits, []) == int(np.argmax(logits))


def test_top_k_keeps_the_k_largest():
    ids, probs = Sampler(params(top_k=2)).candidates(LOGITS)
    assert ids.tolist() == [3, 0]
    np.testing.assert_allclose(probs, [0.5 / 0.7, 0.2 / 0.7], rtol=1e-6)


@pytest.mark.parametrize("top_p, kept", [(0.4, [3]), (0.6, [3, 0]), (0.75, [3, 0, 4]),
                                         (0.9, [3, 0, 4, 1]), (0.99, [3, 0, 4, 1, 2])])
def test_top_p_keeps_the_smallest_prefix_reaching_p(top_p, kept):
    # cumulative: 0.5, 0.7, 0.85, 0.95, 1.0 -> keep up to the first that is >= top_p
    ids, probs = Sampler(params(top_p=top_p)).candidates(LOGITS)
    assert ids.tolist() == kept
    expect = np.array([PROBS[i] for i in kept])
    np.testing.assert_allclose(probs, expect / expect.sum(), rtol=1e-6)


@pytest.mark.parametrize("min_p, kept", [(0.05, [3, 0, 4, 1, 2]), (0.25, [3, 0, 4]),
                                         (0.35, [3, 0]), (0.9, [3])])
def test_min_p_keeps_tokens_at_least_min_p_times_the_best(min_p, kept):
    # thresholds 0.5 * min_p: 0.025, 0.125, 0.175, 0.45
    ids, _ = Sampler(params(min_p=min_p)).candidates(LOGITS)
    assert ids.tolist() == kept


def test_chain_order_top_k_top_p_min_p_then_temperature():
    # top_k=4 drops id 2; top_p=0.9 of the renormalised four (0.526, 0.737, 0.895, 1.0)
    # keeps 4; min_p=0.25 (threshold 0.125 of the best's 0.5) keeps 3; T=2 flattens them
    s = Sampler(params(top_k=4, top_p=0.9, min_p=0.25, temperature=2.0))
    ids, probs = s.candidates(LOGITS)
    assert ids.tolist() == [3, 0, 4]
    expect = np.sqrt([0.5, 0.2, 0.15])
    np.testing.assert_allclose(probs, expect / expect.sum(), rtol=1e-6)


def test_temperature_sampling_matches_the_distribution():
    logits = np.array([2.0, 1.0, 0.5, 0.0, -1.0], dtype=np.float32)
    t = 0.7
    s = Sampler(params(temperature=t, seed=123))
    n = 20000
    counts = np.bincount([s.sample(logits, []) for _ in range(n)], minlength=5)
    expect = np.exp(logits / t) / np.exp(logits / t).sum() * n
    chi2 = float(((counts - expect) ** 2 / expect).sum())
    assert chi2 < 18.47, (counts, expect)   # chi-square, 4 dof, p = 0.001
    # the same draws without the temperature would be far off
    flat = np.exp(logits) / np.exp(logits).sum() * n
    assert float(((counts - flat) ** 2 / flat).sum()) > 100


def test_repeat_penalty_rule():
    logits = np.array([2.0, -1.0, 0.5, 4.0], dtype=np.float32)
    out = apply_repeat_penalty(logits, [0, 1, 1, 1], penalty=2.0, last_n=64)
    np.testing.assert_allclose(out, [1.0, -2.0, 0.5, 4.0])  # once per token, however often
    out = apply_repeat_penalty(logits, [0, 1, 3], penalty=2.0, last_n=1)
    np.testing.assert_allclose(out, [2.0, -1.0, 0.5, 2.0])  # only the last token counts
    assert apply_repeat_penalty(logits, [0], penalty=2.0, last_n=0).tolist() == logits.tolist()
    assert logits.tolist() == [2.0, -1.0, 0.5, 4.0]         # input left alone


def test_repeat_penalty_changes_the_choice():
    logits = np.array([3.0, 2.0, 0.0], dtype=np.float32)
    plain = Sampler(SamplingParams(temperature=0))
    penalised = Sampler(SamplingParams(temperature=0, repeat_penalty=2.0))
    assert plain.sample(logits, [0]) == 0
    assert penalised.sample(logits, [0]) == 1
    assert penalised.sample(logits, [5, 7]) == 0
    # the whole history with -1
    long = Sampler(SamplingParams(temperature=0, repeat_penalty=2.0, repeat_last_n=-1))
    assert long.sample(logits, [0] + [2] * 100) == 1


def test_seed_reproduces_the_sequence():
    rng = np.random.default_rng(0)
    logits = rng.normal(scale=2.0, size=5000).astype(np.float32)

    def run(seed):
        s = Sampler(SamplingParams(seed=seed, top_k=0, top_p=1.0, min_p=0.0))
        return [s.sample(logits, []) for _ in range(50)]

    assert run(42) == run(42)
    assert run(42) != run(43)
    assert len(set(run(None))) > 1


def test_default_chain_on_a_large_vocabulary():
    logits = np.random.default_rng(3).normal(size=262144).astype(np.float32)
    s = Sampler(SamplingParams(seed=5))
    ids, probs = s.candidates(logits, list(range(64)))
    assert 1 <= len(ids) <= 40 and abs(probs.sum() - 1) < 1e-9
    assert s.sample(logits, []) in set(np.argsort(-logits)[:40].tolist())


# -- penalties, logit bias, degenerate values ----------------------------------------------

def test_frequency_and_presence_penalties_rule():
    logits = np.array([2.0, -1.0, 0.5, 4.0, 1.0], dtype=np.float32)
    history = [0, 1, 1, 3, 3, 3]                              # counts: 0 once, 1 twice, 3 thrice
    out = apply_penalties(logits, history, 2.0, 64, frequency=0.5, presence=0.25)
    # 0: 2/2 - (1*0.5 + 0.25); 1: -1*2 - (2*0.5 + 0.25); 3: 4/2 - (3*0.5 + 0.25)
    np.testing.assert_array_equal(out, np.float32([0.25, -3.25, 0.5, 0.25, 1.0]))
    # only the last repeat_last_n tokens count: [1, 3] once each
    out = apply_penalties(logits, history[2:4], 1.0, 2, frequency=1.0)
    np.testing.assert_array_equal(out, np.float32([2.0, -2.0, 0.5, 3.0, 1.0]))
    out = apply_penalties(logits, history, 1.0, 2, frequency=1.0)    # window [3, 3]
    np.testing.assert_array_equal(out, np.float32([2.0, -1.0, 0.5, 2.0, 1.0]))
    # negative values reward repetition; last_n 0 turns all three off
    out = apply_penalties(logits, history, 1.0, -1, frequency=-0.5, presence=-1.0)
    np.testing.assert_array_equal(out, np.float32([3.5, 1.0, 0.5, 6.5, 1.0]))
    assert apply_penalties(logits, history, 2.0, 0, 1.0, 1.0).tolist() == logits.tolist()
    assert logits.tolist() == [2.0, -1.0, 0.5, 4.0, 1.0]          # input left alone


def test_logit_bias_adds_and_bans():
    logits = np.array([2.0, -1.0, 0.5, 4.0], dtype=np.float32)
    out = apply_logit_bias(logits, {1: 3.5, 3: BAN, 99: 7.0})     # past the vocabulary: skipped
    np.testing.assert_array_equal(out, np.float32([2.0, 2.5, 0.5, -np.inf]))
    assert Sampler(SamplingParams(temperature=0, logit_bias={3: BAN})).sample(logits) == 0
    assert Sampler(SamplingParams(temperature=0, logit_bias={2: 5.0})).sample(logits) == 2


def test_banned_tokens_never_take_part():
    ids, probs = Sampler(params(logit_bias={3: BAN})).candidates(LOGITS)
    assert ids.tolist() == [0, 4, 1, 2]                           # 3 (p = 0.5) is gone
    np.testing.assert_allclose(probs, np.array([0.2, 0.15, 0.1, 0.05]) / 0.5, rtol=1e-6)
    with pytest.raises(SamplingError) as info:
        Sampler(params(logit_bias={i: BAN for i in range(5)})).sample(LOGITS)
    assert info.value.param == "logit_bias"


def test_chain_order_bias_then_penalties():
    # bias first: 1 - 2 = -1, then the repeat penalty multiplies a negative logit: -2.
    # (penalty first would give 1 / 2 - 2 = -1.5)
    logits = np.array([1.0, 0.5, 0.0], dtype=np.float32)
    s = Sampler(params(logit_bias={0: -2.0}, repeat_penalty=2.0))
    ids, probs = s.candidates(logits, [0])
    assert ids.tolist() == [1, 2, 0]
    expect = np.exp([0.5, 0.0, -2.0])
    np.testing.assert_allclose(probs, expect / expect.sum(), rtol=1e-6)


def test_frequency_penalty_changes_the_greedy_choice():
    logits = np.array([3.0, 2.0, 0.0], dtype=np.float32)
    p = SamplingParams(temperature=0, frequency_penalty=0.6)
    assert not p.plain_greedy
    assert Sampler(p).sample(logits, [0]) == 0                    # 3 - 0.6 > 2
    assert Sampler(p).sample(logits, [0, 0]) == 1                 # 3 - 1.2 < 2
    assert Sampler(SamplingParams(temperature=0, presence_penalty=1.5)).sample(
        logits, [0]) == 1                                          # 3 - 1.5 < 2
    assert SamplingParams(temperature=0).plain_greedy
    assert SamplingParams(temperature=0, repeat_penalty=2.0, repeat_last_n=0).plain_greedy


@pytest.mark.parametrize("t", [0.0, 1e-320, 1e-300, MIN_TEMPERATURE / 2])
def test_tiny_temperatures_are_greedy_and_quiet(t):
    logits = np.array([1.0, 3.0, 2.999, -1.0], dtype=np.float32)
    p = SamplingParams(temperature=t, top_k=0, top_p=1.0, min_p=0.0, seed=3)
    assert p.greedy
    with warnings.catch_warnings():
        warnings.simplefilter("error")                             # a numpy warning fails
        assert all(Sampler(p).sample(logits) == 1 for _ in range(20))


def test_small_temperature_above_the_cut_does_not_overflow():
    logits = np.array([30.0, -30.0, 29.9999], dtype=np.float32)
    s = Sampler(params(temperature=MIN_TEMPERATURE * 2))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ids, probs = s.candidates(logits)
    assert ids.tolist() == [0, 2, 1] and np.isfinite(probs).all()
    assert probs[0] > 0.99 and probs.sum() == pytest.approx(1.0)


@pytest.mark.parametrize("kw, param", [
    (dict(repeat_penalty=0.0), "repeat_penalty"), (dict(repeat_penalty=-1.0), "repeat_penalty"),
    (dict(temperature=float("nan")), "temperature"), (dict(top_p=float("inf")), "top_p"),
    (dict(frequency_penalty=float("nan")), "frequency_penalty"),
    (dict(repeat_last_n=-2), "repeat_last_n"), (dict(logit_bias={-1: 1.0}), "logit_bias"),
    (dict(logit_bias={0: float("inf")}), "logit_bias")])
def test_values_that_cannot_work_are_refused(kw, param):
    with pytest.raises(SamplingError) as info:
        SamplingParams(**kw)
    assert info.value.param == param and param in str(info.value)
