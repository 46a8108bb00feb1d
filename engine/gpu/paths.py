"""Paths by capability, chosen once per device: `Tuning` holds the tile sizes and kernel
choices for a device, and `Paths` the table of kernels a model's graphs take (decode and
prefill products, attention in each phase, expert products), which `Builder` reads and
`hotseat bench` prints whole."""
from __future__ import annotations

import os
import re
from dataclasses import asdict, dataclass

from . import limits, vk
from .kernels import compiled
from shaders.registry import MATVECQ_TYPES


FLASH_ATTN_MODES = ("auto", "on", "off")
MAX_SPLITS = 32          # decode attention: KV splits per head, at most
AMD_VENDOR = 0x1002
# GCN chips (GCN 1 to 5) as RADV names them ("AMD RADV POLARIS10"), and the marketing names
# other drivers report for the same generations (RX 480/580, R9 390, RX Vega, Radeon VII...)
GCN_CHIPS = ("TAHITI", "PITCAIRN", "VERDE", "OLAND", "HAINAN", "BONAIRE", "KAVERI", "KABINI",
             "HAWAII", "MULLINS", "TONGA", "ICELAND", "TOPAZ", "CARRIZO", "FIJI", "STONEY",
             "POLARIS", "VEGAM", "VEGA", "RAVEN", "RENOIR")
GCN_NAMES = re.compile(r"\bRX [456]\d0X?\b|\bR[579] [23M]\d\d|\bR9 (FURY|NANO)|\bRX VEGA"
                       r"|RADEON VII|\bHD [78]\d{3}\b|\bPRO WX [2-9]\d{3}\b|FIREPRO")


def flash_attn_mode(mode: str) -> str:
    """mode, checked: one of FLASH_ATTN_MODES."""
    if mode not in FLASH_ATTN_MODES:
        raise ValueError(f"flash attention must be one of {', '.join(FLASH_ATTN_MODES)}, "
                         f"got {mode!r}")
    return mode


def is_amd_gcn(info: vk.DeviceInfo) -> bool:
    """An AMD GPU of the GCN generations (not RDNA), by the name its driver reports."""
    if info.vendor_id != AMD_VENDOR:
        return False
    name = info.name.upper()
    return any(re.search(rf"\b{chip}\d*\b", name) for chip in GCN_CHIPS) or \
        bool(GCN_NAMES.search(name))


