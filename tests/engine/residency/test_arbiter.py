"""The VRAM arbiter: grants, LRU eviction order, pinning, the over-budget error, the ledger."""
from __future__ import annotations

import pytest

from engine.residency.arbiter import Arbiter, BudgetError

MiB = 1 << 20


class FakeModel:
    """Stands in for a model's device memory: warm bytes, and what a weights-only release
    keeps (KV + compute)."""

    def __init__(self, arb: Arbiter, name: str, warm: int, kept_weights_only: int = 0,
                 shadow: int = 0):
        self.arb, self.name, self.warm, self.kept = arb, name, warm, kept_weights_only
        self.shadow = shadow                  # the RAM a full release leaves (its KV)
        self.releases: list[bool] = []
        self.held = warm
        self.ram = self.disk = 0
        arb.register(name, self)

    def release(self, full: bool = True, discard: bool = False) -> dict:
        self.releases.append(full)
        self.held = 0 if full else self.kept
        if full and not self.disk:
            self.ram = self.shadow
        return {"op": "release"}

    def device_bytes(self) -> dict[str, int]:
        return {"kv": self.held} if self.held else {}

    def ram_bytes(self) -> int:
        return self.ram

    def spill(self) -> int:
        freed, self.disk, self.ram = self.ram, self.disk + self.ram, 0
        return freed


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


def test_host_budget_moves_the_least_recently_used_to_disk_never_a_pinned():
    """Two warm at a time; each cold one leaves 60 MiB of KV in RAM; 130 MiB of RAM."""
    arb = Arbiter(200 * MiB, host_budget=130 * MiB)
    a, b, c, d, e = (FakeModel(arb, n, 100 * MiB, shadow=60 * MiB) for n in "abcde")
    arb.pin("a", a.warm)
    for m in (a, b, c):
        arb.acquire(m.name, m.warm)           # c takes b's place: b's KV in RAM
    assert (b.ram, b.disk) == (60 * MiB, 0) and arb.host_used == 60 * MiB
    arb.acquire("d", d.warm)                  # c's KV too: 120 MiB, still in the budget
    assert (c.ram, b.ram) == (60 * MiB, 60 * MiB)
    arb.acquire("e", e.warm)                  # d's: 180 MiB; b, the least recent, to disk
    assert (b.ram, b.disk) == (0, 60 * MiB) and c.ram == d.ram == 60 * MiB
    assert arb.host_used <= arb.host_budget
    assert [n for _, n, op, *_ in arb.ledger if op == "spill"] == ["b"]
    arb.release("a", full=True)               # pinned: its KV stays in RAM, c's goes
    assert (a.ram, a.disk) == (60 * MiB, 0) and (c.ram, c.disk) == (0, 60 * MiB)
    assert arb.host_used == 120 * MiB
    arb.set_host_budget(0)                    # all but the pinned one's
    assert arb.host_used == a.ram == 60 * MiB and d.disk == 60 * MiB
    with pytest.raises(ValueError, match="must not be negative"):
        arb.set_host_budget(-1)
