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
from ..gpu.tensors import View
from .config import Config


def embed(b: Builder, c: Config, rs: RunState, n: int, scale: float = 1.0) -> None:
    """rs.x[:n] = token_embd[rs.ids] * scale: the residual stream. In a pass of embeddings
    (an image's soft tokens, b.embd) rs.embd_in's rows as they are: llama.cpp scales only a
    batch of tokens (gemma3's `ubatch.token ? sqrt(n_embd) : 1`)."""
    if b.embd:
        b.g.copy(rs.embd_input(), 0, rs.x, 0, 4 * n * c.n_embd)
        return
    b.get_rows(b.weights["token_embd.weight"], rs.ids, rs.x, n, scale=scale)


def attention(b: Builder, c: Config, rs: RunState, i: int, n: int, rope: Rope, *,
              neox: bool, scale: float, window: int = 0, softcap: float = 0.0,
              sinks: bool = False, qkv_bias: bool = False, out_bias: bool = False,
              qk_norm: str = "", norm: str | None = "attn_norm", post_norm: bool = False,
              fused_qkv: bool = False, gated: bool = False, residual: float = 1.0,
              temp: tuple[float, int] = (0.0, 0)) -> None:
    """x += attn_output(attention(rope(norm(x) @ q, k, v))) for layer i. Options: the input
    norm's tensor (None: none, olmo2), biases on q, k, v and the output, RMS norms on q and
    k ("head": per head; "whole": over the whole projection, olmo2), one fused QKV weight
    (phi3: row slices of it), attention soft-capping, sinks (gpt-oss), a sliding window, q's
    temperature (mistral3), a sigmoid gate on the output that the q projection gives per
    head beside q (gated: Qwen3.5); the output normed (post_norm: gemma, olmo2) or scaled
    (residual: granite) before the add."""
    w, p, x, hd = b.weights, f"blk.{i}.", rs.x, c.head_dim
    nq, nkv, rows = c.n_head * hd, c.n_head_kv * hd, n * c.n_head
    if fused_qkv:                                              # Q | K | V rows of one weight
        qkv = w[p + "attn_qkv.weight"]
        proj = [qkv.row_slice(0, nq), qkv.row_slice(nq, nq + nkv),
                qkv.row_slice(nq + nkv, nq + 2 * nkv)]
    else:
        proj = [w[p + "attn_q.weight"], w[p + "attn_k.weight"], w[p + "attn_v.weight"]]
    products = list(zip(proj, (rs.qg if gated else rs.q, rs.k, rs.v)))
    biases = [w[p + name + ".bias"] for name in ("attn_q", "attn_k", "attn_v")] \
        if qkv_bias else None
    roped = False               # q, k and v rotated and in place already (one token)
    if norm is not None and not (gated or qk_norm not in ("", "head") or temp[0]):
        heads = (w[p + "attn_q_norm.weight"], w[p + "attn_k_norm.weight"], c.rms_eps, rs.k) \
            if qk_norm else None
        roped = b.norm_qkv_rope(x, w[p + norm + ".weight"], c.rms_eps, n, proj, rs.q,
                                rs.k_cache[i], rs.v_cache[i], c.n_head_kv, hd, rope, neox,
                                biases=biases, head_norm=heads)
    if norm is None:
        for weight, y in products:
            b.matmul(weight, x, y, n)
    elif not roped:
        b.norm_matmuls(x, w[p + norm + ".weight"], c.rms_eps, rs.xn, n, products)
    if gated:                                                  # per head q | gate: q apart
        b.cpy(View(rs.qg, (hd, rows, 1), (1, 2 * hd, 2 * hd * rows)), View(rs.q, (hd, rows, 1)))
    if qkv_bias and not roped:
        for bias, y in zip(biases, (rs.q, rs.k, rs.v)):
            b.add_bias(y, bias, n)
    head_norm = None                        # per head: in rope_qkv's pass; whole: before it
    if qk_norm == "head":
        head_norm = (w[p + "attn_q_norm.weight"], w[p + "attn_k_norm.weight"], c.rms_eps)
    elif qk_norm:
        b.rms_norm(rs.q, w[p + "attn_q_norm.weight"], rs.q, n, c.rms_eps)
        b.rms_norm(rs.k, w[p + "attn_k_norm.weight"], rs.k, n, c.rms_eps)
    if not roped:
        b.rope_qkv(rs.q, rs.k, rs.v, rs.k_cache[i], rs.v_cache[i], c.n_head, c.n_head_kv,
                   c.head_dim, n, rope, neox=neox, temp_scale=temp[0], temp_floor=temp[1],
                   head_norm=head_norm)
    b.attention(rs.q, rs.k_cache[i], rs.v_cache[i], rs.att, c.n_head, c.n_head_kv,
                c.head_dim, n, scale=scale, window=window, softcap=softcap,
                sinks=w[p + "attn_sinks.weight"] if sinks else None)
    if gated:                                                  # * sigmoid(the gate)
        b.mul(View(rs.att, (hd, rows, 1)),
              View(rs.qg, (hd, rows, 1), (1, 2 * hd, 2 * hd * rows), hd), rs.att, sigmoid=True)
    out = w[p + "attn_output.weight"]
    out_b = w[p + "attn_output.bias"] if out_bias else None
    if post_norm or residual != 1.0:                           # into xn, then onto x
        b.matmul(out, rs.att, rs.xn, n, bias=out_b)            # [n, n_embd]
        _onto_x(b, c, rs, n, w[p + "post_attention_norm.weight"] if post_norm else None,
                residual)
    else:
        b.matmul(out, rs.att, x, n, accumulate=True, bias=out_b)


