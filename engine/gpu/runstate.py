"""The state a forward pass runs on: `RunState` holds the preallocated activations, the KV
cache, recurrent states and the small host-visible buffers for per-step values."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from . import vk
from .paths import CM2_WIDE_TILE, MAX_SPLITS
from .rope import Rope, rope_table

DELTA_CHUNK = 64    # the longest chunk (Tuning.delta_chunk) the delta rule's scratch is sized for
TOP_LOGPROBS = 20                      # the most alternatives per token (OpenAI's limit;
                                       # shaders/logprobs.comp's TOP_MAX)
LOGPROB_WORDS = 1 + 2 * TOP_LOGPROBS   # what the logprobs pass writes: lse, values, ids
PREDECODE_ROWS = 256   # a slice of predecoded rows: a multiple of the largest tile's rows


def delta_scratch_floats(n_head: int, n_tokens: int, chunk: int) -> int:
    """delta_chunk_prep's scratch for n_tokens: per value head and chunk T, M [chunk, chunk]
    and the gates G, beta [chunk]."""
    return n_head * -(-n_tokens // chunk) * (2 * chunk * chunk + 2 * chunk)



class RunState:
    """Activations for up to `max_tokens` tokens per pass, and an f16 KV cache of n_ctx.

    With experts (n_expert > 0) the feed-forward buffers hold n_expert_used slots per token
    (n_ff is then one expert's), beside the router's logits and choices.

    Attention scratch: per-split scores, maxima and outputs of decode attention, and with
    `flash_block` = (rows, cols) one prefill mask and tile classes per sliding window in
    `windows` (0: full causal), for flash attention.

    Gated delta-net layers (`delta_layers`: qwen3next, qwen35): per layer a conv state
    [delta_conv_dim, delta_width - 1] (in `conv_state`, beside lfm2's) and a delta-rule state
    [delta_heads, delta_head_dim, delta_head_dim] (`delta_state`); activations for them, and
    the chunked delta rule's scratch. Both states are "recurrent" device bytes; residency
    captures them through `recurrent_states()`.

    `q_gate`: the q projection gives per head [q | gate] (qwen3next, qwen35: `qg`, twice q).
    `n_ff_shexp`: a shared expert of that length beside the routed ones (`sh_gate`, `sh_up`,
    and its gate's logit per token `sh_w`).
    """

    def __init__(self, dev: vk.Device, label: str, *, n_layer: int, n_embd: int, n_head: int,
                 q_dim: int, kv_dim: int, n_ff: int, n_vocab: int, n_ctx: int, max_tokens: int,
                 kv_layers: list[int] | None = None,
                 rope: tuple[Rope, ...] = (),
                 conv_layers: tuple[int, ...] = (), d_conv: int = 0, n_expert: int = 0,
                 n_expert_used: int = 0, windows: tuple[int, ...] = (0,),
                 flash_block: tuple[int, int] | None = None,
                 delta_layers: tuple[int, ...] = (), delta_conv_dim: int = 0,
                 delta_width: int = 0, delta_heads: int = 0, delta_head_dim: int = 0,
                 q_gate: bool = False, n_ff_shexp: int = 0, positioned: bool = False):
        self.dev, self.n_ctx, self.max_tokens = dev, n_ctx, max_tokens
        self.n_embd, self.label = n_embd, label
        # the slots' positions are not theirs (M-RoPE after an image): rope_qkv reads the
        # rope table, whose rows the model writes for each pass (host-visible tables)
        self.positioned = positioned
        self.embd_in: vk.Buffer | None = None    # [T, n_embd] an image's rows (embd_input)
        self.split_part: list[vk.Buffer] = []   # split K's partial sums (split_partials)
        # predecoded weights' two slices of f16 rows (predecode_slices)
        self.predecoded_a: vk.Buffer | None = None
        self.predecoded_b: vk.Buffer | None = None
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
        d_inner = delta_heads * delta_head_dim          # a delta-net layer's value dims
        k_max = max(n_embd, q_dim, n_ff, d_inner)
        self.k_max = k_max                           # the longest row a product reads
        self.xq = act("xq", S * k_max)               # [S, k_max] rounded activations
        if n_expert:
            self.router = act("router", T * n_expert)               # [T, n_expert] logits
            self.expert_ids = alloc(4 * S, f"{label}/expert_ids", "compute")   # [T, used] u32
            self.expert_w = act("expert_w", S)                      # [T, n_expert_used]
            self.moe_out = act("moe_out", S * n_embd)               # [T, n_expert_used, n_embd]
            # slots grouped by expert (moe_group): (offset, count) per expert; then their
            # tiles (moe_tiles): a start per expert and the list, at most one a slot and a
            # partial one an expert
            self.moe_groups = alloc(4 * moe_groups_words(n_expert, S), f"{label}/moe_groups",
                                    "compute")
            self.moe_perm = alloc(4 * S, f"{label}/moe_perm", "compute")           # [S] u32
        self.scores = act("scores", n_head * n_ctx)  # [n_head, n_ctx] decode attention
        self.split_stats = act("split_stats", 2 * n_head * MAX_SPLITS)  # [n_head, splits, 2]
        self.split_out = act("split_out", MAX_SPLITS * q_dim)  # [n_head, splits, head_dim]
        # [n_head] u32: attn_decode's splits done this token; 0 between tokens
        self.split_done = alloc(4 * max(n_head, 1), f"{label}/split_done", "compute")
        # [2 * n_head] u32: q's heads, then k's, that mul_mat_vecq's HNORM has ended; 0 between
        self.heads_done = alloc(8 * max(n_head, 1), f"{label}/heads_done", "compute")
        with vk.Uploader(dev, staging_bytes=4096) as up:
            up.write(self.split_done, np.zeros(self.split_done.nbytes, np.uint8))
            up.write(self.heads_done, np.zeros(self.heads_done.nbytes, np.uint8))
        self.flash_block = flash_block
        self.masks: dict[int, tuple[vk.Buffer, vk.Buffer]] = {}   # window -> (mask, classes)
        if flash_block:
            rows, cols = _mask_shape(T, n_ctx, flash_block)
            for w in windows:
                self.masks[w] = (alloc(2 * rows * cols, f"{label}/mask{w}", "compute"),
                                 act(f"mask{w}_tiles", _tiles(rows, cols, flash_block)))
        self.rope_tables: dict[Rope, vk.Buffer] = {}
        self.ids = alloc(4 * T, f"{label}/ids", "compute", host=True)        # [T] token ids
        # pos0, n_past, then per token the first slot of its sequence (packed passes)
        self.step = alloc(16 + 4 * T, f"{label}/step", "compute", host=True)
        # the argmax or the logits, then the logprobs pass's words (lse, top values, top ids)
        self.result = alloc(4 * (n_vocab + LOGPROB_WORDS), f"{label}/result", "compute",
                            host=True)
        layers = kv_layers if kv_layers is not None else list(range(n_layer))
        self.k_cache = {i: alloc(2 * n_ctx * kv_dim, f"{label}/k_cache.{i}", "kv")
                        for i in layers}             # [n_ctx, n_head_kv, head_dim] f16
        self.v_cache = {i: alloc(2 * n_ctx * kv_dim, f"{label}/v_cache.{i}", "kv")
                        for i in layers}
        # short-convolution layers: per channel the last d_conv inputs (ggml's conv state)
        self.conv_state = {i: alloc(4 * d_conv * n_embd, f"{label}/conv_state.{i}", "recurrent")
                           for i in conv_layers}         # [n_embd, d_conv] f32
        # gated delta-net layers: the conv state [conv_dim, width - 1] and the delta-rule state
        # [n_head, head_dim (v), head_dim (k)] (include/delta.glsl's layout), both f32
        d_state = delta_heads * delta_head_dim * delta_head_dim
        for i in delta_layers:
            self.conv_state[i] = alloc(4 * delta_conv_dim * (delta_width - 1),
                                       f"{label}/conv_state.{i}", "recurrent")
        self.delta_state = {i: alloc(4 * d_state, f"{label}/delta_state.{i}", "recurrent")
                            for i in delta_layers}
        if delta_layers:
            self.dn_qkv = act("dn_qkv", T * delta_conv_dim)      # [T, conv_dim] q | k | v
            self.dn_conv = act("dn_conv", T * delta_conv_dim)    # [T, conv_dim] conv, normed
            self.dn_z = act("dn_z", T * d_inner)                 # [T, n_head * head_dim] gate z
            self.dn_ba = act("dn_ba", T * 2 * delta_heads)       # [T, 2 n_head] beta (| alpha)
            self.dn_alpha = act("dn_alpha", T * delta_heads)     # [T, n_head] alpha (qwen35)
            self.dn_out = act("dn_out", T * d_inner)             # [T, n_head, head_dim]
            self.delta_scratch = act("delta_scratch",
                                     delta_scratch_floats(delta_heads, T, DELTA_CHUNK))
        if conv_layers:
            self.bcx = act("bcx", T * 3 * n_embd)        # [T, 3 * n_embd] B | C | x
            self.bx = act("bx", T * n_embd)              # [T, n_embd] B * x
            self.conv_x = act("conv_x", n_embd * (d_conv + T))   # [n_embd, d_conv + T]
            self.conv = act("conv", T * n_embd)          # [T, n_embd] conv output, then C * it
        if q_gate:
            self.qg = act("qg", T * 2 * q_dim)           # [T, n_head, 2 * head_dim] q | gate
        if n_ff_shexp:
            self.sh_gate = act("sh_gate", T * n_ff_shexp)    # [T, n_ff_shexp]
            self.sh_up = act("sh_up", T * n_ff_shexp)
            self.sh_w = act("sh_w", T)                       # [T] the shared expert's gate
        for r in rope:
            self.rope_table(r)

    def rope_table(self, rope: Rope) -> vk.Buffer:
        """(cos, sin) for every position and pair (engine/gpu/rope.py), on the device; host-
        visible where the run state is `positioned` (its rows written for each pass:
        M-RoPE, engine/vision/positions.py)."""
        key = rope
        if key not in self.rope_tables:
            table = rope_table(self.n_ctx, rope)
            buf = self.dev.allocator.alloc(table.nbytes, f"rope{rope.base:g}", "compute",
                                           host=self.positioned)
            with vk.Uploader(self.dev, staging_bytes=table.nbytes) as up:
                up.write(buf, table)
            self.rope_tables[key] = buf
        return self.rope_tables[key]

    def set_positioned(self) -> None:
        """From now on the rope tables' rows are written for each pass (M-RoPE): those made
        before, device-local where the device is discrete, go and are made again host-
        visible (graphs that bound them must be dropped first)."""
        self.positioned = True
        for buf in self.rope_tables.values():
            self.dev.allocator.free(buf)
        self.rope_tables.clear()

    @staticmethod
    def bytes_for(*, n_layer: int, n_embd: int, n_head: int, q_dim: int, kv_dim: int,
                  n_ff: int, n_vocab: int, n_ctx: int, max_tokens: int, kv_layers=None,
                  rope: tuple[Rope, ...] = (), conv_layers: tuple[int, ...] = (),
                  d_conv: int = 0, n_expert: int = 0, n_expert_used: int = 0,
                  windows: tuple[int, ...] = (0,),
                  flash_block: tuple[int, int] | None = None,
                  delta_layers: tuple[int, ...] = (), delta_conv_dim: int = 0,
                  delta_width: int = 0, delta_heads: int = 0, delta_head_dim: int = 0,
                  q_gate: bool = False, n_ff_shexp: int = 0) -> int:
        """What the constructor allocates, without allocating (for the arbiter)."""
        T = max_tokens
        S = T * max(n_expert_used, 1)
        d_inner = delta_heads * delta_head_dim
        k_max = max(n_embd, q_dim, n_ff, d_inner)
        floats = T * (2 * n_embd + 2 * q_dim + 2 * kv_dim) + 2 * S * n_ff + n_vocab
        floats += S * k_max + sum(n_ctx * r.n_dims for r in rope)
        if n_expert:
            floats += T * n_expert + 2 * S + S * n_embd      # router, ids, weights, moe_out
            floats += moe_groups_words(n_expert, S) + S      # moe_groups, moe_perm
        if conv_layers:
            floats += len(conv_layers) * d_conv * n_embd + T * 5 * n_embd
            floats += n_embd * (d_conv + T)
        if delta_layers:
            floats += RunState.recurrent_bytes(
                conv_layers=(), d_conv=0, n_embd=0, delta_layers=delta_layers,
                delta_conv_dim=delta_conv_dim, delta_width=delta_width,
                delta_heads=delta_heads, delta_head_dim=delta_head_dim) // 4
            floats += T * (2 * delta_conv_dim + 2 * d_inner + 3 * delta_heads)
            floats += delta_scratch_floats(delta_heads, T, DELTA_CHUNK)
        floats += n_head * n_ctx + 2 * n_head * MAX_SPLITS + MAX_SPLITS * q_dim
        floats += 3 * max(n_head, 1)                         # split_done, heads_done (u32)
        floats += T * 2 * q_dim * int(q_gate) + (T * (2 * n_ff_shexp + 1) if n_ff_shexp else 0)
        mask = 0
        if flash_block:
            rows, cols = _mask_shape(T, n_ctx, flash_block)
            mask = len(windows) * (2 * rows * cols + 4 * _tiles(rows, cols, flash_block))
        host = 4 * T + 16 + 4 * T + 4 * (n_vocab + LOGPROB_WORDS)
        layers = n_layer if kv_layers is None else len(kv_layers)
        return 4 * floats + mask + host + 2 * 2 * n_ctx * kv_dim * layers

    @staticmethod
    def recurrent_bytes(*, conv_layers: tuple[int, ...] = (), d_conv: int = 0, n_embd: int = 0,
                        delta_layers: tuple[int, ...] = (), delta_conv_dim: int = 0,
                        delta_width: int = 0, delta_heads: int = 0, delta_head_dim: int = 0,
                        **_) -> int:
        """Bytes of the recurrent states (what a release copies to the host), from the
        constructor's arguments."""
        per_delta = delta_conv_dim * (delta_width - 1) + delta_heads * delta_head_dim ** 2
        return 4 * (len(conv_layers) * d_conv * n_embd + len(delta_layers) * per_delta)

    def recurrent_states(self) -> dict[str, vk.Buffer]:
        """Every recurrent state by a stable key ("conv.3", "delta.3"): read-write buffers
        that residency copies out on release and back on restore."""
        out = {f"conv.{i}": b for i, b in sorted(self.conv_state.items())}
        out.update((f"delta.{i}", b) for i, b in sorted(self.delta_state.items()))
        return out

    def capture_recurrent(self) -> dict[str, np.ndarray]:
        """A host copy of every recurrent state, by recurrent_states()' keys (one submit)."""
        states = self.recurrent_states()
        if not states:
            return {}
        return dict(zip(states, vk.download_many(self.dev, [(b, b.nbytes)
                                                            for b in states.values()])))

    def restore_recurrent(self, copies: dict[str, np.ndarray]) -> int:
        """Write capture_recurrent()'s copies back; bytes moved."""
        states = self.recurrent_states()
        if set(states) != set(copies):
            raise RuntimeError(f"recurrent states {sorted(copies)} do not fit this run state's "
                               f"{sorted(states)}")
        if not states:
            return 0
        with vk.Uploader(self.dev, staging_bytes=max(4096, sum(
                c.nbytes for c in copies.values()))) as up:
            for key, buf in states.items():
                up.write(buf, copies[key])
            return up.bytes

    def set_step(self, token_ids, pos0: int, seq_first=None, bidir: bool = False) -> None:
        """The pass's token ids and first slot; seq_first, for a pass of packed sequences
        (graphs recorded with SEQS = 1), the slot where each token's sequence starts;
        bidir: the pass's tokens see each other both ways (an image's embeddings)."""
        ids = np.asarray(token_ids, np.uint32)
        self.ids.write(ids)
        self.step.write(np.array([pos0, pos0 + len(ids), int(bidir), 0], np.uint32))
        if seq_first is not None:
            first = np.asarray(seq_first, np.uint32)
            if len(first) != len(ids):
                raise ValueError(f"{len(first)} sequence starts for {len(ids)} tokens")
            self.step.write(first, 16)

    def embd_input(self) -> vk.Buffer:
        """The host-visible rows a pass of embeddings reads instead of token ids (an image's
        soft tokens), [max_tokens, n_embd] f32: made on first use."""
        if self.embd_in is None:
            self.embd_in = self.dev.allocator.alloc(4 * self.max_tokens * self.n_embd,
                                                    f"{self.label}/embd_in", "compute",
                                                    host=True)
        return self.embd_in

    def split_partials(self, tuning, i: int = 0) -> vk.Buffer:
        """The i-th buffer of partial sums of the prefill products whose K is split
        (mul_mat_cm2's k_split), made on first use: room for the most Tuning.cm2_k_split
        gives, slices x tiles of at most two per compute unit, each tile's rows x tokens.
        Products recorded side by side take one each (Builder.norm_matmuls)."""
        while len(self.split_part) <= i:
            floats = 2 * max(tuning.compute_units, 1) * max(
                bm * bn for bm, bn, _ in (tuning.cm2_tile, CM2_WIDE_TILE))
            self.split_part.append(self.dev.allocator.alloc(
                4 * floats, f"{self.label}/split_part{len(self.split_part)}", "compute"))
        return self.split_part[i]

    def predecode_slices(self, tuning, n_in: int) -> tuple[tuple[vk.Buffer, vk.Buffer], int]:
        """The two buffers of f16 weight rows that prefill products read where their weights
        are decoded once a pass (Tuning.predecode), made on first use at predecode_mib each
        (or PREDECODE_ROWS rows of the longest row), and the rows a slice takes at rows of
        n_in weights: a multiple of PREDECODE_ROWS, so the tiles of a slice are whole."""
        if self.predecoded_a is None:
            nbytes = max(tuning.predecode_mib << 20, 2 * PREDECODE_ROWS * self.k_max)
            self.predecoded_a, self.predecoded_b = (
                self.dev.allocator.alloc(nbytes, f"{self.label}/predecoded_{s}", "compute")
                for s in "ab")
        rows = self.predecoded_a.nbytes // (2 * n_in) // PREDECODE_ROWS * PREDECODE_ROWS
        return (self.predecoded_a, self.predecoded_b), rows

    def reset_recurrent(self) -> None:
        """Zero every recurrent state: a sequence starting at position 0 has no past."""
        states = list(self.recurrent_states().values())
        if not states:
            return
        with vk.Uploader(self.dev, staging_bytes=max(4096, max(b.nbytes for b in states))) as up:
            for buf in states:
                up.write(buf, np.zeros(buf.nbytes, np.uint8))

    def buffers(self) -> list[vk.Buffer]:
        return [b for b in vars(self).values() if isinstance(b, vk.Buffer)] + \
            list(self.k_cache.values()) + list(self.v_cache.values()) + \
            list(self.conv_state.values()) + list(self.delta_state.values()) + \
            list(self.rope_tables.values()) + self.split_part + \
            [b for pair in self.masks.values() for b in pair]

    def close(self) -> None:
        for b in self.buffers():
            self.dev.allocator.free(b)


@dataclass(frozen=True)
class Extra:
    """What an architecture's Config declares (`state()`) beyond what every model has (a KV
    cache on every layer, llama's activations): RunState allocates from it, by these names.

    kv_layers: the attention layers (None: every layer); conv_layers of d_conv inputs over
    n_embd channels (lfm2's short convolutions); experts (n_ff is then one expert's) and a
    shared expert of n_ff_shexp; q_gate: the q projection gives per head q | gate; gated
    delta-net layers with their conv (delta_conv_dim channels, delta_width taps) and a state
    of delta_heads matrices of delta_head_dim squared."""
    kv_layers: tuple[int, ...] | None = None
    conv_layers: tuple[int, ...] = ()
    d_conv: int = 0
    n_expert: int = 0
    n_expert_used: int = 0
    n_ff_shexp: int = 0
    q_gate: bool = False
    delta_layers: tuple[int, ...] = ()
    delta_conv_dim: int = 0
    delta_width: int = 0
    delta_heads: int = 0
    delta_head_dim: int = 0


def run_state_args(c, n_ctx: int, max_tokens: int, rope: tuple = (), windows: tuple = (0,),
                   flash_block: tuple[int, int] | None = None) -> dict:
    """RunState's sizes for a model config (engine/arch/config.py's): the common shapes, and
    what its `state()` declares beyond them."""
    return dict(n_layer=c.n_layer, n_embd=c.n_embd, n_head=c.n_head,
                q_dim=c.n_head * c.head_dim, kv_dim=c.n_head_kv * c.head_dim, n_ff=c.n_ff,
                n_vocab=c.n_vocab, n_ctx=n_ctx, max_tokens=max_tokens, rope=rope,
                windows=windows, flash_block=flash_block,
                **dataclasses.asdict(c.state()))


def _mask_shape(max_tokens: int, n_ctx: int, block: tuple[int, int]) -> tuple[int, int]:
    """(rows, columns) of a flash-attention mask: whole tiles."""
    rows, cols = block
    return -(-max_tokens // rows) * rows, -(-n_ctx // cols) * cols


def _tiles(rows: int, cols: int, block: tuple[int, int]) -> int:
    return (rows // block[0]) * (cols // block[1])


def moe_groups_words(n_expert: int, n_slots: int) -> int:
    """u32s of moe_group's and moe_tiles' buffer (shaders/moe_tiles.comp's layout): (offset,
    count) and a first tile per expert, all tiles, and the list of at most n_slots +
    n_expert tiles."""
    return 3 * n_expert + 1 + n_slots + n_expert
