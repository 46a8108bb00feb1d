"""`hotseat kernel-bench mul_mat_moe` on shapes small enough for lavapipe: both paths run and
agree (the bench checks them against each other), and the table prints."""
from __future__ import annotations

import argparse
import functools

import pytest

from engine.tools import kernelbench

pytestmark = pytest.mark.gpu

TINY = dict(shapes=(("Q4_0", 64, 24, False), ("Q6_K", 256, 8, True)), n_expert=8, k=2, n=12,
            tiles=((2, 4),))


def test_mul_mat_moe_bench_rows(dev, kc, monkeypatch):
    """W past the buffer range (made small here: 2 Q4_0 experts, 1 Q6_K) goes in parts; the
    matrix units' tiles are timed too where prefill takes them."""
    from engine.gpu.paths import Tuning

    on_cm = Tuning.for_device(dev).fast_prefill
    monkeypatch.setattr(dev, "max_storage_range", 2000)
    rows = kernelbench.bench_mul_mat_moe(dev, kc, 1, **TINY)
    assert [(r["type"], r["routing"], r["parts"]) for r in rows] == \
        [(t, routing, parts) for t, parts in (("Q4_0", 4), ("Q6_K", 8))
         for routing in ("even", "uneven", "hot")]
    for r in rows:
        assert r["mul_mat_id_us"] > 0 and r["moe_group_us"] > 0 and r["speedup"] > 0
        assert r["max_expert_tokens"] <= 12 and 0 <= r["idle_experts"] < 8
        grouped = [v for v in r["variants"] if v["kernel"] == "mul_mat_moe"]
        assert [(v["tile"], v["token_tiles"]) for v in grouped] == [([2, 4], 12)]  # the most
        assert all(v["max_rel_err"] <= 1e-4 for v in grouped)
        cm = [v for v in r["variants"] if v["kernel"] == "mul_mat_moe_cm"]
        assert [tuple(v["tile"]) for v in cm] == (list(kernelbench.MOE_CM_TILES) if on_cm else [])
        assert all(v["max_rel_err"] <= 2e-2 and v["us"] > 0 for v in cm)


def test_the_sweep_narrows_and_says_each_variant_as_it_comes(dev, kc, capsys):
    """--types and --variants narrow a sweep; each variant timed is said on stderr at once
    (a sweep cut short still tells what it timed); --variants names no other kernel's."""
    rows = kernelbench.bench_mul_mat_moe(dev, kc, 1, types={"Q6_K"}, variants={"mul_mat_moe"},
                                         **TINY)
    assert [r["type"] for r in rows] == ["Q6_K"] * 3
    assert all({v["kernel"] for v in r["variants"]} == {"mul_mat_moe"} for r in rows)
    said = [ln for ln in capsys.readouterr().err.splitlines() if " mul_mat_moe 2x4: " in ln]
    assert [ln.split(" mul_mat_moe ")[0] for ln in said] == \
        [f"Q6_K 256x8x12 {routing}" for routing in ("even", "uneven", "hot")]
    args = argparse.Namespace(kernel="concat", repeats=1, json=False, variants="mul_mat_moe")
    with pytest.raises(ValueError, match="--variants"):
        kernelbench.run_kernel_bench(args)


def test_shapes_and_tiles_are_read_and_checked():
    """--shapes and --tiles (mul_mat_cm only): TYPE:INxOUTxTOKENS and ROWSxTOKENSxLANES
    lists; a malformed one, an unknown type or another kernel is an error naming them."""
    assert kernelbench.parse_shapes("Q4_K:4096x14336x512, Q6_K:14336x4096x256") == \
        [("Q4_K", 4096, 14336, 512), ("Q6_K", 14336, 4096, 256)]
    assert kernelbench.parse_tiles("128x128x256,64x64x128") == [(128, 128, 256), (64, 64, 128)]
    for bad in ("Q4_K:4096x14336", "Q4_K", "Q9_K:1x2x3", "Q4_K:ax2x3"):
        with pytest.raises(ValueError, match="shape|weight type"):
            kernelbench.parse_shapes(bad)
    for bad in ("128x128", "wide", ""):
        with pytest.raises(ValueError, match="ROWSxTOKENSxLANES"):
            kernelbench.parse_tiles(bad)
    args = argparse.Namespace(kernel="mul_mat_moe", repeats=1, json=False, shapes="Q4_K:1x2x3",
                              tiles=None)
    with pytest.raises(ValueError, match="--shapes and --tiles"):
        kernelbench.run_kernel_bench(args)


