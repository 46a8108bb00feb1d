"""`hotseat swap-bench --json` as a user runs it: two models taking turns, the same answers in
every cycle, the prompt cache across the swap, and a restore's time and rate from each tier
of the host shadows."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.gpu, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[3]


def test_swap_bench_reports_every_tier(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HOTSEAT_CACHE_DIR": str(tmp_path / "c")}
    out = subprocess.run([sys.executable, "-m", "engine.cli", "swap-bench", "--cycles", "2",
                          "-n", "4", "--ctx", "256", "--no-arena", "--json"],
                         capture_output=True, text=True, cwd=ROOT, env=env, timeout=600)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert len(report["models"]) == 2
    for m in report["models"]:
        assert m["outputs_identical_across_cycles"] and m["cached_tokens"][0] == 0
        assert m["cached_tokens"][1] > 0
        tiers = m["tiers"]
        assert set(tiers) == {"ram", "disk", "file"}
        for t in tiers.values():
            assert t["restore_s_median"] > 0 and t["bytes"] > 90 << 20 and t["GBps"] > 0
    assert not list((tmp_path / "c").glob("*"))        # the spill files went with the models
