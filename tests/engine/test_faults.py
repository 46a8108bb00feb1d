"""Device faults at every stage of a model's life, through the engine facade: a request hit
by one fails cleanly (EngineFault) or succeeds after the engine's recovery, the next
request's greedy output is a clean run's, and evict, restore and unload go on working.

Faults come from gpu/vk.py's injection hook (vk.inject): the nth submit, fence wait, copy
or allocation from now fails with a timeout, a lost device or out of memory, the way a real
failure does (the device made idle, the work's results undefined).
"""
from __future__ import annotations

import pytest

from engine.api import Engine
from engine.facade import EngineFault, Request
from engine.gpu import vk
from engine.residency.model import Model
from engine.text.sampling import SamplingParams
from tests.conftest import load_reference

pytestmark = pytest.mark.gpu
GREEDY = SamplingParams(temperature=0.0)
N = 6


@pytest.fixture(scope="module")
def ref():
    return load_reference("smollm2-135m-instruct-q4_1.json")["prompts"]["plain"]


@pytest.fixture(autouse=True)
def _no_faults_left():
    vk.clear_faults()
    yield
    vk.clear_faults()


@pytest.fixture(params=[True, pytest.param(False, marks=pytest.mark.slow)],
                ids=["unified", "discrete"])
def engine(request, smollm2_path, monkeypatch):
    """An engine with SmolLM2 loaded; "discrete" takes the copy path a discrete GPU takes
    (host shadow plus device copies), so copies can fail too."""
    monkeypatch.setattr(Model, "write_in_place", request.param)
    with Engine(n_ctx=256) as eng:
        eng.load(smollm2_path, name="m")
        yield eng


def answer(eng: Engine, ref) -> list[int]:
    return eng.generate(Request("m", tokens=ref["prompt_ids"], max_tokens=N,
                                sampling=GREEDY)).tokens


def still_works(eng: Engine, ref, want: list[int]) -> None:
    """After the fault: a clean run's answer, then evict, restore and a second answer."""
    assert answer(eng, ref) == want
    eng.evict("m", full=True)
    assert eng.status()[0]["state"] == "cold"
    eng.warm("m")
    assert answer(eng, ref) == want
    assert eng.health()["status"] == "recovered"


@pytest.mark.parametrize("kind", ["timeout", "out_of_memory"])
@pytest.mark.parametrize("point", ["submit", "wait"])
def test_fault_during_prefill_is_recovered_and_the_request_answers(engine, ref, point, kind,
                                                                   monkeypatch):
    want = ref["greedy_ids"][:N]
    engine.evict("m", full=True)             # nothing cached: the prompt runs in passes
    passes = []

    def second_pass_faults(model, remaining: int) -> int:
        """Passes of 4 tokens, however fast the device (a fast one takes the prompt in one),
        and the fault armed for the second pass's submit or wait, after the restore's own."""
        passes.append(remaining)
        if len(passes) == 2:
            vk.inject(point, kind, nth=1)
        return remaining if remaining <= 5 else 4
    monkeypatch.setattr(Model, "next_chunk", second_pass_faults)
    assert answer(engine, ref) == want       # recovered, run again from the host copies
    assert len(passes) > 2                   # the prompt ran again after the fault
    assert engine.health()["faults"] == 1
    assert engine.status()[0]["faults"] == 1
    still_works(engine, ref, want)


def test_fault_during_decode_fails_the_request_cleanly(engine, ref):
    want = ref["greedy_ids"][:N]
    pieces = []

    def on_text(piece: str) -> None:         # text has gone out: no silent retry
        pieces.append(piece)
        if len(pieces) == 1:
            vk.inject("submit", "timeout", nth=1)
    with pytest.raises(EngineFault, match="a retry gives the right answer") as err:
        engine.generate(Request("m", tokens=ref["prompt_ids"], max_tokens=12,
                                sampling=GREEDY), on_text=on_text)
    assert err.value.code == "device_fault" and not err.value.lost
    assert engine.status()[0]["state"] == "cold"
    assert engine.status()[0]["cached_tokens"] == 0   # its KV was only on the device
    still_works(engine, ref, want)


@pytest.mark.parametrize("point", ["copy", "wait"])
def test_fault_during_a_release(engine, ref, point):
    want = ref["greedy_ids"][:N]
    assert answer(engine, ref) == want
    vk.inject(point, "timeout", nth=1)       # the KV's copy to its host shadow
    with pytest.raises(EngineFault):
        engine.evict("m", full=True)
    s = engine.status()[0]
    assert s["state"] == "cold" and not s["device_bytes"]
    still_works(engine, ref, want)


def test_fault_during_a_restore(engine, ref):
    want = ref["greedy_ids"][:N]
    assert answer(engine, ref) == want
    engine.evict("m", full=True)
    vk.inject("copy", "timeout", nth=1)      # weights (discrete) or the KV shadow's copy back
    with pytest.raises(EngineFault):
        engine.warm("m")
    assert engine.status()[0]["state"] == "cold"
    still_works(engine, ref, want)


def test_fault_during_a_load(smollm2_path, ref, monkeypatch):
    want = ref["greedy_ids"][:N]
    monkeypatch.setattr(Model, "write_in_place", False)   # the upload is a copy
    with Engine(n_ctx=256) as eng:
        vk.inject("copy", "timeout", nth=1)
        with pytest.raises(EngineFault):
            eng.load(smollm2_path, name="m")
        assert eng.status() == []
        eng.load(smollm2_path, name="m")
        still_works(eng, ref, want)
        eng.unload("m")
        assert eng.status() == [] and eng.vram()["granted_bytes"] == 0


def test_out_of_memory_at_allocation_refuses_the_load(smollm2_path, ref):
    with Engine(n_ctx=256) as eng:
        vk.inject("alloc", "out_of_memory", nth=1)
        with pytest.raises(vk.OutOfMemory):
            eng.load(smollm2_path, name="m")
        assert eng.status() == []
        eng.load(smollm2_path, name="m")
        assert answer(eng, ref) == ref["greedy_ids"][:N]


def test_a_lost_device_refuses_work_and_says_so(engine, ref):
    vk.inject("submit", "device_lost", nth=1)
    with pytest.raises(EngineFault) as err:
        answer(engine, ref)
    assert err.value.lost and err.value.code == "device_lost"
    assert engine.health()["status"] == "device_lost"
    with pytest.raises(EngineFault, match="restart Hotseat"):
        answer(engine, ref)
    with pytest.raises(EngineFault, match="restart Hotseat"):
        engine.warm("m")
    assert engine.status()[0]["state"] == "unusable"
    engine.unload("m")                       # freeing still works
    assert engine.status() == []
