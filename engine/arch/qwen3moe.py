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

from ..formats.gguf_file import GGUFFile
from . import config, llama
from .llama import forward  # noqa: F401  (the llama graph, with experts)


@dataclass(frozen=True)
class Config(config.Experts, llama.Config):
    n_expert: int              # n_ff is one expert's feed-forward length
    n_expert_used: int

    ROPE_FREQS = False
    NEOX = True
    QK_NORM = "head"
    MOE = True
    BIASES = ()

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
        return {**super().extra(g, common), "n_ff": int(n_ff),
                "n_expert": int(g.require(f"{a}.expert_count")), "n_expert_used": n_used}

    def tensor_shapes(self) -> dict[str, tuple[int, ...]]:
        """Every tensor the forward pass reads, with its ggml shape (row length first)."""
        e, f, x = self.n_embd, self.n_ff, self.n_expert
        shapes = self.io_shapes()
        for i in range(self.n_layer):
            b = f"blk.{i}."
            shapes.update({
                **self.attention_shapes(i, qk_norm="head"),
                b + "ffn_norm.weight": (e,),
                b + "ffn_gate_inp.weight": (e, x),
                b + "ffn_gate_exps.weight": (e, f, x),
                b + "ffn_up_exps.weight": (e, f, x),
                b + "ffn_down_exps.weight": (f, e, x),
            })
        return shapes
