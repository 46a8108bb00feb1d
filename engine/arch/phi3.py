"""The phi3 architecture (Phi-3, Phi-3.5 and Phi-4 mini GGUFs), as llama.cpp defines it.

Llama's graph with two fused weights: `attn_qkv` holds the Q, K and V rows in that order,
`ffn_up` the gate rows then the up rows. Each product runs on a row slice of the fused
weight where it lies (Tensor.row_slice: no copy). NeoX rope (halves rotated). LongRoPE:
the rope's per-pair frequency factors are `rope_factors_long` when the context (padded to
256, as llama.cpp pads it) exceeds the rope's original context, else `rope_factors_short`,
with the file's attention factor; so the rope depends on the context size (`at_context`).
phi3.cpp reads a sliding window but runs every layer global, and so does this.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from ..formats.gguf_file import GGUFFile
from . import config
from .llama import unread_biases
from ..gpu.builder import Builder
from ..gpu.rope import Rope
from ..gpu.runstate import RunState

CTX_PAD = 256            # llama_context pads the context to this before choosing factors


@dataclass(frozen=True)
class Config(config.Config):
    rope_short: Rope           # LongRoPE's two ropes; `rope` is the one in use
    rope_long: Rope
    unread: tuple[str, ...]    # bias tensors in the file (this graph adds none)

    LONGROPE = True

    @classmethod
    def extra(cls, g: GGUFFile, common: dict) -> dict:
        args = (g, common["rope_base"], common["rope_dims"], common["n_ctx_train"])
        short = config.rope_from_gguf(*args, "rope_factors_short.weight")
        return dict(rope=short, rope_short=short,
                    rope_long=config.rope_from_gguf(*args, "rope_factors_long.weight"),
                    unread=unread_biases(g, ()))

    def at_context(self, n_ctx: int) -> "Config":
        """With the long factors past the original context, else the short ones."""
        long = -(-n_ctx // CTX_PAD) * CTX_PAD > self.rope_long.n_ctx_orig
        return replace(self, rope=self.rope_long if long else self.rope_short)

    def problems(self) -> list[str]:
        return [f"bias tensors this graph does not add ({', '.join(self.unread)})"] \
            if self.unread else []

    def tensor_shapes(self) -> dict[str, tuple[int, ...]]:
        """Every tensor the forward pass reads, with its ggml shape (row length first)."""
        e, hd = self.n_embd, self.head_dim
        shapes = self.io_shapes()
        for i in range(self.n_layer):
            b = f"blk.{i}."
            shapes.update({
                b + "attn_norm.weight": (e,),
                b + "attn_qkv.weight": (e, (self.n_head + 2 * self.n_head_kv) * hd),
                b + "attn_output.weight": (self.n_head * hd, e),
                b + "ffn_norm.weight": (e,),
                b + "ffn_up.weight": (e, 2 * self.n_ff),
                b + "ffn_down.weight": (self.n_ff, e),
            })
        return shapes


def rope_tables(c: Config) -> tuple[Rope, ...]:
    """Every rope the layers use; RunState precomputes their angles."""
    return (c.rope,)


def attn_windows(c: Config) -> tuple[int, ...]:
    """The sliding windows of the attention layers (0: full causal); one mask each."""
    return (0,)


def forward(b: Builder, c: Config, rs: RunState, n: int) -> None:
    """Tokens rs.ids[:n] at positions step.pos0.. -> logits of the last token in rs.logits."""
    w = b.weights
    nq, nkv = c.n_head * c.head_dim, c.n_head_kv * c.head_dim
    x = rs.x                                                   # [n, n_embd] residual stream
    b.get_rows(w["token_embd.weight"], rs.ids, x, n)
    for i in range(c.n_layer):
        p = f"blk.{i}."
        # attention: Q | K | V rows of one weight
        b.rms_norm(x, w[p + "attn_norm.weight"], rs.xn, n, c.rms_eps)
        qkv = w[p + "attn_qkv.weight"]
        b.matmul(qkv.row_slice(0, nq), rs.xn, rs.q, n)         # [n, n_head * head_dim]
        b.matmul(qkv.row_slice(nq, nq + nkv), rs.xn, rs.k, n)  # [n, n_head_kv * head_dim]
        b.matmul(qkv.row_slice(nq + nkv, nq + 2 * nkv), rs.xn, rs.v, n)
        b.rope_qkv(rs.q, rs.k, rs.v, rs.k_cache[i], rs.v_cache[i], c.n_head, c.n_head_kv,
                   c.head_dim, n, c.rope, neox=True)
        b.attention(rs.q, rs.k_cache[i], rs.v_cache[i], rs.att, c.n_head, c.n_head_kv,
                    c.head_dim, n, scale=c.head_dim ** -0.5)  # [n, n_head * head_dim]
        b.matmul(w[p + "attn_output.weight"], rs.att, x, n, accumulate=True)
        # feed-forward: gate | up rows of one weight
        b.rms_norm(x, w[p + "ffn_norm.weight"], rs.xn, n, c.rms_eps)
        up = w[p + "ffn_up.weight"]
        b.matmul(up.row_slice(0, c.n_ff), rs.xn, rs.gate, n)   # [n, n_ff]
        b.matmul(up.row_slice(c.n_ff, 2 * c.n_ff), rs.xn, rs.up, n)   # [n, n_ff]
        b.silu_mul(rs.gate, rs.up, rs.gate, n * c.n_ff)
        b.matmul(w[p + "ffn_down.weight"], rs.gate, x, n, accumulate=True)
    # only the last token's logits are needed
    b.rms_norm(x, w["output_norm.weight"], rs.xn, 1, c.rms_eps, row_offset=n - 1)
    head = w["token_embd.weight" if c.tied_output else "output.weight"]
    b.matmul(head, rs.xn, rs.logits, 1, x_row=n - 1)           # [1, n_vocab]
