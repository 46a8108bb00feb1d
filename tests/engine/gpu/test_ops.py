"""Per-device choices in ops.Tuning, from plain DeviceInfo records (no device needed)."""
from __future__ import annotations

import numpy as np
import pytest

from engine.gpu.builder import moe_tile_slots, moe_tiles_most

from engine.gpu.paths import Tuning, is_amd_gcn
from engine.gpu.vk import DeviceInfo

AMD, NVIDIA, INTEL, MESA_CPU = 0x1002, 0x10DE, 0x8086, 0x10005


def gpu(name: str, vendor: int = AMD, kind: str = "discrete") -> DeviceInfo:
    return DeviceInfo(0, name, kind, vendor, "1.3", 0x67DF)


@pytest.mark.parametrize("name", [
    "AMD RADV POLARIS10", "AMD RADV POLARIS12", "AMD RADV VEGA10", "AMD RADV TONGA",
    "AMD RADV FIJI", "AMD RADV HAWAII", "AMD RADV BONAIRE", "AMD RADV TAHITI", "AMD RADV RAVEN2",
    "AMD RADV RENOIR", "AMD Radeon RX 580 Series (RADV POLARIS10)", "AMD Radeon RX 480",
    "Radeon RX 570X", "AMD Radeon R9 390", "AMD Radeon R9 Fury", "AMD Radeon RX Vega",
    "AMD Radeon VII", "AMD Radeon(TM) Vega 8 Graphics", "AMD Radeon HD 7970"])
def test_gcn_names(name):
    assert is_amd_gcn(gpu(name))


@pytest.mark.parametrize("info", [
    gpu("AMD RADV NAVI10"), gpu("AMD RADV NAVI21"), gpu("AMD RADV GFX1100"),
    gpu("AMD RADV VANGOGH"), gpu("AMD RADV REMBRANDT"), gpu("AMD Radeon RX 5700 XT"),
    gpu("AMD Radeon RX 6800 XT (RADV NAVI21)"), gpu("AMD Radeon RX 7900 XTX"),
    gpu("AMD Radeon(TM) Graphics", kind="integrated"),
    gpu("NVIDIA H200", NVIDIA), gpu("POLARIS10 lookalike", NVIDIA),
    gpu("Intel(R) Arc(tm) A770 Graphics (DG2)", INTEL),
    gpu("llvmpipe (LLVM 15.0.6, 256 bits)", MESA_CPU, "cpu")])
def test_not_gcn(info):
    assert not is_amd_gcn(info)


def test_auto_turns_flash_attention_on_for_gcn_at_large_heads_in_prefill_only():
    t = Tuning.for_info(gpu("AMD RADV POLARIS10"), subgroup=64, max_shared=65536)
    assert t.flash_attn == "auto" and t.amd_gcn
    assert t.use_flash_attn(256, 512) and t.use_flash_attn(512, 2)
    assert not t.use_flash_attn(256, 1)                  # decode keeps the split path
    assert not t.use_flash_attn(64, 512) and not t.use_flash_attn(128, 512)
    for info in (gpu("AMD RADV NAVI21"), gpu("NVIDIA H200", NVIDIA),
                 gpu("llvmpipe", MESA_CPU, "cpu")):
        assert not Tuning.for_info(info, subgroup=32).use_flash_attn(256, 512), info.name


def test_on_and_off_force_it():
    on = Tuning.for_info(gpu("NVIDIA H200", NVIDIA), subgroup=32, flash_attn="on")
    assert on.use_flash_attn(64, 2) and on.use_flash_attn(256, 256)
    assert not on.use_flash_attn(64, 1)
    off = Tuning.for_info(gpu("AMD RADV VEGA10"), subgroup=64, flash_attn="off")
    assert not off.use_flash_attn(256, 512)
    with pytest.raises(ValueError, match="auto, on, off"):
        Tuning.for_info(gpu("AMD RADV VEGA10"), subgroup=64, flash_attn="yes")


