"""qwen3next, qwen35 and qwen35moe (hybrid gated delta-net models) on the GPU engine against
llama.cpp's stored logits on the synthetic models (tests/data/synth; the comparison is
tests/helpers/synth_reference.py: argmax at every position, ties aside, and cosine >= 0.999
after the prompt and after every continuation token).

A recurrent state cannot rewind, so every prompt position's logits come from one-token
decode steps from position 0 on, and the prompt's last position also from one prefill of the
whole prompt (which starts the sequence again); the continuation's decode steps follow it.
The delta rule runs token by token (lavapipe's choice) and by chunks (a GPU's), and the
model's output is held to the same data both ways. Release/restore in the middle of the
continuation (weights only, and full eviction: KV to host memory, the device freed) brings
back the KV cache and every conv and delta-rule state bit for bit.
"""
from __future__ import annotations

import functools

import numpy as np
import pytest

from engine.formats.gguf_file import GGUFFile
from engine.gpu.paths import Tuning
from engine.residency.model import Model
from tests.helpers import synth_reference as sr
from tests.helpers.reference_hybrid import open_model

pytestmark = pytest.mark.gpu

ARCHS = ("qwen3next", "qwen35", "qwen35moe")
CASES = [n for n in sr.case_names() if n.split("-")[0] in ARCHS]


def prompt_logits(m: Model, ids: list[int]) -> np.ndarray:
    """[len(ids), n_vocab]: rows 0..n-2 by decode steps, the last by one prefill."""
    rows = [m.eval([t], i, greedy=False) for i, t in enumerate(ids[:-1])]
    rows.append(m.eval(ids, 0, greedy=False))
    return np.stack(rows)


def teacher_forced(m: Model, case: sr.Case, between=None) -> np.ndarray:
    """[n_tokens, n_vocab]; between(i) runs before continuation step i."""
    def step(tok: int, pos: int) -> np.ndarray:
        if between is not None:
            between(pos - len(case.prompt_ids))
        return m.eval([tok], pos, greedy=False)
    return sr.logits_by_steps(case, lambda ids: prompt_logits(m, ids), step)


def load(dev, kc, case: sr.Case, **kw) -> Model:
    sr.check_file(case)
    return Model(dev, kc, str(case.model_path), n_ctx=case.n_ctx, name=case.name, **kw)


def dev_has_fast_prefill(dev) -> bool:
    """Whether prefill passes take the matrix units (f16 products) on this device."""
    return Tuning.for_device(dev).fast_prefill


def same_bound(dev, across_widths: bool = False) -> float:
    """The largest normalized squared difference of two runs of one model that should agree
    to rounding: f32 rounding (1e-9) where every product is f32. On matrix units a prefill
    pass rounds its activations to f16, so a last-bit difference upstream (the chunked delta
    rule's other summation order) comes out at f16's scale (measured 3e-9 on the H200: bound
    1e-6); passes of other widths (a one-token step takes mul_mat_vec in f32, a wider pass
    mul_mat_cm in f16) differ by f16 rounding itself (bound 1e-4, still far below a changed
    token: the argmax is checked beside it)."""
    if not dev_has_fast_prefill(dev):
        return 1e-9
    return 1e-4 if across_widths else 1e-6


# a router's last chosen logit over the next by less than this: f16 activations (a prefill
# pass on matrix units) may choose the other expert where f32 ones (a one-token step) do not.
# The qwen35moe-f16 case's smallest margin, 0.009 (its third token, last layer), flipped on
# an H100 with x as f16 from to_f16, flash_attn_cm2 and mul_mat_moe_cm2 together (nmse 0.044).
ROUTER_TIE = 0.02


@functools.cache
def router_margins(name: str) -> np.ndarray:
    """[n_tokens]: per position of the case's tokens, the smallest margin over its layers
    between the router's last chosen logit and the next (the numpy reference's, one pass);
    inf for a model without experts."""
    case = sr.load_case(name)
    ref = open_model(GGUFFile(str(case.model_path)), n_ctx=case.n_ctx)
    if not ref.config.n_expert:
        return np.full(len(case.tokens), np.inf, np.float32)
    ref.router_log = []
    ref.forward(case.tokens, 0)
    return np.min(np.stack(ref.router_log), axis=0)


def test_router_margins_find_the_near_tie():
    """router_margins reads the numpy reference's routers: the qwen35moe-f16 case's smallest
    margin is its third token's (in its last layer), under ROUTER_TIE, and the others' are
    over it; a model without experts has none."""
    if "qwen35moe-f16" not in CASES:
        pytest.skip("the qwen35moe-f16 case is missing")
    m = router_margins("qwen35moe-f16")
    assert m.shape == (len(sr.load_case("qwen35moe-f16").tokens),)
    assert int(np.argmin(m)) == 2 and 0 < m[2] < ROUTER_TIE
    assert np.sum(m < ROUTER_TIE) <= 3
    assert np.all(np.isinf(router_margins("qwen35-f16")))