def test_mul_mat_moe_bench_table(monkeypatch, capsys):
    monkeypatch.setattr(kernelbench, "bench_mul_mat_moe",
                        functools.partial(kernelbench.bench_mul_mat_moe, **TINY))
    args = argparse.Namespace(kernel="mul_mat_moe", repeats=1, json=False)
    assert kernelbench.run_kernel_bench(args) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("prefill expert products on ")
    assert len([ln for ln in lines if ln.startswith("| Q")]) == 6     # 2 types, 3 routings


def test_mul_mat_vec_bench_types(dev, kc, monkeypatch):
    """The decode bench's random weights are valid blocks for every weight type it lists:
    each of its shapes' types, small, runs, and mul_mat_vec and (where the device has int8
    dot products and the type a reader) mul_mat_vecq agree with mul_mat (the bench raises
    where they disagree), each op reading its own copy of the weights."""
    from shaders.registry import MATVECQ_TYPES

    monkeypatch.setattr(kernelbench, "MATVECQ_GRID", ((dev.subgroup_size * 2, 2, 2, 0),
                                                      (dev.subgroup_size, 1, 1, 1)))
    monkeypatch.setattr(kernelbench, "COLD_BYTES", 1 << 16)
    types = sorted({t for t, _, _ in kernelbench.MATVEC_SHAPES})
    shapes = tuple((t, 256, 8) for t in types)
    rows = kernelbench.bench_mul_mat_vec(dev, kc, 1, shapes=shapes)
    assert [r["type"] for r in rows] == types
    for r in rows:
        assert r["mul_mat_vec"]["us"] > 0 and r["copies"] >= 2
        if dev.dot4 and r["type"] in MATVECQ_TYPES:
            assert len(r["variants"]) == 2 and all(v["us"] > 0 for v in r["variants"])
        else:
            assert r["variants"] == [] and r["best"] is None


def test_attn_decode_bench(dev, kc, monkeypatch, capsys):
    """`hotseat kernel-bench attn_decode`: every variant of its grid that the heads allow runs
    attn_decode, agrees with numpy (the bench raises where not), each op on its own K and V,
    and the table prints a row a shape."""
    monkeypatch.setattr(kernelbench, "COLD_BYTES", 1 << 16)
    shapes = ((8, 2, 64, 100), (4, 4, 128, 37))
    grid = ((64, 1, 2, 32, False), (64, 4, 4, 16, True))
    monkeypatch.setattr(kernelbench, "ATTN_SHAPES", shapes)
    monkeypatch.setattr(kernelbench, "ATTN_GRID", grid)
    rows = kernelbench.bench_attn_decode(dev, kc, 1)
    assert [(r["n_head"], r["positions"]) for r in rows] == [(8, 100), (4, 37)]
    first, second = rows
    assert [(v["heads"], v["splits"], v["chunk"], v["ahead"]) for v in first["variants"]] == \
        [(1, 2, 32, False), (4, 4, 16, True)]
    assert [v["heads"] for v in second["variants"]] == [1]        # no 4 heads of one KV head
    assert all(v["us"] > 0 for r in rows for v in r["variants"]) and first["copies"] >= 2
    args = argparse.Namespace(kernel="attn_decode", repeats=1, json=False)
    assert kernelbench.run_kernel_bench(args) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("decode attention on ")
    assert [ln.split("|")[3].strip() for ln in lines[3:]] == ["100", "37"]
