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

from dataclasses import dataclass


from ..formats.gguf_file import GGUFFile
from . import blocks, config
from ..gpu.builder import Builder
from ..gpu.runstate import RunState


@dataclass(frozen=True)
class Config(config.Experts, config.SlidingWindows, config.Config):
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


def forward(b: Builder, c: Config, rs: RunState, n: int) -> None:
    """Tokens rs.ids[:n] at positions step.pos0.. -> logits of the last token in rs.logits."""
    blocks.embed(b, c, rs, n)
    for i in range(c.n_layer):
        blocks.attention(b, c, rs, i, n, c.layer_rope(i), neox=True,
                         scale=c.head_dim ** -0.5, window=c.layer_window(i),
                         sinks=True, qkv_bias=True, out_bias=True)
        blocks.moe(b, c, rs, i, n, norm="post_attention_norm", biases=True, clamped=True,
                   softmax_chosen=True)
    blocks.head(b, c, rs, n)