def test_every_case_of_the_hybrid_architectures_is_here():
    if not CASES:
        pytest.skip(f"{sr.DATA / 'index.json'} missing")
    assert {n.split("-")[0] for n in CASES} == set(ARCHS)
    assert {"qwen3next-f16", "qwen35-f16", "qwen35moe-f16", "qwen35-q8_0"} <= set(CASES)


@pytest.fixture(scope="module", params=CASES or [None])
def case(request) -> sr.Case:
    if request.param is None:
        pytest.skip(f"{sr.DATA / 'index.json'} missing")
    return sr.load_case(request.param)


def test_warm_bytes_are_what_a_load_allocates(dev, kc, case):
    """The arbiter's estimate (weights and RunState.bytes_for, the q-gate and shared-expert
    buffers included) is what the load holds; the recurrent bytes are the config's."""
    m = load(dev, kc, case)
    try:
        held = m.device_bytes()
        assert m.warm_bytes() == sum(held.values())
        assert held["recurrent"] == m.config.recurrent_bytes() > 0
        assert held["kv"] == m.config.kv_bytes(case.n_ctx)
    finally:
        m.close()


@pytest.mark.parametrize("paths", ["plain", "flash", "gpu", "device"])
def test_follows_llamacpp(dev, kc, case, paths):
    """lavapipe's paths (per-token prefill attention, two-pass split decode attention,
    llama.cpp's rounding); tiled (flash) prefill attention; a discrete GPU's decode paths
    (mul_mat_vec, one-pass split attention, device numerics); the device's own choice."""
    m = load(dev, kc, case, flash_attn="on" if paths == "flash" else "off")
    if paths != "device":
        m.tuning.coopmat = False
        m.tuning.matvec, m.tuning.ggml_numerics = (True, False) if paths == "gpu" \
            else (False, True)
    try:
        if paths != "device":
            assert m.uses_flash_attn == (paths == "flash")
        logits = teacher_forced(m, case)
    finally:
        m.close()
    figures = sr.compare(case, logits)
    print(f"{case.name} ({paths}): ties at {figures['ties']}, cosines "
          f"{figures['cos_prompt_last']:.6f} {figures['cos_steps_min']:.6f}, "
          f"max |diff| {figures['max_diff']:.4f}")


@pytest.mark.parametrize("chunk", [8, 64])
def test_chunked_delta_rule_gives_the_same_model_output(dev, kc, case, chunk):
    """The whole model with the delta rule by chunks (Tuning.delta_chunk; 8: the 47-token
    prompt is six chunks, the last one short) against token by token: in float activations
    the same logits to f32 rounding (with llama.cpp's 16- and 8-bit rounding of activations
    a last-bit difference can flip a rounding step: ~1e-6 there); and the chunked run, with
    llama.cpp's rounding, follows llama.cpp."""
    outs = {}
    for c, numerics in ((0, False), (chunk, False), (chunk, True)):
        m = load(dev, kc, case)
        m.tuning.delta_chunk, m.tuning.ggml_numerics = c, numerics
        m.tuning.dot4 = False   # one-token steps on f32 x: a GPU's int8 rounding would turn
                                # the two orders' last-bit differences into whole steps
        try:
            outs[c, numerics] = teacher_forced(m, case)
        finally:
            m.close()
    a, b = outs[0, False], outs[chunk, False]
    assert not np.array_equal(a, b)        # the chunked kernels did run
    assert np.sum((a - b) ** 2) / np.sum(a ** 2) < same_bound(dev)
    sr.compare(case, outs[chunk, True])


def test_prefill_in_uneven_passes_continues_the_state(dev, kc, case):
    """The sequence in passes of 1..7 tokens, each continuing the recurrent states where
    the last left them: each pass's last logits are the ones of one-token steps (to f32
    rounding: float activations, as llama.cpp's rounding of them may flip a step). On matrix
    units, a pass with a token whose experts are a near tie (ROUTER_TIE) is not compared."""
    margins = router_margins(case.name) if dev_has_fast_prefill(dev) else None
    m = load(dev, kc, case)
    m.tuning.ggml_numerics = False
    m.tuning.dot4 = False       # one-token steps on f32 x (a GPU's int8 x is checked apart)
    try:
        ids = case.tokens
        steps = np.stack([m.eval([t], i, greedy=False) for i, t in enumerate(ids)])
        pos, sizes = 0, [3, 1, 7, 2, 5, 4, 6]
        k = 0
        while pos < len(ids):
            n = min(sizes[k % len(sizes)], len(ids) - pos)
            got = m.eval(ids[pos:pos + n], pos, greedy=False)
            tie = margins is not None and margins[pos:pos + n].min() < ROUTER_TIE
            pos, k = pos + n, k + 1
            if tie:
                continue
            nmse = np.sum((got - steps[pos - 1]) ** 2) / np.sum(steps[pos - 1] ** 2)
            assert nmse < same_bound(dev, across_widths=True), f"pass ending at {pos}: {nmse}"
            assert got.argmax() == steps[pos - 1].argmax() or \
                case.top2_gap[pos - 1] < case.tie
    finally:
        m.close()


