"""The ops a model's forward pass is written in, and the state it runs on.

`Builder` turns calls like `b.matmul(w, x, y, n)` into recorded dispatches on a `Graph`:
it knows each kernel's group counts and push constants, so architectures read as a list
of tensor operations. `RunState` holds the preallocated activations, the KV cache and the
small host-visible buffers for per-step values.
"""
from __future__ import annotations

import functools
import re
from dataclasses import dataclass

import numpy as np

from . import vk
from .graph import Graph
from .kernels import (ACT_BLOCK, ACT_FORMAT, ACT_INLINE, CM_K, MATVEC_ACT, MATVEC_CHUNK,
                      compiled)


@dataclass(eq=False)
class Tensor:
    """A device tensor: its GGUF type, ggml shape (row length first) and where it lives.

    `parts` lists (first row, row count, arena index, byte offset, byte count): a tensor
    larger than the device's storage-buffer range is bound in row-aligned parts. The bytes
    live in the model's weight arenas (`arenas`), shared by all its tensors.
    """
    wtype: str
    shape: tuple[int, ...]
    parts: list[tuple[int, int, int, int, int]]
    arenas: list[vk.Buffer]

    def bindings(self) -> list[tuple[tuple[vk.Buffer, int, int], int, int]]:
        """((buffer, offset, range), first row, row count) per part."""
        return [((self.arenas[a], off, n), first, count)
                for first, count, a, off, n in self.parts]

    def binding(self) -> tuple[vk.Buffer, int, int]:
        if len(self.parts) != 1:
            raise ValueError("tensor is split into parts")
        return self.bindings()[0][0]

    @property
    def rows(self) -> int:
        n = 1
        for d in self.shape[1:]:
            n *= d
        return n


