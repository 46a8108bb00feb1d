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
from . import blocks, config
from ..gpu.builder import Builder
from ..gpu.rope import Rope
from ..gpu.runstate import Extra, RunState
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
        e = self.n_embd
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
                shapes.update(self.attention_shapes(i, qk_norm="head", norm=False))
            shapes.update(self.ffn_shapes(i))
        return shapes

    def attn_windows(self) -> tuple[int, ...]:
        return (self.window,)

    def rope_tables(self) -> tuple[Rope, ...]:
        return (self.rope,) if self.kv_layers else ()

    def state(self) -> Extra:
        """K and V on the attention layers only; a conv state on the others."""
        return Extra(kv_layers=self.kv_layers, conv_layers=self.conv_layers, d_conv=self.d_conv)

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
        if i in c.conv_layers:
            # short convolution, as llama.cpp builds it
            b.rms_norm(x, w[p + "attn_norm.weight"], rs.xn, n, c.rms_eps)
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
            blocks.attention(b, c, rs, i, n, c.rope, neox=True, scale=c.head_dim ** -0.5,
                             window=c.window, qk_norm="head")
        blocks.ffn(b, c, rs, i, n)
    blocks.head(b, c, rs, n, norm="token_embd_norm")           # its output norm
