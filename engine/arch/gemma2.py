"""The gemma2 architecture (Gemma 2 text models), as llama.cpp defines it in GGUF.

As gemma3 without Q/K norms: embeddings scaled by sqrt(n_embd), post-attention and
post-feed-forward norms before each residual add, GELU (tanh) gating, NeoX-style rope. Its
own: attention logits soft-capped at `attn_logit_softcapping` (cap * tanh(s / cap), on the
scaled scores) and the final logits at `final_logit_softcapping`; sliding-window attention on
alternate layers (`attention.sliding_window_pattern`, 2 by default: layers 0, 2, ... slide),
their rope base `rope.freq_base_swa`; Q scaled by 1/sqrt(head_dim), except in the 27B (46
layers), which llama.cpp scales by 1/sqrt(n_embd / n_head). GGUF norm weights already hold
Gemma's (1 + w), so they are used as stored.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ..formats.gguf_file import GGUFFile
from . import config
from ..gpu.builder import Builder
from ..gpu.rope import Rope
from ..gpu.runstate import RunState


@dataclass(frozen=True)
class Config(config.Config):
    window: int                # sliding window of the local layers, in tokens
    swa_layers: tuple[bool, ...]
    rope_base_local: float     # sliding-window layers (rope_base: global layers)
    attn_scale: float
    attn_softcap: float        # 0: none
    final_softcap: float       # 0: none

    DEFAULTS = {"context_length": 8192, "rope.freq_base": 10000.0,
                "attention.layer_norm_rms_epsilon": 1e-6}

    @classmethod
    def extra(cls, g: GGUFFile, common: dict) -> dict:
        a, n_layer = g.arch, common["n_layer"]
        per_head = common["n_embd"] // common["n_head"] if n_layer == 46 else common["head_dim"]
        return dict(
            window=int(g.get(f"{a}.attention.sliding_window", 4096)),
            swa_layers=config.swa_layers(g, n_layer),
            rope_base_local=float(g.get(f"{a}.rope.freq_base_swa", common["rope_base"])),
            attn_scale=per_head ** -0.5,
            attn_softcap=float(g.get(f"{a}.attn_logit_softcapping", 50.0) or 0.0),
            final_softcap=float(g.get(f"{a}.final_logit_softcapping", 30.0) or 0.0),
        )

    def is_local(self, layer: int) -> bool:
        return self.swa_layers[layer]

    def tensor_shapes(self) -> dict[str, tuple[int, ...]]:
        """Every tensor the forward pass reads, with its ggml shape (row length first)."""
        e = self.n_embd
        shapes = self.io_shapes()
        for i in range(self.n_layer):
            b = f"blk.{i}."
            shapes.update({
                **self.attention_shapes(i),
                b + "post_attention_norm.weight": (e,),
                b + "ffn_norm.weight": (e,),
                b + "ffn_gate.weight": (e, self.n_ff),
                b + "ffn_up.weight": (e, self.n_ff),
                b + "ffn_down.weight": (self.n_ff, e),
                b + "post_ffw_norm.weight": (e,),
            })
        return shapes


def local_rope(c: Config) -> Rope:
    """The sliding-window layers' rope: the file's scaling, their own base."""
    return dataclasses.replace(c.rope, base=c.rope_base_local)


def rope_tables(c: Config) -> tuple[Rope, ...]:
    """Every rope the layers use; RunState precomputes their angles."""
    return tuple({local_rope(c) if c.is_local(i) else c.rope: None
                  for i in range(c.n_layer)})


def attn_windows(c: Config) -> tuple[int, ...]:
    """The sliding windows of the attention layers (0: full causal); one mask each."""
    return tuple(sorted({c.window if c.is_local(i) else 0 for i in range(c.n_layer)}))


def forward(b: Builder, c: Config, rs: RunState, n: int) -> None:
    """Tokens rs.ids[:n] at positions step.pos0.. -> logits of the last token in rs.logits."""
    w = b.weights
    x = rs.x                                                   # [n, n_embd] residual stream
    b.get_rows(w["token_embd.weight"], rs.ids, x, n, scale=c.n_embd ** 0.5)
    for i in range(c.n_layer):
        p = f"blk.{i}."
        local = c.is_local(i)
        # attention, soft-capped; the local layers slide, with their own rope base
        b.rms_norm(x, w[p + "attn_norm.weight"], rs.xn, n, c.rms_eps)
        b.matmul(w[p + "attn_q.weight"], rs.xn, rs.q, n)       # [n, n_head, head_dim]
        b.matmul(w[p + "attn_k.weight"], rs.xn, rs.k, n)       # [n, n_head_kv, head_dim]
        b.matmul(w[p + "attn_v.weight"], rs.xn, rs.v, n)       # [n, n_head_kv, head_dim]
        b.rope_qkv(rs.q, rs.k, rs.v, rs.k_cache[i], rs.v_cache[i], c.n_head, c.n_head_kv,
                   c.head_dim, n, local_rope(c) if local else c.rope, neox=True)
        b.attention(rs.q, rs.k_cache[i], rs.v_cache[i], rs.att, c.n_head, c.n_head_kv,
                    c.head_dim, n, scale=c.attn_scale, window=c.window if local else 0,
                    softcap=c.attn_softcap)                    # [n, n_head * head_dim]
        b.matmul(w[p + "attn_output.weight"], rs.att, rs.xn, n)   # [n, n_embd]
        b.rms_norm(rs.xn, w[p + "post_attention_norm.weight"], rs.xn, n, c.rms_eps)
        b.add(x, rs.xn, x, n * c.n_embd)
        # feed-forward
        b.rms_norm(x, w[p + "ffn_norm.weight"], rs.xn, n, c.rms_eps)
        b.matmul(w[p + "ffn_gate.weight"], rs.xn, rs.gate, n)  # [n, n_ff]
        b.matmul(w[p + "ffn_up.weight"], rs.xn, rs.up, n)      # [n, n_ff]
        b.silu_mul(rs.gate, rs.up, rs.gate, n * c.n_ff, gelu=True)
        b.matmul(w[p + "ffn_down.weight"], rs.gate, rs.xn, n)  # [n, n_embd]
        b.rms_norm(rs.xn, w[p + "post_ffw_norm.weight"], rs.xn, n, c.rms_eps)
        b.add(x, rs.xn, x, n * c.n_embd)
    # only the last token's logits are needed, soft-capped
    b.rms_norm(x, w["output_norm.weight"], rs.xn, 1, c.rms_eps, row_offset=n - 1)
    head = w["token_embd.weight" if c.tied_output else "output.weight"]
    b.matmul(head, rs.xn, rs.logits, 1, x_row=n - 1)           # [1, n_vocab]
    if c.final_softcap:
        b.softcap(rs.logits, c.n_vocab, c.final_softcap)
