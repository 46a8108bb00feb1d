"""The blocks the architectures' forward passes are composed of, as llama.cpp's graphs compose
build_norm, build_attn, build_ffn and build_moe_ffn: a layer's attention, its gated
feed-forward, its mixture of experts, and the output head. Each reads a layer's tensors by
their GGUF names and takes the fused decode path wherever the math allows (the norm before
the q, k and v products into the products' reading of x; SwiGLU into the down product):
Builder.norm_matmuls and swiglu_matmul decide per pass, and keep the separate ops for
prefill and where ggml's rounding is asked for.
"""
from __future__ import annotations

from ..gpu.builder import Builder
from ..gpu.rope import Rope
from ..gpu.runstate import RunState
from .config import Config


def embed(b: Builder, c: Config, rs: RunState, n: int, scale: float = 1.0) -> None:
    """rs.x[:n] = token_embd[rs.ids] * scale: the residual stream."""
    b.get_rows(b.weights["token_embd.weight"], rs.ids, rs.x, n, scale=scale)


def attention(b: Builder, c: Config, rs: RunState, i: int, n: int, rope: Rope, *,
              neox: bool, scale: float, window: int = 0, softcap: float = 0.0,
              sinks: bool = False, qkv_bias: bool = False, out_bias: bool = False,
              qk_norm: bool = False, post_norm: bool = False, fused_qkv: bool = False,
              temp: tuple[float, int] = (0.0, 0)) -> None:
    """x += attn_output(attention(rope(norm(x) @ q, k, v))) for layer i; with post_norm
    (gemma) the output is normed before the add. Options: biases on q, k, v and the output,
    per-head RMS norms on q and k, one fused QKV weight (phi3: row slices of it), attention
    soft-capping, sinks (gpt-oss), a sliding window, q's temperature (mistral3)."""
    w, p, x = b.weights, f"blk.{i}.", rs.x
    nq, nkv = c.n_head * c.head_dim, c.n_head_kv * c.head_dim
    if fused_qkv:                                              # Q | K | V rows of one weight
        qkv = w[p + "attn_qkv.weight"]
        proj = [qkv.row_slice(0, nq), qkv.row_slice(nq, nq + nkv),
                qkv.row_slice(nq + nkv, nq + 2 * nkv)]
    else:
        proj = [w[p + "attn_q.weight"], w[p + "attn_k.weight"], w[p + "attn_v.weight"]]
    b.norm_matmuls(x, w[p + "attn_norm.weight"], c.rms_eps, rs.xn, n,
                   list(zip(proj, (rs.q, rs.k, rs.v))))      # [n, n_head(_kv) * head_dim]
    if qkv_bias:
        for name, y in (("attn_q", rs.q), ("attn_k", rs.k), ("attn_v", rs.v)):
            b.add_bias(y, w[p + name + ".bias"], n)
    if qk_norm:                                                # per head
        b.rms_norm(rs.q, w[p + "attn_q_norm.weight"], rs.q, n * c.n_head, c.rms_eps)
        b.rms_norm(rs.k, w[p + "attn_k_norm.weight"], rs.k, n * c.n_head_kv, c.rms_eps)
    b.rope_qkv(rs.q, rs.k, rs.v, rs.k_cache[i], rs.v_cache[i], c.n_head, c.n_head_kv,
               c.head_dim, n, rope, neox=neox, temp_scale=temp[0], temp_floor=temp[1])
    b.attention(rs.q, rs.k_cache[i], rs.v_cache[i], rs.att, c.n_head, c.n_head_kv,
                c.head_dim, n, scale=scale, window=window, softcap=softcap,
                sinks=w[p + "attn_sinks.weight"] if sinks else None)
    out = w[p + "attn_output.weight"]
    if post_norm or out_bias:                                  # into xn, then onto x
        b.matmul(out, rs.att, rs.xn, n)                        # [n, n_embd]
        if out_bias:
            b.add_bias(rs.xn, w[p + "attn_output.bias"], n)
        if post_norm:
            b.rms_norm(rs.xn, w[p + "post_attention_norm.weight"], rs.xn, n, c.rms_eps)
        b.add(x, rs.xn, x, n * c.n_embd)
    else:
        b.matmul(out, rs.att, x, n, accumulate=True)


