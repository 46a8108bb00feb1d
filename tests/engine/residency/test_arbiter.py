"""The VRAM arbiter: grants, LRU eviction order, pinning, the over-budget error, the ledger."""
from __future__ import annotations

import pytest

from engine.residency.arbiter import Arbiter, BudgetError

MiB = 1 << 20


class FakeModel:
    """Stands in for a model's device memory: warm bytes, and what a weights-only release
    keeps (KV + compute)."""

    def __init__(self, arb: Arbiter, name: str, warm: int, kept_weights_only: int = 0):
        self.arb, self.name, self.warm, self.kept = arb, name, warm, kept_weights_only
        self.releases: list[bool] = []
        self.held = warm
        arb.register(name, self)

    def release(self, full: bool = True, discard: bool = False) -> dict:
        self.releases.append(full)
        self.held = 0 if full else self.kept
        return {"op": "release"}

    def device_bytes(self) -> dict[str, int]:
        return {"kv": self.held} if self.held else {}


def check_ledger(arb: Arbiter) -> None:
    assert all(total <= arb.budget for *_, total in arb.ledger)


def test_lru_unpinned_released_first():
    arb = Arbiter(300 * MiB)
    a, b, c = (FakeModel(arb, n, 100 * MiB) for n in "abc")
    for m in (a, b, c):
        assert arb.acquire(m.name, m.warm) == []
    arb.acquire("a", a.warm)                  # a is now most recently used
    d = FakeModel(arb, "d", 150 * MiB)
    assert arb.acquire("d", d.warm) == ["b", "c"]
    assert arb.held("a") == 100 * MiB and arb.held("b") == 0 and arb.used == 250 * MiB
    check_ledger(arb)


def test_pinned_never_released_and_clear_error():
    arb = Arbiter(250 * MiB)
    a, b = FakeModel(arb, "a", 100 * MiB), FakeModel(arb, "b", 100 * MiB)
    arb.acquire("a", a.warm)
    arb.pin("a", a.warm)
    arb.acquire("b", b.warm)
    arb.pin("b", b.warm)
    c = FakeModel(arb, "c", 100 * MiB)
    with pytest.raises(BudgetError, match=r"budget 250 MiB, pinned models: a \(100 MiB\), "
                                          r"b \(100 MiB\)"):
        arb.acquire("c", c.warm)
    assert a.releases == [] and b.releases == []
    arb.unpin("a")
    assert arb.acquire("c", c.warm) == ["a"]
    check_ledger(arb)


def test_pinning_more_than_the_budget_is_refused():
    arb = Arbiter(150 * MiB)
    a, b = FakeModel(arb, "a", 100 * MiB), FakeModel(arb, "b", 100 * MiB)
    arb.acquire("a", a.warm)
    arb.pin("a", a.warm)
    with pytest.raises(BudgetError, match="pinning b"):
        arb.pin("b", b.warm)
    with pytest.raises(BudgetError, match="making warm big"):
        FakeModel(arb, "big", 400 * MiB)
        arb.acquire("big", 400 * MiB)


def test_weights_only_release_then_full_when_needed():
    arb = Arbiter(200 * MiB, full_release=False)
    a = FakeModel(arb, "a", 100 * MiB, kept_weights_only=30 * MiB)
    arb.acquire("a", a.warm)
    b = FakeModel(arb, "b", 120 * MiB)
    arb.acquire("b", b.warm)                 # 30 + 120 fits: weights-only is enough
    assert a.releases == [False] and arb.held("a") == 30 * MiB
    arb.acquire("a", a.warm)                 # back: needs 70 more, b goes weights-only
    c = FakeModel(arb, "c", 190 * MiB)
    arb.acquire("c", c.warm)                 # nothing kept fits beside 190: full releases
    assert arb.held("a") == 0 and arb.held("b") == 0
    assert True in a.releases
    check_ledger(arb)


def test_budget_must_be_positive():
    with pytest.raises(ValueError):
        Arbiter(0)