@dataclass
class Tuning:
    """Tile sizes and kernel choices picked per device (lavapipe wants different ones than a
    discrete GPU)."""
    subgroup: int = 32      # the device's subgroup size
    warps: int = 4          # subgroups per matrix-product workgroup
    mv_rows: int = 2        # weight rows per subgroup: one-token mul_mat, mul_mat_id
    mm_rows: int = 4        # weight rows per subgroup, prefill
    mm_tokens: int = 8      # tokens per subgroup, prefill
    matvec: bool = True     # decode products through mul_mat_vec (else mul_mat with one token)
    mv_lanes: int = 256     # most lanes sharing one row in mul_mat_vec
    norm_wg: int = 256      # lanes per row of rms_norm
    fuse_decode: bool = True  # one token: the norm before a product, and the GLU before
                              # the down product, go into the product's reading of x
    argmax_wg: int = 1024   # lanes of the one argmax (and logprobs) workgroup, at least
    coopmat: bool = False   # prefill products on the matrix units (mul_mat_cm)
    cm_tile: tuple[int, int] = (128, 64)   # its weight rows x tokens per workgroup
    coopmat2: bool = False  # ... through NVIDIA's workgroup-scope matrices where the type
                            # has a decoder (mul_mat_cm2, VK_NV_cooperative_matrix2): where
                            # the device has them, unless $HOTSEAT_COOPMAT2=off
    cm2_tile: tuple[int, int, int] = (128, 128, 256)   # its rows x tokens x lanes
    cm2_x16: bool = True    # ... x turned to f16 by a pass before (to_f16, or the norm or
                            # GLU before the product), not in its loads; the grouped
                            # expert products on matrix units too (mul_mat_moe_cm's X16)
    cm2_ahead: bool = True  # ... the K-quants' scales fetched a super-block ahead
    cm2_f16dec: bool = False   # ... the K-quants decoded in f16 (scale products rounded to
                               # f16 first), not f32: $HOTSEAT_CM2_F16DEC=on, to time it
    cm2_acc16: bool = True   # ... its tiles' sums in f16, as llama.cpp's on NVIDIA (half the
                             # registers: room for wider tiles), not f32; on an H100 the
                             # 8B's pp512 11030 t/s against 9375, Q4_K's 4096 x 14336 x 512
                             # 196 TFLOP/s against 152; $HOTSEAT_CM2_ACC16=off for f32
    cm2_group: bool = True  # ... Q8_0 and Q4_0 read eight blocks as one group of 256 weights,
                            # their scales through shared memory as the K-quants' (rows of
                            # 256k weights): on an H100 Q4_0's 2048 x 8192 x 512 226 TFLOP/s
                            # against 80, the 1B's pp512 58938 t/s against 29805;
                            # $HOTSEAT_CM2_GROUP=off for a block at a time
    cm2_wide: bool = True   # ... tiles twice as wide (CM2_WIDE_TILE) for products whose rows
                            # fill the compute units with them (Tuning.cm2_tile_for)
    cm2_split: bool = True  # ... K split over workgroups where the tiles are too few to
                            # fill the GPU (Tuning.cm2_k_split)
    cm2_sums_after: bool = False  # ... the products of one input (q, k and v; gate and
                                  # up) recorded side by side, each into partial sums of
                                  # its own, their split_sums after all of them (not a
                                  # barrier between each product and its sum; the same
                                  # bits): $HOTSEAT_CM2_SUMS_AFTER=on, to time it (not
                                  # timed on a GPU yet)
    cm2_attn: bool = True   # prefill attention on them too (flash_attn_cm2)
    cm_attn_256: bool = True   # prefill attention with heads of 256 on KHR's matrix units
                               # (flash_attn_cm, where its blocks fit shared memory), not the
                               # shader cores': on an H100 Qwen3.5-35B-A3B's ten took 1.2 ms
                               # of a 512-token pass against 22; $HOTSEAT_CM_ATTN_256=off
    fa_cm2_tile: tuple[int, int, int] = (128, 64, 256)  # its query rows x keys a block x
                                                         # lanes
    cm2_staged: bool = False  # ... W dequantized by the lanes into shared memory, every type
                              # (mul_mat_cm2s), not through the tensor loads' decoders
    predecode: bool = False  # prefill products on the matrix units read their quantized
                             # weights as f16 rows that dequant_f16 writes once a pass, in
                             # slices of predecode_mib (two, one made while the other is
                             # read), not decoded in the tile loads (once per tile of
                             # tokens); $HOTSEAT_PREDECODE=on, to time it. Off: on an H100
                             # mul_mat_cm2's f16 product of 4096 x 14336 x 512 ran at 35
                             # TFLOP/s against 140 for Q4_K's (an 8B's pp512 340 t/s)
    predecode_mib: int = 32  # ... MiB a slice of f16 rows
    prefill_tokens: int = 0  # tokens per prefill pass (0: the model's default chunk)
    ggml_numerics: bool = True   # round like llama.cpp's CPU backend (token-exact greedy);
                                 # off by default on devices with matrix units
    flash_attn: str = "auto"     # prefill attention: "on" tiled (flash_attn.comp), "off" per
                                 # token (attention.comp), "auto" tiled on AMD GCN at head
                                 # size >= 256, where the per-token kernel is slowest
    amd_gcn: bool = False
    max_shared: int = 32768      # shared memory per workgroup, bytes
    flash_skip: bool = True      # flash attention skips masked tiles (off: for tests)
    split_max: int = 16          # decode attention: KV splits per head at long context
    split_chunk: int = 32        # ... and the fewest positions a split takes
    decode_wg: int = 64          # attn_decode's lanes: more position groups walk a split's
                                 # KV side by side, fewer one after another (a GPU: 256)
    decode_ahead: bool = False   # attn_decode: a position's K and V loaded a step ahead (a
                                 # GPU: on; on the H100, 64-dim heads at 4160 positions took
                                 # 21.1 us against 23.4, 128-dim 26.3 against 31.4)
    decode_heads: int = 1        # attn_decode: most query heads of one KV head a workgroup
                                 # takes (each K and V row read once for all of them; fewer
                                 # workgroups: on the H200 4 took an 8B layer 53 us, 1 21)
    moe_grouped: bool = True     # prefill expert products grouped by expert (mul_mat_moe),
                                 # else one per token and slot (mul_mat_id, as decode)
    route_experts: bool = True   # one token's routing inside its experts' first product
                                 # (mul_mat_vecq's ROUTE), not a moe_router pass before it;
                                 # $HOTSEAT_ROUTE_EXPERTS=off for the pass
    head_norm: bool = False      # one token's per-head q/k norms and rope at the end of each
                                 # head's product (mul_mat_vecq's HNORM), not in rope_qkv's
                                 # pass: on an H100 Qwen3-8B decoded 2.5% slower with it and
                                 # Qwen3-30B-A3B 8%; $HOTSEAT_HEAD_NORM=on takes it
    moe_cm2: bool = False        # ... through NVIDIA's workgroup-scope matrices where the
                                 # paths take them (mul_mat_moe_cm2), not mul_mat_moe_cm's
                                 # subgroup ones: on an H100 Qwen3-30B-A3B's gate product
                                 # (Q4_K 2048 x 768, 256 tokens) took 350 us against 164;
                                 # $HOTSEAT_MOE_CM2=on
    moe_cm: bool = True          # ... and on the matrix units where prefill takes them
                                 # (mul_mat_moe_cm): on an H100 Qwen3-30B-A3B's pp512 5611
                                 # t/s against 1930 on mul_mat_moe; $HOTSEAT_MOE_CM=off for
                                 # the shader cores
    delta_chunk: int = 0         # gated delta rule: tokens per chunk of its prefill path
                                 # (delta_chunk_prep + delta_chunk, at most 64); 0: token
                                 # by token (delta_net), as decode. Token by token is
                                 # the faster on both devices measured: on the H200, a
                                 # 35B-A3B shape's pp512 2154 t/s against 1996 by chunks of
                                 # 64, pp2048 1835 against 1721 ($HOTSEAT_DELTA_CHUNK picks)
    loop_ticks: int = 0          # the driver's bound on a subgroup's loop iterations, all
                                 # loops of a dispatch together (limits.py); 0: none
    max_ctx: int = limits.MAX_CTX    # the longest context this device's kernels take
    dot4: bool = False           # the device has 4-wide int8 dot products: decode products
                                 # of the types mul_mat_vecq reads take int8 activations
                                 # there (where ggml's rounding is not asked for)
    compute_units: int = 0       # the GPU's SMs or CUs where the driver tells them; 0: not
    long_groups: int = 0         # mul_mat_vecq over rows longer than 8192: workgroups that
                                 # loop over row tiles (0: one a tile)
    tall_groups: int = 4         # ... of more than 8192 rows: looping workgroups a compute
                                 # unit

    @classmethod
    def for_device(cls, dev: vk.Device, flash_attn: str = "auto") -> "Tuning":
        # $HOTSEAT_COOPMAT=off keeps prefill off the matrix units (to measure their numerics)
        coopmat = (dev.coopmat and dev.subgroup_size == 32 and compiled("mul_mat_cm")
                   and compiled("flash_attn_cm") and os.environ.get("HOTSEAT_COOPMAT") != "off")
        t = cls.for_info(dev.info, dev.subgroup_size, dev.max_shared, flash_attn, coopmat,
                         dot4=dev.dot4 and compiled("mul_mat_vecq")
                         and os.environ.get("HOTSEAT_MATVECQ") != "off",
                         compute_units=dev.compute_units)
        t.moe_cm = t.moe_cm and compiled("mul_mat_moe_cm")
        # the device has them unless $HOTSEAT_COOPMAT2=off (vk.coopmat2_asked)
        t.coopmat2 = (t.coopmat and dev.coopmat2 and compiled("mul_mat_cm2")
                      and compiled("mul_mat_moe_cm2"))
        t.cm2_attn = t.cm2_attn and t.coopmat2 and compiled("flash_attn_cm2")
        t.cm2_staged = t.cm2_staged and t.coopmat2 and compiled("mul_mat_cm2s")
        return t

    @classmethod
    def for_info(cls, info: vk.DeviceInfo, subgroup: int, max_shared: int = 32768,
                 flash_attn: str = "auto", coopmat: bool = False,
                 dot4: bool = False, compute_units: int = 0) -> "Tuning":
        driver = limits.for_device(info)
        common = dict(subgroup=subgroup, flash_attn=flash_attn_mode(flash_attn),
                      loop_ticks=driver.loop_ticks, max_ctx=driver.max_ctx,
                      amd_gcn=is_amd_gcn(info), coopmat=coopmat, dot4=dot4,
                      compute_units=compute_units,
                      # (the setting: to measure wider passes, more tokens a tile)
                      prefill_tokens=count_setting("HOTSEAT_PREFILL_TOKENS",
                                                   512 if coopmat else 0),
                      max_shared=max_shared,
                      # where the matrix units can take prefill, their f16 inputs cannot
                      # follow ggml's CPU rounding anyway: decode does not either
                      ggml_numerics=not coopmat)
        if info.kind == "cpu":   # lavapipe: few, fat workgroups amortise its dispatch cost
            # (the chunked delta rule's many barriers cost lavapipe more than they save: 8
            # heads of 128, 256 tokens took 2.2 s chunked against 0.35 s token by token)
            return cls(warps=4, mv_rows=4, mm_rows=8, mm_tokens=8, split_max=2,
                       split_chunk=64, matvec=False, norm_wg=subgroup, argmax_wg=subgroup,
                       **common)
        # attn_decode on `hotseat kernel-bench attn_decode` (H100, K and V read cold): 256
        # lanes, the next position's K and V in flight, about two workgroups a compute unit
        # (decode_splits); 8B heads at 4160 positions 26.3 us against 48.7 for 64 lanes, 16
        # splits and nothing ahead
        t = cls(warps=4, mv_rows=2, mm_rows=4, mm_tokens=8, decode_wg=max(256, subgroup),
                decode_ahead=True, **common)
        # to measure attn_decode's width and its query heads per workgroup
        t.decode_wg = count_setting("HOTSEAT_DECODE_WG", t.decode_wg)
        t.decode_heads = count_setting("HOTSEAT_DECODE_HEADS", t.decode_heads)
        t.split_chunk = count_setting("HOTSEAT_SPLIT_CHUNK", t.split_chunk)
        # to measure looping workgroups for products of long rows (x staged fewer times)
        t.long_groups = count_setting("HOTSEAT_LONG_GROUPS", t.long_groups)
        t.tall_groups = count_setting("HOTSEAT_TALL_GROUPS", t.tall_groups)
        t.moe_cm = switch_setting("HOTSEAT_MOE_CM", t.moe_cm)
        t.moe_cm2 = switch_setting("HOTSEAT_MOE_CM2", t.moe_cm2)
        t.cm_tile = cm_tile_setting(t.cm_tile, max_shared)   # to measure the matrix units'
        t.cm2_tile = tile_setting("HOTSEAT_CM2_TILE", t.cm2_tile, CM2_TILES)      # tiles
        t.cm2_x16 = switch_setting("HOTSEAT_CM2_X16", t.cm2_x16)
        t.cm2_ahead = switch_setting("HOTSEAT_CM2_AHEAD", t.cm2_ahead)
        t.cm2_f16dec = switch_setting("HOTSEAT_CM2_F16DEC", t.cm2_f16dec)
        t.cm2_acc16 = switch_setting("HOTSEAT_CM2_ACC16", t.cm2_acc16)
        t.cm2_group = switch_setting("HOTSEAT_CM2_GROUP", t.cm2_group)
        t.cm2_split = switch_setting("HOTSEAT_CM2_SPLIT", t.cm2_split)
        t.cm2_wide = switch_setting("HOTSEAT_CM2_WIDE", t.cm2_wide)
        t.cm2_sums_after = switch_setting("HOTSEAT_CM2_SUMS_AFTER", t.cm2_sums_after)
        t.cm2_attn = switch_setting("HOTSEAT_CM2_ATTN", t.cm2_attn)
        t.cm_attn_256 = switch_setting("HOTSEAT_CM_ATTN_256", t.cm_attn_256)
        t.fa_cm2_tile = tile_setting("HOTSEAT_FA_CM2_TILE", t.fa_cm2_tile, FA_CM2_TILES)
        t.cm2_staged = switch_setting("HOTSEAT_CM2_STAGED", t.cm2_staged)
        t.predecode = switch_setting("HOTSEAT_PREDECODE", t.predecode)
        t.predecode_mib = count_setting("HOTSEAT_PREDECODE_MIB", t.predecode_mib)
        if t.cm2_staged and coopmat and cm2s_shared_bytes(*t.cm2_tile[:2]) > max_shared:
            raise ValueError(f"HOTSEAT_CM2_TILE={'x'.join(map(str, t.cm2_tile))}: mul_mat_cm2s "
                             f"would take {cm2s_shared_bytes(*t.cm2_tile[:2])} bytes of shared "
                             f"memory, past the device's {max_shared}")
        t.route_experts = switch_setting("HOTSEAT_ROUTE_EXPERTS", t.route_experts)
        t.head_norm = switch_setting("HOTSEAT_HEAD_NORM", t.head_norm)
        if os.environ.get("HOTSEAT_DELTA_CHUNK"):    # to measure the two delta-rule paths
            t.delta_chunk = int(os.environ["HOTSEAT_DELTA_CHUNK"])
        return t

    def cm2_tile_for(self, n_out: int, n_tokens: int, n_in: int) -> tuple[int, int, int]:
        """mul_mat_cm2's tile for a product of n_out rows over n_in in passes of n_tokens:
        the wide tile (Tuning.cm2_wide) where its workgroups, with K split where that is on
        (cm2_k_split), fill at least two thirds of the compute units (each decoded weight
        then serves twice the tokens), else cm2_tile."""
        bm, bn, wg = CM2_WIDE_TILE
        tiles = -(-n_out // bm) * -(-n_tokens // bn)
        if self.cm2_wide and self.compute_units and \
                3 * tiles * self.cm2_k_split(tiles, n_in)[0] >= 2 * self.compute_units:
            return CM2_WIDE_TILE
        return self.cm2_tile

    def cm2_k_split(self, tiles: int, n_in: int) -> tuple[int, int]:
        """(slices, K a slice) for a mul_mat_cm2 product of `tiles` workgroups over n_in:
        one slice (all of K) where the tiles fill the GPU's compute units, or K is short;
        else K cut in up to 8 slices of whole super-blocks (256), so that tiles x slices
        about fill them (a third more work for a GPU two-thirds full). split_sum adds the
        slices after."""
        cu = self.compute_units
        if not self.cm2_split or not cu or n_in < CM2_SPLIT_MIN_K or n_in % CM2_SPLIT_UNIT:
            return 1, n_in
        if tiles <= cu // 2:
            slices = cu // tiles
        elif tiles <= cu * 2 // 3:
            slices = 3
        else:
            return 1, n_in
        units = n_in // CM2_SPLIT_UNIT
        per = -(-units // min(slices, CM2_SPLIT_MAX, units))
        return -(-units // per), per * CM2_SPLIT_UNIT

    @property
    def fast_prefill(self) -> bool:
        """Prefill on the matrix units (mul_mat_cm, flash_attn_cm): x goes in as f16, so not
        where ggml's CPU rounding is asked for."""
        return self.coopmat and not self.ggml_numerics

    def matvec_shape(self, wtype: str, n_out: int, chunks: int) -> tuple[int, int, int]:
        """(rows, lanes, lane map) of a mul_mat_vec workgroup for rows of `chunks` chunks,
        from `hotseat kernel-bench mul_mat_vec` on an H200 (the decode shapes of 1B and 8B
        Llamas): few rows where there are few (a workgroup a row under 1024), many where a
        4-bit matrix is tall; Q4_K rows of up to 16 super-blocks take sixteen lanes a
        super-block (map 1, best against best: 7.3 us against 8.4 for 1024 rows of 4096,
        12.7 against 14.2 for 4096, 28.5 against 29.5 for 14336; rows of 14336 keep map 0,
        26.8 against 28.2). Q6_K's map 1 (as Q4_K's) is timed by kernel-bench but has not
        run on a GPU yet: Q6_K keeps map 0. The types not measured take the 4-bit choice.
        $HOTSEAT_MATVEC ("Q4_K=8x64m1,Q6_K=2x128") sets them per weight type, to measure a
        choice in a whole model."""
        chosen = matvec_override().get(wtype)
        if chosen is not None:
            return chosen
        wide = wtype in ("F32", "F16", "BF16", "Q8_0", "Q6_K")
        if wtype == "Q4_K" and chunks <= 64:
            return (1 if n_out <= 1024 else 2 if n_out <= 4096 else 4), 128, 1
        lanes = self.subgroup
        while lanes < min(chunks, self.mv_lanes if not wide else self.mv_lanes // 2):
            lanes *= 2
        if n_out <= 1024:
            rows = 1
        elif wide:
            rows = 2
        else:       # long rows want many per workgroup even where there are few
            rows = 2 if n_out <= 2048 and chunks <= 64 else 8
        return rows, lanes, 0

    @property
    def matvecq(self) -> bool:
        """Decode products with int8 activations (mul_mat_vecq) where the type allows."""
        return self.dot4 and self.matvec and not self.ggml_numerics

    def matvecq_fits(self, wtype: str, n_in: int) -> bool:
        """Whether mul_mat_vecq reads this type, and x of n_in fits its shared memory (the
        int8 values, a scale per 32 and a sum per 16)."""
        block = 32 if wtype in ("Q4_0", "Q8_0", "MXFP4") else 256
        return (wtype in MATVECQ_TYPES and n_in % block == 0
                and n_in + n_in // 8 + n_in // 4 + 128 <= self.max_shared)

    def matvecq_shape(self, wtype: str, n_out: int, n_in: int) -> tuple[int, int, int, int]:
        """(lanes, rows a subgroup takes at once, super-blocks read ahead, workgroups; 0 for
        one per row tile) of a mul_mat_vecq dispatch, from `hotseat kernel-bench mul_mat_vec`
        on an H200 (weights read cold, the 1B and 8B Llamas' shapes): 256 lanes; Q4_K a row
        at a time (9.2 us for 1024 rows of 4096, 11.8 for 4096, 25.6 for 4096 of 14336),
        MXFP4 a row at a time too, a block ahead (gpt-oss-20b's decode on the H100: 257.8 t/s,
        against 234.7 two blocks ahead and 227.2 at two rows), the others two where rows are
        many; Q6_K's long rows four super-blocks
        ahead (29.2 us for 4096 of 14336 against 30.4 at two); tall matrices 512 looping
        workgroups (21.0 us for 14336 rows of 4096 against 25.9, 52.6 for 32768 of Q6_K
        against 54.2), so x is
        staged fewer times: four a compute unit where the driver gives their count (the
        H200's 132 SMs take 528), else one a row tile. $HOTSEAT_MATVECQ ("Q4_K=128x2x2x0")
        sets them per weight type, to measure a choice in a whole model."""
        chosen = matvecq_override().get(wtype)
        if chosen is not None:
            return chosen
        rows = 1 if wtype in ("Q4_K", "MXFP4") or n_out <= 2048 else 2
        ahead = 4 if wtype == "Q6_K" and n_in >= 8192 else 1 if wtype == "MXFP4" else 2
        looping = self.tall_groups * self.compute_units if n_out > 8192 else \
            self.long_groups if n_in > 8192 else 0
        return max(256, self.subgroup), rows, ahead, looping

    def use_flash_attn(self, head_dim: int, n_tokens: int) -> bool:
        """Tiled attention for this pass? Never for decode (one token), which splits instead."""
        if n_tokens <= 1 or self.flash_attn == "off":
            return False
        return self.flash_attn == "on" or (self.amd_gcn and head_dim >= 256)

    def attn_lanes(self, head_dim: int) -> int:
        """Lanes that share one dot product of q and k (flash and decode attention): more at
        large heads, for fewer registers per lane; they must divide head_dim / 4."""
        lanes = min(8 if head_dim >= 128 else 4, self.subgroup)
        while (head_dim // 4) % lanes:
            lanes //= 2
        return lanes

    def flash_block(self, head_dim: int) -> tuple[int, int]:
        """(query rows, KV positions) of a flash-attention tile: the widest KV block whose K
        and V (f16) and mask tile fit in shared memory."""
        rows = 16
        for cols in (32, 16, 8):
            if 2 * 2 * cols * head_dim + 2 * rows * cols <= self.max_shared:
                return rows, cols
        raise ValueError(f"head dim {head_dim} does not fit flash attention's shared memory")

    def decode_lanes(self, head_dim: int) -> int:
        """attn_decode's workgroup: decode_wg lanes, fewer where its shared partial sums (a
        head's vec4s per position group) would pass half the shared memory."""
        wg = max(self.decode_wg, self.subgroup)
        while wg > self.subgroup and \
                (wg // self.attn_lanes(head_dim)) * head_dim * 4 > self.max_shared // 2:
            wg //= 2
        return wg

    def decode_group(self, head_dim: int, n_head: int, n_head_kv: int) -> int:
        """Query heads per attn_decode workgroup: the most that divide the heads sharing a KV
        head, up to decode_heads, and within 16 vec4s of q (and of sums) a lane."""
        per_lane = head_dim // 4 // self.attn_lanes(head_dim)
        most = max(1, min(self.decode_heads, 16 // max(per_lane, 1)))
        group = n_head // n_head_kv
        return max(q for q in range(1, most + 1) if group % q == 0)

    def decode_splits(self, n_ctx: int, rows: int = 0) -> int:
        """KV splits per head for decode: about one per 128 positions of context, so long
        contexts fill the GPU; a pass uses only as many as min chunks of split_chunk allow.
        Where the compute units are known, no more than make about two workgroups a unit
        for `rows` workgroups a split (query heads over heads a workgroup): more only add
        partial results to combine (32 heads on the H100's 132 SMs: 8 splits, 26.3 us at 4160
        positions against 33.1 for 16). Under a loop bound, enough that one split's walk (a
        lane per position in the worst case, a head of 256) stays within half of it."""
        splits = max(1, min(self.split_max, n_ctx // 128))
        if self.compute_units and rows:
            splits = max(1, min(splits, 2 * self.compute_units // rows))
        if self.loop_ticks:
            splits = max(splits, -(-n_ctx // (self.loop_ticks // 2)))
        return min(splits, MAX_SPLITS)

    def reduce_wg(self, n: int) -> int:
        """Lanes of a one-workgroup reduction over n values (argmax, logprobs): argmax_wg,
        widened under a loop bound until a lane's walk takes at most half of it."""
        wg = self.argmax_wg
        while self.loop_ticks and wg < 1024 and -(-n // wg) > self.loop_ticks // 2:
            wg *= 2
        return wg

    def paths(self, head_dim: int) -> "Paths":
        """The kernels a model with heads of head_dim takes on this device."""
        if self.fast_prefill and head_dim in (64, 128):
            prefill_attn = "flash_attn_cm2" if self.coopmat2 and self.cm2_attn else "flash_attn_cm"
        elif self.fast_prefill and head_dim == 256 and self.cm_attn_256 \
                and fa_cm_shared_bytes(head_dim) <= self.max_shared:
            prefill_attn = "flash_attn_cm"
        else:
            prefill_attn = "flash_attn" if self.use_flash_attn(head_dim, 2) else "attention"
        return Paths(
            head_dim=head_dim,
            decode_matmul="mul_mat_vecq" if self.matvecq else "mul_mat_vec" if self.matvec
            else "mul_mat",
            prefill_matmul="mul_mat_cm2" if self.fast_prefill and self.coopmat2
            else "mul_mat_cm" if self.fast_prefill else "mul_mat",
            # with ggml's rounding a token's attention has the same bits whichever pass
            # computes it: decode takes the prefill's kernel, so a cached prefix followed by
            # one token gives the answer of the whole prompt
            decode_attention=prefill_attn if self.ggml_numerics
            else "attn_decode" if self.matvec else "attn_split",
            prefill_attention=prefill_attn,
            moe_prefill=("mul_mat_moe_cm2" if self.coopmat2 and self.moe_cm2
                         else "mul_mat_moe_cm")
            if self.moe_grouped and self.moe_cm and self.fast_prefill
            else "mul_mat_moe" if self.moe_grouped else "mul_mat_id",
            numerics="ggml" if self.ggml_numerics else "device",
            prefill_delta="delta_chunk" if self.delta_chunk else "delta_net",
            prefill_weights="dequant_f16" if self.predecode and self.fast_prefill
            and not (self.coopmat2 and self.cm2_staged) else "in_tiles")


@dataclass(frozen=True)
class Paths:
    """The kernel each op takes, per phase (decode: one token; prefill: a chunk)."""
    head_dim: int
    decode_matmul: str       # mul_mat_vecq (int8 activations, where the type has a
                             # reader; else mul_mat_vec) | mul_mat_vec | mul_mat (one token)
    prefill_matmul: str      # mul_mat_cm2 (workgroup-scope matrix units; the types it
                             # has no decoder for take mul_mat_cm) | mul_mat_cm (matrix
                             # units) | mul_mat (register tiles); a product whose row
                             # length is no multiple of 64 takes mul_mat
    decode_attention: str    # attn_decode (one pass per split) | attn_split (two) | with
                             # ggml numerics, prefill_attention's kernel
    prefill_attention: str   # flash_attn_cm2 (workgroup-scope) | flash_attn_cm | flash_attn
                             # (tiled) | attention (per token)
    moe_prefill: str         # mul_mat_moe_cm2 (grouped, workgroup-scope matrix units;
                             # the types it has no decoder for take mul_mat_moe_cm) |
                             # mul_mat_moe_cm (grouped, matrix units) | mul_mat_moe
                             # (grouped by expert) | mul_mat_id (per token); a product
                             # whose row length is no multiple of 64 takes mul_mat_moe
    numerics: str            # ggml (llama.cpp's CPU rounding) | device
    prefill_delta: str = "delta_net"     # delta_chunk (chunks of Tuning.delta_chunk
                                         # tokens) | delta_net (token by token, as decode)
    prefill_weights: str = "in_tiles"    # dequant_f16 (prefill_matmul reads the quantized
                                         # types as f16 rows made once a pass: Tuning.
                                         # predecode) | in_tiles (decoded where the tiles
                                         # are loaded)

    @property
    def steps_match_prompts(self) -> bool:
        """Whether a decode step gives a token the bits a prompt's pass gives it: ggml's
        rounding on the prompt's own kernels (lavapipe). Elsewhere decode's products and
        attention round otherwise (int8 or f32 x against the matrix units' f16 tiles)."""
        return self.numerics == "ggml" and self.decode_matmul == "mul_mat"

    def as_dict(self) -> dict:
        return asdict(self)


def switch_setting(name: str, default: bool) -> bool:
    """$name as on or off, or default where it is unset."""
    value = os.environ.get(name, "").strip()
    if value not in ("", "on", "off"):
        raise ValueError(f"{name}: {value!r} is not on or off")
    return default if not value else value == "on"


CM_TILES = {"BM": (64, 128), "BN": (32, 64, 128)}                     # mul_mat_cm's
CM2_SPLIT_MIN_K, CM2_SPLIT_UNIT, CM2_SPLIT_MAX = 2048, 256, 8   # mul_mat_cm2's split K
CM2_WIDE_TILE = (128, 256, 256)     # mul_mat_cm2's tile for products of many rows
# mul_mat_cm2's (512 lanes: a 128 x 256 tile's f32 sums at 64 registers a lane)
CM2_TILES = {"BM": (64, 128, 256), "BN": (64, 128, 256), "WG": (128, 256, 512)}
FA_CM2_TILES = {"BR": (32, 64, 128), "BC": (32, 64, 128), "WG": (128, 256)}  # flash_attn_cm2's


def tile_setting(name: str, default: tuple[int, ...], sizes: dict[str, tuple[int, ...]]):
    """$name as sizes joined by x, one of each entry of `sizes` in its order (BMxBN...),
    or default where it is unset."""
    value = os.environ.get(name, "").strip()
    if not value:
        return default
    parts = value.split("x")
    if len(parts) != len(sizes) or not all(v.isdigit() for v in parts) \
            or any(int(v) not in allowed for v, allowed in zip(parts, sizes.values())):
        raise ValueError(f"{name}: {value!r} is not {'x'.join(sizes)} with "
                         + ", ".join(f"{k} in {v}" for k, v in sizes.items()))
    return tuple(int(v) for v in parts)


def cm2s_shared_bytes(bm: int, bn: int) -> int:
    """mul_mat_cm2s's shared memory at a tile: its W and x tiles as f16 rows of 64 + 8
    padding."""
    return 2 * 72 * (bm + bn)


def fa_cm_shared_bytes(head_dim: int) -> int:
    """flash_attn_cm's shared memory for heads of head_dim: a block of 32 keys' K and V rows
    (padded by 8 halves), and per subgroup S or P.V in f32 and P in f16."""
    return 2 * 32 * (head_dim + 8) * 2 + 4 * 16 * 32 * 4 + 4 * 16 * (32 + 8) * 2


def cm_shared_bytes(bm: int, bn: int) -> int:
    """mul_mat_cm's shared memory at a tile: the same W and x tiles, and each subgroup's
    16x16 staging of f32 sums."""
    return cm2s_shared_bytes(bm, bn) + 4 * 4 * 256


def cm_tile_setting(default: tuple[int, int], max_shared: int) -> tuple[int, int]:
    """$HOTSEAT_CM_TILE as BMxBN (weight rows x tokens of a mul_mat_cm workgroup), or default
    where it is unset; a tile past the device's shared memory is refused."""
    tile = tile_setting("HOTSEAT_CM_TILE", default, CM_TILES)
    if cm_shared_bytes(*tile) > max_shared:
        raise ValueError(f"HOTSEAT_CM_TILE: {'x'.join(map(str, tile))} needs "
                         f"{cm_shared_bytes(*tile)} bytes of shared memory; the device gives "
                         f"{max_shared}")
    return tile


def count_setting(name: str, default: int) -> int:
    """$name as a whole number from 1, or default where it is unset."""
    value = os.environ.get(name, "").strip()
    if not value:
        return default
    if not value.isdigit() or int(value) < 1:
        raise ValueError(f"{name}: {value!r} is not a whole number from 1")
    return int(value)


def matvecq_override() -> dict[str, tuple[int, int, int, int]]:
    """$HOTSEAT_MATVECQ parsed: {type: (lanes, rows, read-ahead, workgroups)}; "off" turns
    mul_mat_vecq off (Tuning.for_device)."""
    out = {}
    value = os.environ.get("HOTSEAT_MATVECQ", "")
    for item in filter(None, "" if value == "off" else value.split(",")):
        try:
            wtype, shape = item.split("=")
            lanes, rows, ahead, groups = (int(v) for v in shape.split("x"))
        except ValueError:
            raise ValueError(f"HOTSEAT_MATVECQ: {item!r} is not TYPE=LANESxROWSxAHEADxGROUPS"
                             ) from None
        if lanes < 1 or rows < 1 or ahead < 1 or groups < 0:
            raise ValueError(f"HOTSEAT_MATVECQ: {item!r}: lanes, rows and read-ahead from 1, "
                             "workgroups from 0")
        out[wtype.strip()] = (lanes, rows, ahead, groups)
    return out


def matvec_override() -> dict[str, tuple[int, int, int]]:
    """$HOTSEAT_MATVEC parsed: {type: (rows, lanes, map)}."""
    out = {}
    for item in filter(None, os.environ.get("HOTSEAT_MATVEC", "").split(",")):
        try:
            wtype, shape = item.split("=")
            rows, rest = shape.split("x")
            lanes, _, mode = rest.partition("m")
            shape = (int(rows), int(lanes), int(mode or 0))
        except ValueError:
            raise ValueError(f"HOTSEAT_MATVEC: {item!r} is not TYPE=ROWSxLANES[mMAP]") from None
        rows, lanes, mode = shape
        if rows < 1 or lanes < 1 or mode not in (0, 1) or (mode == 1 and lanes % 16):
            raise ValueError(f"HOTSEAT_MATVEC: {item!r}: rows and lanes from 1, map 0 or 1, "
                             "and map 1 takes lanes in multiples of 16")
        out[wtype.strip()] = shape
    return out
