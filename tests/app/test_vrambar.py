"""The stacked VRAM bar and the byte formatting beside it."""
from __future__ import annotations

import pytest

from app.window.vrambar import VramBar, format_bytes


@pytest.mark.parametrize("n, text", [(0, "0 B"), (512, "512 B"), (1536, "1.5 KiB"),
                                     (96 << 20, "96.0 MiB"), (122 << 20, "122 MiB"),
                                     (1792 << 20, "1.8 GiB"), (24 << 30, "24.0 GiB")])
def test_format_bytes(n, text):
    assert format_bytes(n) == text


def test_segments_scale_to_the_budget_and_keep_tiny_kinds_visible(qtbot):
    bar = VramBar()
    qtbot.addWidget(bar)
    bar.set_data({"weights": 300, "kv": 100, "scratch": 0, "compute": 1}, budget=1000)
    segs = bar.segments(500)
    assert [k for k, _, _ in segs] == ["weights", "kv", "compute"]   # zero bytes: no segment
    assert segs[0] == ("weights", 0.0, 150.0) and segs[1] == ("kv", 150.0, 50.0)
    assert segs[2][2] == 1.0                                          # at least a pixel
    assert "Total: 401 B of 1000 B budget" in bar.toolTip()


def test_over_budget_scales_to_the_total(qtbot):
    bar = VramBar()
    qtbot.addWidget(bar)
    bar.set_data({"weights": 2000}, budget=1000)
    assert bar.segments(100) == [("weights", 0.0, 100.0)]


def test_cold_model_tooltip_says_what_warm_needs(qtbot):
    bar = VramBar()
    qtbot.addWidget(bar)
    bar.set_data({}, budget=1 << 30, warm_bytes=110 << 20)
    assert "Warm it needs 110 MiB" in bar.toolTip()
    assert not bar.grab().toImage().isNull()
