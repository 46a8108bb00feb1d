"""The numpy reference forward pass of the hybrid gated delta-net architectures: qwen3next,
qwen35 and qwen35moe, as llama.cpp's graphs compute them (src/models/qwen3next.cpp,
qwen35.cpp, qwen35moe.cpp, delta-net-base.cpp and ggml-cpu's gated_delta_net).

Kept apart from reference.py for length; it reads the GGUF keys itself (not through
engine/arch/qwen35.py, which the GPU path uses) and shares reference.py's pieces: Linear
(weights, and ggml's activation rounding with quantize_activations), rms_norm, the rope, the
attention with its KV cache, the expert routing.

The delta rule is the plain per-token recurrence on a float32 state, as ggml-cpu's fused
gated_delta_net op runs it (llama.cpp's chunked form is the same sum reordered). Conv and
delta-net states are carried from one forward() to the next, so a prompt split over two
calls gives the logits of one call; snapshot() / restore() copy the whole sequence state
(KV cache included), as a release and restore in the middle of a generation would.

    m = open_model(GGUFFile(path), n_ctx=512)    # HybridModel here, else ReferenceModel
    logits = m.forward(prompt_ids, 0)                        # [n_prompt, n_vocab]
    logits = m.forward([next_id], len(prompt_ids))           # one more token
"""
from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from types import SimpleNamespace

import numpy as np

from engine.formats.gguf_file import GGUFFile, ModelFileError
from tests.helpers.reference import HYBRID_ARCHS, Linear, ReferenceModel, rms_norm, rope, silu

ARCHS = HYBRID_ARCHS


