"""The ops a model's forward pass is written in.

`Builder` turns calls like `b.matmul(w, x, y, n)` into recorded dispatches on a `Graph`:
it knows each kernel's group counts and push constants, so architectures read as a list
of tensor operations. Which kernel an op takes comes from the model's `Paths` table.

Why this module is long: it is one method per op, and the ops share the state that saves
work across them (x rounded once for several products, expert groups made once for gate,
up and down); split by kind, that state would cross modules.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from . import vk
from .graph import Graph
from .kernels import (ACT_BLOCK, ACT_FORMAT, ACT_INLINE, CM_K, MATVEC_ACT, MATVEC_CHUNK,
                      SPLIT_SUM_WG)
from .paths import Paths, Tuning
from .rope import Rope
from .runstate import RunState, delta_scratch_floats
from .tensors import Tensor, View
from shaders.registry import CM2_GROUPS, CM2_TYPES, MATVECQ_TYPES, PREDECODE_TYPES

# mul_mat_vecq's push constants that only PAIR, ROPE, OUT16 and EXPERTS read
VECQ_PLAIN = dict(row2=0, head_dim=0, freq_base=0.0, freq_scale=0.0, kv_row=0, expert_base=0,
                  n_experts=0)
# mul_mat_moe_cm's tile: weight rows x slots (a 512-token chunk gives each of 128 experts
# about 32 slots where 8 are used, as Qwen3-30B-A3B routes); 128 rows took 144 us where 64
# took 211 on an H100 (Q4_K 2048 x 768, 256 tokens, x as f16; 142 and 198 routed hot)
MOE_CM_TILE = (128, 32)
MOE_CM2_TILE = (128, 32, 256)    # mul_mat_moe_cm2's: weight rows x slots x lanes


class Builder:
    """Records a forward pass on a Graph; one method per op."""

    def __init__(self, graph: Graph, weights: dict[str, Tensor], rs: RunState, tuning: Tuning,
                 paths: Paths | None = None, *, hidden: bool = False, embd: bool = False,
                 prompt: bool = False):
        self.g, self.weights, self.rs, self.t = graph, weights, rs, tuning
        self._paths = paths       # the model's table; else per head size from the tuning
        self._rounded = None      # (source buffer, where, how much, format, its write stamp)
                                  # of what rs.xq holds now
        self._grouped = None      # (ids buffer, n, n_used, n_expert) grouped in rs.moe_perm
        self._tiled = None        # (that, slots a tile) listed in rs.moe_groups (moe_tiles)
        self._slice = 0           # which of rs's two predecoded slices fills next
        # split K's sums held back while the products of one input are recorded, each into
        # partial sums of its own, so that they run side by side (norm_matmuls; None: each
        # product's split_sum right after it)
        self._sums: list[tuple] | None = None
        self._masks: set[int] = set()    # windows whose attention mask this graph has built
        self._counted = False     # this graph zeroes attn_decode's split counters first
        self._heads_counted = False   # ... and mul_mat_vecq's HNORM head counters
        # 1: the pass packs several sequences (rope_qkv, prefill attention and attn_mask read
        # step.seq_first, the first slot of each token's sequence); 0: one sequence
        self.seqs = 0
        # an embeddings pass: the architecture's head leaves every token's final-normed
        # state in rs.xn and computes no logits (engine/arch/blocks.py's head), then says
        # so in `ended`
        self.hidden = hidden
        self.ended = False
        # a pass of embeddings: rs.embd_in's rows are the input, not the token ids' rows
        self.embd = embd
        # a prompt's pass (or an embeddings pass): one token takes the kernels of a wider
        # pass too, so a token's bits do not depend on the width of the pass that computed
        # it (a cached prefix's last token, packed inputs against each alone); decode's
        # one-token kernels round otherwise on devices with matrix units
        self.prompt = prompt

    def _one(self, n: int) -> bool:
        """Whether a pass of n tokens takes one token's kernels (decode's): one token, not
        of a prompt (Builder.prompt)."""
        return n == 1 and not self.prompt

    def _rounded_input(self, x: vk.Buffer, x_row: int, n: int, n_in: int, fmt: int):
        """x rounded to `fmt` in rs.xq (reused while x and the format stay the same)."""
        key = (id(x), x_row, n, n_in, fmt, self.g.last_write(x))
        if self._rounded != key:
            blocks = n * n_in // ACT_BLOCK[fmt]
            self.g.op("quantize_act", [x, self.rs.xq], (-(-blocks // 64), 1, 1),
                      spec=dict(FMT=fmt), n_cols=n_in, n_rows=n, x_offset=x_row)
            self._rounded = key
        return self.rs.xq

    def _f16_input(self, x: vk.Buffer, x_row: int, n: int, n_in: int) -> vk.Buffer:
        """x[x_row:x_row+n] as f16 in rs.xq (to_f16), for the products that load f16 tiles
        (mul_mat_cm2's X16): one pass serves every product of the same x until x is written
        again (q, k and v; gate and up). rs.xq is free on that path: it holds ggml's
        roundings, which the matrix units' paths never take."""
        key = (id(x), x_row * n_in, n * n_in, "f16", self.g.last_write(x))
        if self._rounded != key:
            count = n * n_in
            self.g.op("to_f16", [x, self.rs.xq], _groups_1d(-(-count // 4)), n=count,
                      x_offset=x_row * n_in // 4)
            self._rounded = key
        return self.rs.xq

    def _f16_beside(self, n: int, count: int) -> bool:
        """Whether an op writing `count` values (from its output's start) of a pass of n
        tokens writes them as f16 into rs.xq too, for the products after it that load x as
        f16 tiles (mul_mat_cm2's X16): they then need no to_f16 pass (_f16_input)."""
        return (not self._one(n) and self.rs is not None and self.t.cm2_x16
                and not self.t.cm2_staged and self.paths().prefill_matmul == "mul_mat_cm2"
                and 2 * count <= self.rs.xq.nbytes)

    def reads_f16(self, w: Tensor, n: int) -> bool:
        """Whether matmul(w, x, ..., n) takes x as f16 from rs.xq (_f16_input): an op before
        it that gives it as f16 too (_f16_beside) then need not write its f32 values where
        the product is their only reader."""
        return (self._f16_beside(n, n * w.shape[0])
                and (w.wtype in CM2_TYPES or self.predecodes(w))
                and w.shape[0] % CM_K == 0 and not any(w.skips()))

    def _made_f16(self, out: vk.Buffer, count: int) -> None:
        """out's first `count` values are in rs.xq as f16 now (an op wrote both)."""
        self._wrote(out)
        self._rounded = (id(out), 0, count, "f16", self.g.last_write(out))

    def paths(self, head_dim: int = 0) -> Paths:
        p = self._paths
        if p is None or (head_dim and p.head_dim != head_dim):
            p = self.t.paths(head_dim or (p.head_dim if p else 64))
        return p

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

    def int8_throughout(self) -> bool:
        """Whether every quantized matrix of the layers has an int8 reader (mul_mat_vecq), so
        that one token's products all take x rounded to int8 where the device does, as
        llama.cpp's CPU backend rounds x before every product with a quantized weight."""
        return all(t.wtype in MATVECQ_TYPES for name, t in self.weights.items()
                   if name.startswith("blk.") and len(t.shape) >= 2
                   and t.wtype not in ("F32", "F16", "BF16"))

    def matmul(self, w: Tensor, x: vk.Buffer, y: vk.Buffer, n: int, accumulate: bool = False,
               x_row: int = 0, bias: Tensor | None = None, int8: bool = True,
               row: bool = False) -> None:
        """y[n, rows(w)] (+)= x[x_row:x_row+n, :] @ w^T (+ bias, F32, in the same pass where
        one token's product takes int8 activations, else added after). A row slice whose
        rows do not start on a bindable offset (Tensor.skip) takes mul_mat, which reads from
        a row offset. int8=False keeps one token's x in f32 where the device would round it
        to int8 (the logits' product: its rounding lands on the log-probabilities whole).
        row: one row's product (the logits') takes one token's kernels in any pass."""
        if bias is not None:
            if self._vecq_whole(n, [w]) and bias.wtype == "F32":
                self._matvecq(w, x, y, accumulate, x_row, 0, None, 0.0, bias=bias)
            else:
                self.matmul(w, x, y, n, accumulate, x_row, row=row)
                self.add_bias(y, bias, n)
            return
        p = self.paths()
        skips = w.skips()
        one = self._one(n) or (row and n == 1)
        if one and p.decode_matmul in ("mul_mat_vec", "mul_mat_vecq") and not any(skips):
            self._matvec(w, x, y, accumulate, x_row, int8=int8)
            return
        n_in, n_out = w.shape[0], w.rows
        if not one and p.prefill_matmul in ("mul_mat_cm", "mul_mat_cm2") \
                and n_in % CM_K == 0 and not any(skips):
            self._matmul_cm(w, x, y, n, accumulate, x_row)
            return
        rows, nt = (self.t.mv_rows, 1) if one else (self.t.mm_rows, self.t.mm_tokens)
        per_group = rows * self.t.warps
        inline = ACT_INLINE.get(w.wtype, 0) if self.t.ggml_numerics else 0
        spec = dict(WG=self.t.subgroup * self.t.warps, ROWS=rows, NT=nt, ACC=int(accumulate),
                    ACT=inline)
        fmt = ACT_FORMAT.get(w.wtype) if self.t.ggml_numerics and not inline else None
        if fmt is not None:
            x = self._rounded_input(x, x_row, n, n_in, fmt)
            x_row = 0
        for (buf, first, count), skip in zip(w.bindings(), skips):
            self.g.op("mul_mat", [buf, x, y], (-(-count // per_group), -(-n // nt), 1),
                      wtype=w.wtype, spec=spec, n_in=n_in, n_out=count, n_tokens=n,
                      x_offset=x_row * n_in // 4, y_offset=first, row_offset=skip,
                      y_stride=n_out)
        self._wrote(y)

    def _matmul_cm(self, w: Tensor, x: vk.Buffer, y: vk.Buffer, n: int, accumulate: bool,
                   x_row: int) -> None:
        """Many tokens on the matrix units: f16 tiles, f32 sums. x goes in as f16, not
        rounded as ggml's CPU backend rounds it (f16 cannot hold those values). Where the
        paths take NVIDIA's workgroup-scope matrices and the type has a decoder, mul_mat_cm2
        (W decoded inside the driver's tile loads; x turned to f16 by a pass before, shared
        by the products of the same x, or inside the loads), else mul_mat_cm; with
        Tuning.cm2_staged, mul_mat_cm2s for every type (W staged by the lanes). Where the
        paths predecode (Tuning.predecode), a quantized W is read as f16 rows that
        dequant_f16 writes a slice at a time (_predecoded), whatever its type."""
        n_in, n_out = w.shape[0], w.rows
        x_offset = x_row * n_in // 4
        predecode = self.predecodes(w)
        wtype = "F16" if predecode else w.wtype
        cm2 = self.paths().prefill_matmul == "mul_mat_cm2"
        if cm2 and self.t.cm2_staged:
            bm, bn, wg = self.t.cm2_tile
            kernel, spec = "mul_mat_cm2s", dict(WG=wg, BM=bm, BN=bn, ACC=int(accumulate))
        elif cm2 and wtype in CM2_TYPES:
            # by the model's widest pass, as the split below (the same bits in any pass)
            bm, bn, wg = self.t.cm2_tile if predecode else \
                self.t.cm2_tile_for(n_out, self.rs.max_tokens, n_in)
            x16 = self.reads_f16(w, n)
            kernel, spec = "mul_mat_cm2", dict(WG=wg, BM=bm, BN=bn, ACC=int(accumulate),
                                               X16=int(x16), AHEAD=int(self.t.cm2_ahead),
                                               F16DEC=int(self.t.cm2_f16dec),
                                               ACC16=int(self.t.cm2_acc16))
            if x16:
                x, x_offset = self._f16_input(x, x_row, n, n_in), 0
        else:
            bm, bn = self.t.cm_tile
            kernel, spec = "mul_mat_cm", dict(ACC=int(accumulate), BM=bm, BN=bn)
        # K split by the tiles of the model's widest pass, not this one's: a token's bits
        # do not depend on the pass that computes it (a cached prefix, a prompt cut anywhere).
        # Predecoded products are not split: their f16 tiles load without decoding.
        slices, k_split = 1, 0
        if kernel == "mul_mat_cm2" and not predecode:
            slices, k_split = self.t.cm2_k_split(
                -(-n_out // bm) * -(-self.rs.max_tokens // bn), n_in)
        if slices > 1:       # each slice of K into its own slice of rs's partial sums
            part = self.rs.split_partials(self.t, len(self._sums or ()))
            out, y, spec = y, part, dict(spec, ACC=0)
        split = dict(k_split=k_split if slices > 1 else 0, y_slice=n * n_out) \
            if kernel == "mul_mat_cm2" else {}
        # Q8_0 and Q4_0 in groups of eight blocks where the rows hold whole groups and the
        # part's binding starts on 16 bytes (the group's alignment); the same bits either way
        group = self.t.cm2_group and wtype in CM2_GROUPS and n_in % 256 == 0
        parts = self._predecoded(w) if predecode else w.bindings()
        for buf, first, count in parts:
            if kernel == "mul_mat_cm2":
                spec = dict(spec, GROUP=int(group and buf[1] % 16 == 0))
            self.g.op(kernel, [buf, x, y], (-(-count // bm), -(-n // bn), slices),
                      wtype=wtype, spec=spec, n_in=n_in, n_out=count, n_tokens=n,
                      x_offset=x_offset, y_offset=first, y_stride=n_out, **split)
        if slices > 1 and self._sums is not None:
            self._sums.append((part, out, n * n_out, slices, accumulate))
        elif slices > 1:
            self._split_sum(part, out, n * n_out, slices, accumulate)
        else:
            self._wrote(y)

    def _split_sum(self, part: vk.Buffer, out: vk.Buffer, count: int, slices: int,
                   accumulate: bool) -> None:
        """out (+)= the sum of part's `slices` slices of `count` floats, in slice order."""
        self.g.op("split_sum", [part, out], _groups_1d(count, SPLIT_SUM_WG),
                  spec=dict(ACC=int(accumulate)), n=count, slices=slices)
        self._wrote(out)

    def predecodes(self, w: Tensor) -> bool:
        """Whether a prefill product of w reads it as f16 rows dequant_f16 makes
        (Paths.prefill_weights): the quantized types, where the paths say so."""
        return (self.paths().prefill_weights == "dequant_f16" and self.rs is not None
                and w.wtype in PREDECODE_TYPES)

    def _predecoded(self, w: Tensor):
        """w's rows as f16, a slice at a time: for each, dequant_f16 fills one of rs's two
        slice buffers (the other may still be read by the product before), then yields
        (that buffer, the slice's first row in w, its rows) for the product to read."""
        n_in = w.shape[0]
        pair, rows = self.rs.predecode_slices(self.t, n_in)
        for buf, first, count in w.bindings():
            for r0 in range(0, count, rows):
                m = min(rows, count - r0)
                out = pair[self._slice]
                self._slice ^= 1
                self.g.op("dequant_f16", [buf, out], _groups_1d(m * n_in // 8),
                          wtype=w.wtype, n_in=n_in, n_rows=m, row0=r0)
                yield out, first + r0, m

    def _matvec(self, w: Tensor, x: vk.Buffer, y: vk.Buffer, accumulate: bool,
                x_row: int, xform: int = 0, x2=None, eps: float = 0.0,
                int8: bool = True) -> None:
        """One token: mul_mat_vec, the activations rounded inside it (no quantize_act), or
        mul_mat_vecq's int8 activations where the device takes them and int8 allows.
        xform 1 or 2 fuses the op before (mul_mat_vec.comp's XFORM) with its input x2."""
        n_in = w.shape[0]
        if int8 and self.paths().decode_matmul == "mul_mat_vecq" \
                and self.t.matvecq_fits(w.wtype, n_in):
            self._matvecq(w, x, y, accumulate, x_row, xform, x2, eps)
            return
        act = MATVEC_ACT[w.wtype] if self.t.ggml_numerics else 0
        rows, lanes, mode = self.t.matvec_shape(w.wtype, w.rows, n_in // MATVEC_CHUNK[w.wtype])
        spec = dict(WG=lanes, ROWS=rows, ACC=int(accumulate), ACT=act, XFORM=xform,
                    MAP=mode if act == 0 else 0)
        for buf, first, count in w.bindings():
            self.g.op("mul_mat_vec", [buf, x, y, x if x2 is None else x2],
                      (-(-count // rows), 1, 1), wtype=w.wtype, spec=spec, n_in=n_in,
                      n_out=count, x_offset=x_row * n_in // 4, y_offset=first, eps=eps)
        self._wrote(y)

    def _matvecq(self, w: Tensor, x: vk.Buffer, y: vk.Buffer, accumulate: bool, x_row: int,
                 xform: int, x2, eps: float, bias: Tensor | None = None) -> None:
        """One token with x rounded to int8 in shared memory (mul_mat_vecq): each workgroup
        stages x (and the op before) once, then its subgroups walk row tiles."""
        for buf, first, count in w.bindings():
            self._vecq(w.wtype, w.shape[0], count, buf, x, y, dict(ACC=int(accumulate),
                       XFORM=xform), x2=x2, x_offset=x_row * w.shape[0] // 4, y_offset=first,
                       eps=eps, bias=bias)
        self._wrote(y)

    def _vecq(self, wtype: str, n_in: int, n_out: int, w, x, y, spec: dict, *, rows: int = 0,
              kmax: int = 0, slots: int = 1, x2=None, w2=None, table=None, ids=None,
              weights=None, bias: Tensor | None = None, bias2: Tensor | None = None,
              writes: tuple[int, ...] = (), bind: dict | None = None, **push) -> None:
        """One mul_mat_vecq dispatch of n_out rows: its shape from the tuning (rows, if
        given, overrides the rows a subgroup takes), `slots` workgroup rows (EXPERTS without
        SUM), each row's bias added where given (bias2: PAIR's second product's), the buffers
        a mode does not read bound to x; writes: the bindings beside y it writes (ROUTE,
        HNORM); bind: buffers for bindings by number (HNORM's), over the others."""
        lanes, tuned_rows, ahead, groups = self.t.matvecq_shape(wtype, n_out, n_in)
        rows = rows or tuned_rows
        tiles = -(-n_out // (rows * max(1, lanes // self.t.subgroup)))
        step = self.rs.step if self.rs is not None else x
        b1 = bias.binding() if bias is not None else x
        b2 = bias2.binding() if bias2 is not None else b1
        buffers = [w, x, y, x2 or x, w2 or w, step, table or x, ids or x, weights or x, b1, b2]
        for i, b in (bind or {}).items():
            buffers[i] = b
        self.g.op("mul_mat_vecq", buffers,
                  (min(tiles, groups) if groups else tiles, slots, 1), wtype=wtype,
                  writes=writes,
                  spec=dict(WG=lanes, ROWS=rows, KMAX=kmax or n_in, UNROLL=ahead,
                            BIAS=int(bias is not None), **spec),
                  n_in=n_in, n_out=n_out, **{**VECQ_PLAIN, "x_offset": 0, "y_offset": 0,
                                             "eps": 0.0, **push})

    def _fusing(self, n: int, ws: list[Tensor]) -> bool:
        """Whether one token's products over ws can take the op before them into their
        reading of x (mul_mat_vec's XFORM): not where ggml's rounding of x is asked for,
        which must see the op's output."""
        return (self._one(n) and self.t.fuse_decode and not self.t.ggml_numerics
                and self.paths().decode_matmul in ("mul_mat_vec", "mul_mat_vecq")
                and not any(any(w.skips()) for w in ws))

    def _vecq_whole(self, n: int, ws: list[Tensor]) -> bool:
        """Whether one token's products over ws can take mul_mat_vecq's fused modes: each
        weight a whole binding of a type it reads, x (a row's length) within its shared
        memory."""
        return (self._fusing(n, ws) and self.paths().decode_matmul == "mul_mat_vecq"
                and all(len(w.parts) == 1 and self.t.matvecq_fits(w.wtype, w.shape[0])
                        for w in ws))

    def _vecq_pair(self, n: int, gate: Tensor, up: Tensor) -> bool:
        """Whether gate and up can run as mul_mat_vecq's PAIR: whole bindings it reads, of
        one type and shape."""
        return (self._vecq_whole(n, [gate, up]) and gate.shape == up.shape
                and gate.wtype == up.wtype)

    def norm_matmuls(self, x: vk.Buffer, norm: Tensor, eps: float, xn: vk.Buffer, n: int,
                     products: list[tuple[Tensor, vk.Buffer]]) -> None:
        """xn = rms_norm(x) * norm, then y = xn @ w^T for each (w, y). For one token the
        norm goes into each product instead (xn is then left unwritten)."""
        if self._fusing(n, [w for w, _ in products]) and norm.wtype == "F32":
            for w, y in products:
                self._matvec(w, x, y, False, 0, xform=1, x2=norm.binding(), eps=eps)
            return
        self.rms_norm(x, norm, xn, n, eps)
        # the products read one x and write their own y: where K is split, their split_sums
        # go after all of them (Tuning.cm2_sums_after), so the products run side by side
        self._sums = [] if self.t.cm2_sums_after and len(products) > 1 else None
        try:
            for w, y in products:
                self.matmul(w, xn, y, n)
            sums = self._sums or []
        finally:
            self._sums = None
        for s in sums:
            self._split_sum(*s)

    def norm_qkv_rope(self, x: vk.Buffer, norm: Tensor, eps: float, n: int,
                      proj: list[Tensor], q: vk.Buffer, k_cache: vk.Buffer, v_cache: vk.Buffer,
                      n_head_kv: int, head_dim: int, rope: Rope, neox: bool,
                      biases: list[Tensor] | None = None,
                      head_norm: tuple[Tensor, Tensor, float, vk.Buffer] | None = None) -> bool:
        """One token's q, k and v from rms_norm(x) * norm (plus their biases, where given)
        with rope applied as the sums come out (mul_mat_vecq's ROPE): q into q, k and v as
        f16 into their caches' row for step.pos0, so no rope_qkv pass follows (True).
        head_norm (q's weight, k's, their epsilon, a scratch for k's sums): each head of q
        and k RMS-normed over itself before rope, by the subgroup that completes the head
        (HNORM), where Tuning.head_norm; else nothing is done (False). Only where one
        token's products take int8 activations and rope turns every dim of a head."""
        biases = biases or [None] * 3
        if not (self._vecq_whole(n, proj) and norm.wtype == "F32" and self.seqs == 0
                and rope.n_dims == head_dim
                and all(b is None or b.wtype == "F32" for b in biases)):
            return False
        if head_norm is not None and not (
                self.t.head_norm and biases == [None] * 3 and head_norm[2] == eps
                and head_norm[0].wtype == head_norm[1].wtype == "F32"):
            return False
        table = self.rs.rope_table(rope) if self.t.ggml_numerics or not rope.plain else None
        turn = 2 if neox else 1
        if head_norm is not None and not self._heads_counted:   # each replay from 0
            self.g.fill(self.rs.heads_done, 0)
            self._heads_counted = True
        n_head = proj[0].shape[1] // head_dim
        for w, y, mode, out16, bias, which in ((proj[0], q, turn, 0, biases[0], 0),
                                               (proj[1], k_cache, turn, 1, biases[1], 1),
                                               (proj[2], v_cache, 0, 1, biases[2], None)):
            (buf, first, count), = w.bindings()
            spec = dict(ACC=0, XFORM=1, ROPE=mode, TABLE=int(table is not None), OUT16=out16)
            extra: dict = dict(rows=2 if mode else 0)    # a subgroup takes a pair's two rows
            if head_norm is not None and which is not None:
                # the sums into y as they are (k's into the scratch), the head's end turns them
                counters = (self.rs.heads_done, 4 * n_head * which,
                            4 * (n_head_kv if which else n_head))
                spec.update(ROPE=0, HNORM=mode)
                extra = dict(bind={7: counters, 8: head_norm[which].binding(),
                                   9: y if out16 else x},
                             writes=(7, 9) if out16 else (7,))
                y = head_norm[3] if out16 else y
            self._vecq(w.wtype, w.shape[0], count, buf, x, y, spec,
                       x2=norm.binding(), table=table, y_offset=first, eps=eps, bias=bias,
                       head_dim=head_dim, freq_base=rope.base, freq_scale=rope.freq_scale,
                       kv_row=n_head_kv * head_dim, **extra)
            self._wrote(y)
        return True

    def experts_swiglu(self, xn: vk.Buffer, logits: vk.Buffer, ids: vk.Buffer,
                       weights: vk.Buffer, gate: Tensor, up: Tensor, down: Tensor,
                       glu: vk.Buffer, x: vk.Buffer, n: int, n_used: int,
                       biases: tuple[Tensor, Tensor, Tensor] | None = None,
                       clamped: bool = False, norm: tuple[Tensor, float] | None = None,
                       softmax_chosen: bool = False) -> bool:
        """One token's routed experts on int8 activations (mul_mat_vecq's EXPERTS): the
        router's choice from its logits (as moe_router makes it, into ids and weights; inside
        the first product where Tuning.route_experts), gate and up of each chosen expert
        paired into glu [n_used, n_ff] (SwiGLU, or gpt-oss's clamped form), then the experts'
        down products summed with the router's weights straight onto x (True); biases
        (gate's, up's, down's: [n_expert, rows] F32) added to each expert's sums; with norm
        (its weight and epsilon), xn is x before the norm, which goes into gate and up's
        reading of it. Only where the three take mul_mat_vecq whole (gate and up one binding
        each); else nothing is done."""
        n_in, n_ff, _ = gate.shape
        gb, ub, db = biases or (None, None, None)
        if not self._experts_fit(n, gate, up, down, n_used, biases):
            return False
        n_expert = gate.shape[2]
        route = self.t.route_experts
        if not route:
            self.moe_router(logits, ids, weights, n, n_expert, n_used,
                            softmax_chosen=softmax_chosen)
        self._vecq(gate.wtype, n_in, n_ff, gate.bindings()[0][0], xn, glu,
                   dict(ACC=0, PAIR=3 if clamped else 1, EXPERTS=n_used,
                        XFORM=int(norm is not None),
                        ROUTE=(3 if softmax_chosen else 1) if route else 0,
                        ROUTE_N=n_expert if route else 1), slots=n_used,
                   w2=up.bindings()[0][0], ids=ids, n_experts=n_expert, bias=gb, bias2=ub,
                   x2=norm[0].binding() if norm else None, eps=norm[1] if norm else 0.0,
                   table=logits if route else None, weights=weights if route else None,
                   writes=(7, 8) if route else ())
        self._wrote(glu)
        if route:
            self._wrote(ids)
            self._wrote(weights)
        per = down.shape[1]                          # rows of one expert: n_embd
        for buf, first, count in down.bindings():    # parts of whole experts
            self._vecq(down.wtype, n_ff, per, buf, glu, x, dict(ACC=1, EXPERTS=n_used, SUM=1),
                       kmax=n_used * n_ff, ids=ids, weights=weights,
                       expert_base=first // per, n_experts=count // per, bias=db)
        self._wrote(x)
        return True

    def _experts_fit(self, n: int, gate: Tensor, up: Tensor, down: Tensor, n_used: int,
                     biases) -> bool:
        """Whether one token's experts take mul_mat_vecq's EXPERTS (experts_swiglu)."""
        return (self._vecq_pair(n, gate, up) and self._fusing(n, [down])
                and self.t.matvecq_fits(down.wtype, n_used * gate.shape[1])   # down: parts
                and (biases is None or (all(b.wtype == "F32" for b in biases)
                                        and len(down.parts) == 1)))

    def experts_take_norm(self, n: int, norm: Tensor, router: Tensor, gate: Tensor,
                          up: Tensor, down: Tensor, n_used: int, biases=None) -> bool:
        """Whether the norm before a mixture of experts can go into the router's product
        and the experts' (one token on int8 activations), so no pass writes the normed x."""
        return (norm.wtype == "F32" and self._fusing(n, [router])
                and self._experts_fit(n, gate, up, down, n_used, biases))

    def norm_fuses(self, n: int, norm: Tensor, ws: list[Tensor]) -> bool:
        """Whether norm_matmuls puts the norm into the products over ws."""
        return self._fusing(n, ws) and norm.wtype == "F32"

    def norm_glu_fits(self, n: int, norm: Tensor, gate: Tensor, up: Tensor) -> bool:
        """Whether norm_glu makes the GLU in one pass."""
        return self._vecq_pair(n, gate, up) and norm.wtype == "F32"

    def norm_glu(self, x: vk.Buffer, norm: Tensor, eps: float, xn: vk.Buffer, n: int,
                 gate: Tensor, up: Tensor, gbuf: vk.Buffer, ubuf: vk.Buffer,
                 gelu: bool = False, gate_logit: vk.Buffer | None = None) -> bool:
        """A GLU's first half: act(rms_norm(x) * norm @ gate^T) * (... @ up^T), act silu
        (SwiGLU) or gelu's tanh form (GeGLU), into gbuf in one pass (mul_mat_vecq's PAIR)
        where one token's products take int8 activations and gate and up are whole bindings
        of one type (True); gate_logit: times sigmoid(its first value) too (GATED: a shared
        expert's gate). Else the two products into gbuf and ubuf as norm_matmuls makes
        them (False: the GLU, and the gate, still to come)."""
        if not self.norm_glu_fits(n, norm, gate, up):
            self.norm_matmuls(x, norm, eps, xn, n, [(gate, gbuf), (up, ubuf)])
            return False
        self._vecq(gate.wtype, gate.shape[0], gate.rows, gate.bindings()[0][0], x, gbuf,
                   dict(ACC=0, XFORM=1, PAIR=2 if gelu else 1, GATED=int(gate_logit is not None)),
                   x2=norm.binding(), w2=up.bindings()[0][0], eps=eps, weights=gate_logit)
        self._wrote(gbuf)
        return True

    def swiglu_matmul(self, w: Tensor, gate: vk.Buffer, up: vk.Buffer, y: vk.Buffer, n: int,
                      n_ff: int, accumulate: bool = True) -> None:
        """y (+)= (silu(gate) * up) @ w^T, the feed-forward's down product; gate is
        overwritten. For one token the GLU goes into the product."""
        if self._fusing(n, [w]):
            self._matvec(w, gate, y, accumulate, 0, xform=2, x2=up)
            return
        self.silu_mul(gate, up, gate, n * n_ff, rows=n, f16_only=self.reads_f16(w, n))
        self.matmul(w, gate, y, n, accumulate=accumulate)

    def matmul_id(self, w: Tensor, x: vk.Buffer, ids: vk.Buffer, y: vk.Buffer, n: int,
                  n_used: int, per_slot: bool = False) -> None:
        """y[t, j, :] = x[t (, j), :] @ w[ids[t, j]]^T for n tokens of n_used routed experts;
        w is [n_in, n_out, n_expert], x is [n, n_in] or, per_slot, [n, n_used, n_in].
        Several tokens: grouped by expert (Tuning.moe_grouped), each expert one product."""
        if not self._one(n) and self.paths().moe_prefill in ("mul_mat_moe", "mul_mat_moe_cm",
                                                             "mul_mat_moe_cm2"):
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
            self._tiled = None

    def moe_tiles(self, n_expert: int, bn: int) -> None:
        """rs.moe_groups' tile list for the grouped products' tiles of bn slots (moe_tiles),
        after moe_group; reused while the grouping and bn stay the same."""
        key = (self._grouped, bn)
        if self._tiled != key:
            self.g.op("moe_tiles", [self.rs.moe_groups], (1, 1, 1), n_expert=n_expert, bn=bn)
            self._tiled = key

    def _matmul_moe(self, w: Tensor, x: vk.Buffer, ids: vk.Buffer, y: vk.Buffer, n: int,
                    n_used: int, per_slot: bool) -> None:
        """The routed products grouped by expert: activations rounded as mul_mat_id rounds
        them (ggml_numerics), then one register-tiled product per expert over its slots."""
        n_in, n_out, n_expert = w.shape
        self.moe_group(ids, n, n_used, n_expert)
        if self.paths().moe_prefill in ("mul_mat_moe_cm", "mul_mat_moe_cm2") \
                and n_in % CM_K == 0:
            self._matmul_moe_cm(w, x, y, n, n_used, per_slot)
            return
        rows = self.t.mm_rows
        nt = moe_tile_slots(n, n_used, n_expert, self.t.mm_tokens)
        inline = ACT_INLINE.get(w.wtype, 0) if self.t.ggml_numerics else 0
        spec = dict(WG=self.t.subgroup * self.t.warps, ROWS=rows, NT=nt, ACT=inline,
                    X_SLOT=int(per_slot))
        fmt = ACT_FORMAT.get(w.wtype) if self.t.ggml_numerics and not inline else None
        if fmt is not None:
            x = self._rounded_input(x, 0, n * n_used if per_slot else n, n_in, fmt)
        self._moe_products("mul_mat_moe", w, x, y, n, n_used, rows * self.t.warps, nt, spec)

    def _moe_products(self, kernel: str, w: Tensor, x: vk.Buffer, y: vk.Buffer, n: int,
                      n_used: int, bm: int, bn: int, spec: dict) -> None:
        """One grouped product a part of W (whole experts): workgroups of bm rows over every
        tile of bn slots that moe_tiles lists for the part's experts (those past exit)."""
        n_in, n_out, n_expert = w.shape
        self.moe_tiles(n_expert, bn)
        rs = self.rs
        for buf, first, count in w.bindings():          # parts of whole experts
            experts = count // n_out
            self.g.op(kernel, [buf, x, rs.moe_groups, rs.moe_perm, y],
                      (-(-n_out // bm), moe_tiles_most(n, n_used, experts, bn), 1),
                      wtype=w.wtype, spec=spec, n_in=n_in, n_out=n_out, n_used=n_used,
                      expert_base=first // n_out, n_experts=experts, n_expert=n_expert)
        self._wrote(y)

    def _matmul_moe_cm(self, w: Tensor, x: vk.Buffer, y: vk.Buffer, n: int, n_used: int,
                       per_slot: bool) -> None:
        """The routed products grouped by expert on the matrix units, x in as f16 as
        mul_mat_cm takes it: mul_mat_moe_cm2's tiles of MOE_CM2_TILE (W decoded and x
        gathered inside the driver's tile loads) where the paths take NVIDIA's
        workgroup-scope matrices and the type has a decoder, else mul_mat_moe_cm's of
        MOE_CM_TILE (weight rows x slots)."""
        n_in, n_out, n_expert = w.shape
        rows = n * n_used if per_slot else n
        # x as f16 from a pass before (Tuning.cm2_x16), not turned so in the gather (the same
        # halves): one pass for gate and up, half the bytes each of their tiles reads
        x16 = self.t.cm2_x16 and 2 * rows * n_in <= self.rs.xq.nbytes
        if x16:
            x = self._f16_input(x, 0, rows, n_in)
        if self.paths().moe_prefill == "mul_mat_moe_cm2" and w.wtype in CM2_TYPES:
            bm, bn, wg = MOE_CM2_TILE
            kernel, spec = "mul_mat_moe_cm2", dict(WG=wg, BM=bm, BN=bn, X_SLOT=int(per_slot),
                                                   F16DEC=int(self.t.cm2_f16dec), X16=int(x16),
                                                   ACC16=int(self.t.cm2_acc16))
        else:
            bm, bn = MOE_CM_TILE
            kernel, spec = "mul_mat_moe_cm", dict(BM=bm, BN=bn, X_SLOT=int(per_slot),
                                                  X16=int(x16))
        self._moe_products(kernel, w, x, y, n, n_used, bm, bn, spec)

    def moe_router(self, logits: vk.Buffer, ids: vk.Buffer, weights: vk.Buffer, n: int,
                   n_expert: int, n_used: int, norm: bool = True,
                   softmax_chosen: bool = False) -> None:
        """Softmax over n_expert logits per token; the n_used largest into ids and weights.
        softmax_chosen (gpt-oss): the n_used largest logits, weighted by the softmax over
        them alone."""
        self.g.op("moe_router", [logits, ids, weights], (n, 1, 1),
                  spec=dict(NORM=int(norm), SOFTMAX_K=int(softmax_chosen)),
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
                 row_offset: int = 0, add: bool = False) -> None:
        """out = rms_norm(x) * w per row (add: out += that, as ggml's norm, mul, then add);
        as f16 too where the products after it load x so (_f16_beside)."""
        count = n * w.shape[0]
        f16 = row_offset == 0 and not add and self._f16_beside(n, count)
        self.g.op("rms_norm", [x, w.binding(), out, self.rs.xq if f16 else out], (n, 1, 1),
                  spec=dict(WG=self.t.norm_wg, ADD=int(add), OUT16=int(f16)),
                  writes=(3,) if f16 else (), n_cols=w.shape[0], n_rows=n, eps=eps,
                  x_offset=row_offset)
        if f16:
            self._made_f16(out, count)
        else:
            self._wrote(out)

    def layer_norm(self, x: vk.Buffer, w: Tensor, bias: Tensor, out: vk.Buffer, n: int,
                   eps: float) -> None:
        """out = (x - mean) / sqrt(var + eps) * w + bias per row (a vision encoder's
        LayerNorm; w and bias F32)."""
        self.g.op("layer_norm", [x, w.binding(), bias.binding(), out], (n, 1, 1),
                  spec=dict(WG=self.t.norm_wg), n_cols=w.shape[0], n_rows=n, eps=eps)
        self._wrote(out)

    def gelu(self, x: vk.Buffer, out: vk.Buffer, count: int) -> None:
        """out = gelu(x), tanh form (ggml_gelu)."""
        self.g.op("silu_mul", [x, x, out, out], _groups_1d(count),
                  spec=dict(GELU=1, CLAMPED=0, GATED=0), n=count)
        self._wrote(out)

    def pool2d(self, x: vk.Buffer, out: vk.Buffer, n_cols: int, side: int, k: int) -> None:
        """out = the k x k average pooling of x, a side x side grid of tokens of n_cols values
        (token y * side + x), into (side / k)^2 tokens."""
        if side % k:
            raise ValueError(f"a grid of {side} tokens a side does not pool by {k}")
        self.g.op("pool2d", [x, out], _groups_1d((side // k) ** 2 * n_cols), spec=dict(K=k),
                  n_cols=n_cols, side=side)
        self._wrote(out)

    def kv_store(self, k: vk.Buffer, v: vk.Buffer, k_cache: vk.Buffer, v_cache: vk.Buffer,
                 n_head_kv: int, head_dim: int, n: int) -> None:
        """k and v into the f16 K and V caches at step.pos0, unrotated: rope_qkv with no
        query heads and a rotation by angle 0 (freq_scale 0 makes every angle 0, and cos 0
        = 1, sin 0 = 0 leave each value as it is)."""
        self.g.op("rope_qkv", [k, k, v, k_cache, v_cache, self.rs.step, k, k, k],
                  (-(-(n * n_head_kv * (1 + head_dim)) // 64), 1, 1),
                  spec=dict(NEOX=0, TABLE=0, TEMP=0, SEQS=0, NORM=0, WG=64),
                  n_head=0, n_head_kv=n_head_kv, head_dim=head_dim, n_dims=2, n_tokens=n,
                  freq_base=1.0, freq_scale=0.0, temp_scale=0.0, temp_floor=1, eps=0.0)

    def rope_qkv(self, q: vk.Buffer, k: vk.Buffer, v: vk.Buffer, k_cache: vk.Buffer,
                 v_cache: vk.Buffer, n_head: int, n_head_kv: int, head_dim: int, n: int,
                 rope: Rope, neox: bool, temp_scale: float = 0.0, temp_floor: int = 0,
                 head_norm: tuple[Tensor, Tensor, float] | None = None) -> None:
        """rope(q) in place, rope(k) into the K cache and v into the V cache, at step.pos0
        (with seqs, each token at its slot less step.seq_first: its own sequence's position).
        head_norm (q's weight, k's, eps) RMS-norms each head of q and k first, in the same
        pass (a workgroup a head).
        The angles come from the rope's table (engine/gpu/rope.py) where ggml's numerics are
        asked for or the rope is scaled; else the kernel computes them. With temp_scale,
        q is then multiplied by 1 + temp_scale * ln(1 + floor(pos / temp_floor)) (Llama 4's
        attention temperature, as mistral3 has it). A run state whose positions are not its
        slots (`positioned`: M-RoPE after an image, a vision encoder's 2-D rope) has its
        table written for each pass: the kernel always reads it."""
        table = self.t.ggml_numerics or not rope.plain or getattr(self.rs, "positioned", False)
        n_dims = rope.n_dims
        count = n * ((n_head + n_head_kv) * n_dims // 2 + n_head_kv * head_dim)
        temp = bool(temp_scale)
        if temp and temp_floor <= 0:
            raise ValueError(f"attention temperature: floor scale {temp_floor}")
        if head_norm is None:
            norms, eps, wg, groups = [q, q], 0.0, 64, (-(-count // 64), 1, 1)
        else:               # a head a workgroup of rms_norm's lanes (its sums' order)
            norms, eps = [head_norm[0].binding(), head_norm[1].binding()], head_norm[2]
            wg = self.t.norm_wg
            groups = (n_head + n_head_kv + -(-(n_head_kv * head_dim) // wg), n, 1)
        self.g.op("rope_qkv", [q, k, v, k_cache, v_cache, self.rs.step,
                               self.rs.rope_table(rope) if table else q, *norms],
                  groups, spec=dict(NEOX=int(neox), TABLE=int(table), TEMP=int(temp),
                                    SEQS=self.seqs, NORM=int(head_norm is not None), WG=wg),
                  n_head=n_head, n_head_kv=n_head_kv, head_dim=head_dim, n_dims=n_dims,
                  n_tokens=n, freq_base=rope.base, freq_scale=rope.freq_scale,
                  temp_scale=temp_scale, temp_floor=max(temp_floor, 1), eps=eps)
        self._wrote(q)

    def attention(self, q: vk.Buffer, k_cache: vk.Buffer, v_cache: vk.Buffer, out: vk.Buffer,
                  n_head: int, n_head_kv: int, head_dim: int, n: int, scale: float,
                  window: int = 0, softcap: float = 0.0, sinks: Tensor | None = None) -> None:
        """out[n, n_head, head_dim] = softmax(q k^T * scale) v over the cache up to each
        token's position (the last `window` positions only, when window > 0; with seqs, none
        before the token's sequence: every prefill path honours it). Options, on
        every path: softcap > 0 caps the scaled scores at softcap * tanh(s / softcap)
        (gemma2); sinks [n_head] F32 join each head's softmax as one more logit (gpt-oss)."""
        p = self.paths(head_dim)
        if sinks is not None and (sinks.wtype != "F32" or sinks.shape != (n_head,)):
            raise ValueError(f"attention sinks must be F32 [{n_head}], got {sinks.wtype} "
                             f"{list(sinks.shape)}")
        # the sinks buffer, or (SINKS = 0) any buffer to fill the binding
        sk = sinks.binding() if sinks is not None else q
        opt = dict(softcap=float(softcap))
        spec = dict(SINKS=int(sinks is not None))
        kernel = p.decode_attention if self._one(n) else p.prefill_attention
        if kernel in ("attn_decode", "attn_split"):
            if self.seqs:
                raise ValueError("a pass of packed sequences has more than one token")
            self._split_attention(q, k_cache, v_cache, out, n_head, n_head_kv, head_dim,
                                  scale, window, sk, opt, spec, kernel)
        elif kernel == "flash_attn_cm2":
            br, bc, wg = self.t.fa_cm2_tile
            self.g.op("flash_attn_cm2", [q, k_cache, v_cache, out, self.rs.step, sk],
                      (-(-n // br), n_head, 1),
                      spec=dict(WG=wg, HD=head_dim, BR=br, BC=bc, SEQS=self.seqs, **spec),
                      n_head=n_head, n_head_kv=n_head_kv, n_tokens=n, window=window,
                      scale=scale, **opt)
        elif kernel == "flash_attn_cm":
            self.g.op("flash_attn_cm", [q, k_cache, v_cache, out, self.rs.step, sk],
                      (-(-n // 64), n_head, 1), spec=dict(HD=head_dim, SEQS=self.seqs, **spec),
                      n_head=n_head,
                      n_head_kv=n_head_kv, n_tokens=n, window=window, scale=scale, **opt)
        elif kernel == "flash_attn":
            self._flash_attention(q, k_cache, v_cache, out, n_head, n_head_kv, head_dim, n,
                                  scale, window, sk, opt, spec)
        else:
            ggml = self.t.ggml_numerics
            self.g.op("attention", [q, k_cache, v_cache, out, self.rs.step, sk],
                      (n_head, n, 1),
                      spec=dict(HD=head_dim, GGML=int(ggml), SEQS=self.seqs, **spec),
                      n_head=n_head, n_head_kv=n_head_kv, n_tokens=n, window=window,
                      scale=scale, **opt)
        self._wrote(out)

    def _split_attention(self, q, k_cache, v_cache, out, n_head, n_head_kv, head_dim, scale,
                         window, sk, opt, spec, kernel: str) -> None:
        rs = self.rs
        heads = self.t.decode_group(head_dim, n_head, n_head_kv) \
            if kernel == "attn_decode" else 1
        splits = self.t.decode_splits(rs.n_ctx, n_head // heads)
        if kernel == "attn_decode":   # one pass
            if not self._counted:     # each replay starts from 0, whatever came before it
                self.g.fill(rs.split_done, 0)
                self._counted = True
            self.g.op("attn_decode", [q, k_cache, v_cache, rs.split_stats, rs.split_out,
                                     rs.step, sk, out, rs.split_done],
                      (splits, n_head // heads, 1),
                      spec=dict(WG=self.t.decode_lanes(head_dim), HD=head_dim,
                                LP=self.t.attn_lanes(head_dim), QH=heads,
                                AHEAD=int(self.t.decode_ahead), **spec),
                      n_head=n_head, n_head_kv=n_head_kv, window=window, n_split=splits,
                      min_chunk=self.t.split_chunk, scale=scale, **opt)
            return
        bufs = [q, k_cache, v_cache, rs.scores, rs.split_stats, rs.split_out, rs.step, sk]
        for pass_ in (0, 1):
            self.g.op("attn_split", bufs, (splits, n_head, 1),
                      spec=dict(WG=64, HD=head_dim, LP=self.t.attn_lanes(head_dim),
                                PASS=pass_, **spec),
                      n_head=n_head, n_head_kv=n_head_kv, n_ctx=rs.n_ctx, window=window,
                      n_split=splits, min_chunk=self.t.split_chunk, scale=scale, **opt)
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
                      (stride // cols, -(-n // rows), 1),
                      spec=dict(WG=64, BR=rows, BC=cols, SEQS=self.seqs),
                      n_tokens=n, stride=stride, window=window)
            self._masks.add(window)
        return mask, tiles

    def _flash_attention(self, q, k_cache, v_cache, out, n_head, n_head_kv, head_dim, n,
                         scale, window, sk, opt, spec) -> None:
        mask, tiles = self.attention_mask(n, window)
        rows, cols = self.rs.flash_block
        lanes = self.t.attn_lanes(head_dim)
        self.g.op("flash_attn", [q, k_cache, v_cache, out, mask, tiles, self.rs.step, sk],
                  (-(-n // rows), n_head, 1),
                  spec=dict(WG=rows * lanes, HD=head_dim, BR=rows, BC=cols, LP=lanes,
                            GGML=int(self.t.ggml_numerics), SKIP=int(self.t.flash_skip),
                            **spec),
                  n_head=n_head, n_head_kv=n_head_kv, n_tokens=n,
                  stride=-(-self.rs.n_ctx // cols) * cols, scale=scale, **opt)

    def silu_mul(self, gate: vk.Buffer, up: vk.Buffer, out: vk.Buffer, count: int,
                 gelu: bool = False, clamped: bool = False, rows: int = 0,
                 f16_only: bool = False) -> None:
        """out = act(gate) * up: SiLU, GELU (gelu), or gpt-oss's clamped SwiGLU (clamped).
        rows: the pass's tokens, where a product of the output follows (as f16 too where it
        loads x so: _f16_beside); f16_only: then as f16 alone, out's f32 values left as they
        were (that product is out's only reader)."""
        f16 = rows > 0 and self._f16_beside(rows, count)
        v4 = count % 4 == 0
        lanes = count // 4 if v4 else count          # a lane's four values, or one
        self.g.op("silu_mul", [gate, up, out, self.rs.xq if f16 else out], _groups_1d(lanes),
                  spec=dict(GELU=int(gelu), CLAMPED=int(clamped),
                            OUT16=(2 if f16_only else 1) if f16 else 0, V4=int(v4)),
                  writes=(3,) if f16 else (), n=lanes)
        if f16:
            self._made_f16(out, count)
        else:
            self._wrote(out)

    def add_id(self, x: vk.Buffer, bias: Tensor, ids: vk.Buffer, rows: int) -> None:
        """x[r, :] += bias[:, ids[r]] in place for rows r: bias is [n_cols, n_ids] F32 (one row
        per expert), ids one u32 per row (gpt-oss's expert biases: rows are (token, slot))."""
        if bias.wtype != "F32" or len(bias.shape) != 2:
            raise ValueError(f"add_id takes a 2-D F32 bias, got {bias.wtype} {list(bias.shape)}")
        n_cols = bias.shape[0]
        self.g.op("add_id", [x, bias.binding(), ids, x], _groups_1d(rows * n_cols),
                  n_cols=n_cols, n=rows * n_cols)
        self._wrote(x)

    def softcap(self, x: vk.Buffer, count: int, cap: float) -> None:
        """x = cap * tanh(x / cap) in place (gemma2's final logit soft-capping)."""
        self.g.op("softcap", [x], _groups_1d(count), n=count, cap=float(cap))
        self._wrote(x)

    def add(self, a: vk.Buffer, b: vk.Buffer, out: vk.Buffer, count: int,
            scale: float = 1.0) -> None:
        """out = a + scale * b (the product rounded first, as ggml's scale then add)."""
        self.g.op("add", [a, b, out], _groups_1d(count), n=count, b_len=count, scale=scale)
        self._wrote(out)

    def scale(self, x: vk.Buffer, count: int, scale: float) -> None:
        """x *= scale, in place."""
        self.g.op("scale", [x], _groups_1d(count), n=count, scale=scale)
        self._wrote(x)

    def add_bias(self, x: vk.Buffer, bias: Tensor, n: int) -> None:
        """x[n, len(bias)] += bias, in place (the biases of qwen2's, phi3's and gpt-oss's
        projections; GGUF keeps them in F32)."""
        if bias.wtype != "F32":
            raise ValueError(f"a bias must be F32, got {bias.wtype}")
        width = bias.shape[0]
        self.g.op("add", [x, bias.binding(), x], _groups_1d(n * width), n=n * width,
                  b_len=width, scale=1.0)
        self._wrote(x)

    def argmax(self, x: vk.Buffer, out: vk.Buffer, count: int) -> None:
        self.g.op("argmax", [x, out], (1, 1, 1), spec=dict(WG=self.t.reduce_wg(count)), n=count,
                  x_offset=0)

    def logprobs(self, x: vk.Buffer, out: vk.Buffer, count: int, k: int,
                 out_offset: int = 0) -> None:
        """out[out_offset:] = lse, the k best of x[:count] as log-probabilities, their ids
        (shaders/logprobs.comp)."""
        self.g.op("logprobs", [x, out], (1, 1, 1), spec=dict(WG=self.t.reduce_wg(count)),
                  n=count, x_offset=0, k=k, o_offset=out_offset)

    def mul(self, a: View, b: View, out: vk.Buffer, sigmoid: bool = False) -> None:
        """out[r, i] = a[r, i] * b[r, i] over 2-D row views; out contiguous. b may hold one
        value per row (its dim-0 stride 0), for every i; sigmoid: times sigmoid(b) instead
        (a gate)."""
        (n_cols, n_rows, _), (a0, a_stride, _), (b0, b_stride, _) = a.ne, a.strides, b.strides
        if a0 != 1 or b0 not in (0, 1) or b.ne[:2] != a.ne[:2]:
            raise ValueError("mul takes two row views of one shape")
        self.g.op("mul", [a.buf, b.buf, out], (-(-n_cols // 64), n_rows, 1),
                  spec=dict(SIGMOID=int(sigmoid), BCAST=int(b0 == 0)), n_cols=n_cols,
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

    # -- gated delta-net layers (qwen3next, qwen35, qwen35moe) ----------------------------------

    def delta_conv(self, x: vk.Buffer, w: Tensor, state: vk.Buffer, out: vk.Buffer, n: int,
                   heads: "DeltaHeads", eps: float) -> None:
        """out[n, conv_dim] = silu(causal conv of x[n, conv_dim] after the conv state), with the
        q and k heads (the first 2 n_head_k head_dim channels) L2-normed: x / sqrt(sum x^2 +
        eps). w [conv_dim, width] F32 (GGUF ssm_conv1d, ggml shape (width, conv_dim)); state
        [conv_dim, width - 1] moves on by n inputs in place. conv_dim = heads.conv_dim."""
        width, n_channels = w.shape
        hd = heads.head_dim
        if w.wtype != "F32" or n_channels != heads.conv_dim or hd > 4 * DELTA_CONV_WG:
            raise ValueError(f"delta conv: kernel {w.wtype} {list(w.shape)} for "
                             f"{heads.conv_dim} channels of heads of {hd}")
        tb = max(16, width - 1)         # the first token block alone reads the state
        self.g.op("delta_conv", [x, w.binding(), state, out], (n_channels // hd, -(-n // tb), 1),
                  spec=dict(WG=DELTA_CONV_WG, TB=tb), n_channels=n_channels, n_tokens=n,
                  width=width, head_dim=hd, n_norm=2 * heads.n_head_k * hd, eps=eps)
        self._wrote(state)
        self._wrote(out)

    def delta_net(self, qkv: vk.Buffer, gates: "DeltaGates", dt_bias: Tensor, ssm_a: Tensor,
                  state: vk.Buffer, out: vk.Buffer, n: int, heads: "DeltaHeads",
                  chunked: bool | None = None) -> None:
        """The gated delta rule over n tokens: out[n, n_head, head_dim] from qkv[n, conv_dim]
        (delta_conv's output: q | k | v), the gates' raw projections and the layer's ssm_dt
        bias and ssm_a (F32 [n_head]); state [n_head, head_dim (v), head_dim (k)] f32 read
        and written in place. Token by token (delta_net) for one token, where
        Tuning.delta_chunk is 0, or chunked=False; else by chunks of Tuning.delta_chunk
        tokens (delta_chunk_prep, delta_chunk, with rs.delta_scratch), equal within f32
        rounding."""
        hd = heads.head_dim
        for t in (dt_bias, ssm_a):
            if t.wtype != "F32" or t.shape != (heads.n_head,):
                raise ValueError(f"delta net: gate tensor {t.wtype} {list(t.shape)}, expected "
                                 f"F32 [{heads.n_head}]")
        if chunked is None:
            chunked = n > 1 and self.t.delta_chunk > 0
        common = dict(n_head=heads.n_head, n_head_k=heads.n_head_k, tiled=int(heads.tiled),
                      n_tokens=n, qkv_stride=heads.conv_dim, k_offset=heads.k_offset,
                      scale=1.0 / math.sqrt(hd))
        gate_push = dict(gate_stride=gates.stride, gate_group=gates.group,
                         beta_offset=gates.beta_offset, alpha_offset=gates.alpha_offset)
        gate_bufs = [gates.beta, gates.alpha, dt_bias.binding(), ssm_a.binding()]
        if not chunked:
            lanes = min(self.t.subgroup, hd)
            cols = max(1, min(hd, 128 // lanes))
            if hd % lanes or hd % cols:
                raise ValueError(f"delta net: head dim {hd} for {lanes} lanes per column")
            self.g.op("delta_net", [qkv, *gate_bufs, state, out], (heads.n_head, hd // cols, 1),
                      spec=dict(WG=lanes * cols, L=lanes, HD=hd), v_offset=heads.v_offset,
                      **common, **gate_push)
        else:
            # value columns per workgroup: its shared state slice, k and q tiles fit 32 KiB
            c, jb = self.t.delta_chunk, min(DELTA_COLUMNS if hd <= 128 else 8, hd)
            if hd % jb or not 0 < c <= DELTA_PREP_WG or c % DELTA_TILE:
                raise ValueError(f"delta net: head dim {hd}, chunk {c}")
            scratch = self.rs.delta_scratch
            need = delta_scratch_floats(heads.n_head, n, c)
            if 4 * need > scratch.nbytes:
                raise ValueError(f"delta net: {n} tokens need {4 * need} scratch bytes, "
                                 f"the run state has {scratch.nbytes}")
            self.g.op("delta_chunk_prep", [qkv, *gate_bufs, scratch],
                      (heads.n_head, -(-n // c), 1),
                      spec=dict(WG=DELTA_PREP_WG, C=c, HD=hd, DT=16), **common, **gate_push)
            self.g.op("delta_chunk", [qkv, scratch, state, out], (heads.n_head, hd // jb, 1),
                      spec=dict(WG=DELTA_CHUNK_WG, C=c, HD=hd, JB=jb, TT=DELTA_TILE),
                      v_offset=heads.v_offset, **common)
        self._wrote(state)
        self._wrote(out)

    def norm_gated(self, x: vk.Buffer, w: Tensor, z: vk.Buffer, out: vk.Buffer, rows: int,
                   eps: float) -> None:
        """out[r] = rms_norm(x[r]) * w * silu(z[r]) for rows of len(w) (a delta-net layer's
        output: rows are (token, v head), w its ssm_norm)."""
        self.g.op("norm_gated", [x, w.binding(), z, out], _groups_1d(rows, 1),
                  spec=dict(WG=self.t.norm_wg if w.shape[0] >= self.t.norm_wg
                            else self.t.subgroup), n_cols=w.shape[0], n_rows=rows, eps=eps)
        self._wrote(out)


DELTA_CONV_WG = 64          # delta_conv's lanes: heads of up to 4 x 64 channels
DELTA_PREP_WG = 256         # delta_chunk_prep's lanes: at least a chunk's tokens
DELTA_CHUNK_WG = 128        # delta_chunk's lanes
DELTA_COLUMNS = 16          # delta_chunk's value columns per workgroup (8 past 128 dims)
DELTA_TILE = 8              # delta_chunk's tokens per shared tile of k and q


@dataclass(frozen=True)
class DeltaHeads:
    """A gated delta-net layer's heads: n_head value heads of head_dim reading n_head_k key
    heads (GGUF ssm.time_step_rank, ssm.group_count, ssm.state_size). Value head h reads key
    head h % n_head_k where tiled (qwen35, qwen35moe: llama.cpp repeats the k heads whole),
    else h // (n_head // n_head_k) (qwen3next: each k head repeated in place). The conv
    channels, and delta_conv's output rows, are q [n_head_k, head_dim] | k [n_head_k,
    head_dim] | v [n_head, head_dim]."""
    n_head: int
    n_head_k: int
    head_dim: int
    tiled: bool

    def __post_init__(self):
        if self.n_head_k <= 0 or self.n_head % self.n_head_k:
            raise ValueError(f"delta net: {self.n_head} value heads over {self.n_head_k} "
                             "key heads")

    @property
    def k_offset(self) -> int:
        return self.n_head_k * self.head_dim

    @property
    def v_offset(self) -> int:
        return 2 * self.n_head_k * self.head_dim

    @property
    def conv_dim(self) -> int:
        return (2 * self.n_head_k + self.n_head) * self.head_dim


@dataclass(frozen=True)
class DeltaGates:
    """Where the delta rule's raw gate projections sit: per token, `stride` floats; value head
    h's beta input at beta_offset + (h // r) * group + h % r (r = n_head // n_head_k), its
    alpha input likewise from alpha_offset. beta and alpha may be one buffer."""
    beta: vk.Buffer
    alpha: vk.Buffer
    stride: int
    group: int
    beta_offset: int = 0
    alpha_offset: int = 0

    @classmethod
    def separate(cls, beta: vk.Buffer, alpha: vk.Buffer, heads: DeltaHeads) -> "DeltaGates":
        """qwen35: ssm_beta and ssm_alpha projected apart, each [n, n_head]."""
        r = heads.n_head // heads.n_head_k
        return cls(beta, alpha, heads.n_head, r)

    @classmethod
    def fused(cls, ba: vk.Buffer, heads: DeltaHeads) -> "DeltaGates":
        """qwen3next: ssm_beta_alpha's one projection [n, 2 n_head], per key head its r betas
        then its r alphas."""
        r = heads.n_head // heads.n_head_k
        return cls(ba, ba, 2 * heads.n_head, 2 * r, 0, r)


def moe_tile_slots(n: int, n_used: int, n_expert: int, nt_max: int) -> int:
    """Slots per token tile of mul_mat_moe: the smallest power of two, at most nt_max, that
    holds an expert's share of an even routing (a short chunk's tiles would otherwise be
    mostly padding, computed all the same)."""
    nt = nt_max
    while nt > 1 and (nt // 2) * n_expert >= n * n_used:
        nt //= 2
    return nt


def moe_tiles_most(n: int, n_used: int, n_expert: int, nt: int) -> int:
    """The most tiles of nt slots that n tokens, each routed to n_used distinct experts, make
    among n_expert of them: an expert's c slots make ceil(c / nt) <= (c + nt - 1) / nt, at
    most min(n_expert, slots) experts have any, and none more than n tokens."""
    slots = n * min(n_used, n_expert)
    return max(1, min((slots + (nt - 1) * min(n_expert, slots)) // nt, n_expert * -(-n // nt)))


def _groups_1d(count: int, wg: int = 64) -> tuple[int, int, int]:
    groups = -(-count // wg)
    if groups <= 65535:
        return (groups, 1, 1)
    return (65535, -(-groups // 65535), 1)
