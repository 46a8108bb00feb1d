"""The lfm2 architecture (Liquid LFM2), a hybrid of short convolutions and attention, as
llama.cpp defines it in GGUF (src/models/lfm2.cpp).

`attention.head_count_kv` is an array: layers with zero KV heads are short-convolution
blocks, the others attention blocks. A short-convolution block projects the normed input to
three chunks B, C and x, runs B * x through a causal depthwise convolution of length
`shortconv.l_cache` whose state is the previous l_cache - 1 inputs of each channel, and
projects C * conv back. Attention blocks have per-head RMS norms on q and k and NeoX rope.
Every layer ends in a SwiGLU feed-forward. The final norm is stored as `token_embd_norm`.

The conv state is recurrent: it lives in RunState.conv_state and is updated inside the
recorded graph, so one state belongs to the end of the tokens run so far.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..formats.gguf_file import GGUFFile
from . import config
from ..gpu.builder import Builder
from ..gpu.rope import Rope
from ..gpu.runstate import RunState
from ..gpu.tensors import View


@dataclass(frozen=True)
class Config(config.Config):
    d_conv: int                    # conv state length: l_cache - 1
    window: int                    # sliding window of the attention layers; 0: none
    kv_layers: tuple[int, ...]     # attention layers (n_head_kv: theirs)
    conv_layers: tuple[int, ...]   # short-convolution layers
    head_counts_kv: tuple[int, ...]

    DEFAULTS = {"context_length": 128000, "rope.freq_base": 10000.0,
                "attention.layer_norm_rms_epsilon": None}

    @classmethod
    def extra(cls, g: GGUFFile, common: dict) -> dict:
        a = g.arch
        kv = g.require(f"{a}.attention.head_count_kv")
        kv = tuple(int(k) for k in kv) if isinstance(kv, (list, tuple)) \
            else (int(kv),) * common["n_layer"]
        attn = tuple(i for i, k in enumerate(kv) if k > 0)
        return dict(
            n_head_kv=max(kv, default=0) if attn else common["n_head"],
            n_vocab=g.tensor("token_embd.weight").shape[1],
            d_conv=int(g.require(f"{a}.shortconv.l_cache")) - 1,
            window=int(g.get(f"{a}.attention.sliding_window", 0) or 0),
            kv_layers=attn,
            conv_layers=tuple(i for i, k in enumerate(kv) if k == 0),
            head_counts_kv=kv,
        )

    def tensor_shapes(self) -> dict[str, tuple[int, ...]]:
        """Every tensor the forward pass reads, with its ggml shape (row length first)."""
        e, hd = self.n_embd, self.head_dim
        shapes = {"token_embd.weight": (e, self.n_vocab), "token_embd_norm.weight": (e,)}
        if not self.tied_output:
            shapes["output.weight"] = (e, self.n_vocab)
        for i in range(self.n_layer):
            b = f"blk.{i}."
            shapes[b + "attn_norm.weight"] = (e,)
            if i in self.conv_layers:
                shapes.update({
                    b + "shortconv.in_proj.weight": (e, 3 * e),
                    b + "shortconv.conv.weight": (self.d_conv + 1, e),
                    b + "shortconv.out_proj.weight": (e, e),
                })
            else:
                shapes.update({
                    b + "attn_q.weight": (e, self.n_head * hd),
                    b + "attn_k.weight": (e, self.n_head_kv * hd),
                    b + "attn_v.weight": (e, self.n_head_kv * hd),
                    b + "attn_q_norm.weight": (hd,),
                    b + "attn_k_norm.weight": (hd,),
                    b + "attn_output.weight": (self.n_head * hd, e),
                })
            shapes.update({
                b + "ffn_norm.weight": (e,),
                b + "ffn_gate.weight": (e, self.n_ff),
                b + "ffn_up.weight": (e, self.n_ff),
                b + "ffn_down.weight": (self.n_ff, e),
            })
        return shapes

    def tensor_types(self) -> dict[str, tuple[str, ...]]:
        """Tensors that only some weight types can hold: ssm_conv reads its kernel as f32."""
        return {f"blk.{i}.shortconv.conv.weight": ("F32",) for i in self.conv_layers}

    def problems(self) -> list[str]:
        extra = []
        if len(self.head_counts_kv) != self.n_layer:
            extra.append(f"head_count_kv has {len(self.head_counts_kv)} entries for "
                         f"{self.n_layer} layers")
        if len({self.head_counts_kv[i] for i in self.kv_layers}) > 1:
            extra.append("attention layers with different KV head counts")
        if not 1 <= self.d_conv <= 64:
            extra.append(f"shortconv.l_cache {self.d_conv + 1}")
        return extra


def attn_windows(c: Config) -> tuple[int, ...]:
    """The sliding windows of the attention layers (0: full causal); one mask each."""
    return (c.window,)


def rope_tables(c: Config) -> tuple[Rope, ...]:
    """Every rope the layers use; RunState precomputes their angles."""
    return (c.rope,) if c.kv_layers else ()


def forward(b: Builder, c: Config, rs: RunState, n: int) -> None:
    """Tokens rs.ids[:n] at positions step.pos0.. -> logits of the last token in rs.logits;
    the conv states move on by n inputs."""
    w = b.weights
    e, row = c.n_embd, c.d_conv + n

    def chunk(k: int) -> View:      # B, C or x of in_proj's output: [n, n_embd] rows
        return View(rs.bcx, (e, n, 1), (1, 3 * e, 3 * e * n), k * e)

    x = rs.x                                                   # [n, n_embd] residual stream
    b.get_rows(w["token_embd.weight"], rs.ids, x, n)
    for i in range(c.n_layer):
        p = f"blk.{i}."
        b.rms_norm(x, w[p + "attn_norm.weight"], rs.xn, n, c.rms_eps)
        if i in c.conv_layers:
            # short convolution, as llama.cpp builds it
            b.matmul(w[p + "shortconv.in_proj.weight"], rs.xn, rs.bcx, n)  # [n, 3 * n_embd]
            b.mul(chunk(0), chunk(2), rs.bx)                   # [n, n_embd] B * x
            state = View(rs.conv_state[i], (c.d_conv, e, 1))   # [n_embd, d_conv]
            b.concat(state, View(rs.bx, (e, n, 1)).T, rs.conv_x)   # [n_embd, d_conv + n]
            # the last d_conv inputs of each channel are the next state
            b.cpy(View(rs.conv_x, (c.d_conv, e, 1), (1, row, row * e), n), state)
            b.ssm_conv(rs.conv_x, w[p + "shortconv.conv.weight"], rs.conv, n)  # [n, n_embd]
            b.mul(chunk(1), View(rs.conv, (e, n, 1)), rs.conv)  # [n, n_embd] C * conv
            b.matmul(w[p + "shortconv.out_proj.weight"], rs.conv, x, n, accumulate=True)
        else:
            # attention
            b.matmul(w[p + "attn_q.weight"], rs.xn, rs.q, n)   # [n, n_head, head_dim]
            b.matmul(w[p + "attn_k.weight"], rs.xn, rs.k, n)   # [n, n_head_kv, head_dim]
            b.matmul(w[p + "attn_v.weight"], rs.xn, rs.v, n)   # [n, n_head_kv, head_dim]
            b.rms_norm(rs.q, w[p + "attn_q_norm.weight"], rs.q, n * c.n_head, c.rms_eps)
            b.rms_norm(rs.k, w[p + "attn_k_norm.weight"], rs.k, n * c.n_head_kv, c.rms_eps)
            b.rope_qkv(rs.q, rs.k, rs.v, rs.k_cache[i], rs.v_cache[i], c.n_head, c.n_head_kv,
                       c.head_dim, n, c.rope, neox=True)
            b.attention(rs.q, rs.k_cache[i], rs.v_cache[i], rs.att, c.n_head, c.n_head_kv,
                        c.head_dim, n, scale=c.head_dim ** -0.5, window=c.window)
            b.matmul(w[p + "attn_output.weight"], rs.att, x, n, accumulate=True)
        # feed-forward
        b.rms_norm(x, w[p + "ffn_norm.weight"], rs.xn, n, c.rms_eps)
        b.matmul(w[p + "ffn_gate.weight"], rs.xn, rs.gate, n)  # [n, n_ff]
        b.matmul(w[p + "ffn_up.weight"], rs.xn, rs.up, n)      # [n, n_ff]
        b.silu_mul(rs.gate, rs.up, rs.gate, n * c.n_ff)
        b.matmul(w[p + "ffn_down.weight"], rs.gate, x, n, accumulate=True)
    # only the last token's logits are needed
    b.rms_norm(x, w["token_embd_norm.weight"], rs.xn, 1, c.rms_eps, row_offset=n - 1)
    head = w["token_embd.weight" if c.tied_output else "output.weight"]
    b.matmul(head, rs.xn, rs.logits, 1, x_row=n - 1)           # [1, n_vocab]