def test_flash_tiles_fit_shared_memory():
    small = Tuning.for_info(gpu("llvmpipe", MESA_CPU, "cpu"), subgroup=8, max_shared=32768)
    assert small.flash_block(64) == (16, 32) and small.flash_block(256) == (16, 16)
    big = Tuning.for_info(gpu("NVIDIA H200", NVIDIA), subgroup=32, max_shared=49152)
    assert big.flash_block(256) == (16, 32)
    for t in (small, big):
        for hd in (64, 256):
            rows, cols = t.flash_block(hd)
            assert 4 * cols * hd + 2 * rows * cols <= t.max_shared
    assert small.attn_lanes(64) == 4 and small.attn_lanes(256) == 8
    assert Tuning.for_info(gpu("x", MESA_CPU, "cpu"), subgroup=4).attn_lanes(256) == 4
    assert small.attn_lanes(72) == 2                     # 18 vec4: lanes must divide it


def test_decode_splits_follow_context_and_device():
    gpu_t = Tuning.for_info(gpu("NVIDIA H200", NVIDIA), subgroup=32)
    assert [gpu_t.decode_splits(n) for n in (16, 256, 1024, 2048, 8192, 1 << 17)] == \
        [1, 2, 8, 16, 16, 16]
    # about two workgroups a compute unit where their count is known: 32 heads on 132 SMs
    # take 8 splits, 64 heads 4, 8 heads the context's 16
    sms = Tuning.for_info(gpu("NVIDIA H100", NVIDIA), subgroup=32, compute_units=132)
    assert [sms.decode_splits(8192, rows) for rows in (0, 8, 32, 64, 512)] == [16, 16, 8, 4, 1]
    assert sms.decode_splits(256, 32) == 2
    cpu_t = Tuning.for_info(gpu("llvmpipe", MESA_CPU, "cpu"), subgroup=8)
    assert [cpu_t.decode_splits(n) for n in (16, 256, 2048)] == [1, 2, 2]
    assert cpu_t.split_chunk >= gpu_t.split_chunk


@pytest.mark.parametrize("n,k,n_expert,slots,most", [
    (256, 8, 128, 8, 368),   # Qwen3-30B-A3B, a full chunk: 16 slots an expert, tiles of 8
    (32, 8, 128, 2, 192),    # a short prompt: 2 an expert
    (8, 8, 128, 1, 64),      # fewer slots than experts: a tile a slot
    (9, 2, 8, 4, 10),        # the test model
    (4, 8, 8, 4, 8)])        # every token takes every expert: one tile holds each
