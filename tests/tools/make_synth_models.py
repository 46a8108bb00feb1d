"""Write tests/data/synth/*.gguf: tiny random-weight models of the architectures and weight
types no real small model covers here, for checking against llama.cpp.

Run by hand where llama-cpp-python is installed (the weight-type files are quantized by
llama.cpp itself, through llama_model_quantize; CI has no llama-cpp-python and only reads the
stored files):

    /work/llamacpp-venv/bin/python tests/tools/make_synth_models.py
    /work/llamacpp-venv/bin/python tests/tools/make_synth_reference.py

Every model has 2 layers, n_embd 256 (the hybrid delta-net ones 4 layers of 128, see
hybrid_writer) and a 400-token byte-level BPE vocabulary cut down from SmolLM2's (the 17
special tokens, the 256 byte tokens, the first merges). Weights are
zero-mean normal with std 1/sqrt(fan_in) (norm weights around 1, biases small), seeded by the
file name, so the files come out the same on every run. The architecture files keep their
matrices in F16 and each one exercises its architecture's particular parts (see MODELS);
the weight-type files are one llama model quantized with `pure` (every matrix, token
embedding and output included, in the one type), gpt-oss's experts in MXFP4 (its other
tensors F16, as in gpt-oss-f16), and qwen35-f16's numbers with every matrix in Q8_0.
"""
from __future__ import annotations

import argparse
import ctypes
import pickle
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "tests" / "data" / "synth"
TOKENIZER = ROOT.parent / "shared" / "tools" / "smollm2_tokenizer.pkl"
N_VOCAB = 400
N_EMBD = 256
N_LAYER = 2


# -- the vocabulary ----------------------------------------------------------------------------

def small_vocab(path: Path, n_vocab: int = N_VOCAB) -> dict:
    """SmolLM2's tokenizer.* keys (a pickled dict of key -> (type, subtype, value)) cut to the
    first n_vocab tokens, keeping only the merges whose parts and result all survive."""
    import gguf

    kv = pickle.load(open(path, "rb"))
    tokens = kv["tokenizer.ggml.tokens"][2][:n_vocab]
    keep = set(tokens)
    merges = [m for m in kv["tokenizer.ggml.merges"][2]
              if all(p in keep for p in m.split(" ")) and m.replace(" ", "") in keep]
    out = dict(kv)
    arr, s, i32 = gguf.GGUFValueType.ARRAY, gguf.GGUFValueType.STRING, gguf.GGUFValueType.INT32
    out["tokenizer.ggml.tokens"] = (arr, s, tokens)
    out["tokenizer.ggml.token_type"] = (arr, i32, kv["tokenizer.ggml.token_type"][2][:n_vocab])
    out["tokenizer.ggml.merges"] = (arr, s, merges)
    return out


def add_vocab(w, kv: dict) -> None:
    import gguf

    for k, (t, sub, val) in kv.items():
        if t == gguf.GGUFValueType.ARRAY:
            w.add_array(k, val)
        elif t == gguf.GGUFValueType.STRING:
            w.add_string(k, val)
        else:
            w.add_key_value(k, val, t)


# -- random tensors ------------------------------------------------------------------------------

class Rand:
    """Named random tensors from one generator: matrices (F16 unless told), vectors (F32)."""

    def __init__(self, name: str, f32: bool = False):
        self.rng = np.random.default_rng(sum(name.encode()) * 7919 + len(name))
        self.dtype = np.float32 if f32 else np.float16

    def mat(self, *shape: int, scale: float = 1.0) -> np.ndarray:
        """numpy shape (..., rows, fan_in): std scale / sqrt(fan_in)."""
        a = self.rng.standard_normal(shape, dtype=np.float32) * (scale / np.sqrt(shape[-1]))
        return a.astype(self.dtype)

    def norm(self, n: int, mean: float = 1.0) -> np.ndarray:
        return (mean * (1.0 + 0.1 * self.rng.standard_normal(n))).astype(np.float32)

    def vec(self, n, std: float) -> np.ndarray:
        return (std * self.rng.standard_normal(n)).astype(np.float32)


def writer(path: Path, arch: str, vocab: dict, *, n_head: int, n_head_kv: int, head_dim: int,
           n_ff: int, ctx: int = 4096, rope_base: float = 10000.0, f32: bool = False):
    """A GGUFWriter with the keys every architecture here shares."""
    import gguf

    w = gguf.GGUFWriter(str(path), arch)
    # llama.cpp's vocabulary loader looks up Phi-3's "</s>" when the name says phi3
    w.add_name(f"synthetic {path.stem}".replace("phi3", "phi 3"))
    w.add_context_length(ctx)
    w.add_embedding_length(N_EMBD)
    w.add_block_count(N_LAYER)
    if n_ff:
        w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head_kv)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_rope_dimension_count(head_dim)
    w.add_rope_freq_base(rope_base)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_vocab_size(N_VOCAB)
    w.add_file_type(gguf.LlamaFileType.ALL_F32 if f32 else gguf.LlamaFileType.MOSTLY_F16)
    add_vocab(w, vocab)
    return w


