"""The qwen3moe architecture (Qwen3 mixture-of-experts models), as llama.cpp defines it in GGUF.

Attention as in Qwen3: per-head RMS norms on q and k, NeoX-style rope, grouped KV heads. The
feed-forward is a mixture of experts: a router `ffn_gate_inp` scores every expert, softmax,
the `expert_used_count` most probable are chosen and their probabilities renormalised to
sum 1; each chosen expert is a SwiGLU (`ffn_gate_exps`, `ffn_up_exps`, `ffn_down_exps`,
3-D: one matrix per expert) and the outputs are summed by those weights. Routing happens on
the device (moe_router writes expert ids that mul_mat_id reads), so decode stays one recorded
graph; in prefill, matmul_id groups the chunk's tokens by expert on the device (moe_group)
and runs each expert as one product over its tokens (mul_mat_moe), still one graph.
"""
from __future__ import annotations

from dataclasses import dataclass

from shaders.registry import MOE_MAX_EXPERT, MOE_MAX_USED

from ..formats.gguf_file import GGUFFile
from . import config
from ..gpu.builder import Builder
from ..gpu.rope import Rope
from ..gpu.runstate import RunState

EXPERT_TENSORS = ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps")   # placement order


@dataclass(frozen=True)
class Config(config.Config):
    n_expert: int              # n_ff is one expert's feed-forward length
    n_expert_used: int

    DEFAULTS = {"context_length": 40960, "rope.freq_base": 1e6,
                "attention.layer_norm_rms_epsilon": 1e-6}

    @classmethod
    def extra(cls, g: GGUFFile, common: dict) -> dict:
        a = g.arch
        n_used = int(g.require(f"{a}.expert_used_count"))
        # llama.cpp: without expert_feed_forward_length, feed_forward_length / experts used
        n_ff = g.get(f"{a}.expert_feed_forward_length")
        if n_ff is None:
            n_ff = common["n_ff"] // max(n_used, 1)
        return dict(n_ff=int(n_ff), n_expert=int(g.require(f"{a}.expert_count")),
                    n_expert_used=n_used)

    def tensor_shapes(self) -> dict[str, tuple[int, ...]]:
        """Every tensor the forward pass reads, with its ggml shape (row length first)."""
        e, hd, f, x = self.n_embd, self.head_dim, self.n_ff, self.n_expert
        shapes = self.io_shapes()
        for i in range(self.n_layer):
            b = f"blk.{i}."
            shapes.update({
                b + "attn_norm.weight": (e,),
                b + "attn_q.weight": (e, self.n_head * hd),
                b + "attn_k.weight": (e, self.n_head_kv * hd),
                b + "attn_v.weight": (e, self.n_head_kv * hd),
                b + "attn_q_norm.weight": (hd,),
                b + "attn_k_norm.weight": (hd,),
                b + "attn_output.weight": (self.n_head * hd, e),
                b + "ffn_norm.weight": (e,),
                b + "ffn_gate_inp.weight": (e, x),
                b + "ffn_gate_exps.weight": (e, f, x),
                b + "ffn_up_exps.weight": (e, f, x),
                b + "ffn_down_exps.weight": (f, e, x),
            })
        return shapes

    def problems(self) -> list[str]:
        extra = []
        if not 0 < self.n_expert <= MOE_MAX_EXPERT:
            extra.append(f"expert_count {self.n_expert}")
        if not 0 < self.n_expert_used <= min(self.n_expert, MOE_MAX_USED):
            extra.append(f"expert_used_count {self.n_expert_used}")
        if self.rope_dims != self.head_dim:
            extra.append(f"rope dimension_count {self.rope_dims} (head dim {self.head_dim})")
        return extra


def expert_tensors(c: Config, layer: int) -> list[str]:
    """The expert tensors of one layer, in the order a fractional cpu_moe places them."""
    return [f"blk.{layer}.{n}.weight" for n in EXPERT_TENSORS]


def attn_windows(c: Config) -> tuple[int, ...]:
    """The sliding windows of the attention layers (0: full causal); one mask each."""
    return (0,)


def rope_tables(c: Config) -> tuple[Rope, ...]:
    """Every rope the layers use; RunState precomputes their angles."""
    return (c.rope,)


def forward(b: Builder, c: Config, rs: RunState, n: int) -> None:
    """Tokens rs.ids[:n] at positions step.pos0.. -> logits of the last token in rs.logits."""
    w = b.weights
    k = c.n_expert_used
    x = rs.x                                                   # [n, n_embd] residual stream
    b.get_rows(w["token_embd.weight"], rs.ids, x, n)
    for i in range(c.n_layer):
        p = f"blk.{i}."
        # attention
        b.rms_norm(x, w[p + "attn_norm.weight"], rs.xn, n, c.rms_eps)
        b.matmul(w[p + "attn_q.weight"], rs.xn, rs.q, n)       # [n, n_head, head_dim]
        b.matmul(w[p + "attn_k.weight"], rs.xn, rs.k, n)       # [n, n_head_kv, head_dim]
        b.matmul(w[p + "attn_v.weight"], rs.xn, rs.v, n)       # [n, n_head_kv, head_dim]
        b.rms_norm(rs.q, w[p + "attn_q_norm.weight"], rs.q, n * c.n_head, c.rms_eps)
        b.rms_norm(rs.k, w[p + "attn_k_norm.weight"], rs.k, n * c.n_head_kv, c.rms_eps)
        b.rope_qkv(rs.q, rs.k, rs.v, rs.k_cache[i], rs.v_cache[i], c.n_head, c.n_head_kv,
                   c.head_dim, n, c.rope, neox=True)
        b.attention(rs.q, rs.k_cache[i], rs.v_cache[i], rs.att, c.n_head, c.n_head_kv,
                    c.head_dim, n, scale=c.head_dim ** -0.5)  # [n, n_head * head_dim]
        b.matmul(w[p + "attn_output.weight"], rs.att, x, n, accumulate=True)
        # mixture of experts
        b.rms_norm(x, w[p + "ffn_norm.weight"], rs.xn, n, c.rms_eps)
        b.matmul(w[p + "ffn_gate_inp.weight"], rs.xn, rs.router, n)   # [n, n_expert]
        b.moe_router(rs.router, rs.expert_ids, rs.expert_w, n, c.n_expert, k)  # [n, k] each
        b.matmul_id(w[p + "ffn_gate_exps.weight"], rs.xn, rs.expert_ids, rs.gate, n, k)
        b.matmul_id(w[p + "ffn_up_exps.weight"], rs.xn, rs.expert_ids, rs.up, n, k)
        b.silu_mul(rs.gate, rs.up, rs.gate, n * k * c.n_ff)    # [n, k, n_ff]
        b.matmul_id(w[p + "ffn_down_exps.weight"], rs.gate, rs.expert_ids, rs.moe_out, n, k,
                    per_slot=True)                             # [n, k, n_embd]
        b.moe_combine(rs.moe_out, rs.expert_w, x, n, c.n_embd, k)
    # only the last token's logits are needed
    b.rms_norm(x, w["output_norm.weight"], rs.xn, 1, c.rms_eps, row_offset=n - 1)
    head = w["token_embd.weight" if c.tied_output else "output.weight"]
    b.matmul(head, rs.xn, rs.logits, 1, x_row=n - 1)           # [1, n_vocab]
