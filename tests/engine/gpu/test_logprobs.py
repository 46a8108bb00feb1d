"""logprobs.comp against numpy: the log-sum-exp of a logits row and its k best entries as
log-probabilities, in order, lowest index first on ties; on random rows and on a real model's
logits (SmolLM2's, read back from the engine)."""
from __future__ import annotations

import numpy as np
import pytest

from engine.gpu.graph import run_once
from tests.engine.gpu.test_kernels import buf, read

pytestmark = pytest.mark.gpu


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    m = x.max()
    return x - (m + np.log(np.exp(x - m).sum()))


def top_ref(x: np.ndarray, k: int) -> np.ndarray:
    """The k best indices, largest first, lower index first among equals."""
    return np.lexsort((np.arange(x.shape[0]), -x))[:k]


def run_logprobs(dev, kc, x: np.ndarray, k: int, lanes: int, x_offset: int = 0,
                 o_offset: int = 0):
    n = x.shape[0] - x_offset
    bx, bo = buf(dev, x), buf(dev, nbytes=4 * (o_offset + 1 + 2 * k))
    run_once(dev, kc, "logprobs", [bx, bo], (1, 1, 1),
             spec=dict(WG=dev.subgroup_size * lanes), n=n, x_offset=x_offset, k=k,
             o_offset=o_offset)
    raw = read(dev, bo, np.uint32)[o_offset:]
    return (float(raw[:1].view(np.float32)[0]), raw[1:1 + k].view(np.float32),
            raw[1 + k:1 + 2 * k])


@pytest.mark.parametrize("lanes", [1, 4, 32])
@pytest.mark.parametrize("k", [1, 5, 20])
def test_logprobs_match_numpy(dev, kc, lanes, k):
    x = (4 * np.random.default_rng(k + lanes).standard_normal(49152)).astype(np.float32)
    lse, lp, ids = run_logprobs(dev, kc, x, k, lanes)
    ref = log_softmax(x)
    want = top_ref(x, k)
    assert ids.tolist() == want.tolist()
    assert np.allclose(lp, ref[want], atol=2e-5)
    m = float(x.max())
    assert abs(lse - (m + np.log(np.exp(x.astype(np.float64) - m).sum()))) < 2e-5
    assert np.all(np.diff(lp) <= 0)


def test_logprobs_ties_offsets_and_no_top(dev, kc):
    """Equal logits come out lowest index first; x_offset and o_offset are honoured; k=0
    still gives the log-sum-exp."""
    x = np.random.default_rng(3).standard_normal(1000 + 30000).astype(np.float32)
    body = x[1000:]
    body[[25000, 7, 29999, 12345]] = 9.0          # four equal bests across lanes
    body[[3, 11]] = 8.0
    lse, lp, ids = run_logprobs(dev, kc, x, 6, 4, x_offset=1000, o_offset=5)
    assert ids.tolist() == [7, 12345, 25000, 29999, 3, 11]
    ref = log_softmax(body)
    assert np.allclose(lp, ref[ids], atol=2e-5)
    lse0, _, _ = run_logprobs(dev, kc, x, 0, 4, x_offset=1000)
    assert abs(lse0 - lse) < 1e-5


@pytest.fixture(scope="module", params=["smollm2", "gemma3"])
def model(request, dev, kc):
    from engine.residency.model import Model

    m = Model(dev, kc, request.getfixturevalue(f"{request.param}_path"), n_ctx=256,
              name=request.param)
    yield m
    m.close()


def test_logprobs_of_the_engines_logits(model):
    """The logprobs pass of a real model against numpy's log-softmax of the logits the same
    model reads back: the top 20, in order, and the log-sum-exp, to 1e-4 nats; with greedy
    decoding and with the logits read back for sampling. Gemma 3's 262,144 logits are the
    longest walk a bundled model gives it."""
    from tests.conftest import LLAMACPP

    cases = __import__("json").loads((LLAMACPP / f"llamacpp_{model.name}.json").read_text())
    ids = cases["cases"][0]["prompt_ids"]
    logits = model.eval(ids, 0, greedy=False)
    tok, (lse, lp, top) = model.eval(ids, 0, greedy=True, logprobs=True)
    again, (lse2, lp2, top2) = model.eval(ids, 0, greedy=False, logprobs=True)
    ref = log_softmax(logits)
    want = top_ref(logits, 20)
    assert top.tolist() == want.tolist() == top2.tolist()
    assert tok == int(np.argmax(logits)) == top[0]
    assert np.abs(lp - ref[want]).max() < 1e-4 and np.allclose(lp2, lp, atol=1e-6)
    assert np.array_equal(again, logits)
    m = float(logits.max())
    assert abs(lse - (m + np.log(np.exp(logits.astype(np.float64) - m).sum()))) < 1e-4