def finish(w) -> None:
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def attention(w, r: Rand, il: int, n_head: int, n_head_kv: int, hd: int, *, bias: float = 0.0,
              fused: bool = False) -> None:
    p = f"blk.{il}."
    q, kv = n_head * hd, n_head_kv * hd
    if fused:
        w.add_tensor(p + "attn_qkv.weight", r.mat(q + 2 * kv, N_EMBD))
    else:
        w.add_tensor(p + "attn_q.weight", r.mat(q, N_EMBD))
        w.add_tensor(p + "attn_k.weight", r.mat(kv, N_EMBD))
        w.add_tensor(p + "attn_v.weight", r.mat(kv, N_EMBD))
    if bias:
        w.add_tensor(p + "attn_q.bias", r.vec(q, bias))
        w.add_tensor(p + "attn_k.bias", r.vec(kv, bias))
        w.add_tensor(p + "attn_v.bias", r.vec(kv, bias))
    w.add_tensor(p + "attn_output.weight", r.mat(N_EMBD, q))


def dense_ffn(w, r: Rand, il: int, n_ff: int) -> None:
    p = f"blk.{il}."
    w.add_tensor(p + "ffn_gate.weight", r.mat(n_ff, N_EMBD))
    w.add_tensor(p + "ffn_up.weight", r.mat(n_ff, N_EMBD))
    w.add_tensor(p + "ffn_down.weight", r.mat(N_EMBD, n_ff))


def embeddings(w, r: Rand, tied: bool, embd_std: float | None = None,
               out_norm: float | None = None) -> None:
    """token_embd [n_vocab, n_embd]; output [n_vocab, n_embd] unless tied; output_norm.
    Tied embeddings are small beside what the layers add, or every token predicts itself;
    the output norm's weights (~2) then bring the logits to the untied ones' std of ~3."""
    embd_std = embd_std or (0.1 if tied else 0.5)
    out_norm = out_norm or (2.0 if tied else 1.0)
    emb = (embd_std * r.rng.standard_normal((N_VOCAB, N_EMBD), dtype=np.float32))
    w.add_tensor("token_embd.weight", emb.astype(r.dtype))
    w.add_tensor("output_norm.weight", r.norm(N_EMBD, out_norm))
    if not tied:        # logits of std ~3: greedy steps are rarely near-ties
        w.add_tensor("output.weight", r.mat(N_VOCAB, N_EMBD, scale=3.0))


# -- the architecture files --------------------------------------------------------------------

def make_qwen2(path: Path, vocab: dict, f32: bool = False) -> None:
    """Q/K/V biases (large on K, as trained Qwen2 has), untied output, YaRN x4 from 4096."""
    import gguf

    r, nh, nkv, hd, ff = Rand("qwen2-yarn-f16", f32), 4, 2, 64, 256
    w = writer(path, "qwen2", vocab, n_head=nh, n_head_kv=nkv, head_dim=hd, n_ff=ff, ctx=16384,
               rope_base=1e6, f32=f32)
    w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
    w.add_rope_scaling_factor(4.0)
    w.add_rope_scaling_orig_ctx_len(4096)
    embeddings(w, r, tied=False)
    for il in range(N_LAYER):
        w.add_tensor(f"blk.{il}.attn_norm.weight", r.norm(N_EMBD))
        attention(w, r, il, nh, nkv, hd, bias=0.5)
        w.add_tensor(f"blk.{il}.ffn_norm.weight", r.norm(N_EMBD))
        dense_ffn(w, r, il, ff)
    finish(w)


def make_qwen3(path: Path, vocab: dict) -> None:
    """Q/K RMS norms, 3 heads of 128 (n_head * head_dim != n_embd), tied output, linear rope x2."""
    import gguf

    r, nh, nkv, hd, ff = Rand(path.stem), 3, 1, 128, 256
    w = writer(path, "qwen3", vocab, n_head=nh, n_head_kv=nkv, head_dim=hd, n_ff=ff,
               rope_base=1e6)
    w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
    w.add_rope_scaling_factor(2.0)
    embeddings(w, r, tied=True)
    for il in range(N_LAYER):
        p = f"blk.{il}."
        w.add_tensor(p + "attn_norm.weight", r.norm(N_EMBD))
        attention(w, r, il, nh, nkv, hd)
        w.add_tensor(p + "attn_q_norm.weight", r.norm(hd))
        w.add_tensor(p + "attn_k_norm.weight", r.norm(hd))
        w.add_tensor(p + "ffn_norm.weight", r.norm(N_EMBD))
        dense_ffn(w, r, il, ff)
    finish(w)


PHI3_ORIG_CTX = 256     # llama.cpp takes the long factors when n_ctx_seq > this


