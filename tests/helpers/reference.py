"""A numpy reference forward pass: what the GPU engine is checked against.

Float32 math on weights dequantized once from the GGUF file, computed the way llama.cpp's
graph builders compute it (src/models/llama.cpp, gemma3.cpp, lfm2.cpp, qwen3moe.cpp with
build_moe_ffn; qwen2.cpp, qwen3.cpp, mistral3.cpp, phi3.cpp, gemma2.cpp, openai-moe.cpp for
gpt-oss), with ggml's rounding order in the cheap places (rms_norm, the rope angles). The
hyperparameters are the GGUF keys llama.cpp reads (llama-model.cpp, each model's
load_arch_hparams) with its defaults, and the rope scaling is set up the way llama-context.cpp
sets its cparams (linear, YaRN, LongRoPE's short/long factors chosen by the context size).
Slow but plain: one matrix product per weight for a whole batch of tokens (per token and
expert for the experts), a float32 KV cache.

`quantize_activations=True` also rounds the numbers the way llama.cpp's CPU backend does:
activations go through Q8_0 / Q8_1 / Q8_K blocks before every product with a quantized
weight (ggml's vec_dot_type), the KV cache, Q and the attention probabilities through
float16, GELU through ggml's float16 table. Each op then agrees with llama.cpp's to float32
rounding (~1e-7, against ~1e-3 without), but whole-model logits get no closer: one activation
landing on the other side of a Q8 or float16 rounding step, from a 1e-7 difference in
accumulation order, is magnified by the residual-stream outliers (1e4 to 1e5) of both models.

Why this module is long: every architecture's reference shares the same blocks (attention
with its masks, sinks and soft-caps, the rope scalings, the expert routing, the rounding),
and keeping them in one file written apart from the GPU path keeps it independent of what
it checks.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from engine.formats.gguf_file import GGUFFile, ModelFileError

ARCHS = ("llama", "gemma3", "lfm2", "qwen3moe", "qwen2", "qwen3", "mistral3", "phi3", "gemma2",
         "gpt-oss", "olmo2", "granite")
# gated delta-net hybrids: reference_hybrid.py (its open_model returns a HybridModel)
HYBRID_ARCHS = ("qwen3next", "qwen35", "qwen35moe")
# the architectures whose graph is llama's: norm, attention (biases, Q/K norms where the file
# has them), norm, SwiGLU feed-forward
LLAMA_LIKE = ("llama", "qwen2", "qwen3", "mistral3", "granite")
# llama_model_rope_type: these rotate adjacent pairs, the others halves (NeoX)
ROPE_NORM = ("llama", "mistral3", "granite")
# the graphs that pass rope factors (rope_freqs, or LongRoPE's long/short) to ggml_rope_ext
ROPE_FACTORS = ("llama", "mistral3", "phi3", "granite")


@dataclass(frozen=True)
class Config:
    arch: str
    n_layer: int
    n_embd: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_ff: int
    n_vocab: int
    rms_eps: float
    rope_base: float            # global layers
    rope_base_swa: float        # sliding-window layers
    rope_neox: bool             # rotate halves (NeoX) rather than adjacent pairs
    n_swa: int                  # sliding window in tokens; 0: every layer attends to all
    swa_layers: tuple[bool, ...]
    attn_scale: float
    embd_scale: float           # multiplies the token embeddings
    final_softcap: float        # logits = c * tanh(logits / c); 0: none
    recurrent_layers: tuple[bool, ...] = ()   # lfm2: short-convolution layers
    d_conv: int = 0             # lfm2: conv state length, l_cache - 1
    n_expert: int = 0           # experts per layer (qwen3moe, gpt-oss); 0: a dense feed-forward
    n_expert_used: int = 0      # experts routed per token
    # rope as llama-context.cpp sets it up (ggml_rope_ext's arguments)
    n_rot: int = 0              # rotated dims of each head; 0: all of head_dim
    rope_scaling: str = "none"  # rope.scaling.type: none, linear, yarn, longrope
    rope_freq_scale: float = 1.0        # 1 / rope.scaling.factor (linear and YaRN)
    rope_freq_scale_swa: float = 1.0    # sliding-window layers
    yarn_ext_factor: float = 0.0        # 1 for YaRN: mix extrapolated and interpolated angles
    yarn_attn_factor: float = 1.0       # cparams.yarn_attn_factor: scales cos and sin
    yarn_beta_fast: float = 32.0
    yarn_beta_slow: float = 1.0
    n_ctx_orig: int = 0         # rope.scaling.original_context_length (else context_length)
    attn_softcap: float = 0.0   # gemma2: scores = c * tanh(scores / c); 0: none
    attn_temp_scale: float = 0.0        # mistral3: Q *= 1 + s * log(1 + floor(pos / n_ctx_orig))
    residual_scale: float = 1.0 # granite: each sublayer's output times this before the add
    logit_scale: float = 1.0    # granite: the logits divided by this

    @property
    def rope_dims(self) -> int:
        return self.n_rot or self.head_dim

    @classmethod
    def from_gguf(cls, g: GGUFFile) -> "Config":
        arch = g.arch
        if arch in HYBRID_ARCHS:
            raise ModelFileError(g.path, f"architecture {arch!r}: its reference is "
                                         f"reference_hybrid.HybridModel (its open_model picks it)")
        if arch not in ARCHS:
            raise ModelFileError(g.path, f"architecture {arch!r} has no reference forward pass")
        key = lambda k, *d: g.get(f"{arch}.{k}", *d) if d else g.require(f"{arch}.{k}")
        n_layer, n_embd = int(key("block_count")), int(key("embedding_length"))
        n_head = int(key("attention.head_count"))
        head_dim = int(key("attention.key_length", n_embd // n_head))
        n_vocab = int(g.tensor("token_embd.weight").shape[1])
        rope_base = float(key("rope.freq_base", 10000.0))
        if arch in LLAMA_LIKE or arch in ("phi3", "gemma2", "gpt-oss", "olmo2"):
            return cls._from_gguf_rope_scaled(g, arch, key, n_layer, n_embd, n_head, head_dim,
                                              n_vocab, rope_base)
        if arch == "lfm2":
            # head_count_kv per layer: zero marks a short-convolution layer
            kv = key("attention.head_count_kv")
            kv = [int(k) for k in kv] if isinstance(kv, (list, tuple)) else [int(kv)] * n_layer
            n_swa = int(key("attention.sliding_window", 0) or 0)
            return cls(arch, n_layer, n_embd, n_head, max(kv) or n_head, head_dim,
                       int(key("feed_forward_length")), n_vocab,
                       float(key("attention.layer_norm_rms_epsilon")), rope_base, rope_base,
                       rope_neox=True, n_swa=n_swa, swa_layers=tuple(n_swa > 0 and k > 0
                                                                     for k in kv),
                       attn_scale=1.0 / math.sqrt(head_dim), embd_scale=1.0, final_softcap=0.0,
                       recurrent_layers=tuple(k == 0 for k in kv),
                       d_conv=int(key("shortconv.l_cache")) - 1)
        if arch == "qwen3moe":
            return cls(arch, n_layer, n_embd, n_head, int(key("attention.head_count_kv", n_head)),
                       head_dim, 0, n_vocab, float(key("attention.layer_norm_rms_epsilon")),
                       rope_base, rope_base, rope_neox=True, n_swa=0,
                       swa_layers=(False,) * n_layer, attn_scale=1.0 / math.sqrt(head_dim),
                       embd_scale=1.0, final_softcap=0.0, n_expert=int(key("expert_count")),
                       n_expert_used=int(key("expert_used_count")))
        # gemma3, as llama-model.cpp loads it: every 6th layer global (set_swa_pattern(6)), the
        # local ones with rope base 10000; no sliding window key means all layers global.
        n_swa = int(key("attention.sliding_window", 0))
        swa = tuple(n_swa > 0 and (il + 1) % 6 != 0 for il in range(n_layer))
        return cls(arch, n_layer, n_embd, n_head, int(key("attention.head_count_kv", n_head)),
                   head_dim, int(key("feed_forward_length")), n_vocab,
                   float(key("attention.layer_norm_rms_epsilon")), rope_base, 10000.0,
                   rope_neox=True, n_swa=n_swa, swa_layers=swa,
                   attn_scale=1.0 / math.sqrt(head_dim), embd_scale=math.sqrt(n_embd),
                   final_softcap=float(key("final_logit_softcapping", 0.0)))

    @classmethod
    def _from_gguf_rope_scaled(cls, g: GGUFFile, arch: str, key, n_layer: int, n_embd: int,
                               n_head: int, head_dim: int, n_vocab: int, rope_base: float
                               ) -> "Config":
        """llama, qwen2, qwen3, mistral3, granite, phi3, gemma2, gpt-oss, olmo2: the keys their
        load_arch_hparams read, the defaults llama_hparams has, the rope llama-context.cpp
        derives from them."""
        f32 = np.float32
        n_head_kv = int(key("attention.head_count_kv", n_head))
        n_ff = int(key("feed_forward_length", 0))
        n_rot = int(key("rope.dimension_count", head_dim))
        n_ctx_orig = int(key("rope.scaling.original_context_length", key("context_length")))
        scaling = str(key("rope.scaling.type", "linear"))
        factor = float(key("rope.scaling.factor", key("rope.scale_linear", 0.0)))
        freq_scale = 1.0 if factor == 0.0 else float(f32(1.0) / f32(factor))
        freq_scale_swa = freq_scale     # rope_freq_scale_train_swa = rope_freq_scale_train
        if scaling == "none":
            freq_scale = 1.0
        beta_fast = beta_slow = log_mul = temp_scale = 0.0
        if arch == "mistral3":
            beta_fast = float(key("rope.scaling.yarn_beta_fast", 0.0))
            beta_slow = float(key("rope.scaling.yarn_beta_slow", 0.0))
            log_mul = float(key("rope.scaling.yarn_log_multiplier", 0.0))
            temp_scale = float(key("attention.temperature_scale", 0.0))
        ext_factor = 1.0 if scaling == "yarn" else 0.0
        attn_factor = f32(1.0)
        if ext_factor:
            # llama_context's constructor; rope_yarn multiplies by 1 + 0.1 ln(factor) again
            mscale = lambda s, m: f32(1.0) if s <= 1 else f32(0.1) * f32(m) * np.log(s) + f32(1)
            s = f32(1.0) / f32(freq_scale)
            attn_factor = mscale(s, 1.0) / mscale(s, log_mul) if log_mul else mscale(s, 1.0)
            attn_factor = attn_factor * (f32(1.0) / (f32(1.0) + f32(0.1) * np.log(s)))
        attn_factor = attn_factor * f32(key("rope.scaling.attn_factor", 1.0))

        n_swa, swa, rope_base_swa = 0, (False,) * n_layer, rope_base
        attn_scale, embd_scale = 1.0 / math.sqrt(head_dim), 1.0
        final_softcap = attn_softcap = 0.0
        if arch in ("gemma2", "gpt-oss"):
            # load_swa_pattern(ml, 2): layer il slides unless il % 2 == 1
            n_swa = int(key("attention.sliding_window", 4096) if arch == "gemma2"
                        else key("attention.sliding_window"))
            swa = _swa_pattern(key("attention.sliding_window_pattern", 2), n_layer)
            rope_base_swa = float(key("rope.freq_base_swa", rope_base))
        if arch == "gemma2":
            # gemma2.cpp: the 27B (46 layers) scales Q by 1/sqrt(n_embd / n_head); the file's
            # query_pre_attn_scalar is not read
            attn_scale = 1.0 / math.sqrt(n_embd // n_head if n_layer == 46 else head_dim)
            embd_scale = math.sqrt(n_embd)
            attn_softcap = float(key("attn_logit_softcapping", 50.0))
            final_softcap = float(key("final_logit_softcapping", 30.0))
        residual_scale = logit_scale = 1.0
        if arch == "granite":           # granite.cpp: a scale of 0 is none
            attn_scale = float(key("attention.scale", 0.0)) or attn_scale
            embd_scale = float(key("embedding_scale", 0.0)) or 1.0
            residual_scale = float(key("residual_scale", 0.0)) or 1.0
            logit_scale = float(key("logit_scale"))
        # phi3.cpp reads attention.sliding_window but turns the window off: all layers global
        return cls(arch, n_layer, n_embd, n_head, n_head_kv, head_dim, n_ff, n_vocab,
                   float(key("attention.layer_norm_rms_epsilon")), rope_base, rope_base_swa,
                   rope_neox=arch not in ROPE_NORM, n_swa=n_swa, swa_layers=swa,
                   attn_scale=attn_scale, embd_scale=embd_scale, final_softcap=final_softcap,
                   n_expert=int(key("expert_count", 0)),
                   n_expert_used=int(key("expert_used_count", 0)),
                   n_rot=n_rot if n_rot != head_dim else 0, rope_scaling=scaling,
                   rope_freq_scale=freq_scale, rope_freq_scale_swa=freq_scale_swa,
                   yarn_ext_factor=ext_factor, yarn_attn_factor=float(attn_factor),
                   yarn_beta_fast=beta_fast or 32.0, yarn_beta_slow=beta_slow or 1.0,
                   n_ctx_orig=n_ctx_orig, attn_softcap=attn_softcap,
                   attn_temp_scale=temp_scale, residual_scale=residual_scale,
                   logit_scale=logit_scale)


def _swa_pattern(pattern, n_layer: int) -> tuple[bool, ...]:
    """llama_hparams::set_swa_pattern (dense_first false), or the per-layer array itself."""
    if isinstance(pattern, (list, tuple)):
        return tuple(bool(p) for p in pattern[:n_layer])
    n = int(pattern)
    return tuple(n == 0 or il % n < n - 1 for il in range(n_layer))


# -- ggml's number formats, for quantize_activations -------------------------------------------

def _f16(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float16).astype(np.float32)


def _bf16(x: np.ndarray) -> np.ndarray:
    """Round to bfloat16, nearest even, as GGML_FP32_TO_BF16."""
    u = np.ascontiguousarray(x, np.float32).view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000
    return u.astype(np.uint32).view(np.float32)


def _q8_0(x: np.ndarray, f16_scale: bool = True) -> np.ndarray:
    """quantize_row_q8_0 (x86 SIMD) then dequantize: blocks of 32, d = amax/127 kept as f16
    (as f32 without f16_scale: mul_mat_vecq's staged x)."""
    b = x.reshape(*x.shape[:-1], -1, 32)
    amax = np.abs(b).max(axis=-1, keepdims=True)
    d = amax / np.float32(127.0)
    q = np.rint(b * np.divide(np.float32(127.0), amax, out=np.zeros_like(amax), where=amax > 0))
    return (q * (_f16(d) if f16_scale else d)).reshape(x.shape)


def _q8_1(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """quantize_row_q8_1 then dequantize; also the per-block sums s = fp16(d * sum(q))."""
    b = x.reshape(*x.shape[:-1], -1, 32)
    amax = np.abs(b).max(axis=-1, keepdims=True)
    d = amax / np.float32(127.0)
    q = np.rint(b * np.divide(np.float32(127.0), amax, out=np.zeros_like(amax), where=amax > 0))
    s = _f16(d[..., 0] * q.sum(axis=-1))
    return (q * _f16(d)).reshape(x.shape), s


def _q8_k(x: np.ndarray) -> np.ndarray:
    """quantize_row_q8_K then dequantize: blocks of 256, float32 scale -max/127."""
    b = x.reshape(*x.shape[:-1], -1, 256)
    i = np.abs(b).argmax(axis=-1)[..., None]
    mx = np.take_along_axis(b, i, axis=-1)
    iscale = np.divide(np.float32(-127.0), mx, out=np.zeros_like(mx), where=mx != 0)
    q = np.minimum(np.rint(iscale * b), 127)
    d = np.divide(np.float32(1.0), iscale, out=np.zeros_like(iscale), where=iscale != 0)
    return (q * d).reshape(x.shape)


# The activation format ggml's CPU backend pairs with each weight type (its vec_dot_type).
VEC_DOT = {"Q4_0": "Q8_0", "Q5_0": "Q8_0", "Q8_0": "Q8_0", "Q4_1": "Q8_1", "Q5_1": "Q8_1",
           "Q2_K": "Q8_K", "Q3_K": "Q8_K", "Q4_K": "Q8_K", "Q5_K": "Q8_K", "Q6_K": "Q8_K",
           "IQ4_NL": "Q8_0", "IQ4_XS": "Q8_K", "MXFP4": "Q8_0", "IQ3_XXS": "Q8_K",
           "IQ3_S": "Q8_K", "IQ2_XXS": "Q8_K", "IQ2_XS": "Q8_K", "IQ2_S": "Q8_K",
           "F16": "F16", "BF16": "BF16", "F32": "F32"}


class Linear:
    """One weight matrix, dequantized: y = x @ w.T, optionally with ggml's activation rounding.
    A 3-D tensor holds one matrix per expert: y = x @ w[expert].T."""

    def __init__(self, g: GGUFFile, name: str, emulate: bool):
        t = g.tensor(name)
        self.w = g.dequantize(name)             # [rows, row_len] or [n_expert, rows, row_len]
        self.act = VEC_DOT.get(t.type_name, "F32") if emulate else "F32"
        self.mins = None
        if self.act == "Q8_1":
            # Q4_1/Q5_1 blocks hold (d, m) as float16 first; ggml adds m * s with the rounded s.
            blk = t.data.reshape(*self.w.shape[:-1], -1, t.nbytes // (self.w.size // 32))
            self.mins = blk[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float32)

    def __call__(self, x: np.ndarray, expert: int | None = None) -> np.ndarray:
        w = self.w if expert is None else self.w[expert]
        if self.act == "F32":
            return x @ w.T
        if self.act == "F16":
            return _f16(x) @ w.T
        if self.act == "BF16":
            return _bf16(x) @ w.T
        if self.act == "Q8_0":
            return _q8_0(x) @ w.T
        if self.act == "Q8_K":
            return _q8_k(x) @ w.T
        mins = self.mins if expert is None else self.mins[expert]
        xq, s = _q8_1(x)                                # xq [T, row_len], s [T, n_blocks]
        exact = xq.reshape(*s.shape, 32).sum(axis=-1)
        return xq @ w.T + (s - exact) @ mins.T


# -- weights, named as the GGUF tensors ----------------------------------------------------------

@dataclass
class Block:
    """The tensors blk.{il}.*.weight of one layer."""
    attn_norm: np.ndarray           # [n_embd]
    ffn_norm: np.ndarray            # [n_embd]
    ffn_gate: Linear | None = None  # [n_ff, n_embd]      dense feed-forward
    ffn_up: Linear | None = None    # [n_ff, n_embd]
    ffn_down: Linear | None = None  # [n_embd, n_ff]
    attn_q: Linear | None = None    # [n_head * head_dim, n_embd]; None in lfm2 conv layers
    attn_k: Linear | None = None    # [n_head_kv * head_dim, n_embd]
    attn_v: Linear | None = None    # [n_head_kv * head_dim, n_embd]
    attn_output: Linear | None = None   # [n_embd, n_head * head_dim]
    attn_q_norm: np.ndarray | None = None           # [head_dim]   gemma3, qwen3moe
    attn_k_norm: np.ndarray | None = None           # [head_dim]   gemma3, qwen3moe
    ffn_gate_inp: Linear | None = None              # [n_expert, n_embd]           qwen3moe
    ffn_gate_exps: Linear | None = None             # [n_expert, n_ff_exp, n_embd] qwen3moe
    ffn_up_exps: Linear | None = None               # [n_expert, n_ff_exp, n_embd] qwen3moe
    ffn_down_exps: Linear | None = None             # [n_expert, n_embd, n_ff_exp] qwen3moe
    post_attention_norm: np.ndarray | None = None   # [n_embd]     gemma3
    post_ffw_norm: np.ndarray | None = None         # [n_embd]     gemma3
    shortconv_in_proj: Linear | None = None         # [3 * n_embd, n_embd]  lfm2: B | C | x
    shortconv_conv: np.ndarray | None = None        # [n_embd, l_cache]     lfm2
    shortconv_out_proj: Linear | None = None        # [n_embd, n_embd]      lfm2
    attn_qkv: Linear | None = None      # [(n_head + 2 n_head_kv) * hd, n_embd]  phi3: Q | K | V
    attn_q_b: np.ndarray | None = None              # [n_head * hd]     qwen2, gpt-oss
    attn_k_b: np.ndarray | None = None              # [n_head_kv * hd]
    attn_v_b: np.ndarray | None = None              # [n_head_kv * hd]
    attn_qkv_b: np.ndarray | None = None            # [(n_head + 2 n_head_kv) * hd]
    attn_output_b: np.ndarray | None = None         # [n_embd]          gpt-oss
    attn_sinks: np.ndarray | None = None            # [n_head]          gpt-oss
    ffn_gate_inp_b: np.ndarray | None = None        # [n_expert]                gpt-oss
    ffn_gate_exps_b: np.ndarray | None = None       # [n_expert, n_ff_exp]      gpt-oss
    ffn_up_exps_b: np.ndarray | None = None         # [n_expert, n_ff_exp]      gpt-oss
    ffn_down_exps_b: np.ndarray | None = None       # [n_expert, n_embd]        gpt-oss


@dataclass
class Weights:
    token_embd: Linear              # [n_vocab, n_embd]
    output_norm: np.ndarray         # [n_embd]
    output: Linear                  # [n_vocab, n_embd]; token_embd when the file has no output
    blk: list[Block]
    output_b: np.ndarray | None = None          # [n_vocab]       qwen2, phi3 (when present)
    rope_factors_long: np.ndarray | None = None     # [n_rot / 2]   phi3 LongRoPE
    rope_factors_short: np.ndarray | None = None    # [n_rot / 2]
    rope_freqs: np.ndarray | None = None        # [n_rot / 2]     llama 3, mistral3: always used

    @classmethod
    def from_gguf(cls, g: GGUFFile, cfg: Config, emulate: bool) -> "Weights":
        lin = lambda name: Linear(g, name, emulate)
        opt = lambda name: Linear(g, name, emulate) if name in g.tensors else None
        vec = lambda name: g.dequantize(name) if name in g.tensors else None
        blocks = []
        for il in range(cfg.n_layer):
            p = f"blk.{il}."
            conv = bool(cfg.recurrent_layers) and cfg.recurrent_layers[il]
            fused = p + "attn_qkv.weight" in g.tensors
            split = ("attn_q.weight", "attn_k.weight", "attn_v.weight")
            attn = lambda name: None if conv or (fused and name in split) else lin(p + name)
            short = lambda name: lin(p + name) if conv else None
            blocks.append(Block(
                attn_norm=vec(p + "attn_norm.weight"), attn_q=attn("attn_q.weight"),
                attn_k=attn("attn_k.weight"), attn_v=attn("attn_v.weight"),
                attn_output=attn("attn_output.weight"), ffn_norm=vec(p + "ffn_norm.weight"),
                ffn_gate=opt(p + "ffn_gate.weight"), ffn_up=opt(p + "ffn_up.weight"),
                ffn_down=opt(p + "ffn_down.weight"),
                ffn_gate_inp=opt(p + "ffn_gate_inp.weight"),
                ffn_gate_exps=opt(p + "ffn_gate_exps.weight"),
                ffn_up_exps=opt(p + "ffn_up_exps.weight"),
                ffn_down_exps=opt(p + "ffn_down_exps.weight"),
                attn_q_norm=vec(p + "attn_q_norm.weight"),
                attn_k_norm=vec(p + "attn_k_norm.weight"),
                post_attention_norm=vec(p + "post_attention_norm.weight"),
                post_ffw_norm=vec(p + "post_ffw_norm.weight"),
                shortconv_in_proj=short("shortconv.in_proj.weight"),
                shortconv_conv=vec(p + "shortconv.conv.weight"),
                shortconv_out_proj=short("shortconv.out_proj.weight"),
                attn_qkv=opt(p + "attn_qkv.weight"), attn_q_b=vec(p + "attn_q.bias"),
                attn_k_b=vec(p + "attn_k.bias"), attn_v_b=vec(p + "attn_v.bias"),
                attn_qkv_b=vec(p + "attn_qkv.bias"), attn_output_b=vec(p + "attn_output.bias"),
                attn_sinks=vec(p + "attn_sinks.weight"),
                ffn_gate_inp_b=vec(p + "ffn_gate_inp.bias"),
                ffn_gate_exps_b=vec(p + "ffn_gate_exps.bias"),
                ffn_up_exps_b=vec(p + "ffn_up_exps.bias"),
                ffn_down_exps_b=vec(p + "ffn_down_exps.bias")))
        token_embd = lin("token_embd.weight")
        output = lin("output.weight") if "output.weight" in g.tensors else token_embd
        # lfm2's final norm is stored under the name token_embd_norm
        norm = "token_embd_norm.weight" if cfg.arch == "lfm2" else "output_norm.weight"
        return cls(token_embd, vec(norm), output, blocks, output_b=vec("output.bias"),
                   rope_factors_long=vec("rope_factors_long.weight"),
                   rope_factors_short=vec("rope_factors_short.weight"),
                   rope_freqs=vec("rope_freqs.weight"))


# -- the pieces forward() is made of ----------------------------------------------------------

def rms_norm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    """x / rms(x) * w over the last axis, rounded step by step as ggml_rms_norm and ggml_mul."""
    sum_sq = (x * x).sum(axis=-1, keepdims=True, dtype=np.float64)   # float squares, double sum
    mean = (sum_sq / x.shape[-1]).astype(np.float32)
    scale = np.float32(1.0) / np.sqrt(mean + np.float32(eps))
    return (x * scale) * w


def yarn_corr_dims(n_dims: int, n_ctx_orig: int, base: float, beta_fast: float,
                   beta_slow: float) -> tuple[float, float]:
    """ggml_rope_yarn_corr_dims: the pair indices where YaRN's ramp starts and ends."""
    f32 = np.float32

    def dim(n_rot: float) -> np.float32:
        return (f32(n_dims) * np.log(f32(n_ctx_orig) / (f32(n_rot) * f32(2 * math.pi)))
                / (f32(2) * np.log(f32(base))))
    return (max(0.0, float(np.floor(dim(beta_fast)))),
            min(n_dims - 1.0, float(np.ceil(dim(beta_slow)))))


def rope(x: np.ndarray, pos: np.ndarray, base: float, neox: bool, *, n_dims: int = 0,
         freq_scale: float = 1.0, ext_factor: float = 0.0, attn_factor: float = 1.0,
         corr_dims: tuple[float, float] = (0.0, 0.0),
         freq_factors: np.ndarray | None = None) -> np.ndarray:
    """Rotate x [T, heads, head_dim] by position, the angles built as ggml's rope cache is
    (ggml_rope_cache_init and rope_yarn): theta_i = p * base^(-2i/n_dims) / freq_factors[i],
    scaled by freq_scale (linear), mixed with the unscaled angle along YaRN's ramp
    (ext_factor), cos and sin times attn_factor. Only the first n_dims of each head turn."""
    f32 = np.float32
    hd = x.shape[-1]
    nd = n_dims or hd
    theta_scale = f32(base) ** (f32(-2.0) / f32(nd))
    theta = np.empty((len(pos), nd // 2), f32)                          # [T, nd/2]
    t = pos.astype(f32)
    for i in range(nd // 2):                    # theta_i = p * s^i, one float multiply per step
        theta[:, i] = t
        t = t * theta_scale
    if freq_factors is not None:
        theta = theta / freq_factors.astype(f32)
    mscale = f32(attn_factor)
    if freq_scale != 1.0 or ext_factor != 0.0:
        extrap = theta
        theta = f32(freq_scale) * extrap
        if ext_factor != 0.0:
            low, high = corr_dims
            y = (np.arange(nd // 2, dtype=f32) - f32(low)) / max(f32(0.001), f32(high - low))
            mix = (f32(1) - np.minimum(f32(1), np.maximum(f32(0), y))) * f32(ext_factor)
            theta = theta * (f32(1) - mix) + extrap * mix
            mscale = mscale * (f32(1) + f32(0.1) * np.log(f32(1) / f32(freq_scale)))
    cos = (np.cos(theta.astype(np.float64)).astype(f32) * mscale)[:, None]  # [T, 1, nd/2]
    sin = (np.sin(theta.astype(np.float64)).astype(f32) * mscale)[:, None]
    xr = x[..., :nd]
    if neox:                                    # pairs (i, i + nd/2)
        a, b = xr[..., : nd // 2], xr[..., nd // 2:]
    else:                                       # pairs (2i, 2i + 1)
        a, b = xr[..., 0::2], xr[..., 1::2]
    # ggml's loop compiles to fma(x0, cos, -(x1 * sin)): one rounded product, one fused
    a64 = a.astype(np.float64)
    ra = (a64 * cos - b * sin).astype(f32)
    rb = (a64 * sin + b * cos).astype(f32)
    out = np.concatenate([ra, rb], axis=-1) if neox else np.stack([ra, rb], -1).reshape(xr.shape)
    return out if nd == hd else np.concatenate([out, x[..., nd:]], axis=-1)


def silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


def gelu(x: np.ndarray) -> np.ndarray:
    """The tanh approximation, as ggml_gelu."""
    return 0.5 * x * (1.0 + np.tanh(np.float32(math.sqrt(2 / math.pi)) * x
                                    * (1.0 + np.float32(0.044715) * x * x)))


def gelu_f16_table(x: np.ndarray) -> np.ndarray:
    """ggml's CPU GELU: looked up in a float16 table for |x| < 10."""
    y = _f16(gelu(_f16(x)))
    y = np.where(x >= 10.0, x, y)
    return np.where(x <= -10.0, 0.0, y).astype(np.float32)


def softmax(x: np.ndarray) -> np.ndarray:
    """As ggml_soft_max: float exponentials, a double sum, a multiply by its inverse."""
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e * (1.0 / e.sum(axis=-1, keepdims=True, dtype=np.float64)).astype(np.float32)


class RunState:
    """The KV cache, float32, preallocated for n_ctx positions; lfm2's conv states."""

    def __init__(self, cfg: Config, n_ctx: int):
        shape = (cfg.n_layer, n_ctx, cfg.n_head_kv, cfg.head_dim)
        self.k = np.zeros(shape, np.float32)    # [n_layer, n_ctx, n_head_kv, head_dim]
        self.v = np.zeros(shape, np.float32)    # [n_layer, n_ctx, n_head_kv, head_dim]
        # the previous d_conv inputs of each short-convolution layer, oldest first
        self.conv = {il: np.zeros((cfg.d_conv, cfg.n_embd), np.float32)   # [d_conv, n_embd]
                     for il, r in enumerate(cfg.recurrent_layers) if r}
        self.n_past = 0

    def reset_conv(self) -> None:
        for c in self.conv.values():
            c[:] = 0


class ReferenceModel:
    """A whole model in numpy: forward() a batch of tokens, logits out, KV cache kept."""

    def __init__(self, g: GGUFFile, n_ctx: int = 2048, quantize_activations: bool = False):
        self.config = Config.from_gguf(g)
        self.n_ctx = n_ctx
        self.emulate = quantize_activations
        self.weights = Weights.from_gguf(g, self.config, quantize_activations)
        self.state = RunState(self.config, n_ctx)
        # a list to have _moe append, per call, each token's router margin (router_log)
        self.router_log: list[np.ndarray] | None = None
        # llama_model::get_rope_factors: LongRoPE's long factors once the context (padded to
        # 256 as llama_context pads n_ctx_seq) exceeds the original one, else the short ones
        W = self.weights
        long_ctx = -(-n_ctx // 256) * 256 > self.config.n_ctx_orig
        self.rope_factors = None if self.config.arch not in ROPE_FACTORS else (
            W.rope_freqs if W.rope_freqs is not None else
            W.rope_factors_long if long_ctx else W.rope_factors_short)

    def reset(self) -> None:
        self.state.n_past = 0
        self.state.reset_conv()

    def forward(self, tokens: list[int], start_pos: int) -> np.ndarray:
        """Logits [len(tokens), n_vocab] for tokens at positions start_pos...; fills the cache."""
        if not tokens:
            raise ValueError("forward() needs at least one token")
        if start_pos + len(tokens) > self.n_ctx:
            raise ValueError(f"{start_pos + len(tokens)} positions exceed n_ctx={self.n_ctx}")
        if start_pos > self.state.n_past:
            raise ValueError(f"start_pos {start_pos} leaves a gap after {self.state.n_past}")
        if self.state.conv and start_pos not in (0, self.state.n_past):
            raise ValueError(f"conv states are at {self.state.n_past}, cannot rewind to "
                             f"{start_pos}")
        if start_pos == 0:
            self.state.reset_conv()
        tok = np.asarray(tokens, dtype=np.int64)
        pos = np.arange(start_pos, start_pos + len(tokens))
        forward = self._forward_llama if self.config.arch in LLAMA_LIKE else {
            "phi3": self._forward_phi3, "gemma2": self._forward_gemma2,
            "gpt-oss": self._forward_gpt_oss, "gemma3": self._forward_gemma3,
            "lfm2": self._forward_lfm2, "olmo2": self._forward_olmo2,
            "qwen3moe": self._forward_qwen3moe}[self.config.arch]
        logits = forward(tok, pos)
        self.state.n_past = start_pos + len(tokens)
        return logits

    def generate_greedy(self, prompt: list[int], n: int) -> list[int]:
        """n tokens by argmax after the prompt, from an empty cache."""
        self.reset()
        logits = self.forward(prompt, 0)[-1]
        out: list[int] = []
        for _ in range(n):
            out.append(int(np.argmax(logits)))
            if len(out) == n:
                break
            logits = self.forward(out[-1:], len(prompt) + len(out) - 1)[-1]
        return out

    # -- attention, shared by both architectures -------------------------------------------
    def _attention(self, il: int, q: np.ndarray, k: np.ndarray, v: np.ndarray,
                   pos: np.ndarray, scale: float, softcap: float = 0.0,
                   sinks: np.ndarray | None = None) -> np.ndarray:
        """q [T, n_head, hd], k/v [T, n_head_kv, hd] -> [T, n_head * hd], causal (and windowed).
        softcap: scores = c * tanh(scores / c) before the scale (gemma2); sinks [n_head]: one
        more logit per head in each softmax's denominator, attending to nothing (gpt-oss)."""
        c, s = self.config, self.state
        if self.emulate:                        # llama.cpp's cache and its mul_mat inputs are f16
            q, k, v = _f16(q), _f16(k), _f16(v)
        n = int(pos[-1]) + 1
        s.k[il, pos[0]:n], s.v[il, pos[0]:n] = k, v
        K, V = s.k[il, :n], s.v[il, :n]                             # [n, n_head_kv, hd]
        T, g = len(pos), c.n_head // c.n_head_kv
        qg = q.reshape(T, c.n_head_kv, g, c.head_dim).transpose(1, 2, 0, 3)  # [kv, g, T, hd]
        att = qg @ K.transpose(1, 2, 0)[:, None]                            # [kv, g, T, n]
        if softcap:
            att = np.tanh(att * np.float32(1.0 / softcap)) * np.float32(softcap)
        att = att * np.float32(scale)
        j = np.arange(n)
        masked = j[None, :] > pos[:, None]                                  # [T, n]
        if c.swa_layers[il]:
            masked |= pos[:, None] - j[None, :] >= c.n_swa
        att = np.where(masked, -np.inf, att).astype(np.float32)
        if sinks is None:
            att = softmax(att)
        else:                               # ggml_soft_max_add_sinks
            sk = sinks.reshape(c.n_head_kv, g, 1, 1).astype(np.float32)
            mx = np.maximum(att.max(axis=-1, keepdims=True), sk)
            e = np.exp(att - mx)
            total = e.sum(axis=-1, keepdims=True, dtype=np.float64) + np.exp(sk - mx)
            att = e * (1.0 / total).astype(np.float32)
        if self.emulate:
            att = _f16(att)
        out = att @ V.transpose(1, 0, 2)[:, None]                           # [kv, g, T, hd]
        return out.transpose(2, 0, 1, 3).reshape(T, c.n_head * c.head_dim)

    # -- pieces of the llama-like graphs --------------------------------------------------------
    def _rope(self, x: np.ndarray, pos: np.ndarray, il: int) -> np.ndarray:
        """ggml_rope_ext with the arguments llama.cpp's graph passes for layer il."""
        c = self.config
        swa = c.swa_layers[il]
        base = c.rope_base_swa if swa else c.rope_base
        freq_scale = c.rope_freq_scale_swa if swa else c.rope_freq_scale
        corr = yarn_corr_dims(c.rope_dims, c.n_ctx_orig, base, c.yarn_beta_fast,
                              c.yarn_beta_slow) if c.yarn_ext_factor else (0.0, 0.0)
        return rope(x, pos, base, c.rope_neox, n_dims=c.rope_dims, freq_scale=freq_scale,
                    ext_factor=c.yarn_ext_factor, attn_factor=c.yarn_attn_factor,
                    corr_dims=corr, freq_factors=self.rope_factors)

    def _qkv(self, L: Block, h: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """build_qkv: h [T, n_embd] -> q [T, n_head, hd], k and v [T, n_head_kv, hd], from
        separate or fused (phi3) weights, with their biases where the file has them."""
        c, T = self.config, len(h)
        nq, nkv = c.n_head * c.head_dim, c.n_head_kv * c.head_dim
        if L.attn_qkv is not None:
            qkv = L.attn_qkv(h)                                         # [T, nq + 2 nkv]
            if L.attn_qkv_b is not None:
                qkv = qkv + L.attn_qkv_b
            q, k, v = qkv[:, :nq], qkv[:, nq:nq + nkv], qkv[:, nq + nkv:]
        else:
            q, k, v = L.attn_q(h), L.attn_k(h), L.attn_v(h)
        if L.attn_q_b is not None:
            q, k, v = q + L.attn_q_b, k + L.attn_k_b, v + L.attn_v_b
        return (q.reshape(T, c.n_head, c.head_dim), k.reshape(T, c.n_head_kv, c.head_dim),
                v.reshape(T, c.n_head_kv, c.head_dim))

    def _out(self, L: Block, att: np.ndarray) -> np.ndarray:
        """The attention output projection [T, n_head * hd] -> [T, n_embd], bias included."""
        y = L.attn_output(att)
        return y if L.attn_output_b is None else y + L.attn_output_b

    def _logits(self, x: np.ndarray) -> np.ndarray:
        W = self.weights
        x = rms_norm(x, W.output_norm, self.config.rms_eps)                 # [T, n_embd]
        y = W.output(x)                                                     # [T, n_vocab]
        return y if W.output_b is None else y + W.output_b

    # -- llama, qwen2, qwen3, mistral3 --------------------------------------------------------
    def _forward_llama(self, tok: np.ndarray, pos: np.ndarray) -> np.ndarray:
        c, W = self.config, self.weights
        x = W.token_embd.w[tok]                                             # [T, n_embd]
        if c.embd_scale != 1.0:                         # granite
            x = x * np.float32(c.embd_scale)
        scaled = lambda y: y if c.residual_scale == 1.0 else y * np.float32(c.residual_scale)
        for il, L in enumerate(W.blk):
            h = rms_norm(x, L.attn_norm, c.rms_eps)                         # [T, n_embd]
            q, k, v = self._qkv(L, h)                   # [T, n_head | n_head_kv, hd]
            if L.attn_q_norm is not None:               # qwen3
                q = rms_norm(q, L.attn_q_norm, c.rms_eps)
                k = rms_norm(k, L.attn_k_norm, c.rms_eps)
            q = self._rope(q, pos, il)  # llama's GGUF q/k rows are permuted for adjacent pairs
            k = self._rope(k, pos, il)
            if c.attn_temp_scale:                       # mistral3: Llama 4's temperature tuning
                t = np.log(np.floor(pos / c.n_ctx_orig) + 1.0) * c.attn_temp_scale + 1.0
                q = q * t.astype(np.float32)[:, None, None]
            att = self._attention(il, q, k, v, pos, c.attn_scale)           # [T, n_head * hd]
            x = x + scaled(self._out(L, att))                               # [T, n_embd]
            h = rms_norm(x, L.ffn_norm, c.rms_eps)                          # [T, n_embd]
            h = silu(L.ffn_gate(h)) * L.ffn_up(h)                           # [T, n_ff]
            x = x + scaled(L.ffn_down(h))                                   # [T, n_embd]
        logits = self._logits(x)                                            # [T, n_vocab]
        if c.logit_scale != 1.0:                        # granite: ggml_scale by 1 / it
            logits = logits * (np.float32(1.0) / np.float32(c.logit_scale))
        return logits

    # -- olmo2 ------------------------------------------------------------------------------
    def _forward_olmo2(self, tok: np.ndarray, pos: np.ndarray) -> np.ndarray:
        c, W = self.config, self.weights
        x = W.token_embd.w[tok]                                             # [T, n_embd]
        T = len(tok)
        for il, L in enumerate(W.blk):
            q, k, v = self._qkv(L, x)                   # no norm before: x itself
            # Q and K normed over the whole projection, then split into heads
            q = rms_norm(q.reshape(T, -1), L.attn_q_norm, c.rms_eps).reshape(q.shape)
            k = rms_norm(k.reshape(T, -1), L.attn_k_norm, c.rms_eps).reshape(k.shape)
            q, k = self._rope(q, pos, il), self._rope(k, pos, il)
            att = self._attention(il, q, k, v, pos, c.attn_scale)           # [T, n_head * hd]
            x = x + rms_norm(self._out(L, att), L.post_attention_norm, c.rms_eps)
            h = silu(L.ffn_gate(x)) * L.ffn_up(x)                           # [T, n_ff]
            x = x + rms_norm(L.ffn_down(h), L.post_ffw_norm, c.rms_eps)     # [T, n_embd]
        return self._logits(x)                                              # [T, n_vocab]

    # -- phi3 -------------------------------------------------------------------------------
    def _forward_phi3(self, tok: np.ndarray, pos: np.ndarray) -> np.ndarray:
        c, W = self.config, self.weights
        x = W.token_embd.w[tok]                                             # [T, n_embd]
        for il, L in enumerate(W.blk):
            h = rms_norm(x, L.attn_norm, c.rms_eps)                         # [T, n_embd]
            q, k, v = self._qkv(L, h)                   # fused Q | K | V rows
            q = self._rope(q, pos, il)                  # LongRoPE factors divide the angles
            k = self._rope(k, pos, il)
            q = q * np.float32(c.attn_scale)            # phi3.cpp scales Q, attends at 1.0
            x = x + self._out(L, self._attention(il, q, k, v, pos, 1.0))    # [T, n_embd]
            h = rms_norm(x, L.ffn_norm, c.rms_eps)                          # [T, n_embd]
            gate, up = np.split(L.ffn_up(h), 2, axis=-1)    # ggml_swiglu: silu(1st half) * 2nd
            x = x + L.ffn_down(silu(gate) * up)                             # [T, n_embd]
        return self._logits(x)                                              # [T, n_vocab]

    # -- gemma2 -----------------------------------------------------------------------------
    def _forward_gemma2(self, tok: np.ndarray, pos: np.ndarray) -> np.ndarray:
        c, W = self.config, self.weights
        act = gelu_f16_table if self.emulate else gelu
        x = W.token_embd.w[tok] * np.float32(c.embd_scale)                  # [T, n_embd]
        for il, L in enumerate(W.blk):
            h = rms_norm(x, L.attn_norm, c.rms_eps)     # GGUF norms already hold 1 + w
            q, k, v = self._qkv(L, h)
            q = self._rope(q, pos, il)                  # the sliding layers' own rope base
            k = self._rope(k, pos, il)
            q = q * np.float32(c.attn_scale)            # f_attention_scale, then soft-capped
            att = self._attention(il, q, k, v, pos, 1.0, softcap=c.attn_softcap)
            x = x + rms_norm(L.attn_output(att), L.post_attention_norm, c.rms_eps)
            h = rms_norm(x, L.ffn_norm, c.rms_eps)                          # [T, n_embd]
            h = act(L.ffn_gate(h)) * L.ffn_up(h)                            # [T, n_ff]
            x = x + rms_norm(L.ffn_down(h), L.post_ffw_norm, c.rms_eps)     # [T, n_embd]
        logits = self._logits(x)                                            # [T, n_vocab]
        return np.tanh(logits * np.float32(1.0 / c.final_softcap)) * np.float32(c.final_softcap)

    # -- gpt-oss ----------------------------------------------------------------------------
    def _forward_gpt_oss(self, tok: np.ndarray, pos: np.ndarray) -> np.ndarray:
        c, W = self.config, self.weights
        x = W.token_embd.w[tok]                                             # [T, n_embd]
        for il, L in enumerate(W.blk):
            h = rms_norm(x, L.attn_norm, c.rms_eps)                         # [T, n_embd]
            q, k, v = self._qkv(L, h)                   # with biases
            q = self._rope(q, pos, il)                  # YaRN on every layer
            k = self._rope(k, pos, il)
            att = self._attention(il, q, k, v, pos, c.attn_scale, sinks=L.attn_sinks)
            x = x + self._out(L, att)                                       # [T, n_embd]
            h = rms_norm(x, L.post_attention_norm, c.rms_eps)   # the FFN's input norm
            x = x + self._moe_oai(L, h)                                     # [T, n_embd]
        return self._logits(x)                                              # [T, n_vocab]

    def _moe_oai(self, L: Block, h: np.ndarray) -> np.ndarray:
        """build_moe_ffn as openai-moe.cpp calls it: router logits plus bias, the top
        n_expert_used by logit, softmax over those alone (SOFTMAX_WEIGHT, no renormalising);
        each expert gate and up plus their biases, the clamped SwiGLU
        min(g, 7) * sigmoid(1.702 min(g, 7)) * (clamp(u, -7, 7) + 1), down plus its bias."""
        k = self.config.n_expert_used
        logits = L.ffn_gate_inp(h) + L.ffn_gate_inp_b                       # [T, n_expert]
        out = np.empty_like(h)
        for t in range(len(h)):
            top = np.argsort(-logits[t], kind="stable")[:k]
            w = softmax(logits[t, top])                                     # [k]
            acc = None
            for j, e in enumerate(top):
                g = L.ffn_gate_exps(h[t:t + 1], e)[0] + L.ffn_gate_exps_b[e]    # [n_ff_exp]
                u = L.ffn_up_exps(h[t:t + 1], e)[0] + L.ffn_up_exps_b[e]        # [n_ff_exp]
                g = np.minimum(g, np.float32(7.0))
                u = np.clip(u, np.float32(-7.0), np.float32(7.0))
                a = g / (np.float32(1.0) + np.exp(np.float32(-1.702) * g)) * (u + np.float32(1))
                y = (L.ffn_down_exps(a[None], e)[0] + L.ffn_down_exps_b[e]) * w[j]  # [n_embd]
                acc = y if acc is None else acc + y             # summed in slot order
            out[t] = acc
        return out

    # -- gemma3 -----------------------------------------------------------------------------
    def _forward_gemma3(self, tok: np.ndarray, pos: np.ndarray) -> np.ndarray:
        c, W, T = self.config, self.weights, len(tok)
        act = gelu_f16_table if self.emulate else gelu
        x = W.token_embd.w[tok] * np.float32(c.embd_scale)                  # [T, n_embd]
        for il, L in enumerate(W.blk):
            base = c.rope_base_swa if c.swa_layers[il] else c.rope_base
            h = rms_norm(x, L.attn_norm, c.rms_eps)     # GGUF norms already hold 1 + w
            q = L.attn_q(h).reshape(T, c.n_head, c.head_dim)                # [T, n_head, hd]
            k = L.attn_k(h).reshape(T, c.n_head_kv, c.head_dim)             # [T, n_head_kv, hd]
            v = L.attn_v(h).reshape(T, c.n_head_kv, c.head_dim)             # [T, n_head_kv, hd]
            q = rope(rms_norm(q, L.attn_q_norm, c.rms_eps), pos, base, neox=True)
            k = rope(rms_norm(k, L.attn_k_norm, c.rms_eps), pos, base, neox=True)
            q = q * np.float32(c.attn_scale)            # llama.cpp scales Q, then attends at 1.0
            att = self._attention(il, q, k, v, pos, 1.0)                    # [T, n_head * hd]
            h = rms_norm(L.attn_output(att), L.post_attention_norm, c.rms_eps)  # [T, n_embd]
            x = x + h
            h = rms_norm(x, L.ffn_norm, c.rms_eps)                          # [T, n_embd]
            h = act(L.ffn_gate(h)) * L.ffn_up(h)                            # [T, n_ff]
            x = x + rms_norm(L.ffn_down(h), L.post_ffw_norm, c.rms_eps)     # [T, n_embd]
        x = rms_norm(x, W.output_norm, c.rms_eps)                           # [T, n_embd]
        logits = W.output(x)                                                # [T, n_vocab]
        if c.final_softcap:
            logits = np.tanh(logits / c.final_softcap) * c.final_softcap
        return logits

    # -- lfm2 -------------------------------------------------------------------------------
    def _shortconv(self, il: int, L: Block, h: np.ndarray) -> np.ndarray:
        """h [T, n_embd] -> [T, n_embd]: in_proj to B, C, x; B * x through the causal depthwise
        convolution over (conv state, new inputs); C * conv; out_proj. Moves the state on."""
        T = len(h)
        b, c, x = np.split(L.shortconv_in_proj(h), 3, axis=-1)             # 3 x [T, n_embd]
        sx = np.concatenate([self.state.conv[il], b * x])          # [d_conv + T, n_embd]
        self.state.conv[il] = sx[T:].copy()                         # the last d_conv inputs
        w = L.shortconv_conv                                        # [n_embd, l_cache]
        conv = np.zeros_like(b)                                     # [T, n_embd]
        for k in range(w.shape[1]):             # in k order, f32, as ggml_ssm_conv sums
            conv = conv + sx[k:k + T] * w[:, k]
        return L.shortconv_out_proj(c * conv)

    def _forward_lfm2(self, tok: np.ndarray, pos: np.ndarray) -> np.ndarray:
        c, W, T = self.config, self.weights, len(tok)
        x = W.token_embd.w[tok]                                             # [T, n_embd]
        for il, L in enumerate(W.blk):
            h = rms_norm(x, L.attn_norm, c.rms_eps)                         # [T, n_embd]
            if c.recurrent_layers[il]:
                h = self._shortconv(il, L, h)                               # [T, n_embd]
            else:
                q = L.attn_q(h).reshape(T, c.n_head, -1)                    # [T, n_head, hd]
                k = L.attn_k(h).reshape(T, -1, c.head_dim)                  # [T, n_head_kv, hd]
                v = L.attn_v(h).reshape(T, -1, c.head_dim)                  # [T, n_head_kv, hd]
                q = rope(rms_norm(q, L.attn_q_norm, c.rms_eps), pos, c.rope_base, neox=True)
                k = rope(rms_norm(k, L.attn_k_norm, c.rms_eps), pos, c.rope_base, neox=True)
                h = L.attn_output(self._attention(il, q, k, v, pos, c.attn_scale))
            x = x + h
            h = rms_norm(x, L.ffn_norm, c.rms_eps)                          # [T, n_embd]
            h = silu(L.ffn_gate(h)) * L.ffn_up(h)                           # [T, n_ff]
            x = x + L.ffn_down(h)                                           # [T, n_embd]
        x = rms_norm(x, W.output_norm, c.rms_eps)                           # [T, n_embd]
        return W.output(x)                                                  # [T, n_vocab]

    # -- qwen3moe ---------------------------------------------------------------------------
    def _forward_qwen3moe(self, tok: np.ndarray, pos: np.ndarray) -> np.ndarray:
        c, W, T = self.config, self.weights, len(tok)
        x = W.token_embd.w[tok]                                             # [T, n_embd]
        for il, L in enumerate(W.blk):
            h = rms_norm(x, L.attn_norm, c.rms_eps)                         # [T, n_embd]
            q = L.attn_q(h).reshape(T, c.n_head, c.head_dim)                # [T, n_head, hd]
            k = L.attn_k(h).reshape(T, c.n_head_kv, c.head_dim)             # [T, n_head_kv, hd]
            v = L.attn_v(h).reshape(T, c.n_head_kv, c.head_dim)             # [T, n_head_kv, hd]
            q = rope(rms_norm(q, L.attn_q_norm, c.rms_eps), pos, c.rope_base, neox=True)
            k = rope(rms_norm(k, L.attn_k_norm, c.rms_eps), pos, c.rope_base, neox=True)
            att = self._attention(il, q, k, v, pos, c.attn_scale)           # [T, n_head * hd]
            x = x + L.attn_output(att)                                      # [T, n_embd]
            h = rms_norm(x, L.ffn_norm, c.rms_eps)                          # [T, n_embd]
            x = self._moe(L, h) + x                                         # [T, n_embd]
        x = rms_norm(x, W.output_norm, c.rms_eps)                           # [T, n_embd]
        return W.output(x)                                                  # [T, n_vocab]

    def _moe(self, L: Block, h: np.ndarray) -> np.ndarray:
        """build_moe_ffn with softmax gating and renormalised weights: h [T, n_embd] ->
        the weighted sum of each token's n_expert_used SwiGLU experts [T, n_embd]."""
        k = self.config.n_expert_used
        logits = L.ffn_gate_inp(h)                                          # [T, n_expert]
        if self.router_log is not None:     # the last chosen logit minus the next, per token
            ranked = -np.sort(-logits, axis=1)
            self.router_log.append(ranked[:, k - 1] - ranked[:, k])
        probs = softmax(logits)
        out = np.empty_like(h)
        for t in range(len(h)):
            top = np.argsort(-probs[t], kind="stable")[:k]      # largest, lowest index on ties
            w = probs[t, top]                                               # [k]
            w = w / max(w.sum(dtype=np.float32), np.float32(6.103515625e-5))
            acc = None
            for j, e in enumerate(top):
                g = L.ffn_gate_exps(h[t:t + 1], e)                          # [1, n_ff_exp]
                u = L.ffn_up_exps(h[t:t + 1], e)                            # [1, n_ff_exp]
                y = L.ffn_down_exps(silu(g) * u, e)[0] * w[j]               # [n_embd]
                acc = y if acc is None else acc + y             # summed in slot order
            out[t] = acc
        return out