@dataclass(frozen=True)
class View:
    """An f32 tensor inside a buffer, as ggml sees one: sizes `ne` and strides `nb` (in
    floats) per dim, dim 0 first; contiguous when nb is None."""
    buf: vk.Buffer
    ne: tuple[int, int, int]
    nb: tuple[int, int, int] | None = None
    offset: int = 0             # floats

    @property
    def strides(self) -> tuple[int, int, int]:
        if self.nb is not None:
            return self.nb
        return (1, self.ne[0], self.ne[0] * self.ne[1])

    @property
    def T(self) -> "View":
        """ggml_transpose: dims 0 and 1 swapped, no data moved."""
        (n0, n1, n2), (s0, s1, s2) = self.ne, self.strides
        return View(self.buf, (n1, n0, n2), (s1, s0, s2), self.offset)

    @property
    def transposed(self) -> bool:
        """Stored with dim 1 contiguous and dim 0 strided (one row along dim 0 is just a
        contiguous vector: a decode step's transposed B * x)."""
        s0, s1, _ = self.strides
        return s1 == 1 and s0 != 1 and self.ne[0] > 1


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
    argmax_wg: int = 1024   # lanes of the one argmax workgroup
    coopmat: bool = False   # prefill products on the matrix units (mul_mat_cm)
    cm_tile: tuple[int, int] = (128, 64)   # its weight rows x tokens per workgroup
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
    moe_grouped: bool = True     # prefill expert products grouped by expert (mul_mat_moe),
                                 # else one per token and slot (mul_mat_id, as decode)

    @classmethod
    def for_device(cls, dev: vk.Device, flash_attn: str = "auto") -> "Tuning":
        coopmat = (dev.coopmat and dev.subgroup_size == 32 and compiled("mul_mat_cm")
                   and compiled("flash_attn_cm"))
        return cls.for_info(dev.info, dev.subgroup_size, dev.max_shared, flash_attn, coopmat)

    @classmethod
    def for_info(cls, info: vk.DeviceInfo, subgroup: int, max_shared: int = 32768,
                 flash_attn: str = "auto", coopmat: bool = False) -> "Tuning":
        common = dict(subgroup=subgroup, flash_attn=flash_attn_mode(flash_attn),
                      amd_gcn=is_amd_gcn(info), coopmat=coopmat,
                      prefill_tokens=512 if coopmat else 0, max_shared=max_shared,
                      # where the matrix units can take prefill, their f16 inputs cannot
                      # follow ggml's CPU rounding anyway: decode does not either
                      ggml_numerics=not coopmat)
        if info.kind == "cpu":   # lavapipe: few, fat workgroups amortise its dispatch cost
            return cls(warps=4, mv_rows=4, mm_rows=8, mm_tokens=8, split_max=2,
                       split_chunk=64, matvec=False, norm_wg=subgroup, argmax_wg=subgroup, **common)
        return cls(warps=4, mv_rows=2, mm_rows=4, mm_tokens=8, **common)

    @property
    def fast_prefill(self) -> bool:
        """Prefill on the matrix units (mul_mat_cm, flash_attn_cm): x goes in as f16, so not
        where ggml's CPU rounding is asked for."""
        return self.coopmat and not self.ggml_numerics

    def matvec_rows(self, wtype: str, n_out: int) -> int:
        """Rows per mul_mat_vec workgroup. Measured on an H200 (`hotseat kernel-bench
        mul_mat_vec`): 4-bit rows want 8 per workgroup (4 below 4096 rows, where fewer
        workgroups would idle the GPU); Q6_K and wider types, 2. The types added later (Q5_1,
        the 2- and 3-bit K-quants, IQ4_NL, IQ4_XS, MXFP4, the IQ3 and IQ2 types) take the
        4-bit rows, unmeasured."""
        if wtype not in ("F32", "F16", "BF16", "Q8_0", "Q6_K"):
            return 8 if n_out >= 4096 else 4
        return 2

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

    def decode_splits(self, n_ctx: int) -> int:
        """KV splits per head for decode: about one per 128 positions of context, so long
        contexts fill the GPU; a pass uses only as many as min chunks of split_chunk allow."""
        return max(1, min(self.split_max, MAX_SPLITS, n_ctx // 128))


class RunState:
    """Activations for up to `max_tokens` tokens per pass, and an f16 KV cache of n_ctx.

    With experts (n_expert > 0) the feed-forward buffers hold n_expert_used slots per token
    (n_ff is then one expert's), beside the router's logits and choices.

    Attention scratch: per-split scores, maxima and outputs of decode attention, and with
    `flash_block` = (rows, cols) one prefill mask and tile classes per sliding window in
    `windows` (0: full causal), for flash attention.
    """

    def __init__(self, dev: vk.Device, label: str, *, n_layer: int, n_embd: int, n_head: int,
                 q_dim: int, kv_dim: int, n_ff: int, n_vocab: int, n_ctx: int, max_tokens: int,
                 kv_layers: list[int] | None = None,
                 rope: tuple[tuple[float, int], ...] = (),
                 conv_layers: tuple[int, ...] = (), d_conv: int = 0, n_expert: int = 0,
                 n_expert_used: int = 0, windows: tuple[int, ...] = (0,),
                 flash_block: tuple[int, int] | None = None):
        self.dev, self.n_ctx, self.max_tokens = dev, n_ctx, max_tokens
        self.kv_row_bytes = 2 * kv_dim              # one position of one layer's K (or V)
        alloc = dev.allocator.alloc
        T = max_tokens
        S = T * max(n_expert_used, 1)               # feed-forward rows: token (or token, slot)

        def act(name: str, floats: int) -> vk.Buffer:
            return alloc(4 * floats, f"{label}/{name}", "compute")

        self.x = act("x", T * n_embd)                # [T, n_embd] residual stream
        self.xn = act("xn", T * n_embd)              # [T, n_embd] normed
        self.q = act("q", T * q_dim)                 # [T, n_head * head_dim]
        self.k = act("k", T * kv_dim)                # [T, n_head_kv * head_dim]
        self.v = act("v", T * kv_dim)
        self.att = act("att", T * q_dim)             # [T, n_head * head_dim]
        self.gate = act("gate", S * n_ff)            # [T, n_ff] or [T, n_expert_used, n_ff]
        self.up = act("up", S * n_ff)
        self.logits = act("logits", n_vocab)         # [1, n_vocab] last token only
        k_max = max(n_embd, q_dim, n_ff)
        self.xq = act("xq", S * k_max)               # [S, k_max] rounded activations
        if n_expert:
            self.router = act("router", T * n_expert)               # [T, n_expert] logits
            self.expert_ids = alloc(4 * S, f"{label}/expert_ids", "compute")   # [T, used] u32
            self.expert_w = act("expert_w", S)                      # [T, n_expert_used]
            self.moe_out = act("moe_out", S * n_embd)               # [T, n_expert_used, n_embd]
            # slots grouped by expert (moe_group): (offset, count) per expert, slot lists
            self.moe_groups = alloc(8 * n_expert, f"{label}/moe_groups", "compute")
            self.moe_perm = alloc(4 * S, f"{label}/moe_perm", "compute")           # [S] u32
        self.scores = act("scores", n_head * n_ctx)  # [n_head, n_ctx] decode attention
        self.split_stats = act("split_stats", 2 * n_head * MAX_SPLITS)  # [n_head, splits, 2]
        self.split_out = act("split_out", MAX_SPLITS * q_dim)  # [n_head, splits, head_dim]
        self.flash_block = flash_block
        self.masks: dict[int, tuple[vk.Buffer, vk.Buffer]] = {}   # window -> (mask, classes)
        if flash_block:
            rows, cols = _mask_shape(T, n_ctx, flash_block)
            for w in windows:
                self.masks[w] = (alloc(2 * rows * cols, f"{label}/mask{w}", "compute"),
                                 act(f"mask{w}_tiles", _tiles(rows, cols, flash_block)))
        self.rope_tables: dict[tuple, vk.Buffer] = {}      # (base, n_dims, scale) -> table
        self.ids = alloc(4 * T, f"{label}/ids", "compute", host=True)        # [T] token ids
        self.step = alloc(16, f"{label}/step", "compute", host=True)         # pos0, n_past
        self.result = alloc(4 * n_vocab, f"{label}/result", "compute", host=True)
        layers = kv_layers if kv_layers is not None else list(range(n_layer))
        self.k_cache = {i: alloc(2 * n_ctx * kv_dim, f"{label}/k_cache.{i}", "kv")
                        for i in layers}             # [n_ctx, n_head_kv, head_dim] f16
        self.v_cache = {i: alloc(2 * n_ctx * kv_dim, f"{label}/v_cache.{i}", "kv")
                        for i in layers}
        # short-convolution layers: per channel the last d_conv inputs (ggml's conv state)
        self.conv_state = {i: alloc(4 * d_conv * n_embd, f"{label}/conv_state.{i}", "recurrent")
                           for i in conv_layers}         # [n_embd, d_conv] f32
        if conv_layers:
            self.bcx = act("bcx", T * 3 * n_embd)        # [T, 3 * n_embd] B | C | x
            self.bx = act("bx", T * n_embd)              # [T, n_embd] B * x
            self.conv_x = act("conv_x", n_embd * (d_conv + T))   # [n_embd, d_conv + T]
            self.conv = act("conv", T * n_embd)          # [T, n_embd] conv output, then C * it
        for base, n_dims in rope:
            self.rope_table(base, n_dims)

    def rope_table(self, base: float, n_dims: int, freq_scale: float = 1.0) -> vk.Buffer:
        """(cos, sin) for every position and pair, computed as ggml does: theta starts at
        pos * freq_scale and is multiplied by powf(base, -2 / n_dims) in float32 per pair."""
        key = (base, n_dims, freq_scale)
        if key not in self.rope_tables:
            table = rope_angles(self.n_ctx, base, n_dims, freq_scale)
            buf = self.dev.allocator.alloc(table.nbytes, f"rope{base:g}", "compute")
            with vk.Uploader(self.dev, staging_bytes=table.nbytes) as up:
                up.write(buf, table)
            self.rope_tables[key] = buf
        return self.rope_tables[key]

    @staticmethod
    def bytes_for(*, n_layer: int, n_embd: int, n_head: int, q_dim: int, kv_dim: int,
                  n_ff: int, n_vocab: int, n_ctx: int, max_tokens: int, kv_layers=None,
                  rope: tuple[tuple[float, int], ...] = (), conv_layers: tuple[int, ...] = (),
                  d_conv: int = 0, n_expert: int = 0, n_expert_used: int = 0,
                  windows: tuple[int, ...] = (0,),
                  flash_block: tuple[int, int] | None = None) -> int:
        """What the constructor allocates, without allocating (for the arbiter)."""
        T = max_tokens
        S = T * max(n_expert_used, 1)
        k_max = max(n_embd, q_dim, n_ff)
        floats = T * (2 * n_embd + 2 * q_dim + 2 * kv_dim) + 2 * S * n_ff + n_vocab
        floats += S * k_max + sum(n_ctx * d for _, d in rope)
        if n_expert:
            floats += T * n_expert + 2 * S + S * n_embd      # router, ids, weights, moe_out
            floats += 2 * n_expert + S                       # moe_groups, moe_perm
        if conv_layers:
            floats += len(conv_layers) * d_conv * n_embd + T * 5 * n_embd
            floats += n_embd * (d_conv + T)
        floats += n_head * n_ctx + 2 * n_head * MAX_SPLITS + MAX_SPLITS * q_dim
        mask = 0
        if flash_block:
            rows, cols = _mask_shape(T, n_ctx, flash_block)
            mask = len(windows) * (2 * rows * cols + 4 * _tiles(rows, cols, flash_block))
        host = 4 * T + 16 + 4 * n_vocab
        layers = n_layer if kv_layers is None else len(kv_layers)
        return 4 * floats + mask + host + 2 * 2 * n_ctx * kv_dim * layers

    def set_step(self, token_ids, pos0: int) -> None:
        ids = np.asarray(token_ids, np.uint32)
        self.ids.write(ids)
        self.step.write(np.array([pos0, pos0 + len(ids), 0, 0], np.uint32))

    def reset_recurrent(self) -> None:
        """Zero every conv state: a sequence starting at position 0 has no past inputs."""
        if not self.conv_state:
            return
        zeros = np.zeros(next(iter(self.conv_state.values())).nbytes, np.uint8)
        with vk.Uploader(self.dev, staging_bytes=max(4096, zeros.nbytes)) as up:
            for buf in self.conv_state.values():
                up.write(buf, zeros)

    def buffers(self) -> list[vk.Buffer]:
        return [b for b in vars(self).values() if isinstance(b, vk.Buffer)] + \
            list(self.k_cache.values()) + list(self.v_cache.values()) + \
            list(self.conv_state.values()) + list(self.rope_tables.values()) + \
            [b for pair in self.masks.values() for b in pair]

    def close(self) -> None:
        for b in self.buffers():
            self.dev.allocator.free(b)


@functools.lru_cache(maxsize=16)
def rope_angles(n_ctx: int, base: float, n_dims: int, freq_scale: float) -> np.ndarray:
    """[n_ctx, n_dims / 2, (cos, sin)] float32; computed once per process (a full restore
    rebuilds the device table from it)."""
    half = n_dims // 2
    theta_scale = np.float32(base) ** np.float32(-2.0 / n_dims)
    theta = np.empty((n_ctx, half), np.float32)
    theta[:, 0] = np.arange(n_ctx, dtype=np.float32) * np.float32(freq_scale)
    for i in range(1, half):
        theta[:, i] = theta[:, i - 1] * theta_scale
    t64 = theta.astype(np.float64)
    table = np.stack([np.cos(t64), np.sin(t64)], axis=-1).astype(np.float32)
    table.flags.writeable = False
    return table


def check_hyperparameters(c, path: str, extra: list[str] = ()) -> None:
    """One-line ModelFileError for hyperparameters no real model has (a corrupt header)."""
    from ..formats.gguf_file import ModelFileError

    problems = list(extra)
    if not 0 < c.n_layer <= 1024:
        problems.append(f"block_count {c.n_layer}")
    if c.n_embd <= 0 or c.n_embd % 32 or c.n_embd > 65536:
        problems.append(f"embedding_length {c.n_embd}")
    if c.n_head <= 0 or c.n_head_kv <= 0 or c.n_head % c.n_head_kv:
        problems.append(f"head counts {c.n_head}/{c.n_head_kv}")
    if c.head_dim <= 0 or c.head_dim % 4 or c.head_dim > 512:
        problems.append(f"head dim {c.head_dim}")
    if c.n_ff <= 0 or c.n_ff % 32 or c.n_ff > 1 << 20:
        problems.append(f"feed_forward_length {c.n_ff}")
    if not 0 < c.n_vocab <= 1 << 22:
        problems.append(f"vocab size {c.n_vocab}")
    if problems:
        raise ModelFileError(path, "absurd or unsupported hyperparameters: " + ", ".join(problems))


def run_state_args(c, n_ctx: int, max_tokens: int, rope: tuple = (), windows: tuple = (0,),
                   flash_block: tuple[int, int] | None = None) -> dict:
    """RunState's sizes for a model config. Hybrid configs name their attention layers
    (`kv_layers`) and their short-convolution layers (`conv_layers`, of `d_conv` inputs);
    with experts, c.n_ff is one expert's."""
    return dict(n_layer=c.n_layer, n_embd=c.n_embd, n_head=c.n_head,
                q_dim=c.n_head * c.head_dim, kv_dim=c.n_head_kv * c.head_dim, n_ff=c.n_ff,
                n_vocab=c.n_vocab, n_ctx=n_ctx, max_tokens=max_tokens, rope=rope,
                kv_layers=getattr(c, "kv_layers", None),
                conv_layers=getattr(c, "conv_layers", ()), d_conv=getattr(c, "d_conv", 0),
                n_expert=getattr(c, "n_expert", 0),
                n_expert_used=getattr(c, "n_expert_used", 0), windows=windows,
                flash_block=flash_block)


def _mask_shape(max_tokens: int, n_ctx: int, block: tuple[int, int]) -> tuple[int, int]:
    """(rows, columns) of a flash-attention mask: whole tiles."""
    rows, cols = block
    return -(-max_tokens // rows) * rows, -(-n_ctx // cols) * cols


def _tiles(rows: int, cols: int, block: tuple[int, int]) -> int:
    return (rows // block[0]) * (cols // block[1])


class Builder:
    """Records a forward pass on a Graph; one method per op."""

    def __init__(self, graph: Graph, weights: dict[str, Tensor], rs: RunState, tuning: Tuning):
        self.g, self.weights, self.rs, self.t = graph, weights, rs, tuning
        self._rounded = None      # (source buffer, row, n, format) now held in rs.xq
        self._grouped = None      # (ids buffer, n, n_used, n_expert) grouped in rs.moe_perm
        self._masks: set[int] = set()    # windows whose attention mask this graph has built

    def _rounded_input(self, x: vk.Buffer, x_row: int, n: int, n_in: int, fmt: int):
        """x rounded to `fmt` in rs.xq (reused while x and the format stay the same)."""
        key = (id(x), x_row, n, n_in, fmt)
        if self._rounded != key:
            blocks = n * n_in // ACT_BLOCK[fmt]
            self.g.op("quantize_act", [x, self.rs.xq], (-(-blocks // 64), 1, 1),
                      spec=dict(FMT=fmt), n_cols=n_in, n_rows=n, x_offset=x_row)
            self._rounded = key
        return self.rs.xq

    def _wrote(self, buf: vk.Buffer) -> None:
        if self._rounded is not None and self._rounded[0] == id(buf):
            self._rounded = None
        if self._grouped is not None and self._grouped[0] == id(buf):
            self._grouped = None

    def get_rows(self, table: Tensor, ids: vk.Buffer, out: vk.Buffer, n: int,
                 scale: float = 1.0) -> None:
        for buf, first, count in table.bindings():
            self.g.op("get_rows", [buf, ids, out], (n, 1, 1), wtype=table.wtype,
                      n_cols=table.shape[0], n_rows=n, scale=scale, row_base=first,
                      part_rows=count)
        self._wrote(out)

    def matmul(self, w: Tensor, x: vk.Buffer, y: vk.Buffer, n: int, accumulate: bool = False,
               x_row: int = 0) -> None:
        """y[n, rows(w)] (+)= x[x_row:x_row+n, :] @ w^T."""
        if n == 1 and self.t.matvec:
            self._matvec(w, x, y, accumulate, x_row)
            return
        n_in, n_out = w.shape[0], w.rows
        if n > 1 and self.t.fast_prefill and n_in % CM_K == 0:
            self._matmul_cm(w, x, y, n, accumulate, x_row)
            return
        rows, nt = (self.t.mv_rows, 1) if n == 1 else (self.t.mm_rows, self.t.mm_tokens)
        per_group = rows * self.t.warps
        inline = ACT_INLINE.get(w.wtype, 0) if self.t.ggml_numerics else 0
        spec = dict(WG=self.t.subgroup * self.t.warps, ROWS=rows, NT=nt, ACC=int(accumulate),
                    ACT=inline)
        fmt = ACT_FORMAT.get(w.wtype) if self.t.ggml_numerics and not inline else None
        if fmt is not None:
            x = self._rounded_input(x, x_row, n, n_in, fmt)
            x_row = 0
        for buf, first, count in w.bindings():
            self.g.op("mul_mat", [buf, x, y], (-(-count // per_group), -(-n // nt), 1),
                      wtype=w.wtype, spec=spec, n_in=n_in, n_out=count, n_tokens=n,
                      x_offset=x_row * n_in // 4, y_offset=first, row_offset=0, y_stride=n_out)
        self._wrote(y)

    def _matmul_cm(self, w: Tensor, x: vk.Buffer, y: vk.Buffer, n: int, accumulate: bool,
                   x_row: int) -> None:
        """Many tokens on the matrix units: f16 tiles, f32 sums. x goes in as f16, not
        rounded as ggml's CPU backend rounds it (f16 cannot hold those values)."""
        n_in, n_out = w.shape[0], w.rows
        bm, bn = self.t.cm_tile
        for buf, first, count in w.bindings():
            self.g.op("mul_mat_cm", [buf, x, y], (-(-count // bm), -(-n // bn), 1),
                      wtype=w.wtype, spec=dict(ACC=int(accumulate), BM=bm, BN=bn), n_in=n_in,
                      n_out=count, n_tokens=n, x_offset=x_row * n_in // 4, y_offset=first,
                      y_stride=n_out)
        self._wrote(y)

    def _matvec(self, w: Tensor, x: vk.Buffer, y: vk.Buffer, accumulate: bool,
                x_row: int) -> None:
        """One token: mul_mat_vec, the activations rounded inside it (no quantize_act)."""
        n_in = w.shape[0]
        chunks = n_in // MATVEC_CHUNK[w.wtype]
        lanes = self.t.subgroup
        while lanes < min(chunks, self.t.mv_lanes):
            lanes *= 2
        rows = self.t.matvec_rows(w.wtype, w.rows)
        spec = dict(WG=lanes, ROWS=rows, ACC=int(accumulate),
                    ACT=MATVEC_ACT[w.wtype] if self.t.ggml_numerics else 0)
        for buf, first, count in w.bindings():
            self.g.op("mul_mat_vec", [buf, x, y], (-(-count // rows), 1, 1), wtype=w.wtype,
                      spec=spec, n_in=n_in, n_out=count, x_offset=x_row * n_in // 4,
                      y_offset=first)
        self._wrote(y)

    def matmul_id(self, w: Tensor, x: vk.Buffer, ids: vk.Buffer, y: vk.Buffer, n: int,
                  n_used: int, per_slot: bool = False) -> None:
        """y[t, j, :] = x[t (, j), :] @ w[ids[t, j]]^T for n tokens of n_used routed experts;
        w is [n_in, n_out, n_expert], x is [n, n_in] or, per_slot, [n, n_used, n_in].
        Several tokens: grouped by expert (Tuning.moe_grouped), each expert one product."""
        if n > 1 and self.t.moe_grouped:
            self._matmul_moe(w, x, ids, y, n, n_used, per_slot)
            return
        n_in, n_out = w.shape[0], w.shape[1]
        per_group = self.t.mv_rows * self.t.warps
        inline = ACT_INLINE.get(w.wtype, 0) if self.t.ggml_numerics else 0
        spec = dict(WG=self.t.subgroup * self.t.warps, ROWS=self.t.mv_rows, ACT=inline,
                    X_SLOT=int(per_slot))
        fmt = ACT_FORMAT.get(w.wtype) if self.t.ggml_numerics and not inline else None
        if fmt is not None:
            x = self._rounded_input(x, 0, n * n_used if per_slot else n, n_in, fmt)
        for buf, first, count in w.bindings():          # parts of whole experts
            self.g.op("mul_mat_id", [buf, x, ids, y], (-(-n_out // per_group), n_used, n),
                      wtype=w.wtype, spec=spec, n_in=n_in, n_out=n_out, n_used=n_used,
                      expert_base=first // n_out, n_experts=count // n_out)
        self._wrote(y)

    def moe_group(self, ids: vk.Buffer, n: int, n_used: int, n_expert: int) -> None:
        """rs.moe_groups, rs.moe_perm: the slots of ids[n, n_used] grouped by expert (reused
        until ids is written again)."""
        key = (id(ids), n, n_used, n_expert)
        if self._grouped != key:
            self.g.op("moe_group", [ids, self.rs.moe_groups, self.rs.moe_perm], (n_expert, 1, 1),
                      n_slots=n * n_used)
            self._grouped = key

    def _matmul_moe(self, w: Tensor, x: vk.Buffer, ids: vk.Buffer, y: vk.Buffer, n: int,
                    n_used: int, per_slot: bool) -> None:
        """The routed products grouped by expert: activations rounded as mul_mat_id rounds
        them (ggml_numerics), then one register-tiled product per expert over its slots."""
        n_in, n_out, n_expert = w.shape
        self.moe_group(ids, n, n_used, n_expert)
        rows = self.t.mm_rows
        nt = moe_tile_slots(n, n_used, n_expert, self.t.mm_tokens)
        inline = ACT_INLINE.get(w.wtype, 0) if self.t.ggml_numerics else 0
        spec = dict(WG=self.t.subgroup * self.t.warps, ROWS=rows, NT=nt, ACT=inline,
                    X_SLOT=int(per_slot))
        fmt = ACT_FORMAT.get(w.wtype) if self.t.ggml_numerics and not inline else None
        if fmt is not None:
            x = self._rounded_input(x, 0, n * n_used if per_slot else n, n_in, fmt)
        tiles = moe_tile_groups(n, n_used, n_expert, nt)
        rs = self.rs
        for buf, first, count in w.bindings():          # parts of whole experts
            self.g.op("mul_mat_moe", [buf, x, rs.moe_groups, rs.moe_perm, y],
                      (-(-n_out // (rows * self.t.warps)), tiles, count // n_out),
                      wtype=w.wtype, spec=spec, n_in=n_in, n_out=n_out, n_used=n_used,
                      expert_base=first // n_out)
        self._wrote(y)

    def moe_router(self, logits: vk.Buffer, ids: vk.Buffer, weights: vk.Buffer, n: int,
                   n_expert: int, n_used: int, norm: bool = True) -> None:
        """Softmax over n_expert logits per token; the n_used largest into ids and weights."""
        self.g.op("moe_router", [logits, ids, weights], (n, 1, 1), spec=dict(NORM=int(norm)),
                  n_expert=n_expert, n_used=n_used)
        self._wrote(ids)
        self._wrote(weights)

    def moe_combine(self, y: vk.Buffer, weights: vk.Buffer, x: vk.Buffer, n: int, n_embd: int,
                    n_used: int) -> None:
        """x[t] += sum_j weights[t, j] * y[t, j] (the experts' outputs into the residual)."""
        self.g.op("moe_combine", [y, weights, x], _groups_1d(n * n_embd), n_embd=n_embd,
                  n_used=n_used, n=n * n_embd)
        self._wrote(x)

    def rms_norm(self, x: vk.Buffer, w: Tensor, out: vk.Buffer, n: int, eps: float,
                 row_offset: int = 0) -> None:
        self.g.op("rms_norm", [x, w.binding(), out], (n, 1, 1), spec=dict(WG=self.t.norm_wg),
                  n_cols=w.shape[0], n_rows=n, eps=eps, x_offset=row_offset)
        self._wrote(out)

    def rope_qkv(self, q: vk.Buffer, k: vk.Buffer, v: vk.Buffer, k_cache: vk.Buffer,
                 v_cache: vk.Buffer, n_head: int, n_head_kv: int, head_dim: int, n_dims: int,
                 n: int, base: float, neox: bool, freq_scale: float = 1.0) -> None:
        """rope(q) in place, rope(k) into the K cache and v into the V cache, at step.pos0."""
        table = self.rs.rope_table(base, n_dims, freq_scale) if self.t.ggml_numerics else q
        count = n * ((n_head + n_head_kv) * n_dims // 2 + n_head_kv * head_dim)
        self.g.op("rope_qkv", [q, k, v, k_cache, v_cache, self.rs.step, table],
                  (-(-count // 64), 1, 1), spec=dict(NEOX=int(neox),
                                                     TABLE=int(self.t.ggml_numerics)),
                  n_head=n_head, n_head_kv=n_head_kv, head_dim=head_dim, n_dims=n_dims,
                  n_tokens=n, freq_base=base, freq_scale=freq_scale)
        self._wrote(q)

    def attention(self, q: vk.Buffer, k_cache: vk.Buffer, v_cache: vk.Buffer, out: vk.Buffer,
                  n_head: int, n_head_kv: int, head_dim: int, n: int, scale: float,
                  window: int = 0) -> None:
        """out[n, n_head, head_dim] = softmax(q k^T * scale) v over the cache up to each
        token's position (the last `window` positions only, when window > 0)."""
        if n == 1:
            self._split_attention(q, k_cache, v_cache, out, n_head, n_head_kv, head_dim,
                                  scale, window)
        elif self.t.fast_prefill and head_dim in (64, 128):
            self.g.op("flash_attn_cm", [q, k_cache, v_cache, out, self.rs.step],
                      (-(-n // 64), n_head, 1), spec=dict(HD=head_dim), n_head=n_head,
                      n_head_kv=n_head_kv, n_tokens=n, window=window, scale=scale)
        elif self.t.use_flash_attn(head_dim, n):
            self._flash_attention(q, k_cache, v_cache, out, n_head, n_head_kv, head_dim, n,
                                  scale, window)
        else:
            ggml = self.t.ggml_numerics
            self.g.op("attention", [q, k_cache, v_cache, out, self.rs.step], (n_head, n, 1),
                      spec=dict(HD=head_dim, GGML=int(ggml)), n_head=n_head,
                      n_head_kv=n_head_kv, n_tokens=n, window=window, scale=scale)
        self._wrote(out)

    def _split_attention(self, q, k_cache, v_cache, out, n_head, n_head_kv, head_dim, scale,
                         window) -> None:
        rs = self.rs
        splits = self.t.decode_splits(rs.n_ctx)
        if self.t.matvec and not self.t.ggml_numerics:    # one pass, no f16 probabilities
            self.g.op("attn_decode", [q, k_cache, v_cache, rs.split_stats, rs.split_out,
                                     rs.step], (splits, n_head, 1),
                      spec=dict(WG=64, HD=head_dim, LP=self.t.attn_lanes(head_dim)),
                      n_head=n_head, n_head_kv=n_head_kv, window=window, n_split=splits,
                      min_chunk=self.t.split_chunk, scale=scale)
            self.g.op("attn_merge", [rs.split_stats, rs.split_out, out], (n_head, 1, 1),
                      head_dim=head_dim, n_split=splits)
            return
        bufs = [q, k_cache, v_cache, rs.scores, rs.split_stats, rs.split_out, rs.step]
        for pass_ in (0, 1):
            self.g.op("attn_split", bufs, (splits, n_head, 1),
                      spec=dict(WG=64, HD=head_dim, LP=self.t.attn_lanes(head_dim),
                                GGML=int(self.t.ggml_numerics), PASS=pass_),
                      n_head=n_head, n_head_kv=n_head_kv, n_ctx=rs.n_ctx, window=window,
                      n_split=splits, min_chunk=self.t.split_chunk, scale=scale)
        self.g.op("attn_combine", [rs.split_out, out], (n_head, 1, 1), head_dim=head_dim,
                  n_split=splits)

    def attention_mask(self, n: int, window: int) -> tuple[vk.Buffer, vk.Buffer]:
        """The (mask, tile classes) of this pass for `window`, built on first use."""
        if window not in self.rs.masks:
            raise ValueError(f"flash attention: the run state has no mask for window {window} "
                             "(built without flash_block, or for other windows)")
        mask, tiles = self.rs.masks[window]
        if window not in self._masks:
            rows, cols = self.rs.flash_block
            stride = -(-self.rs.n_ctx // cols) * cols
            self.g.op("attn_mask", [mask, tiles, self.rs.step],
                      (stride // cols, -(-n // rows), 1), spec=dict(WG=64, BR=rows, BC=cols),
                      n_tokens=n, stride=stride, window=window)
            self._masks.add(window)
        return mask, tiles

    def _flash_attention(self, q, k_cache, v_cache, out, n_head, n_head_kv, head_dim, n,
                         scale, window) -> None:
        mask, tiles = self.attention_mask(n, window)
        rows, cols = self.rs.flash_block
        lanes = self.t.attn_lanes(head_dim)
        self.g.op("flash_attn", [q, k_cache, v_cache, out, mask, tiles, self.rs.step],
                  (-(-n // rows), n_head, 1),
                  spec=dict(WG=rows * lanes, HD=head_dim, BR=rows, BC=cols, LP=lanes,
                            GGML=int(self.t.ggml_numerics), SKIP=int(self.t.flash_skip)),
                  n_head=n_head, n_head_kv=n_head_kv, n_tokens=n,
                  stride=-(-self.rs.n_ctx // cols) * cols, scale=scale)

    def silu_mul(self, gate: vk.Buffer, up: vk.Buffer, out: vk.Buffer, count: int,
                 gelu: bool = False) -> None:
        self.g.op("silu_mul", [gate, up, out], _groups_1d(count), spec=dict(GELU=int(gelu)),
                  n=count)
        self._wrote(out)

    def add(self, a: vk.Buffer, b: vk.Buffer, out: vk.Buffer, count: int) -> None:
        self.g.op("add", [a, b, out], _groups_1d(count), n=count)
        self._wrote(out)

    def argmax(self, x: vk.Buffer, out: vk.Buffer, count: int) -> None:
        self.g.op("argmax", [x, out], (1, 1, 1), spec=dict(WG=self.t.argmax_wg), n=count,
                  x_offset=0)

    def mul(self, a: View, b: View, out: vk.Buffer) -> None:
        """out[r, i] = a[r, i] * b[r, i] over 2-D row views; out contiguous."""
        (n_cols, n_rows, _), (a0, a_stride, _), (b0, b_stride, _) = a.ne, a.strides, b.strides
        if a0 != 1 or b0 != 1 or b.ne[:2] != a.ne[:2]:
            raise ValueError("mul takes two row views of one shape")
        self.g.op("mul", [a.buf, b.buf, out], (-(-n_cols // 64), n_rows, 1), n_cols=n_cols,
                  n_rows=n_rows, a_offset=a.offset, a_stride=a_stride, b_offset=b.offset,
                  b_stride=b_stride)
        self._wrote(out)

    def cpy(self, src: View, dst: View) -> None:
        """dst = src between 2-D row views."""
        (n_cols, n_rows, _), (s0, s_stride, _), (d0, d_stride, _) = \
            src.ne, src.strides, dst.strides
        if s0 != 1 or d0 != 1 or dst.ne[:2] != src.ne[:2]:
            raise ValueError("cpy takes two row views of one shape")
        self.g.op("cpy", [src.buf, dst.buf], _groups_1d(n_cols * n_rows), n_cols=n_cols,
                  n_rows=n_rows, src_offset=src.offset, src_stride=s_stride,
                  dst_offset=dst.offset, dst_stride=d_stride)
        self._wrote(dst.buf)

    def concat(self, a: View, b: View, out: vk.Buffer, tiled: bool | None = None) -> None:
        """out = concat(a, b) along dim 0, contiguous [ne2, ne1, a.ne0 + b.ne0]. The tiled
        path (the default when one source is stored transposed) transposes that one through
        shared memory; tiled=False takes the element-wise path whatever the strides."""
        if a.ne[1:] != b.ne[1:]:
            raise ValueError(f"concat along dim 0 of {a.ne} and {b.ne}")
        tsrc = 0 if a.strides[1] < b.strides[1] else 1    # the one read along dim 1
        if tiled is None:
            tiled = a.transposed or b.transposed
        ne0, (_, ne1, ne2) = a.ne[0] + b.ne[0], a.ne
        if tiled:
            groups = (-(-ne0 // 32), -(-ne1 // 32), ne2)
        else:
            groups = _groups_1d(ne0 * ne1 * ne2, 256)
        (a0, a1, a2), (b0, b1, b2) = a.strides, b.strides
        self.g.op("concat", [a.buf, b.buf, out], groups, spec=dict(TILED=int(tiled), TSRC=tsrc),
                  ne00=a.ne[0], ne10=b.ne[0], ne1=ne1, ne2=ne2, a_nb0=a0, a_nb1=a1, a_nb2=a2,
                  b_nb0=b0, b_nb1=b1, b_nb2=b2, a_offset=a.offset, b_offset=b.offset)
        self._wrote(out)

    def ssm_conv(self, x: vk.Buffer, w: Tensor, out: vk.Buffer, n: int) -> None:
        """out[t, c] = sum_k x[c, t + k] * w[c, k]; x holds d_conv + n inputs per channel."""
        width, n_channels = w.shape
        self.g.op("ssm_conv", [x, w.binding(), out], (-(-n_channels // 64), n, 1),
                  n_channels=n_channels, n_tokens=n, width=width)
        self._wrote(out)


def moe_tile_slots(n: int, n_used: int, n_expert: int, nt_max: int) -> int:
    """Slots per token tile of mul_mat_moe: the smallest power of two, at most nt_max, that
    holds an expert's share of an even routing (a short chunk's tiles would otherwise be
    mostly padding, computed all the same)."""
    nt = nt_max
    while nt > 1 and (nt // 2) * n_expert >= n * n_used:
        nt //= 2
    return nt


def moe_tile_groups(n: int, n_used: int, n_expert: int, nt: int) -> int:
    """Token-tile workgroups per expert of mul_mat_moe (tiles of nt slots): twice what an even
    routing needs (an expert with more tokens loops over its tiles), at most what one expert
    can get (n: a token takes an expert once)."""
    even = -(-n * n_used // (n_expert * nt))
    return max(1, min(-(-n // nt), 2 * even))


def _groups_1d(count: int, wg: int = 64) -> tuple[int, int, int]:
    groups = -(-count // wg)
    if groups <= 65535:
        return (groups, 1, 1)
    return (65535, -(-groups // 65535), 1)