def make_phi3(path: Path, vocab: dict) -> None:
    """Fused QKV, fused gate|up, LongRoPE short/long factors with its attn_factor, untied."""
    import gguf

    r, nh, nkv, hd, ff = Rand(path.stem), 4, 2, 64, 256
    w = writer(path, "phi3", vocab, n_head=nh, n_head_kv=nkv, head_dim=hd, n_ff=ff,
               ctx=4 * PHI3_ORIG_CTX)
    w.add_rope_scaling_type(gguf.RopeScalingType.LONGROPE)
    w.add_rope_scaling_orig_ctx_len(PHI3_ORIG_CTX)
    w.add_rope_scaling_attn_factors(float(np.sqrt(1 + np.log(4) / np.log(PHI3_ORIG_CTX))))
    embeddings(w, r, tied=False)
    # factors divide the rotation frequencies: 1 for the fastest pairs, growing to the slowest
    ramp = np.linspace(0.0, 1.0, hd // 2, dtype=np.float32)
    w.add_tensor("rope_factors_short.weight", (1.0 + 0.5 * ramp ** 2).astype(np.float32))
    w.add_tensor("rope_factors_long.weight", (1.0 + 15.0 * ramp ** 2).astype(np.float32))
    for il in range(N_LAYER):
        p = f"blk.{il}."
        w.add_tensor(p + "attn_norm.weight", r.norm(N_EMBD))
        attention(w, r, il, nh, nkv, hd, fused=True)
        w.add_tensor(p + "ffn_norm.weight", r.norm(N_EMBD))
        w.add_tensor(p + "ffn_up.weight", r.mat(2 * ff, N_EMBD))      # gate rows, then up rows
        w.add_tensor(p + "ffn_down.weight", r.mat(N_EMBD, ff))
    finish(w)


GEMMA2_WINDOW = 12


def make_gemma2(path: Path, vocab: dict, f32: bool = False) -> None:
    """Embedding scale sqrt(n_embd), attention and final soft-capping (small caps so they bite),
    post-attention and post-FFN norms, a 12-token window on layer 0 (layer 1 global) with its
    own rope base, 3 heads of 128 so 1/sqrt(head_dim) differs from 1/sqrt(n_embd / n_head); tied."""
    r, nh, nkv, hd, ff = Rand(path.stem, f32), 3, 1, 128, 256
    w = writer(path, "gemma2", vocab, n_head=nh, n_head_kv=nkv, head_dim=hd, n_ff=ff,
               ctx=8192, f32=f32)
    w.add_sliding_window(GEMMA2_WINDOW)
    w.add_rope_freq_base_swa(1000.0)
    w.add_attn_logit_softcapping(2.0)
    w.add_final_logit_softcapping(10.0)
    # The embedding enters times sqrt(256): it must be tiny beside what the layers add (large
    # post-norm weights, as trained Gemmas have), else every token predicts itself; a large
    # output norm then brings the logits up to where the soft-cap bites.
    embeddings(w, r, tied=True, embd_std=0.01, out_norm=25.0)
    for il in range(N_LAYER):
        p = f"blk.{il}."
        w.add_tensor(p + "attn_norm.weight", r.norm(N_EMBD))
        attention(w, r, il, nh, nkv, hd)
        w.add_tensor(p + "post_attention_norm.weight", r.norm(N_EMBD, 3.0))
        w.add_tensor(p + "ffn_norm.weight", r.norm(N_EMBD))
        dense_ffn(w, r, il, ff)
        w.add_tensor(p + "post_ffw_norm.weight", r.norm(N_EMBD, 3.0))
    finish(w)


GPT_OSS_WINDOW = 16


def make_gpt_oss(path: Path, vocab: dict, f32: bool = False,
                 experts: dict[str, tuple[np.ndarray, int]] | None = None) -> None:
    """Attention sinks, Q/K/V and output biases, 4 experts (2 used) with router and expert
    biases and the clamped SwiGLU, a 16-token window on layer 0, YaRN x32 from 4096; untied.
    experts: tensor name -> (raw bytes, ggml type) to store instead of the F16 expert weights
    (the same random numbers, quantized elsewhere)."""
    import gguf

    r, nh, nkv, hd, n_exp, ff = Rand("gpt-oss", f32), 4, 2, 64, 4, 64
    w = writer(path, "gpt-oss", vocab, n_head=nh, n_head_kv=nkv, head_dim=hd, n_ff=0,
               ctx=131072, rope_base=150000.0, f32=f32)
    if experts:
        w.add_file_type(gguf.LlamaFileType.MOSTLY_MXFP4_MOE)

    def expert_tensor(name: str, a: np.ndarray) -> None:
        if experts and name in experts:
            raw, qtype = experts[name]
            w.add_tensor(name, raw, raw_dtype=gguf.GGMLQuantizationType(qtype))
        else:
            w.add_tensor(name, a)

    w.add_sliding_window(GPT_OSS_WINDOW)
    w.add_expert_count(n_exp)
    w.add_expert_used_count(2)
    w.add_expert_feed_forward_length(ff)
    w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
    w.add_rope_scaling_factor(32.0)
    w.add_rope_scaling_orig_ctx_len(4096)
    embeddings(w, r, tied=False)
    for il in range(N_LAYER):
        p = f"blk.{il}."
        w.add_tensor(p + "attn_norm.weight", r.norm(N_EMBD))
        attention(w, r, il, nh, nkv, hd, bias=0.2)
        w.add_tensor(p + "attn_output.bias", r.vec(N_EMBD, 0.2))
        w.add_tensor(p + "attn_sinks.weight", r.vec(nh, 1.5))
        w.add_tensor(p + "post_attention_norm.weight", r.norm(N_EMBD))
        # Layer 0 routes by the input; layer 1's router is bias-led (experts 0 and 1, by a
        # margin of ~3): its input has passed through layer 0's experts, which llama.cpp
        # feeds 8-bit-rounded activations in the MXFP4 file, and a near-tie there flips
        # between llama.cpp and a float forward pass.
        last = il == N_LAYER - 1
        w.add_tensor(p + "ffn_gate_inp.weight",
                     r.mat(n_exp, N_EMBD, scale=0.5 if last else 4.0).astype(np.float32))
        w.add_tensor(p + "ffn_gate_inp.bias", np.array([3.0, 1.5, -1.5, -3.0], np.float32)
                     if last else r.vec(n_exp, 0.3))
        # gate/up of std ~3.5, so the clamps at 7 bite on a few percent of the values
        expert_tensor(p + "ffn_gate_exps.weight", r.mat(n_exp, ff, N_EMBD, scale=3.5))
        w.add_tensor(p + "ffn_gate_exps.bias", r.vec((n_exp, ff), 0.5))
        expert_tensor(p + "ffn_up_exps.weight", r.mat(n_exp, ff, N_EMBD, scale=3.5))
        w.add_tensor(p + "ffn_up_exps.bias", r.vec((n_exp, ff), 0.5))
        expert_tensor(p + "ffn_down_exps.weight", r.mat(n_exp, N_EMBD, ff, scale=0.5))
        w.add_tensor(p + "ffn_down_exps.bias", r.vec((n_exp, N_EMBD), 0.2))
    finish(w)


def make_olmo2(path: Path, vocab: dict) -> None:
    """No norms before attention and feed-forward, post-norms after both, Q/K norms over the
    whole projection (256 and 128 wide: 4 heads of 64, 2 KV heads), NeoX rope, untied."""
    r, nh, nkv, hd, ff = Rand(path.stem), 4, 2, 64, 256
    w = writer(path, "olmo2", vocab, n_head=nh, n_head_kv=nkv, head_dim=hd, n_ff=ff,
               rope_base=500000.0)
    embeddings(w, r, tied=False)
    for il in range(N_LAYER):
        p = f"blk.{il}."
        attention(w, r, il, nh, nkv, hd)
        w.add_tensor(p + "attn_q_norm.weight", r.norm(nh * hd))
        w.add_tensor(p + "attn_k_norm.weight", r.norm(nkv * hd))
        w.add_tensor(p + "post_attention_norm.weight", r.norm(N_EMBD))
        dense_ffn(w, r, il, ff)
        w.add_tensor(p + "post_ffw_norm.weight", r.norm(N_EMBD))
    finish(w)


def make_granite(path: Path, vocab: dict) -> None:
    """llama's graph with Granite's four scales: embeddings x 12, each sublayer's output
    x 0.22 before the residual add, attention scores x 0.03 (not 1/sqrt(64)), logits / 8;
    an output bias on the attention; adjacent-pair rope; untied (the embeddings small, so
    that x 12 they stay beside what the layers add)."""
    r, nh, nkv, hd, ff = Rand(path.stem), 4, 2, 64, 256
    w = writer(path, "granite", vocab, n_head=nh, n_head_kv=nkv, head_dim=hd, n_ff=ff)
    w.add_embedding_scale(12.0)
    w.add_residual_scale(0.22)
    w.add_attention_scale(0.03)
    w.add_logit_scale(8.0)
    emb = 0.04 * r.rng.standard_normal((N_VOCAB, N_EMBD), dtype=np.float32)
    w.add_tensor("token_embd.weight", emb.astype(r.dtype))
    w.add_tensor("output_norm.weight", r.norm(N_EMBD))
    w.add_tensor("output.weight", r.mat(N_VOCAB, N_EMBD, scale=24.0))    # logits std ~3 / 8
    for il in range(N_LAYER):
        p = f"blk.{il}."
        w.add_tensor(p + "attn_norm.weight", r.norm(N_EMBD))
        attention(w, r, il, nh, nkv, hd)
        w.add_tensor(p + "attn_output.bias", r.vec(N_EMBD, 0.1))
        w.add_tensor(p + "ffn_norm.weight", r.norm(N_EMBD))
        dense_ffn(w, r, il, ff)
    finish(w)


MISTRAL3_ORIG_CTX = 16


def make_mistral3(path: Path, vocab: dict) -> None:
    """Llama-like (adjacent-pair rope) with YaRN x16 (beta_fast/slow and log multiplier from the
    file) and Llama-4 attention temperature scaling, which starts at position 16; tied."""
    import gguf

    r, nh, nkv, hd, ff = Rand(path.stem), 4, 2, 64, 256
    w = writer(path, "mistral3", vocab, n_head=nh, n_head_kv=nkv, head_dim=hd, n_ff=ff,
               ctx=16 * MISTRAL3_ORIG_CTX, rope_base=1e6)
    w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
    w.add_rope_scaling_factor(16.0)
    w.add_rope_scaling_orig_ctx_len(MISTRAL3_ORIG_CTX)
    w.add_rope_scaling_yarn_beta_fast(16.0)
    w.add_rope_scaling_yarn_beta_slow(2.0)
    w.add_rope_scaling_yarn_log_mul(1.0)
    w.add_attn_temperature_scale(0.5)
    embeddings(w, r, tied=True)
    for il in range(N_LAYER):
        w.add_tensor(f"blk.{il}.attn_norm.weight", r.norm(N_EMBD))
        attention(w, r, il, nh, nkv, hd)
        w.add_tensor(f"blk.{il}.ffn_norm.weight", r.norm(N_EMBD))
        dense_ffn(w, r, il, ff)
    finish(w)


def make_llama_f32(path: Path, vocab: dict) -> None:
    """The source of the weight-type files: plain llama, F32, untied, rows of 256."""
    r, nh, nkv, hd, ff = Rand("llama", f32=True), 4, 2, 64, 256
    w = writer(path, "llama", vocab, n_head=nh, n_head_kv=nkv, head_dim=hd, n_ff=ff,
               rope_base=10000.0, f32=True)
    embeddings(w, r, tied=False)
    for il in range(N_LAYER):
        w.add_tensor(f"blk.{il}.attn_norm.weight", r.norm(N_EMBD))
        attention(w, r, il, nh, nkv, hd)
        w.add_tensor(f"blk.{il}.ffn_norm.weight", r.norm(N_EMBD))
        dense_ffn(w, r, il, ff)
    finish(w)


# -- the hybrid gated delta-net files (qwen3next, qwen35, qwen35moe) ---------------------------
# n_embd 128 keeps them small: 4 layers mixing gated delta-net and full attention.
HYB_EMBD = 128
HYB_LAYERS = 4
HYB_K_HEADS, HYB_V_HEADS, HYB_STATE = 2, 4, 32     # value heads twice the key heads
HYB_CONV = 4
HYB_HEAD, HYB_HEAD_KV, HYB_HEAD_DIM, HYB_ROT = 2, 1, 64, 16     # partial rope: 1/4 of a head


def hybrid_writer(path: Path, arch: str, vocab: dict, r: Rand, *, n_layer: int, n_ff: int,
                  f32: bool = False):
    """The keys the three architectures share: attention of 2 heads of 64 (1 KV head) with a
    16-dim rope, delta-net of 2 key heads and 4 value heads of 32, a 4-tap conv."""
    import gguf

    w = gguf.GGUFWriter(str(path), arch)
    w.add_name(f"synthetic {path.stem}")
    w.add_context_length(4096)
    w.add_embedding_length(HYB_EMBD)
    w.add_block_count(n_layer)
    if n_ff:
        w.add_feed_forward_length(n_ff)
    w.add_head_count(HYB_HEAD)
    w.add_head_count_kv(HYB_HEAD_KV)
    w.add_key_length(HYB_HEAD_DIM)
    w.add_value_length(HYB_HEAD_DIM)
    w.add_rope_dimension_count(HYB_ROT)
    w.add_rope_freq_base(1e7)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_vocab_size(N_VOCAB)
    w.add_ssm_conv_kernel(HYB_CONV)
    w.add_ssm_state_size(HYB_STATE)
    w.add_ssm_group_count(HYB_K_HEADS)
    w.add_ssm_time_step_rank(HYB_V_HEADS)
    w.add_ssm_inner_size(HYB_STATE * HYB_V_HEADS)
    w.add_file_type(gguf.LlamaFileType.ALL_F32 if f32 else gguf.LlamaFileType.MOSTLY_F16)
    add_vocab(w, vocab)
    emb = 0.5 * r.rng.standard_normal((N_VOCAB, HYB_EMBD), dtype=np.float32)
    w.add_tensor("token_embd.weight", emb.astype(r.dtype))
    w.add_tensor("output_norm.weight", r.norm(HYB_EMBD))
    w.add_tensor("output.weight", r.mat(N_VOCAB, HYB_EMBD, scale=3.0))
    return w


def hybrid_attention(w, r: Rand, il: int) -> None:
    """Full attention: attn_q holds per head q then its output gate; Q/K norms."""
    p, e, hd = f"blk.{il}.", HYB_EMBD, HYB_HEAD_DIM
    w.add_tensor(p + "attn_q.weight", r.mat(2 * HYB_HEAD * hd, e))
    w.add_tensor(p + "attn_k.weight", r.mat(HYB_HEAD_KV * hd, e))
    w.add_tensor(p + "attn_v.weight", r.mat(HYB_HEAD_KV * hd, e))
    w.add_tensor(p + "attn_q_norm.weight", r.norm(hd))
    w.add_tensor(p + "attn_k_norm.weight", r.norm(hd))
    w.add_tensor(p + "attn_output.weight", r.mat(e, HYB_HEAD * hd))


def hybrid_delta_net(w, r: Rand, il: int, fused_ba: bool) -> None:
    """Gated delta-net: qkv for the conv, z, the conv taps (F32), dt bias and A = -exp(A_log)
    per value head (decays exp(g) of ~0.6 to ~0.95 a token), beta and alpha (fused ssm_ba per
    key head in qwen3next), the gated norm and out."""
    p, e = f"blk.{il}.", HYB_EMBD
    hv, d_inner = HYB_V_HEADS, HYB_STATE * HYB_V_HEADS
    channels = 2 * HYB_K_HEADS * HYB_STATE + d_inner
    w.add_tensor(p + "attn_qkv.weight", r.mat(channels, e))
    w.add_tensor(p + "attn_gate.weight", r.mat(d_inner, e))
    w.add_tensor(p + "ssm_conv1d.weight",
                 (0.5 * r.rng.standard_normal((channels, HYB_CONV))).astype(np.float32))
    w.add_tensor(p + "ssm_dt.bias", (-2.0 + 0.5 * r.rng.standard_normal(hv)).astype(np.float32))
    w.add_tensor(p + "ssm_a", -r.rng.uniform(0.5, 4.0, hv).astype(np.float32))
    if fused_ba:
        w.add_tensor(p + "ssm_ba.weight", r.mat(2 * hv, e))
    else:
        w.add_tensor(p + "ssm_beta.weight", r.mat(hv, e))
        w.add_tensor(p + "ssm_alpha.weight", r.mat(hv, e, scale=0.5))
    w.add_tensor(p + "ssm_norm.weight", r.norm(HYB_STATE))
    w.add_tensor(p + "ssm_out.weight", r.mat(e, d_inner))


HYB_EXPERTS, HYB_USED, HYB_FF_EXP, HYB_FF_SHEXP = 4, 2, 64, 64


def hybrid_moe(w, r: Rand, il: int, gate_2d: bool = False) -> None:
    """Softmax router over 4 experts (2 used), SwiGLU experts, a shared expert behind a
    sigmoid gate (gate_2d: stored [1, n_embd], as converted from HF's Linear(n_embd, 1))."""
    p, e, x, f, fs = f"blk.{il}.", HYB_EMBD, HYB_EXPERTS, HYB_FF_EXP, HYB_FF_SHEXP
    w.add_tensor(p + "ffn_gate_inp.weight", r.mat(x, e, scale=4.0).astype(np.float32))
    w.add_tensor(p + "ffn_gate_exps.weight", r.mat(x, f, e))
    w.add_tensor(p + "ffn_up_exps.weight", r.mat(x, f, e))
    w.add_tensor(p + "ffn_down_exps.weight", r.mat(x, e, f))
    gate = r.vec(e, 1.0 / np.sqrt(e))
    w.add_tensor(p + "ffn_gate_inp_shexp.weight", gate.reshape(1, e) if gate_2d else gate)
    w.add_tensor(p + "ffn_gate_shexp.weight", r.mat(fs, e))
    w.add_tensor(p + "ffn_up_shexp.weight", r.mat(fs, e))
    w.add_tensor(p + "ffn_down_shexp.weight", r.mat(e, fs))


def hybrid_dense_ffn(w, r: Rand, il: int, n_ff: int) -> None:
    p = f"blk.{il}."
    w.add_tensor(p + "ffn_gate.weight", r.mat(n_ff, HYB_EMBD))
    w.add_tensor(p + "ffn_up.weight", r.mat(n_ff, HYB_EMBD))
    w.add_tensor(p + "ffn_down.weight", r.mat(HYB_EMBD, n_ff))


def make_qwen3next(path: Path, vocab: dict) -> None:
    """Gated delta-net layers 0 and 2, full attention with an output gate on 1 and 3
    (full_attention_interval 2); value heads repeat key heads grouped (h // 2); fused ssm_ba;
    NeoX rope on 16 of 64 dims; 4 experts (2 used) and a gated shared expert whose gate is
    stored 2-D [n_embd, 1] as conversions write it; untied."""
    r = Rand(path.stem)
    w = hybrid_writer(path, "qwen3next", vocab, r, n_layer=HYB_LAYERS, n_ff=0)
    w.add_full_attention_interval(2)
    w.add_expert_count(HYB_EXPERTS)
    w.add_expert_used_count(HYB_USED)
    w.add_expert_feed_forward_length(HYB_FF_EXP)
    w.add_expert_shared_feed_forward_length(HYB_FF_SHEXP)
    for il in range(HYB_LAYERS):
        p = f"blk.{il}."
        w.add_tensor(p + "attn_norm.weight", r.norm(HYB_EMBD))
        if il % 2 == 0:
            hybrid_delta_net(w, r, il, fused_ba=True)
        else:
            hybrid_attention(w, r, il)
        w.add_tensor(p + "post_attention_norm.weight", r.norm(HYB_EMBD))
        hybrid_moe(w, r, il, gate_2d=True)
    finish(w)


HYB_SECTIONS = [3, 3, 2, 0]      # Qwen3.5's [11, 11, 10, 0] for 8 rotated pairs


def make_qwen35(path: Path, vocab: dict, f32: bool = False) -> None:
    """Gated delta-net layers 0 to 2, full attention on 3 (full_attention_interval 4); value
    heads tile key heads (h % 2); separate ssm_beta and ssm_alpha; IMROPE sections
    [3, 3, 2, 0] over 16 of 64 dims; dense SwiGLU; one MTP block after the trunk
    (nextn_predict_layers 1, not run); untied."""
    r = Rand("qwen35", f32)
    n_ff = 192
    w = hybrid_writer(path, "qwen35", vocab, r, n_layer=HYB_LAYERS + 1, n_ff=n_ff, f32=f32)
    w.add_full_attention_interval(4)
    w.add_rope_dimension_sections(HYB_SECTIONS)
    w.add_nextn_predict_layers(1)
    for il in range(HYB_LAYERS + 1):
        p = f"blk.{il}."
        w.add_tensor(p + "attn_norm.weight", r.norm(HYB_EMBD))
        if il < 3:
            hybrid_delta_net(w, r, il, fused_ba=False)
        else:
            hybrid_attention(w, r, il)
        w.add_tensor(p + "post_attention_norm.weight", r.norm(HYB_EMBD))
        hybrid_dense_ffn(w, r, il, n_ff)
    p = f"blk.{HYB_LAYERS}.nextn."      # the MTP block's own tensors
    w.add_tensor(p + "eh_proj.weight", r.mat(HYB_EMBD, 2 * HYB_EMBD))
    w.add_tensor(p + "enorm.weight", r.norm(HYB_EMBD))
    w.add_tensor(p + "hnorm.weight", r.norm(HYB_EMBD))
    finish(w)


def make_qwen35moe(path: Path, vocab: dict) -> None:
    """Layer kinds from attention.recurrent_layers [delta, attention, delta, delta]; value
    heads tile key heads; IMROPE; 4 experts (2 used) and a gated shared expert; untied."""
    r = Rand(path.stem)
    w = hybrid_writer(path, "qwen35moe", vocab, r, n_layer=HYB_LAYERS, n_ff=0)
    recurrent = [True, False, True, True]
    w.add_array("qwen35moe.attention.recurrent_layers", recurrent)
    w.add_rope_dimension_sections(HYB_SECTIONS)
    w.add_expert_count(HYB_EXPERTS)
    w.add_expert_used_count(HYB_USED)
    w.add_expert_feed_forward_length(HYB_FF_EXP)
    w.add_expert_shared_feed_forward_length(HYB_FF_SHEXP)
    for il in range(HYB_LAYERS):
        p = f"blk.{il}."
        w.add_tensor(p + "attn_norm.weight", r.norm(HYB_EMBD))
        if recurrent[il]:
            hybrid_delta_net(w, r, il, fused_ba=False)
        else:
            hybrid_attention(w, r, il)
        w.add_tensor(p + "post_attention_norm.weight", r.norm(HYB_EMBD))
        hybrid_moe(w, r, il)
    finish(w)


ARCH_MODELS = {
    "qwen2-yarn-f16": make_qwen2,
    "qwen3-linear-f16": make_qwen3,
    "phi3-longrope-f16": make_phi3,
    "gemma2-swa-f16": make_gemma2,
    "gpt-oss-f16": make_gpt_oss,
    "mistral3-yarn-f16": make_mistral3,
    "qwen3next-f16": make_qwen3next,
    "qwen35-f16": make_qwen35,
    "qwen35moe-f16": make_qwen35moe,
    "olmo2-f16": make_olmo2,
    "granite-f16": make_granite,
}

# file stem -> (llama_ftype, the one ggml type every quantized tensor gets)
QUANT_MODELS = {
    "llama-q2_k": (10, "Q2_K"),          # LLAMA_FTYPE_MOSTLY_Q2_K
    "llama-q3_k": (12, "Q3_K"),          # LLAMA_FTYPE_MOSTLY_Q3_K_M, pure: all Q3_K
    "llama-q5_1": (9, "Q5_1"),           # LLAMA_FTYPE_MOSTLY_Q5_1
    "llama-iq4_nl": (25, "IQ4_NL"),      # LLAMA_FTYPE_MOSTLY_IQ4_NL
    "llama-iq4_xs": (30, "IQ4_XS"),      # LLAMA_FTYPE_MOSTLY_IQ4_XS
    "llama-bf16": (32, "BF16"),          # LLAMA_FTYPE_MOSTLY_BF16
    "llama-q4_0": (2, "Q4_0"),           # LLAMA_FTYPE_MOSTLY_Q4_0
    "llama-q4_k_m": (15, None),          # LLAMA_FTYPE_MOSTLY_Q4_K_M as it comes: Q4_K, Q6_K
}
MXFP4_FTYPE = 38                         # LLAMA_FTYPE_MOSTLY_MXFP4_MOE: experts MXFP4, rest Q8_0
Q8_0_FTYPE = 7                           # LLAMA_FTYPE_MOSTLY_Q8_0


def quantize(src: Path, dst: Path, ftype: int, qtype: str | None) -> None:
    """llama.cpp's own quantizer; qtype given: every tensor llama.cpp quantizes gets it (pure,
    the token embedding and the output too)."""
    import gguf
    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = ftype
    params.nthread = 2
    if qtype is not None:
        params.pure = True
        t = int(gguf.GGMLQuantizationType[qtype])
        params.output_tensor_type = t
        params.token_embedding_type = t
    rc = llama_cpp.llama_model_quantize(str(src).encode(), str(dst).encode(), ctypes.byref(params))
    if rc != 0:
        raise RuntimeError(f"llama_model_quantize({dst.name}) failed: {rc}")


def types_in(path: Path) -> dict[str, int]:
    import gguf

    counts: dict[str, int] = {}
    for t in gguf.GGUFReader(str(path)).tensors:
        counts[t.tensor_type.name] = counts.get(t.tensor_type.name, 0) + 1
    return counts


def main() -> None:
    import gguf

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokenizer", type=Path, default=TOKENIZER)
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--only", action="append", help="file stems to write (default: all)")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    vocab = small_vocab(args.tokenizer)
    want = lambda stem: not args.only or stem in args.only
    for stem, make in ARCH_MODELS.items():
        if want(stem):
            make(args.out / f"{stem}.gguf", vocab)
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "llama-f32.gguf"
        make_llama_f32(src, vocab)
        for stem, (ftype, qtype) in QUANT_MODELS.items():
            if want(stem):
                quantize(src, args.out / f"{stem}.gguf", ftype, qtype)
        if want("gpt-oss-mxfp4"):
            # llama.cpp quantizes the experts to MXFP4 (and the rest to Q8_0); the file keeps
            # its experts and gpt-oss-f16's other tensors. Q8_0 attention would round the
            # router's input to 8 bits upstream in llama.cpp, and near-tied routing decisions
            # then flip between llama.cpp and any float forward pass.
            src, q = Path(tmp) / "gpt-oss-f32.gguf", Path(tmp) / "gpt-oss-mxfp4-q8.gguf"
            make_gpt_oss(src, vocab, f32=True)
            quantize(src, q, MXFP4_FTYPE, None)
            experts = {t.name: (np.array(t.data), int(t.tensor_type))
                       for t in gguf.GGUFReader(str(q)).tensors if "_exps.weight" in t.name}
            assert {t for _, t in experts.values()} == {int(gguf.GGMLQuantizationType.MXFP4)}
            make_gpt_oss(args.out / "gpt-oss-mxfp4.gguf", vocab, experts=experts)
        if want("gemma2-q4_k_m"):
            # gemma2's shape in F32, then llama.cpp's Q4_K_M (Q4_K and Q6_K): GeGLU's gate and
            # up on the int8 decode path
            src = Path(tmp) / "gemma2-f32.gguf"
            make_gemma2(src, vocab, f32=True)
            quantize(src, args.out / "gemma2-q4_k_m.gguf", 15, None)
        if want("qwen2-q8_0"):
            # qwen2-yarn-f16's numbers in F32, every matrix then Q8_0 by llama.cpp (pure): its
            # biased q, k and v on the int8 decode path, rope and bias in the products
            src = Path(tmp) / "qwen2-f32.gguf"
            make_qwen2(src, vocab, f32=True)
            quantize(src, args.out / "qwen2-q8_0.gguf", Q8_0_FTYPE, "Q8_0")
        if want("qwen35-q8_0"):
            # qwen35-f16's numbers in F32, every matrix then Q8_0 by llama.cpp (pure)
            src = Path(tmp) / "qwen35-f32.gguf"
            make_qwen35(src, vocab, f32=True)
            quantize(src, args.out / "qwen35-q8_0.gguf", Q8_0_FTYPE, "Q8_0")
    total = 0
    for p in sorted(args.out.glob("*.gguf")):
        total += p.stat().st_size
        print(f"{p.name:28s} {p.stat().st_size / 1e6:6.2f} MB  {types_in(p)}", file=sys.stderr)
    print(f"total {total / 1e6:.2f} MB", file=sys.stderr)


if __name__ == "__main__":
    main()
