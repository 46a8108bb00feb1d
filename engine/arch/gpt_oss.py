"""The gpt-oss architecture (OpenAI's open-weight MoE models), as llama.cpp defines it in GGUF
(arch name "gpt-oss"; llama.cpp's openai-moe graph).

Attention: biases on Q, K, V and the output projection; NeoX-style rope with YaRN on every
layer (the file's `rope.scaling.*`, read by the shared Config); a sink per head, one more
logit in each softmax that attends to nothing; sliding-window attention on alternate layers
(`attention.sliding_window_pattern`, 2 by default: layers 0, 2, ... slide). The feed-forward
is a mixture of experts behind the norm GGUF names `post_attention_norm`: the router's logits
plus its bias pick the `expert_used_count` largest, weighted by the softmax over those alone;
each expert's gate and up products plus their biases go through the clamped SwiGLU
(min(g, 7) * sigmoid(1.702 min(g, 7)) * (clamp(u, -7, 7) + 1)), its down product plus its
bias is weighted and summed into the residual. Routing stays on the device, as qwen3moe's.
"""
from __future__ import annotations

import dataclasses
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
    window: int                # sliding window of the local layers, in tokens
    swa_layers: tuple[bool, ...]
    rope_base_local: float     # sliding-window layers (rope_base: global layers)

    DEFAULTS = {"context_length": 131072, "rope.freq_base": 150000.0,
                "attention.layer_norm_rms_epsilon": 1e-5}
    FF_KEY = "expert_feed_forward_length"

    @classmethod
    def extra(cls, g: GGUFFile, common: dict) -> dict:
        a, n_layer = g.arch, common["n_layer"]
        return dict(n_expert=int(g.require(f"{a}.expert_count")),
                    n_expert_used=int(g.require(f"{a}.expert_used_count")),
                    window=int(g.require(f"{a}.attention.sliding_window")),
                    swa_layers=config.swa_layers(g, n_layer),
                    rope_base_local=float(g.get(f"{a}.rope.freq_base_swa",
                                                common["rope_base"])))

    def is_local(self, layer: int) -> bool:
        return self.swa_layers[layer]

    def tensor_shapes(self) -> dict[str, tuple[int, ...]]:
        """Every tensor the forward pass reads, with its ggml shape (row length first)."""
        e, hd, f, x = self.n_embd, self.head_dim, self.n_ff, self.n_expert
        q, kv = self.n_head * hd, self.n_head_kv * hd
        shapes = self.io_shapes()
        for i in range(self.n_layer):
            b = f"blk.{i}."
            shapes.update({
                b + "attn_norm.weight": (e,),
                b + "attn_q.weight": (e, q), b + "attn_q.bias": (q,),
                b + "attn_k.weight": (e, kv), b + "attn_k.bias": (kv,),
                b + "attn_v.weight": (e, kv), b + "attn_v.bias": (kv,),
                b + "attn_output.weight": (q, e), b + "attn_output.bias": (e,),
                b + "attn_sinks.weight": (self.n_head,),
                b + "post_attention_norm.weight": (e,),
                b + "ffn_gate_inp.weight": (e, x), b + "ffn_gate_inp.bias": (x,),
                b + "ffn_gate_exps.weight": (e, f, x), b + "ffn_gate_exps.bias": (f, x),
                b + "ffn_up_exps.weight": (e, f, x), b + "ffn_up_exps.bias": (f, x),
                b + "ffn_down_exps.weight": (f, e, x), b + "ffn_down_exps.bias": (e, x),
            })
        return shapes

    def tensor_types(self) -> dict[str, tuple[str, ...]]:
        """The tensors the ops read as F32 only: biases, sinks."""
        return {n: ("F32",) for n in self.tensor_shapes()
                if n.endswith(".bias") or n.endswith("attn_sinks.weight")}

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