def test_moe_tiles_follow_an_even_routing(n, k, n_expert, slots, most):
    """mul_mat_moe's token tiles hold an expert's share of an even routing; the grouped
    products' dispatch covers the most tiles any routing makes (each expert's slots in
    whole tiles and one partial, no expert more than n tokens), even, uneven or hot."""
    assert moe_tile_slots(n, k, n_expert, 8) == slots
    assert moe_tiles_most(n, k, n_expert, slots) == most
    rng = np.random.default_rng(3)
    for skew in (0.0, 1.0, 4.0):
        p = np.exp(skew * rng.standard_normal(n_expert))
        ids = np.stack([rng.choice(n_expert, min(k, n_expert), replace=False, p=p / p.sum())
                        for _ in range(n)])
        counts = np.bincount(ids.reshape(-1), minlength=n_expert)
        assert (-(-counts // slots)).sum() <= most


def test_matvec_shape_per_shape_and_by_setting(monkeypatch):
    """mul_mat_vec's (rows, lanes, map): the measured choices, $HOTSEAT_MATVEC over them,
    and a clear error for a setting that does not parse."""
    from engine.gpu.paths import Tuning

    t = Tuning(subgroup=32)
    monkeypatch.delenv("HOTSEAT_MATVEC", raising=False)
    assert t.matvec_shape("Q4_K", 4096, 64) == (2, 128, 1)        # 4096 rows of 4096
    assert t.matvec_shape("Q4_K", 14336, 64) == (4, 128, 1)
    assert t.matvec_shape("Q4_K", 4096, 224) == (8, 256, 0)       # rows of 14336
    assert t.matvec_shape("Q4_0", 512, 64) == (1, 64, 0)
    assert t.matvec_shape("Q4_0", 2048, 256) == (8, 256, 0)
    assert t.matvec_shape("Q6_K", 4096, 224) == (2, 128, 0)
    monkeypatch.setenv("HOTSEAT_MATVEC", "Q4_K=8x64m1, Q6_K=2x32")
    assert t.matvec_shape("Q4_K", 4096, 64) == (8, 64, 1)
    assert t.matvec_shape("Q6_K", 4096, 224) == (2, 32, 0)
    assert t.matvec_shape("Q4_0", 2048, 256) == (8, 256, 0)      # not named: measured choice
    for bad in ("Q4_K", "Q4_K=8", "Q4_K=axb", "Q4_K=8x64mz", "Q4_K=0x64", "Q4_K=8x8m1",
                "Q4_K=8x64m2"):
        monkeypatch.setenv("HOTSEAT_MATVEC", bad)
        with pytest.raises(ValueError, match="HOTSEAT_MATVEC"):
            t.matvec_shape("Q4_K", 4096, 64)


def test_matvecq_choices_and_settings(monkeypatch):
    """mul_mat_vecq: where it is taken (int8 dot products, no ggml rounding, the types it
    reads, x within shared memory), its measured shapes, $HOTSEAT_MATVECQ over them (and
    "off"), and decode attention's width and heads per workgroup."""
    from engine.gpu.paths import Tuning

    monkeypatch.delenv("HOTSEAT_MATVECQ", raising=False)
    t = Tuning(subgroup=32, dot4=True, ggml_numerics=False, max_shared=49152)
    assert t.matvecq and t.paths(128).decode_matmul == "mul_mat_vecq"
    assert not Tuning(subgroup=32, dot4=True).matvecq                   # ggml's rounding
    assert not Tuning(subgroup=32, ggml_numerics=False).matvecq          # no dot products
    assert t.matvecq_fits("Q4_K", 14336) and t.matvecq_fits("Q8_0", 2880)
    assert not t.matvecq_fits("Q4_K", 2880)                              # not whole blocks
    assert not t.matvecq_fits("Q5_K", 4096) and not t.matvecq_fits("Q4_0", 40960)
    assert t.matvecq_shape("Q4_K", 4096, 4096) == (256, 1, 2, 0)
    assert t.matvecq_shape("Q4_K", 14336, 4096) == (256, 1, 2, 0)       # compute units unknown
    t.compute_units = 132
    assert t.matvecq_shape("Q4_K", 14336, 4096) == (256, 1, 2, 528)     # tall: four a unit
    assert t.matvecq_shape("Q4_K", 4096, 4096) == (256, 1, 2, 0)
    assert t.matvecq_shape("Q6_K", 4096, 14336) == (256, 2, 4, 0)       # long rows read ahead
    assert t.matvecq_shape("Q4_0", 2048, 2048) == (256, 1, 2, 0)
    assert t.matvecq_shape("MXFP4", 2880, 2880) == (256, 1, 1, 0)       # gpt-oss's experts
    monkeypatch.setenv("HOTSEAT_MATVECQ", "Q4_K=128x4x1x264")
    assert t.matvecq_shape("Q4_K", 4096, 4096) == (128, 4, 1, 264)
    assert t.matvecq_shape("Q6_K", 4096, 4096) == (256, 2, 2, 0)        # not named
    for bad in ("Q4_K=128x4x1", "Q4_K=0x4x1x0", "Q4_K=axbxcxd"):
        monkeypatch.setenv("HOTSEAT_MATVECQ", bad)
        with pytest.raises(ValueError, match="HOTSEAT_MATVECQ"):
            t.matvecq_shape("Q4_K", 4096, 4096)
    monkeypatch.setenv("HOTSEAT_MATVECQ", "off")
    assert t.matvecq_shape("Q4_K", 4096, 4096) == (256, 1, 2, 0)
    # attn_decode: a head a workgroup unless asked; 8 lanes a position at head 128 leave 4
    # vec4s a lane, so 4 heads fit
    assert t.decode_group(128, 32, 8) == 1
    on_gpu = Tuning.for_info(gpu("NVIDIA H200", NVIDIA), subgroup=32)
    assert (on_gpu.decode_wg, on_gpu.decode_ahead) == (256, True)
    t.decode_heads = 4
    assert t.decode_group(128, 32, 8) == 4 and t.decode_group(128, 32, 32) == 1
    assert t.decode_group(64, 24, 8) == 3 and t.decode_group(256, 16, 2) == 2
    t.decode_wg = 256
    assert t.decode_lanes(128) == 256 and t.decode_lanes(256) == 128    # shared memory


@pytest.mark.parametrize("n_in", [4096, 28672, 1 << 20])
def test_loop_bounded_drivers_get_walks_within_the_bound(n_in):
    """Under llvmpipe's loop bound: a grouped expert product's workgroup walks K once (a
    tile each, however many tokens pick its expert), within half of it; decode attention gets
    splits enough at any context; reductions widen with the vocabulary."""
    t = Tuning.for_info(gpu("llvmpipe (LLVM 15.0.6, 256 bits)", MESA_CPU, "cpu"), subgroup=8)
    assert t.loop_ticks == 65535
    walk = -(-n_in // 64) + 2        # a grouped product's workgroup walks K once, a tile
    assert walk + 1 < t.loop_ticks // 2
    for n_ctx in (2048, 1 << 16, t.max_ctx):
        assert -(-n_ctx // t.decode_splits(n_ctx)) <= t.loop_ticks // 2
    for n in (49152, 262144, 1 << 22):
        assert -(-n // t.reduce_wg(n)) <= t.loop_ticks // 2


def test_grouped_experts_take_the_matrix_units(monkeypatch):
    """Prefill's expert products take mul_mat_moe_cm where prefill is on the matrix units,
    mul_mat_moe where HOTSEAT_MOE_CM=off or there are none; a value other than on or off is
    an error that names the setting."""
    monkeypatch.setenv("HOTSEAT_MOE_CM", "off")
    assert Tuning.for_info(gpu("NVIDIA H200", NVIDIA), subgroup=32, coopmat=True) \
        .paths(128).moe_prefill == "mul_mat_moe"
    monkeypatch.delenv("HOTSEAT_MOE_CM")
    t = Tuning.for_info(gpu("NVIDIA H200", NVIDIA), subgroup=32, coopmat=True)
    assert t.moe_cm and t.paths(128).moe_prefill == "mul_mat_moe_cm"
    assert Tuning.for_info(gpu("NVIDIA H200", NVIDIA), subgroup=32) \
        .paths(128).moe_prefill == "mul_mat_moe"                       # no matrix units
    t.moe_grouped = False
    assert t.paths(128).moe_prefill == "mul_mat_id"
    monkeypatch.setenv("HOTSEAT_MOE_CM", "yes")
    with pytest.raises(ValueError, match="HOTSEAT_MOE_CM"):
        Tuning.for_info(gpu("NVIDIA H200", NVIDIA), subgroup=32, coopmat=True)


@pytest.mark.parametrize("name, field, default", [("HOTSEAT_ROUTE_EXPERTS", "route_experts", True),
                                                  ("HOTSEAT_HEAD_NORM", "head_norm", False),
                                                  ("HOTSEAT_CM2_X16", "cm2_x16", True),
                                                  ("HOTSEAT_CM2_AHEAD", "cm2_ahead", True),
                                                  ("HOTSEAT_CM2_ATTN", "cm2_attn", True),
                                                  ("HOTSEAT_CM2_STAGED", "cm2_staged", False),
                                                  ("HOTSEAT_CM2_SPLIT", "cm2_split", True),
                                                  ("HOTSEAT_CM2_WIDE", "cm2_wide", True),
                                                  ("HOTSEAT_CM2_SUMS_AFTER", "cm2_sums_after",
                                                   False),
                                                  ("HOTSEAT_CM2_GROUP", "cm2_group", True),
                                                  ("HOTSEAT_CM_ATTN_256", "cm_attn_256", True),
                                                  ("HOTSEAT_CM2_F16DEC", "cm2_f16dec", False)])
def test_the_fusion_switches(monkeypatch, name, field, default):
    """One token's routing goes inside its experts' product unless HOTSEAT_ROUTE_EXPERTS=off
    asks for the moe_router pass; per-head q/k norms stay in rope_qkv's pass unless
    HOTSEAT_HEAD_NORM=on; mul_mat_cm2 takes x as f16 from a pass before unless
    HOTSEAT_CM2_X16=off, and fetches the K-quants' scales a super-block ahead unless
    HOTSEAT_CM2_AHEAD=off; prefill attention takes flash_attn_cm2 unless HOTSEAT_CM2_ATTN=off,
    and every type's product mul_mat_cm2s where HOTSEAT_CM2_STAGED=on; mul_mat_cm2 splits K
    unless HOTSEAT_CM2_SPLIT=off, adds the slices of the products of one input after all of
    them where HOTSEAT_CM2_SUMS_AFTER=on, takes wide tiles unless HOTSEAT_CM2_WIDE=off, reads
    Q8_0's and Q4_0's blocks eight at a time unless HOTSEAT_CM2_GROUP=off, and decodes the
    K-quants in f16 where HOTSEAT_CM2_F16DEC=on; a value other than on or off names the
    setting."""
    def value() -> bool:
        return getattr(Tuning.for_info(gpu("NVIDIA H200", NVIDIA), subgroup=32,
                                       max_shared=49152), field)

    monkeypatch.delenv(name, raising=False)
    assert value() == default
    for setting in ("on", "off"):
        monkeypatch.setenv(name, setting)
        assert value() == (setting == "on")
    monkeypatch.setenv(name, "1")
    with pytest.raises(ValueError, match=name):
        value()


def test_the_matrix_unit_tile_setting(monkeypatch):
    """HOTSEAT_CM_TILE sets mul_mat_cm's weight rows x tokens; a tile it has no variant for,
    or one past the device's shared memory, is an error that names the setting."""
    def tile(max_shared=49152):
        return Tuning.for_info(gpu("NVIDIA H200", NVIDIA), subgroup=32, coopmat=True,
                               max_shared=max_shared).cm_tile

    monkeypatch.delenv("HOTSEAT_CM_TILE", raising=False)
    assert tile() == (128, 64)
    monkeypatch.setenv("HOTSEAT_CM_TILE", "128x128")
    assert tile() == (128, 128)
    with pytest.raises(ValueError, match="HOTSEAT_CM_TILE.*shared memory"):
        tile(max_shared=32768)
    for bad in ("96x64", "128x256", "128", "wide"):
        monkeypatch.setenv("HOTSEAT_CM_TILE", bad)
        with pytest.raises(ValueError, match="HOTSEAT_CM_TILE"):
            tile()


def test_workgroup_scope_products_are_a_path_of_their_own(monkeypatch):
    """Tuning.coopmat2 takes prefill's products to mul_mat_cm2 (bench prints it), its sums
    in f16 unless HOTSEAT_CM2_ACC16=off, and the grouped experts' to mul_mat_moe_cm2 where
    they take the matrix units and HOTSEAT_MOE_CM2 asks for it, off by default
    (prefill attention then takes flash_attn_cm2 unless HOTSEAT_CM2_ATTN=off, for heads of 64
    or 128; heads of 256 take flash_attn_cm where its blocks fit shared memory, unless
    HOTSEAT_CM_ATTN_256=off);
    HOTSEAT_CM2_TILE sets its rows x tokens x lanes, and a tile it has no variant
    for is an error that names the setting."""
    t = Tuning.for_info(gpu("NVIDIA H200", NVIDIA), subgroup=32, coopmat=True)
    assert not t.coopmat2 and t.paths(128).prefill_matmul == "mul_mat_cm"
    t.coopmat2 = True
    assert t.paths(128).prefill_matmul == "mul_mat_cm2"
    assert t.paths(128).prefill_attention == "flash_attn_cm2"
    t.cm2_attn = False                        # HOTSEAT_CM2_ATTN=off
    assert t.paths(128).prefill_attention == "flash_attn_cm"
    t.cm2_attn = True
    assert t.paths(256).prefill_attention != "flash_attn_cm2"     # heads of 64 or 128 only
    t.max_shared = 49152                      # ... those of 256 take KHR's where they fit
    assert t.paths(256).prefill_attention == "flash_attn_cm"
    t.cm_attn_256 = False                     # ... unless HOTSEAT_CM_ATTN_256=off
    assert t.paths(256).prefill_attention not in ("flash_attn_cm", "flash_attn_cm2")
    t.cm_attn_256 = True
    t.max_shared = 32768
    assert t.paths(256).prefill_attention not in ("flash_attn_cm", "flash_attn_cm2")
    t.moe_cm = False                          # the grouped experts follow HOTSEAT_MOE_CM
    assert t.paths(128).moe_prefill == "mul_mat_moe"
    t.moe_cm = True                           # ... the subgroup-scope kernel, the faster
    assert t.paths(128).moe_prefill == "mul_mat_moe_cm"
    t.moe_cm2 = True                          # HOTSEAT_MOE_CM2=on
    assert t.paths(128).moe_prefill == "mul_mat_moe_cm2"
    t.ggml_numerics = True                   # llama.cpp's rounding asked for: no f16 tiles
    assert t.paths(128).prefill_matmul == "mul_mat"
    def tile():
        return Tuning.for_info(gpu("NVIDIA H200", NVIDIA), subgroup=32, coopmat=True).cm2_tile

    monkeypatch.delenv("HOTSEAT_CM2_TILE", raising=False)
    assert tile() == (128, 128, 256)
    monkeypatch.delenv("HOTSEAT_CM2_ACC16", raising=False)
    assert Tuning.for_info(gpu("NVIDIA H200", NVIDIA), subgroup=32, coopmat=True).cm2_acc16
    monkeypatch.setenv("HOTSEAT_CM2_ACC16", "off")
    assert not Tuning.for_info(gpu("NVIDIA H200", NVIDIA), subgroup=32, coopmat=True).cm2_acc16
    monkeypatch.delenv("HOTSEAT_CM2_ACC16")
    monkeypatch.setenv("HOTSEAT_CM2_TILE", "256x128x256")
    assert tile() == (256, 128, 256)
    monkeypatch.setenv("HOTSEAT_CM2_TILE", "128x256x512")
    assert tile() == (128, 256, 512)
    for bad in ("128x128", "96x128x256", "128x128x1024", "wide"):
        monkeypatch.setenv("HOTSEAT_CM2_TILE", bad)
        with pytest.raises(ValueError, match="HOTSEAT_CM2_TILE"):
            tile()


def test_attention_tile_and_pass_width_settings(monkeypatch):
    """HOTSEAT_FA_CM2_TILE sets flash_attn_cm2's query rows x keys x lanes (a size it has
    no variant for is an error naming it); HOTSEAT_PREFILL_TOKENS the tokens of a prefill
    pass, where the matrix units' default is 512 (anything but a whole number from 1 is an
    error naming it)."""
    def tuning():
        return Tuning.for_info(gpu("NVIDIA H200", NVIDIA), subgroup=32, coopmat=True)

    monkeypatch.delenv("HOTSEAT_FA_CM2_TILE", raising=False)
    assert tuning().fa_cm2_tile == (128, 64, 256) and tuning().prefill_tokens == 512
    monkeypatch.setenv("HOTSEAT_FA_CM2_TILE", "64x64x128")
    assert tuning().fa_cm2_tile == (64, 64, 128)
    for bad in ("64x64", "48x64x128", "64x64x512"):
        monkeypatch.setenv("HOTSEAT_FA_CM2_TILE", bad)
        with pytest.raises(ValueError, match="HOTSEAT_FA_CM2_TILE"):
            tuning()
    monkeypatch.delenv("HOTSEAT_FA_CM2_TILE")
    monkeypatch.setenv("HOTSEAT_PREFILL_TOKENS", "2048")
    assert tuning().prefill_tokens == 2048
    for bad in ("0", "-512", "wide", "1e3"):
        monkeypatch.setenv("HOTSEAT_PREFILL_TOKENS", bad)
        with pytest.raises(ValueError, match="HOTSEAT_PREFILL_TOKENS"):
            tuning()


def test_predecode_settings(monkeypatch):
    """HOTSEAT_PREDECODE=on has the prefill products on the matrix units read quantized
    weights as f16 rows made once a pass (Paths.prefill_weights), off by default and where
    prefill is not on the matrix units; HOTSEAT_PREDECODE_MIB sizes a slice of those rows
    (a whole number from 1, else an error naming it)."""
    def tuning(coopmat=True):
        return Tuning.for_info(gpu("NVIDIA H200", NVIDIA), subgroup=32, coopmat=coopmat)

    for name in ("HOTSEAT_PREDECODE", "HOTSEAT_PREDECODE_MIB"):
        monkeypatch.delenv(name, raising=False)
    t = tuning()
    assert (t.predecode, t.predecode_mib, t.paths(128).prefill_weights) == \
        (False, 32, "in_tiles")
    monkeypatch.setenv("HOTSEAT_PREDECODE", "on")
    assert tuning().paths(128).prefill_weights == "dequant_f16"
    assert tuning(coopmat=False).paths(128).prefill_weights == "in_tiles"
    monkeypatch.setenv("HOTSEAT_PREDECODE_MIB", "8")
    assert tuning().predecode_mib == 8
    for bad in ("0", "half"):
        monkeypatch.setenv("HOTSEAT_PREDECODE_MIB", bad)
        with pytest.raises(ValueError, match="HOTSEAT_PREDECODE_MIB"):
            tuning()
    monkeypatch.setenv("HOTSEAT_PREDECODE_MIB", "8")
    monkeypatch.setenv("HOTSEAT_PREDECODE", "yes")
    with pytest.raises(ValueError, match="HOTSEAT_PREDECODE"):
        tuning()


def test_split_k_fills_the_compute_units_the_tiles_leave_idle(monkeypatch):
    """Tuning.cm2_k_split: a product whose tiles fill fewer than half the compute units has
    its K cut in up to 8 slices of whole super-blocks, about filling them; two thirds full,
    3 slices; fuller, short K (< 2048), K not of whole super-blocks, an unknown count of
    units or HOTSEAT_CM2_SPLIT=off: one slice."""
    monkeypatch.delenv("HOTSEAT_CM2_SPLIT", raising=False)
    assert Tuning.for_info(gpu("NVIDIA H100", NVIDIA), subgroup=32, coopmat=True,
                               compute_units=132).cm2_split
    monkeypatch.setenv("HOTSEAT_CM2_SPLIT", "on")
    t = Tuning.for_info(gpu("NVIDIA H100", NVIDIA), subgroup=32, coopmat=True,
                        compute_units=132)
    assert t.cm2_k_split(32, 4096) == (4, 1024)       # 8B k/v: 32 tiles, 132 units
    assert t.cm2_k_split(16, 4096) == (8, 512)        # at most 8
    assert t.cm2_k_split(64, 14336) == (2, 7168)      # 8B's down at 128x256 tiles
    assert t.cm2_k_split(80, 4096) == (3, 1536)       # two thirds full
    assert t.cm2_k_split(128, 4096) == (1, 4096)      # full
    assert t.cm2_k_split(16, 1024) == (1, 1024)       # short K
    assert t.cm2_k_split(16, 4160) == (1, 4160)       # not whole super-blocks
    assert t.cm2_k_split(2, 2048) == (8, 256)
    for slices, k in (t.cm2_k_split(n, 5120) for n in range(1, 90)):
        assert k % 256 == 0 and (slices - 1) * k < 5120 <= slices * k and slices <= 8
    monkeypatch.setenv("HOTSEAT_CM2_SPLIT", "off")
    t = Tuning.for_info(gpu("NVIDIA H100", NVIDIA), subgroup=32, coopmat=True,
                        compute_units=132)
    assert t.cm2_k_split(32, 4096) == (1, 4096)
    monkeypatch.setenv("HOTSEAT_CM2_SPLIT", "on")
    assert Tuning.for_info(gpu("NVIDIA H100", NVIDIA), subgroup=32,
                           coopmat=True).cm2_k_split(8, 4096) == (1, 4096)   # units unknown


def test_wide_tiles_go_where_their_workgroups_fill_the_compute_units(monkeypatch):
    """Tuning.cm2_tile_for: with HOTSEAT_CM2_WIDE on (the default), a product whose 128 x 256 tiles fill
    two thirds of the compute units in the model's widest pass takes them, with K split
    where HOTSEAT_CM2_SPLIT is on (so then nearly every product); fewer tiles (or the setting
    off, or the units unknown) keep cm2_tile."""
    from engine.gpu.paths import CM2_WIDE_TILE

    def tuning(wide, split="off", units=132):
        monkeypatch.setenv("HOTSEAT_CM2_WIDE", wide)
        monkeypatch.setenv("HOTSEAT_CM2_SPLIT", split)
        return Tuning.for_info(gpu("NVIDIA H100", NVIDIA), subgroup=32, coopmat=True,
                               compute_units=units)

    t = tuning("on")
    assert t.cm2_tile_for(14336, 512, 4096) == CM2_WIDE_TILE == (128, 256, 256)   # 224
    assert t.cm2_tile_for(4096, 512, 4096) == t.cm2_tile == (128, 128, 256)       # 64
    assert t.cm2_tile_for(4096, 2048, 4096) == CM2_WIDE_TILE                      # 32 x 8
    assert tuning("on", units=0).cm2_tile_for(14336, 512, 4096) == t.cm2_tile
    assert tuning("off").cm2_tile_for(14336, 512, 4096) == t.cm2_tile
    t = tuning("on", "on")
    assert t.cm2_tile_for(4096, 512, 4096) == CM2_WIDE_TILE       # 64 tiles, 2 slices
    assert t.cm2_tile_for(1024, 512, 4096) == CM2_WIDE_TILE       # 16 tiles, 8 slices
    assert t.cm2_tile_for(1024, 512, 1024) == t.cm2_tile          # K too short to split


def test_a_staged_tile_past_shared_memory_is_refused(monkeypatch):
    """mul_mat_cm2s keeps its W and x tiles in shared memory: with HOTSEAT_CM2_STAGED=on, a
    HOTSEAT_CM2_TILE whose tiles do not fit the device's is an error naming the setting."""
    from engine.gpu.paths import cm2s_shared_bytes

    monkeypatch.setenv("HOTSEAT_CM2_STAGED", "on")
    monkeypatch.setenv("HOTSEAT_CM2_TILE", "128x128x256")
    t = Tuning.for_info(gpu("NVIDIA H200", NVIDIA), subgroup=32, max_shared=49152,
                        coopmat=True)
    assert t.cm2_staged and cm2s_shared_bytes(128, 128) <= 49152
    monkeypatch.setenv("HOTSEAT_CM2_TILE", "256x256x256")
    with pytest.raises(ValueError, match="HOTSEAT_CM2_TILE"):
        Tuning.for_info(gpu("NVIDIA H200", NVIDIA), subgroup=32, max_shared=49152,
                        coopmat=True)


def test_decode_attention_settings(monkeypatch):
    """HOTSEAT_DECODE_WG and HOTSEAT_DECODE_HEADS set attn_decode's width and heads on a
    GPU; a setting that is not a count is an error that names it."""
    monkeypatch.setenv("HOTSEAT_DECODE_WG", "128")
    monkeypatch.setenv("HOTSEAT_DECODE_HEADS", "2")
    t = Tuning.for_info(gpu("NVIDIA H200", NVIDIA), subgroup=32)
    assert (t.decode_wg, t.decode_heads) == (128, 2)
    for name, bad in (("HOTSEAT_DECODE_WG", "wide"), ("HOTSEAT_DECODE_HEADS", "0")):
        monkeypatch.setenv(name, bad)
        with pytest.raises(ValueError, match=name):
            Tuning.for_info(gpu("NVIDIA H200", NVIDIA), subgroup=32)
        monkeypatch.delenv(name)


def test_matvecq_follows_the_device_and_the_setting(dev, monkeypatch):
    """The device's int8 dot products turn mul_mat_vecq's path on; HOTSEAT_MATVECQ=off off."""
    from engine.gpu.paths import Tuning

    monkeypatch.delenv("HOTSEAT_MATVECQ", raising=False)
    assert Tuning.for_device(dev).dot4 == dev.dot4
    monkeypatch.setenv("HOTSEAT_MATVECQ", "off")
    assert not Tuning.for_device(dev).dot4