def ffn(b: Builder, c: Config, rs: RunState, i: int, n: int, *, gelu: bool = False,
        post_norm: bool = False, fused_up: bool = False, norm: str | None = "ffn_norm",
        residual: float = 1.0) -> None:
    """x += down(act(norm(x) @ gate) * (norm(x) @ up)) for layer i: SwiGLU, or GeGLU (gelu);
    gate | up as rows of one weight (fused_up, phi3); `norm` names the norm's tensor (None:
    none, olmo2); the output normed (post_norm: gemma, olmo2) or scaled (residual: granite)
    before the add."""
    w, p, x = b.weights, f"blk.{i}.", rs.x
    if fused_up:
        up = w[p + "ffn_up.weight"]
        gate, up = up.row_slice(0, c.n_ff), up.row_slice(c.n_ff, 2 * c.n_ff)
    else:
        gate, up = w[p + "ffn_gate.weight"], w[p + "ffn_up.weight"]
    glu = False                                   # rs.gate holds the GLU's output already
    if norm is None:
        b.matmul(gate, x, rs.gate, n)
        b.matmul(up, x, rs.up, n)
    else:                                                      # [n, n_ff] each, or the GLU
        glu = b.norm_glu(x, w[p + norm + ".weight"], c.rms_eps, rs.xn, n, gate, up,
                         rs.gate, rs.up, gelu=gelu)
    down = w[p + "ffn_down.weight"]
    apart = post_norm or residual != 1.0          # the output is normed or scaled before the add
    y = rs.xn if apart else x                                  # [n, n_embd]
    if glu:
        b.matmul(down, rs.gate, y, n, accumulate=not apart)
    elif gelu:
        b.silu_mul(rs.gate, rs.up, rs.gate, n * c.n_ff, gelu=True, rows=n,
                   f16_only=b.reads_f16(down, n))
        b.matmul(down, rs.gate, y, n, accumulate=not apart)
    else:
        b.swiglu_matmul(down, rs.gate, rs.up, y, n, c.n_ff, accumulate=not apart)
    if apart:
        _onto_x(b, c, rs, n, w[p + "post_ffw_norm.weight"] if post_norm else None, residual)


def _onto_x(b: Builder, c: Config, rs: RunState, n: int, post_norm, residual: float) -> None:
    """x += residual * (xn, RMS-normed first where post_norm names its weight): one pass
    where the norm's output goes onto x as it is."""
    if post_norm is not None and residual == 1.0:
        b.rms_norm(rs.xn, post_norm, rs.x, n, c.rms_eps, add=True)
        return
    if post_norm is not None:
        b.rms_norm(rs.xn, post_norm, rs.xn, n, c.rms_eps)
    b.add(rs.x, rs.xn, rs.x, n * c.n_embd, scale=residual)