def ffn(b: Builder, c: Config, rs: RunState, i: int, n: int, *, gelu: bool = False,
        post_norm: bool = False, fused_up: bool = False, norm: str = "ffn_norm") -> None:
    """x += down(act(norm(x) @ gate) * (norm(x) @ up)) for layer i: SwiGLU, or GeGLU (gelu);
    gate | up as rows of one weight (fused_up, phi3); with post_norm (gemma) the output is
    normed before the add; `norm` names the norm's tensor."""
    w, p, x = b.weights, f"blk.{i}.", rs.x
    if fused_up:
        up = w[p + "ffn_up.weight"]
        gate, up = up.row_slice(0, c.n_ff), up.row_slice(c.n_ff, 2 * c.n_ff)
    else:
        gate, up = w[p + "ffn_gate.weight"], w[p + "ffn_up.weight"]
    b.norm_matmuls(x, w[p + norm + ".weight"], c.rms_eps, rs.xn, n,
                   [(gate, rs.gate), (up, rs.up)])            # [n, n_ff] each
    down = w[p + "ffn_down.weight"]
    if gelu or post_norm:
        b.silu_mul(rs.gate, rs.up, rs.gate, n * c.n_ff, gelu=gelu)
        b.matmul(down, rs.gate, rs.xn if post_norm else x, n, accumulate=not post_norm)
        if post_norm:
            b.rms_norm(rs.xn, w[p + "post_ffw_norm.weight"], rs.xn, n, c.rms_eps)
            b.add(x, rs.xn, x, n * c.n_embd)
    else:
        b.swiglu_matmul(down, rs.gate, rs.up, x, n, c.n_ff)


def moe(b: Builder, c: Config, rs: RunState, i: int, n: int, *, norm: str = "ffn_norm",
        biases: bool = False, clamped: bool = False, softmax_chosen: bool = False) -> None:
    """x += sum over the k experts the router picks of weight * down(SwiGLU(norm(x))) for
    layer i. Options: biases on the router and each expert's products (gpt-oss), with its
    clamped SwiGLU and softmax over the chosen experts only; the norm's tensor name."""
    w, p, x, k = b.weights, f"blk.{i}.", rs.x, c.n_expert_used
    b.rms_norm(x, w[p + norm + ".weight"], rs.xn, n, c.rms_eps)
    b.matmul(w[p + "ffn_gate_inp.weight"], rs.xn, rs.router, n)       # [n, n_expert]
    if biases:
        b.add_bias(rs.router, w[p + "ffn_gate_inp.bias"], n)
    b.moe_router(rs.router, rs.expert_ids, rs.expert_w, n, c.n_expert, k,
                 softmax_chosen=softmax_chosen)                # [n, k] each

    def experts(name: str, x_in, y, per_slot: bool = False) -> None:
        b.matmul_id(w[p + f"ffn_{name}_exps.weight"], x_in, rs.expert_ids, y, n, k,
                    per_slot=per_slot)
        if biases:
            b.add_id(y, w[p + f"ffn_{name}_exps.bias"], rs.expert_ids, n * k)

    experts("gate", rs.xn, rs.gate)                            # [n, k, n_ff]
    experts("up", rs.xn, rs.up)                                # [n, k, n_ff]
    b.silu_mul(rs.gate, rs.up, rs.gate, n * k * c.n_ff, clamped=clamped)
    experts("down", rs.gate, rs.moe_out, per_slot=True)        # [n, k, n_embd]
    b.moe_combine(rs.moe_out, rs.expert_w, x, n, c.n_embd, k)


def head(b: Builder, c: Config, rs: RunState, n: int, softcap: float = 0.0,
         norm: str = "output_norm") -> None:
    """rs.logits = norm(x[n - 1]) @ output (or the tied embeddings): the last token's only,
    soft-capped where softcap > 0; `norm` names the norm's tensor."""
    w = b.weights
    b.rms_norm(rs.x, w[norm + ".weight"], rs.xn, 1, c.rms_eps, row_offset=n - 1)
    out = w["token_embd.weight" if c.tied_output else "output.weight"]
    b.matmul(out, rs.xn, rs.logits, 1, x_row=n - 1)           # [1, n_vocab]
    if softcap:
        b.softcap(rs.logits, c.n_vocab, softcap)