@pytest.mark.parametrize("full", [False, True], ids=["weights-only", "full"])
def test_release_restore_midway_keeps_states_bit_for_bit(dev, kc, case, full):
    """Released (weights only, or fully: KV to host memory and the device freed, as with
    --evict-kv) and restored in the middle of the continuation: the KV cache and every conv
    and delta-rule state come back bit for bit, and every later logit is the one of a run
    without the cycle."""
    # the uninterrupted run on a model of its own: a model's first prompt starts with a probe
    # pass (PROBE_CHUNK), so both runs take the same passes (on matrix units a pass's width
    # changes its rounding)
    m = load(dev, kc, case)
    try:
        plain = teacher_forced(m, case)
    finally:
        m.close()
    m = load(dev, kc, case)
    try:
        seen = {}

        def cycle(i: int) -> None:
            if i != len(case.continuation_ids) // 2:
                return
            seen["kv"], seen["rec"] = m.kv_checksum(), m.recurrent_checksum()
            seen["keys"] = sorted(m.rs.recurrent_states())
            m.release(full=full)
            assert m.state == "cold"
            assert sorted(m.recurrent_shadow) == seen["keys"]
            if full:
                assert sum(m.device_bytes().values()) == 0
            assert m.recurrent_checksum() == seen["rec"]     # the host shadow
            m.restore()
            assert m.recurrent_shadow is None
            seen["kv_after"], seen["rec_after"] = m.kv_checksum(), m.recurrent_checksum()
        cycled = teacher_forced(m, case, between=cycle)
    finally:
        m.close()
    n_delta = sum(1 for k in seen["keys"] if k.startswith("delta."))
    assert n_delta > 0 and len(seen["keys"]) == 2 * n_delta   # a conv and a delta state each
    assert (seen["kv_after"], seen["rec_after"]) == (seen["kv"], seen["rec"])
    assert np.array_equal(cycled, plain)
    sr.compare(case, cycled)


# -- the prompt cache: the states at the end of the cache, or at the checkpoint -----------------

def recording_argmax(seen: list):
    def sample(logits, history):
        seen.append(np.array(logits))
        return int(np.argmax(logits))
    return sample


@pytest.mark.parametrize("name", ["qwen35-f16", "qwen3next-f16"])
def test_prompt_cache_reuses_what_the_states_allow(dev, kc, monkeypatch, name):
    """Requests on one model: a repeated prompt resumes from the checkpoint CHECKPOINT_BACK
    tokens before its end; one extending the whole cache from the states at its end; one
    that repeats the prompt with another ending from the checkpoint; one that leaves the
    prompt before the checkpoint from nothing. cached_tokens says which, and every answer
    (its logits bit for bit) is the one of a fresh model given the same prompt."""
    from engine.residency import model as model_mod
    from engine.residency.loop import Timings, generate

    monkeypatch.setattr(model_mod.Model, "chunk", 8)      # the same passes in every run
    case = sr.load_case(name)
    p, back = case.prompt_ids, model_mod.CHECKPOINT_BACK
    m = load(dev, kc, case)
    runs = []
    try:
        def ask(prompt):
            seen, t = [], Timings()
            toks = list(generate(m, prompt, 6, sample=recording_argmax(seen), timings=t))
            runs.append((prompt, toks, seen))
            return toks, t.cached_tokens

        first, cached = ask(p)
        assert cached == 0
        assert ask(p) == (first, len(p) - back)                  # the checkpoint
        # where a decode step gives a token a prompt's bits (lavapipe), the states at the end
        # (then the first checkpoint still); else the answer's tokens are computed again
        # from the checkpoint (Model.reusable), which then moves to this prompt's
        steps = m.paths.steps_match_prompts
        _, cached = ask(p + first + [11, 19])
        assert cached == (len(p) + len(first) - 1 if steps else len(p) - back)
        _, cached = ask(p + [7, 8, 9])
        assert cached == (len(p) - back if steps else 0)
        _, cached = ask(p[:30] + [1, 2, 3])
        assert cached == 0                                       # before the checkpoint
        _, cached = ask(p[:30] + [1, 2, 3])
        assert cached == 30 + 3 - back                           # the new checkpoint
    finally:
        m.close()
    for prompt, toks, seen in runs:
        fresh = load(dev, kc, case)
        try:
            want = []
            got = list(generate(fresh, prompt, 6, sample=recording_argmax(want)))
        finally:
            fresh.close()
        if dev_has_fast_prefill(dev):
            # a resumed prompt takes passes of other widths, whose f16 products on the matrix
            # units round apart: the first logits (the same prompt) agree to f16 rounding,
            # and the tokens where no tie decides them
            a, b = seen[0], want[0]
            assert np.sum((a - b) ** 2) / np.sum(b ** 2) < same_bound(dev, True)
            top2 = np.sort(b)[-2:]
            assert got[0] == toks[0] or top2[1] - top2[0] < case.tie
        else:
            assert got == toks
            assert all(np.array_equal(a, b) for a, b in zip(seen, want))