def moe(b: Builder, c: Config, rs: RunState, i: int, n: int, *, norm: str = "ffn_norm",
        biases: bool = False, clamped: bool = False, softmax_chosen: bool = False,
        shared: bool = False) -> None:
    """x += sum over the k experts the router picks of weight * down(SwiGLU(norm(x))) for
    layer i. Options: biases on the router and each expert's products (gpt-oss), with its
    clamped SwiGLU and softmax over the chosen experts only; a shared expert of
    c.n_ff_shexp beside them, scaled by the sigmoid of its own gate (Qwen3.5); the norm's
    tensor name."""
    w, p, x, k = b.weights, f"blk.{i}.", rs.x, c.n_expert_used
    names = ("gate", "up", "down")
    norm_w, router = w[p + norm + ".weight"], w[p + "ffn_gate_inp.weight"]
    exps = tuple(w[p + f"ffn_{name}_exps.weight"] for name in names)
    exps_b = tuple(w[p + f"ffn_{name}_exps.bias"] for name in names) if biases else None
    if shared:
        sh_inp, sh_gate, sh_up, sh_down = (w[p + f"ffn_{name}_shexp.weight"]
                                           for name in ("gate_inp", "gate", "up", "down"))
    # one token on int8 activations: the norm goes into the router's and the experts'
    # reading of x, and a shared expert's (its gate's product, and its GLU's pass)
    into = b.experts_take_norm(n, norm_w, router, *exps, k, exps_b) and (
        not shared or (b.norm_fuses(n, norm_w, [sh_inp])
                       and b.norm_glu_fits(n, norm_w, sh_gate, sh_up)))
    if into:
        b.norm_matmuls(x, norm_w, c.rms_eps, rs.xn, n,
                       [(router, rs.router)] + ([(sh_inp, rs.sh_w)] if shared else []))
    else:
        b.rms_norm(x, norm_w, rs.xn, n, c.rms_eps)
        b.matmul(router, rs.xn, rs.router, n)                          # [n, n_expert]
    if biases:
        b.add_bias(rs.router, w[p + "ffn_gate_inp.bias"], n)

    def experts(j: int, x_in, y, per_slot: bool = False) -> None:     # j: gate, up, down
        b.matmul_id(exps[j], x_in, rs.expert_ids, y, n, k, per_slot=per_slot)
        if exps_b:
            b.add_id(y, exps_b[j], rs.expert_ids, n * k)

    if shared and into:   # silu(gate) * up * sigmoid(its gate), read before x takes the experts'
        b.norm_glu(x, norm_w, c.rms_eps, rs.xn, n, sh_gate, sh_up, rs.sh_gate, rs.sh_up,
                   gate_logit=rs.sh_w)
    fused = b.experts_swiglu(                                  # one token: into x already
        x if into else rs.xn, rs.router, rs.expert_ids, rs.expert_w, *exps, rs.gate, x, n, k,
        clamped=clamped, biases=exps_b, norm=(norm_w, c.rms_eps) if into else None,
        softmax_chosen=softmax_chosen)
    if not fused:
        b.moe_router(rs.router, rs.expert_ids, rs.expert_w, n, c.n_expert, k,
                     softmax_chosen=softmax_chosen)            # [n, k] each
        experts(0, rs.xn, rs.gate)                             # [n, k, n_ff]
        experts(1, rs.xn, rs.up)                               # [n, k, n_ff]
        b.silu_mul(rs.gate, rs.up, rs.gate, n * k * c.n_ff, clamped=clamped)
        experts(2, rs.gate, rs.moe_out, per_slot=True)         # [n, k, n_embd]
        b.moe_combine(rs.moe_out, rs.expert_w, x, n, c.n_embd, k)
    if shared:                   # scaled by sigmoid(its gate) before its (linear) down product
        fs = c.n_ff_shexp
        if not into:
            b.matmul(sh_inp, rs.xn, rs.sh_w, n)                            # [n, 1]
            b.matmul(sh_gate, rs.xn, rs.sh_gate, n)                        # [n, n_ff_shexp]
            b.matmul(sh_up, rs.xn, rs.sh_up, n)
            b.silu_mul(rs.sh_gate, rs.sh_up, rs.sh_gate, n * fs)
            b.mul(View(rs.sh_gate, (fs, n, 1)), View(rs.sh_w, (fs, n, 1), (0, 1, n)),
                  rs.sh_gate, sigmoid=True)
        b.matmul(sh_down, rs.sh_gate, x, n, accumulate=True)


def head(b: Builder, c: Config, rs: RunState, n: int, softcap: float = 0.0,
         norm: str = "output_norm", scale: float = 1.0) -> None:
    """rs.logits = norm(x[n - 1]) @ output (or the tied embeddings): the last token's only,
    scaled where scale != 1 (granite), soft-capped where softcap > 0 (gemma2); `norm` names
    the norm's tensor. In an embeddings pass (b.hidden) every token's norm(x) in rs.xn
    instead: its hidden states. The output product rounds x to int8 (where the device
    does) only where every layer's products did (Builder.int8_throughout): a path that
    rounds x before each product as llama.cpp does follows llama.cpp closer with the
    output's rounded too (qwen35-q8_0: cosine 0.999 and over against 0.99899 on f32 x);
    one that keeps x in f32 elsewhere does not, and rounding only the output moves the
    log-probabilities away (SmolLM2's Q4_1: five teacher-forced steps past the tie rule
    against llama.cpp, one on f32 x)."""
    w = b.weights
    if b.hidden:
        b.rms_norm(rs.x, w[norm + ".weight"], rs.xn, n, c.rms_eps)        # [n, n_embd]
    else:
        b.rms_norm(rs.x, w[norm + ".weight"], rs.xn, 1, c.rms_eps, row_offset=n - 1)
        out = w["token_embd.weight" if c.tied_output else "output.weight"]
        b.matmul(out, rs.xn, rs.logits, 1, x_row=n - 1, int8=b.int8_throughout(), row=True)
        if scale != 1.0:
            b.scale(rs.logits, c.n_vocab, scale)
        if softcap:
            b.softcap(rs.logits, c.n_vocab, softcap)
    b.ended = True