@dataclass(frozen=True)
class HybridConfig:
    arch: str
    n_layer: int                # trunk layers (block_count less nextn_predict_layers)
    n_embd: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_vocab: int
    rms_eps: float
    rope_base: float
    n_rot: int                  # rope.dimension_count: the rotated dims of each head
    rope_freq_scale: float      # 1 / rope.scaling.factor (linear)
    rope_sections: tuple[int, ...]  # qwen35*: the interleaved multi-section rope's sections
    recurrent: tuple[bool, ...]     # per layer: gated delta-net (True) or full attention
    d_conv: int                 # ssm.conv_kernel
    d_inner: int                # ssm.inner_size = n_v_heads * head_v_dim
    d_state: int                # ssm.state_size = head_k_dim
    n_k_heads: int              # ssm.group_count
    n_v_heads: int              # ssm.time_step_rank
    n_expert: int = 0
    n_expert_used: int = 0

    # what reference.ReferenceModel._attention reads: no sliding window
    n_swa = 0

    @property
    def swa_layers(self) -> tuple[bool, ...]:
        return (False,) * self.n_layer

    @property
    def head_v_dim(self) -> int:
        return self.d_inner // self.n_v_heads

    @classmethod
    def from_gguf(cls, g: GGUFFile) -> "HybridConfig":
        a = g.arch
        if a not in ARCHS:
            raise ModelFileError(g.path, f"architecture {a!r} is not a hybrid delta-net one")
        key = lambda k, *d: g.get(f"{a}.{k}", *d) if d else g.require(f"{a}.{k}")  # noqa: E731
        n_layer = int(key("block_count")) - int(key("nextn_predict_layers", 0) or 0)
        rec = key("attention.recurrent_layers", None)
        if rec is not None:                     # llama.cpp takes the per-layer list first
            recurrent = tuple(bool(r) for r in rec[:n_layer])
        else:
            interval = int(key("full_attention_interval", 4))
            recurrent = tuple((i + 1) % interval != 0 for i in range(n_layer))
        n_embd, n_head = int(key("embedding_length")), int(key("attention.head_count"))
        head_dim = int(key("attention.key_length", n_embd // n_head))
        scaling = str(key("rope.scaling.type", "linear"))
        if scaling not in ("none", "linear"):
            raise ModelFileError(g.path, f"rope scaling {scaling!r}: not in the reference")
        factor = float(key("rope.scaling.factor", 0.0))
        sections = ()
        if a != "qwen3next":                    # qwen35*: ggml_rope_multi, IMROPE
            sections = tuple(int(s) for s in key("rope.dimension_sections"))[:4]
        moe = a != "qwen35"
        return cls(a, n_layer, n_embd, n_head, int(key("attention.head_count_kv", n_head)),
                   head_dim, int(g.tensor("token_embd.weight").shape[1]),
                   float(key("attention.layer_norm_rms_epsilon")),
                   float(key("rope.freq_base", 10000.0)),
                   int(key("rope.dimension_count", head_dim)),
                   1.0 if factor == 0.0 or scaling == "none" else float(np.float32(1) / factor),
                   sections, recurrent, int(key("ssm.conv_kernel")), int(key("ssm.inner_size")),
                   int(key("ssm.state_size")), int(key("ssm.group_count")),
                   int(key("ssm.time_step_rank")),
                   n_expert=int(key("expert_count")) if moe else 0,
                   n_expert_used=int(key("expert_used_count")) if moe else 0)

    def k_head_of(self) -> np.ndarray:
        """[n_v_heads]: the key head each value head reads. qwen3next repeats each key head
        for its group of value heads (h // r); qwen35* tile them (h % n_k_heads), the
        converter having reordered the value heads for ggml's broadcast."""
        h = np.arange(self.n_v_heads)
        if self.arch == "qwen3next":
            return h // (self.n_v_heads // self.n_k_heads)
        return h % self.n_k_heads

    def turning_pairs(self) -> np.ndarray:
        """[n_rot / 2] bool: the rope pairs that turn by the text position. ggml's IMROPE
        gives pair i the section i % sum(sections) and the positions t, h, w (all the
        token's position for text) or e (0 for text) by that section's index mod 3."""
        n = self.n_rot // 2
        if not self.rope_sections:
            return np.ones(n, bool)
        t, h, w = self.rope_sections[:3]
        s = np.arange(n) % max(sum(self.rope_sections), 1)
        return ((s % 3 == 1) & (s < 3 * h)) | ((s % 3 == 2) & (s < 3 * w)) | \
               ((s % 3 == 0) & (s < 3 * t))


class _State:
    """The sequence's state: the attention layers' KV cache (float32), each delta-net layer's
    conv inputs [d_conv - 1, conv channels] and recurrent state [n_v_heads, d_k, d_v]."""

    def __init__(self, c: HybridConfig, n_ctx: int):
        shape = (c.n_layer, n_ctx, c.n_head_kv, c.head_dim)
        self.k = np.zeros(shape, np.float32)
        self.v = np.zeros(shape, np.float32)
        channels = 2 * c.n_k_heads * c.d_state + c.d_inner
        self.conv = {i: np.zeros((c.d_conv - 1, channels), np.float32)
                     for i, r in enumerate(c.recurrent) if r}
        self.ssm = {i: np.zeros((c.n_v_heads, c.d_state, c.head_v_dim), np.float32)
                    for i, r in enumerate(c.recurrent) if r}
        self.n_past = 0

    def reset(self) -> None:
        for s in (*self.conv.values(), *self.ssm.values()):
            s[:] = 0
        self.n_past = 0


def _l2_norm(x: np.ndarray, eps: float) -> np.ndarray:
    """llama.cpp's build_gdn_l2_norm: rms_norm(x, eps / n) * (1 / sqrt(n)), i.e.
    x / sqrt(sum(x^2) + eps), over the last axis."""
    n = x.shape[-1]
    y = rms_norm(x, np.float32(1.0), float(np.float32(eps) / np.float32(n)))
    return y * np.float32(1.0 / math.sqrt(n))


def _softplus(x: np.ndarray) -> np.ndarray:
    return np.where(x > 20.0, x, np.log1p(np.exp(np.minimum(x, 20.0)))).astype(np.float32)


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return (np.float32(1.0) / (np.float32(1.0) + np.exp(-x))).astype(np.float32)


class HybridModel(ReferenceModel):
    """A qwen3next / qwen35 / qwen35moe model in numpy: forward() a batch of tokens, logits
    out, the KV cache and the recurrent states kept."""

    def __init__(self, g: GGUFFile, n_ctx: int = 2048, quantize_activations: bool = False):
        self.config = c = HybridConfig.from_gguf(g)
        self.n_ctx = n_ctx
        self.emulate = quantize_activations
        self.rope_factors = None
        self.router_log: list[np.ndarray] | None = None       # as ReferenceModel's
        lin = lambda name: Linear(g, name, quantize_activations)  # noqa: E731
        opt = lambda name: lin(name) if name in g.tensors else None  # noqa: E731
        vec = lambda name: g.dequantize(name) if name in g.tensors else None  # noqa: E731
        blocks = []
        for il in range(c.n_layer):
            p = f"blk.{il}."
            L = SimpleNamespace(attn_norm=vec(p + "attn_norm.weight"),
                                post_attention_norm=vec(p + "post_attention_norm.weight"))
            if c.recurrent[il]:
                if p + "attn_qkv.weight" not in g.tensors:
                    raise ModelFileError(g.path, f"{p}attn_qkv.weight missing (an old fused "
                                                 f"ssm_in file is not read)", "incomplete")
                L.attn_qkv, L.attn_gate = lin(p + "attn_qkv.weight"), lin(p + "attn_gate.weight")
                L.ssm_conv1d = vec(p + "ssm_conv1d.weight")        # [channels, d_conv]
                L.ssm_dt, L.ssm_a = vec(p + "ssm_dt.bias"), vec(p + "ssm_a")   # [n_v_heads]
                L.ssm_ba = opt(p + "ssm_ba.weight")                # qwen3next [2 n_v, n_embd]
                L.ssm_beta, L.ssm_alpha = opt(p + "ssm_beta.weight"), opt(p + "ssm_alpha.weight")
                L.ssm_norm = vec(p + "ssm_norm.weight")            # [head_v_dim]
                L.ssm_out = lin(p + "ssm_out.weight")              # [n_embd, d_inner]
            else:
                L.attn_q = lin(p + "attn_q.weight")        # [n_head * 2 hd, n_embd]: q | gate
                L.attn_k, L.attn_v = lin(p + "attn_k.weight"), lin(p + "attn_v.weight")
                L.attn_q_norm = vec(p + "attn_q_norm.weight")
                L.attn_k_norm = vec(p + "attn_k_norm.weight")
                L.attn_output = lin(p + "attn_output.weight")
            if c.n_expert:
                for n in ("ffn_gate_inp", "ffn_gate_exps", "ffn_up_exps", "ffn_down_exps",
                          "ffn_gate_shexp", "ffn_up_shexp", "ffn_down_shexp"):
                    setattr(L, n, opt(p + n + ".weight"))
                # [n_embd] (ggml [n_embd] or, as converted from a Linear, [n_embd, 1])
                L.ffn_gate_inp_shexp = vec(p + "ffn_gate_inp_shexp.weight").reshape(-1)
            else:
                L.ffn_gate, L.ffn_up = lin(p + "ffn_gate.weight"), lin(p + "ffn_up.weight")
                L.ffn_down = lin(p + "ffn_down.weight")
            blocks.append(L)
        token_embd = lin("token_embd.weight")
        self.weights = SimpleNamespace(
            token_embd=token_embd, output_norm=vec("output_norm.weight"), blk=blocks,
            output=lin("output.weight") if "output.weight" in g.tensors else token_embd)
        self.state = _State(c, n_ctx)
        self._k_head = c.k_head_of()
        self._turning = c.turning_pairs()

    def reset(self) -> None:
        self.state.reset()

    def snapshot(self):
        """A copy of the whole sequence state (KV cache, conv and delta-net states)."""
        return copy.deepcopy(self.state)

    def restore(self, snap) -> None:
        self.state = copy.deepcopy(snap)

    def forward(self, tokens: list[int], start_pos: int) -> np.ndarray:
        """Logits [len(tokens), n_vocab] for tokens at positions start_pos...; the states
        move on. start_pos 0 starts a new sequence; otherwise it must be where the last
        call ended (recurrent states cannot rewind)."""
        if not tokens:
            raise ValueError("forward() needs at least one token")
        if start_pos + len(tokens) > self.n_ctx:
            raise ValueError(f"{start_pos + len(tokens)} positions exceed n_ctx={self.n_ctx}")
        if start_pos == 0:
            self.state.reset()
        elif start_pos != self.state.n_past:
            raise ValueError(f"recurrent states are at {self.state.n_past}, cannot go on "
                             f"from {start_pos}")
        c, W = self.config, self.weights
        tok = np.asarray(tokens, dtype=np.int64)
        pos = np.arange(start_pos, start_pos + len(tokens))
        x = W.token_embd.w[tok]                                             # [T, n_embd]
        for il, L in enumerate(W.blk):
            h = rms_norm(x, L.attn_norm, c.rms_eps)                         # [T, n_embd]
            if c.recurrent[il]:
                h = self._delta_net(il, L, h)                               # [T, n_embd]
            else:
                h = self._gated_attention(il, L, h, pos)                    # [T, n_embd]
            x = h + x
            h = rms_norm(x, L.post_attention_norm, c.rms_eps)               # [T, n_embd]
            x = self._ffn(L, h) + x                                         # [T, n_embd]
        self.state.n_past = start_pos + len(tokens)
        x = rms_norm(x, W.output_norm, c.rms_eps)                           # [T, n_embd]
        return W.output(x)                                                  # [T, n_vocab]

    # -- full attention with the output gate -------------------------------------------------
    def _gated_attention(self, il: int, L, h: np.ndarray, pos: np.ndarray) -> np.ndarray:
        c, T, hd = self.config, len(h), self.config.head_dim
        qg = L.attn_q(h).reshape(T, c.n_head, 2 * hd)          # per head: q | gate
        q, gate = qg[..., :hd], qg[..., hd:].reshape(T, c.n_head * hd)
        k = L.attn_k(h).reshape(T, c.n_head_kv, hd)                         # [T, n_kv, hd]
        v = L.attn_v(h).reshape(T, c.n_head_kv, hd)                         # [T, n_kv, hd]
        q = self._rope(rms_norm(q, L.attn_q_norm, c.rms_eps), pos)          # [T, n_head, hd]
        k = self._rope(rms_norm(k, L.attn_k_norm, c.rms_eps), pos)
        att = self._attention(il, q, k, v, pos, 1.0 / math.sqrt(hd))        # [T, n_head * hd]
        return L.attn_output(att * _sigmoid(gate))                          # [T, n_embd]

    def _rope(self, x: np.ndarray, pos: np.ndarray, il: int = 0) -> np.ndarray:
        """NeoX rope of the first n_rot dims; under IMROPE the pairs whose section takes the
        extra position (0 for text) stay as they are."""
        c = self.config
        y = rope(x, pos, c.rope_base, True, n_dims=c.n_rot, freq_scale=c.rope_freq_scale)
        if not self._turning.all():
            half = c.n_rot // 2
            still = np.nonzero(~self._turning)[0]
            for i in (still, still + half):
                y[..., i] = x[..., i]
        return y

    # -- gated delta-net -------------------------------------------------------------------
    def _delta_net(self, il: int, L, h: np.ndarray) -> np.ndarray:
        """h [T, n_embd] -> [T, n_embd], the conv and delta-net states moved on by T."""
        c, T = self.config, len(h)
        hk, hv, dk, dv = c.n_k_heads, c.n_v_heads, c.d_state, c.head_v_dim
        qkv = L.attn_qkv(h)                                     # [T, channels]: q | k | v
        z = L.attn_gate(h).reshape(T, hv, dv)                   # [T, n_v, d_v]
        if L.ssm_ba is not None:                # qwen3next: per key head [b (r) | a (r)]
            ba = L.ssm_ba(h).reshape(T, hk, 2, hv // hk)
            b, a = ba[:, :, 0].reshape(T, hv), ba[:, :, 1].reshape(T, hv)
        else:
            b, a = L.ssm_beta(h), L.ssm_alpha(h)                # [T, n_v] each
        beta = _sigmoid(b)                                                  # [T, n_v]
        g = _softplus(a + L.ssm_dt) * L.ssm_a                   # [T, n_v] log decay (< 0)

        # causal depthwise conv over (state, inputs), as ggml_ssm_conv sums it, then silu
        sx = np.concatenate([self.state.conv[il], qkv])         # [d_conv - 1 + T, channels]
        self.state.conv[il] = sx[T:].copy()
        w = L.ssm_conv1d                                        # [channels, d_conv]
        conv = np.zeros_like(qkv)
        for j in range(w.shape[1]):
            conv = conv + sx[j:j + T] * w[:, j]
        conv = silu(conv)                                                   # [T, channels]
        nk = hk * dk
        q = _l2_norm(conv[:, :nk].reshape(T, hk, dk), c.rms_eps)[:, self._k_head]  # [T,n_v,d]
        k = _l2_norm(conv[:, nk:2 * nk].reshape(T, hk, dk), c.rms_eps)[:, self._k_head]
        v = conv[:, 2 * nk:].reshape(T, hv, dv)                             # [T, n_v, d_v]

        # the delta rule, token by token: S [n_v, d_k, d_v]
        S = self.state.ssm[il]
        scale = np.float32(1.0 / math.sqrt(dk))
        o = np.empty((T, hv, dv), np.float32)
        decay = np.exp(g).astype(np.float32)
        for t in range(T):
            S = S * decay[t][:, None, None]
            mem = np.einsum("hij,hi->hj", S, k[t])                          # S^T k [n_v, d_v]
            delta = (v[t] - mem) * beta[t][:, None]
            S = S + k[t][:, :, None] * delta[:, None, :]
            o[t] = np.einsum("hij,hi->hj", S, q[t]) * scale                 # S^T q
        self.state.ssm[il] = S

        # gated RMS norm per head, then out
        o = rms_norm(o, L.ssm_norm, c.rms_eps) * silu(z)                    # [T, n_v, d_v]
        return L.ssm_out(o.reshape(T, hv * dv))                             # [T, n_embd]

    # -- feed-forward ------------------------------------------------------------------------
    def _ffn(self, L, h: np.ndarray) -> np.ndarray:
        if not self.config.n_expert:                            # qwen35: SwiGLU
            return L.ffn_down(silu(L.ffn_gate(h)) * L.ffn_up(h))
        out = self._moe(L, h)                   # routed: softmax, top k, renormalised
        shared = L.ffn_down_shexp(silu(L.ffn_gate_shexp(h)) * L.ffn_up_shexp(h))
        gate = _sigmoid(h @ L.ffn_gate_inp_shexp)[:, None]                  # [T, 1]
        return out + shared * gate


def open_model(g: GGUFFile, n_ctx: int = 2048, quantize_activations: bool = False
               ) -> ReferenceModel:
    """The reference model of any architecture: HybridModel for the gated delta-net hybrids,
    reference.ReferenceModel for the others (the same forward() and reset())."""
    if g.arch in ARCHS:
        return HybridModel(g, n_ctx, quantize_activations)
    return ReferenceModel(g, n_ctx, quantize_activations)