def local_rope(c: Config) -> Rope:
    """The sliding-window layers' rope: the file's scaling (YaRN), their own base."""
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
    k = c.n_expert_used
    x = rs.x                                                   # [n, n_embd] residual stream
    b.get_rows(w["token_embd.weight"], rs.ids, x, n)
    for i in range(c.n_layer):
        p = f"blk.{i}."
        local = c.is_local(i)
        # attention: biased projections, sinks; the local layers slide
        b.rms_norm(x, w[p + "attn_norm.weight"], rs.xn, n, c.rms_eps)
        b.matmul(w[p + "attn_q.weight"], rs.xn, rs.q, n)       # [n, n_head, head_dim]
        b.add_bias(rs.q, w[p + "attn_q.bias"], n)
        b.matmul(w[p + "attn_k.weight"], rs.xn, rs.k, n)       # [n, n_head_kv, head_dim]
        b.add_bias(rs.k, w[p + "attn_k.bias"], n)
        b.matmul(w[p + "attn_v.weight"], rs.xn, rs.v, n)       # [n, n_head_kv, head_dim]
        b.add_bias(rs.v, w[p + "attn_v.bias"], n)
        b.rope_qkv(rs.q, rs.k, rs.v, rs.k_cache[i], rs.v_cache[i], c.n_head, c.n_head_kv,
                   c.head_dim, n, local_rope(c) if local else c.rope, neox=True)
        b.attention(rs.q, rs.k_cache[i], rs.v_cache[i], rs.att, c.n_head, c.n_head_kv,
                    c.head_dim, n, scale=c.head_dim ** -0.5, window=c.window if local else 0,
                    sinks=w[p + "attn_sinks.weight"])          # [n, n_head * head_dim]
        b.matmul(w[p + "attn_output.weight"], rs.att, rs.xn, n)   # [n, n_embd]
        b.add_bias(rs.xn, w[p + "attn_output.bias"], n)
        b.add(x, rs.xn, x, n * c.n_embd)
        # mixture of experts, each product with its expert's bias
        b.rms_norm(x, w[p + "post_attention_norm.weight"], rs.xn, n, c.rms_eps)
        b.matmul(w[p + "ffn_gate_inp.weight"], rs.xn, rs.router, n)   # [n, n_expert]
        b.add_bias(rs.router, w[p + "ffn_gate_inp.bias"], n)
        b.moe_router(rs.router, rs.expert_ids, rs.expert_w, n, c.n_expert, k,
                     softmax_chosen=True)                      # [n, k] each
        b.matmul_id(w[p + "ffn_gate_exps.weight"], rs.xn, rs.expert_ids, rs.gate, n, k)
        b.add_id(rs.gate, w[p + "ffn_gate_exps.bias"], rs.expert_ids, n * k)  # [n, k, n_ff]
        b.matmul_id(w[p + "ffn_up_exps.weight"], rs.xn, rs.expert_ids, rs.up, n, k)
        b.add_id(rs.up, w[p + "ffn_up_exps.bias"], rs.expert_ids, n * k)      # [n, k, n_ff]
        b.silu_mul(rs.gate, rs.up, rs.gate, n * k * c.n_ff, clamped=True)
        b.matmul_id(w[p + "ffn_down_exps.weight"], rs.gate, rs.expert_ids, rs.moe_out, n, k,
                    per_slot=True)                             # [n, k, n_embd]
        b.add_id(rs.moe_out, w[p + "ffn_down_exps.bias"], rs.expert_ids, n * k)
        b.moe_combine(rs.moe_out, rs.expert_w, x, n, c.n_embd, k)
    # only the last token's logits are needed
    b.rms_norm(x, w["output_norm.weight"], rs.xn, 1, c.rms_eps, row_offset=n - 1)
    head = w["token_embd.weight" if c.tied_output else "output.weight"]
    b.matmul(head, rs.xn, rs.logits, 1, x_row=n - 1)           # [1, n_vocab]
