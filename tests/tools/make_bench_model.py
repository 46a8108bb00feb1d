#!/usr/bin/env python3
"""Write a user-sized GGUF of a real model's shape with random quantized weights, for speed
runs beside llama-server where the real file cannot travel (speed depends on shapes and
types, not on weight values).

    python tests/tools/make_bench_model.py --arch qwen3 --shape 8b \
        --tokenizer smollm2_tokenizer.pkl qwen3-8b.gguf

Shapes are the published ones (Qwen3-8B: 36 layers of 4096, 32 heads of 128, 8 KV heads,
feed-forward 12288, 151936 tokens). The tokenizer is SmolLM2's (a pickled dict of its
`tokenizer.*` keys), its token list padded with unreachable tokens up to the shape's
vocabulary, so the output projection has the real size. Types follow llama.cpp's Q4_K_M:
Q4_K, with Q6_K for the output and for attn_v and ffn_down in the layers llama.cpp gives
more bits (the first and last eighth and every third between). Blocks are random with
small fixed scales, zero-mean on average, so activations stay finite.

The hybrid gated delta-net shapes (--arch qwen35 --shape 4b, --arch qwen35moe --shape
35b-a3b; `tiny` of each for a quick check) are written tensor by tensor, never more than one
in memory, with Q4_K_M's types as llama.cpp's quantizer picks them for Qwen3.5 (its
tests/snapshots/qwen3.5-397b-a17b.schema and qwen3.6-27b.schema): Q4_K, Q6_K for the output
and, in the use_more_bits layers, for attn_qkv (delta-net layers) or attn_v (attention
layers) and for ffn_down, ffn_down_exps and ffn_down_shexp; F32 for norms, routers, the conv
taps, ssm_a and ssm_dt. The shapes are Qwen3.5's published configs (HYBRID_SHAPES).

The mixture-of-experts shapes (--arch qwen3moe --shape 30b-a3b, --arch gpt-oss --shape 20b;
`tiny` of each) are written the same way (MOE_SHAPES): Qwen3-30B-A3B in Q4_K_M's types,
gpt-oss-20b as llama.cpp's MXFP4_MOE quantizes it (experts MXFP4, the other matrices Q8_0).

Gemma 3 4B's text shape (--arch gemma3 --shape 4b) is written the same way, in Q4_K_M's
types (the tied embedding Q6_K). Vision projectors of the real sizes for the image runs
(--mmproj gemma3|qwen35 --text-width N OUT): SigLIP-so400m at 896 px with Gemma 3's
projector, and Qwen3.5's 27-layer tower with its 2 x 2 merger, F16 matrices as the
converters write them, random with std 1/sqrt(fan_in).
"""
from __future__ import annotations

import argparse
import pickle
import sys

import gguf
import numpy as np
from gguf import GGMLQuantizationType as T

SHAPES = {   # arch, shape: n_embd, n_layer, n_head, n_head_kv, head_dim, n_ff, n_vocab
    ("qwen3", "8b"): (4096, 36, 32, 8, 128, 12288, 151936),
    ("qwen3", "1.7b"): (2048, 28, 16, 8, 128, 6144, 151936),
    ("qwen3", "tiny"): (256, 2, 4, 2, 64, 512, 49152),
}
BLOCK = {T.Q4_K: (144, 256), T.Q6_K: (210, 256), T.Q8_0: (34, 32), T.MXFP4: (17, 32)}

# Qwen3.5's text configs (HF config.json, text_config): hidden_size, num_hidden_layers,
# attention heads / KV heads of head_dim 256 on every 4th layer (full_attention_interval 4),
# linear attention of 16 key heads and 32 value heads of 128 with a 4-tap conv,
# partial_rotary_factor 0.25 (64 rope dims), mrope_section [11, 11, 10], rope_theta 1e7,
# vocab 248320; the 4B a dense SwiGLU of 9216 with tied embeddings, the 35B-A3B 256 experts
# (8 used) of 512 and a shared expert of 512, untied.
HYBRID_SHAPES = {
    ("qwen35", "4b"): dict(n_embd=2560, n_layer=32, n_head=16, n_head_kv=4, n_ff=9216,
                           tied=True),
    ("qwen35moe", "35b-a3b"): dict(n_embd=2048, n_layer=40, n_head=16, n_head_kv=2,
                                   n_expert=256, n_expert_used=8, n_ff_exp=512,
                                   n_ff_shexp=512, tied=False),
    ("qwen35", "tiny"): dict(n_embd=256, n_layer=4, n_head=2, n_head_kv=1, n_ff=512,
                             n_vocab=49152, tied=True, k_heads=2, v_heads=4),
    ("qwen35moe", "tiny"): dict(n_embd=256, n_layer=4, n_head=2, n_head_kv=1, n_expert=8,
                                n_expert_used=2, n_ff_exp=256, n_ff_shexp=256, tied=False,
                                n_vocab=49152, k_heads=2, v_heads=4),
}
# The mixture-of-experts shapes (HF config.json): Qwen3-30B-A3B (48 layers of 2048, 32 heads
# of 128, 4 KV heads, per-head q/k norms, 128 experts of 768, 8 used) in Q4_K_M as llama.cpp
# quantizes it; gpt-oss-20b (24 layers of 2880, 64 heads of 64, 8 KV heads, sinks, q/k/v/o
# and expert biases, a 128-token window on every other layer, 32 experts of 2880, 4 used,
# YaRN x32 from 4096) in llama.cpp's MXFP4_MOE: experts MXFP4, the other matrices Q8_0.
MOE_SHAPES = {
    ("qwen3moe", "30b-a3b"): dict(n_embd=2048, n_layer=48, n_head=32, n_head_kv=4, head_dim=128,
                                  n_expert=128, n_expert_used=8, n_ff_exp=768, n_vocab=151936,
                                  rope_base=1e6, ctx=40960, n_ff=6144),
    ("qwen3moe", "tiny"): dict(n_embd=256, n_layer=2, n_head=4, n_head_kv=2, head_dim=64,
                               n_expert=8, n_expert_used=2, n_ff_exp=256, n_vocab=49152,
                               rope_base=1e6, ctx=4096, n_ff=512),
    ("gpt-oss", "20b"): dict(n_embd=2880, n_layer=24, n_head=64, n_head_kv=8, head_dim=64,
                             n_expert=32, n_expert_used=4, n_ff_exp=2880, n_vocab=201088,
                             rope_base=150000.0, ctx=131072, window=128),
    ("gpt-oss", "tiny"): dict(n_embd=256, n_layer=2, n_head=4, n_head_kv=2, head_dim=64,
                              n_expert=4, n_expert_used=2, n_ff_exp=256, n_vocab=49152,
                              rope_base=150000.0, ctx=4096, window=16),
}
# Gemma 3 4B (HF text_config): 34 layers of 2560, 8 heads of 256, 4 KV heads, feed-forward
# 10240, 262144 tokens, a 1024-token window on five layers of six, rope 1e6 linear x8 on the
# global ones; tied embeddings
GEMMA3_SHAPES = {
    ("gemma3", "4b"): dict(n_embd=2560, n_layer=34, n_head=8, n_head_kv=4, head_dim=256,
                           n_ff=10240, n_vocab=262144, window=1024, ctx=131072),
    ("gemma3", "tiny"): dict(n_embd=256, n_layer=2, n_head=4, n_head_kv=2, head_dim=64,
                             n_ff=512, n_vocab=49152, window=512, ctx=4096),
}
# the vision towers: width, layers, heads, feed-forward, patch, and gemma3's image size or
# qwen35's position table side
MMPROJ_SHAPES = {
    "gemma3": dict(width=1152, layers=27, heads=16, ff=4304, patch=14, image=896),
    "qwen35": dict(width=1152, layers=27, heads=16, ff=4304, patch=16, pos_side=48),
}
HYBRID_DEFAULTS = dict(head_dim=256, k_heads=16, v_heads=32, d_state=128, conv=4, n_rot=64,
                       sections=[11, 11, 10, 0], interval=4, n_vocab=248320, ctx=262144)


def rand_blocks(rng, qtype, rows: int, cols: int) -> np.ndarray:
    nb, ne = BLOCK[qtype]
    if cols % ne:
        raise ValueError(f"{cols} columns are not whole {qtype.name} blocks")
    blocks = rows * cols // ne
    a = rng.integers(0, 256, size=(blocks, nb), dtype=np.uint8)
    f16 = lambda v: np.full(blocks, v, np.float16).view(np.uint8).reshape(-1, 2)  # noqa: E731
    if qtype == T.Q8_0:
        a[:, 0:2] = f16(0.002)
    elif qtype == T.Q4_K:
        a[:, 0:2] = f16(0.0003)
        a[:, 2:4] = f16(0.00225)      # dmin = 7.5 d: the mins cancel the 4-bit values' mean
    elif qtype == T.Q6_K:
        a[:, 208:210] = f16(0.0002)
        a[:, 192:208] &= 0x1F         # small positive int8 sub-scales
    elif qtype == T.MXFP4:
        a[:, 0] = 119                 # e8m0 scale 2^-8: e2m1 values up to 6 scale to 0.023
    return a.reshape(rows, cols // ne * nb)


def more_bits(i: int, n: int) -> bool:
    """llama.cpp's use_more_bits for Q4_K_M's attn_v and ffn_down."""
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def padded_vocab(kv: dict, n_vocab: int) -> tuple[list, list, int]:
    """The tokenizer's tokens and types padded with unreachable tokens up to n_vocab."""
    tokens = list(kv["tokenizer.ggml.tokens"][2])
    types = list(kv.get("tokenizer.ggml.token_type", (None, None, [1] * len(tokens)))[2])
    pad = n_vocab - len(tokens)
    if pad < 0:
        raise SystemExit(f"the tokenizer has {len(tokens)} tokens, more than the shape's "
                         f"{n_vocab}")
    return tokens + [f"<|unused_{i}|>" for i in range(pad)], types + [4] * pad, pad


def add_vocab_keys(w, kv: dict, n_vocab: int) -> None:
    tokens, types, pad = padded_vocab(kv, n_vocab)
    for k, (t, sub, val) in kv.items():
        if k == "tokenizer.ggml.tokens":
            w.add_array(k, tokens)
        elif k == "tokenizer.ggml.token_type":
            w.add_array(k, types)
        elif k == "tokenizer.ggml.scores":
            w.add_array(k, list(val) + [0.0] * pad)
        elif t == gguf.GGUFValueType.ARRAY:
            w.add_array(k, val)
        elif t == gguf.GGUFValueType.STRING:
            w.add_string(k, val)
        else:
            w.add_key_value(k, val, t)


def hybrid_tensors(arch: str, h: dict):
    """(name, ggml type, numpy shape, fill) of every tensor, in file order; fill is "q"
    (random blocks), "ones", or a constant for F32 vectors."""
    e, L, hd = h["n_embd"], h["n_layer"], h["head_dim"]
    hk, hv, d = h["k_heads"], h["v_heads"], h["d_state"]
    channels, d_inner = 2 * hk * d + hv * d, hv * d
    out = [("token_embd.weight", T.Q4_K, (h["n_vocab"], e), "q"),
           ("output_norm.weight", T.F32, (e,), "ones")]
    if not h["tied"]:
        out.append(("output.weight", T.Q6_K, (h["n_vocab"], e), "q"))
    for i in range(L):
        b, big = f"blk.{i}.", T.Q6_K if more_bits(i, L) else T.Q4_K
        out += [(b + "attn_norm.weight", T.F32, (e,), "ones"),
                (b + "post_attention_norm.weight", T.F32, (e,), "ones")]
        if (i + 1) % h["interval"]:           # gated delta-net
            out += [(b + "attn_qkv.weight", big, (channels, e), "q"),
                    (b + "attn_gate.weight", T.Q4_K, (d_inner, e), "q"),
                    (b + "ssm_conv1d.weight", T.F32, (channels, h["conv"]), 0.25),
                    (b + "ssm_dt.bias", T.F32, (hv,), -2.0),
                    (b + "ssm_a", T.F32, (hv,), -1.0),
                    (b + "ssm_beta.weight", T.Q4_K, (hv, e), "q"),
                    (b + "ssm_alpha.weight", T.Q4_K, (hv, e), "q"),
                    (b + "ssm_norm.weight", T.F32, (d,), "ones"),
                    (b + "ssm_out.weight", T.Q4_K, (e, d_inner), "q")]
        else:                                 # full attention, q and its gate per head
            out += [(b + "attn_q.weight", T.Q4_K, (2 * h["n_head"] * hd, e), "q"),
                    (b + "attn_k.weight", T.Q4_K, (h["n_head_kv"] * hd, e), "q"),
                    (b + "attn_v.weight", big, (h["n_head_kv"] * hd, e), "q"),
                    (b + "attn_q_norm.weight", T.F32, (hd,), "ones"),
                    (b + "attn_k_norm.weight", T.F32, (hd,), "ones"),
                    (b + "attn_output.weight", T.Q4_K, (e, h["n_head"] * hd), "q")]
        if arch == "qwen35":
            out += [(b + "ffn_gate.weight", T.Q4_K, (h["n_ff"], e), "q"),
                    (b + "ffn_up.weight", T.Q4_K, (h["n_ff"], e), "q"),
                    (b + "ffn_down.weight", big, (e, h["n_ff"]), "q")]
        else:
            x, f, fs = h["n_expert"], h["n_ff_exp"], h["n_ff_shexp"]
            out += [(b + "ffn_gate_inp.weight", T.F32, (x, e), 0.0),
                    (b + "ffn_gate_exps.weight", T.Q4_K, (x, f, e), "q"),
                    (b + "ffn_up_exps.weight", T.Q4_K, (x, f, e), "q"),
                    (b + "ffn_down_exps.weight", big, (x, e, f), "q"),
                    (b + "ffn_gate_inp_shexp.weight", T.F32, (1, e), 0.0),   # as converted
                    (b + "ffn_gate_shexp.weight", T.Q4_K, (fs, e), "q"),
                    (b + "ffn_up_shexp.weight", T.Q4_K, (fs, e), "q"),
                    (b + "ffn_down_shexp.weight", big, (e, fs), "q")]
    return out


def moe_tensors(arch: str, h: dict):
    """(name, ggml type, numpy shape, fill) of every tensor of a qwen3moe or gpt-oss file, as
    hybrid_tensors gives them."""
    e, L, hd, nh, nkv = h["n_embd"], h["n_layer"], h["head_dim"], h["n_head"], h["n_head_kv"]
    x, f = h["n_expert"], h["n_ff_exp"]
    oss = arch == "gpt-oss"
    dense = T.Q8_0 if oss else T.Q4_K
    out = [("token_embd.weight", dense, (h["n_vocab"], e), "q"),
           ("output_norm.weight", T.F32, (e,), "ones"),
           ("output.weight", T.Q8_0 if oss else T.Q6_K, (h["n_vocab"], e), "q")]
    for i in range(L):
        b = f"blk.{i}."
        big = dense if oss else T.Q6_K if more_bits(i, L) else T.Q4_K
        experts, down = (T.MXFP4, T.MXFP4) if oss else (T.Q4_K, big)
        out += [(b + "attn_norm.weight", T.F32, (e,), "ones"),
                (b + "attn_q.weight", dense, (nh * hd, e), "q"),
                (b + "attn_k.weight", dense, (nkv * hd, e), "q"),
                (b + "attn_v.weight", big, (nkv * hd, e), "q"),
                (b + "attn_output.weight", dense, (e, nh * hd), "q")]
        if oss:
            out += [(b + "attn_q.bias", T.F32, (nh * hd,), 0.0),
                    (b + "attn_k.bias", T.F32, (nkv * hd,), 0.0),
                    (b + "attn_v.bias", T.F32, (nkv * hd,), 0.0),
                    (b + "attn_output.bias", T.F32, (e,), 0.0),
                    (b + "attn_sinks.weight", T.F32, (nh,), 0.0),
                    (b + "post_attention_norm.weight", T.F32, (e,), "ones")]
        else:
            out += [(b + "attn_q_norm.weight", T.F32, (hd,), "ones"),
                    (b + "attn_k_norm.weight", T.F32, (hd,), "ones"),
                    (b + "ffn_norm.weight", T.F32, (e,), "ones")]
        out += [(b + "ffn_gate_inp.weight", T.F32, (x, e), 0.0)]
        if oss:
            out += [(b + "ffn_gate_inp.bias", T.F32, (x,), 0.0)]
        out += [(b + "ffn_gate_exps.weight", experts, (x, f, e), "q"),
                (b + "ffn_up_exps.weight", experts, (x, f, e), "q"),
                (b + "ffn_down_exps.weight", down, (x, e, f), "q")]
        if oss:
            out += [(b + "ffn_gate_exps.bias", T.F32, (x, f), 0.0),
                    (b + "ffn_up_exps.bias", T.F32, (x, f), 0.0),
                    (b + "ffn_down_exps.bias", T.F32, (x, e), 0.0)]
    return out


def write_moe(a, kv: dict) -> int:
    """A qwen3moe or gpt-oss file, streamed as write_hybrid streams its own."""
    h = MOE_SHAPES[a.arch, a.shape]
    w = gguf.GGUFWriter(a.out, a.arch)
    oss = a.arch == "gpt-oss"
    w.add_name(f"synthetic-{a.arch}-{a.shape}-{'mxfp4' if oss else 'q4_k_m'}")
    w.add_file_type(gguf.LlamaFileType.MOSTLY_MXFP4_MOE if oss else 15)
    w.add_context_length(a.ctx or h["ctx"])
    w.add_embedding_length(h["n_embd"])
    w.add_block_count(h["n_layer"])
    w.add_expert_count(h["n_expert"])
    w.add_expert_used_count(h["n_expert_used"])
    w.add_expert_feed_forward_length(h["n_ff_exp"])
    if "n_ff" in h:                          # the dense width the file states, unused
        w.add_feed_forward_length(h["n_ff"])
    w.add_head_count(h["n_head"])
    w.add_head_count_kv(h["n_head_kv"])
    w.add_key_length(h["head_dim"])
    w.add_value_length(h["head_dim"])
    w.add_rope_dimension_count(h["head_dim"])
    w.add_rope_freq_base(h["rope_base"])
    w.add_layer_norm_rms_eps(1e-5 if oss else 1e-6)
    if oss:
        w.add_sliding_window(h["window"])
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(32.0)
        w.add_rope_scaling_orig_ctx_len(4096)
    add_vocab_keys(w, kv, h["n_vocab"])
    return write_tensors(w, moe_tensors(a.arch, h))


def gemma3_tensors(h: dict):
    """(name, ggml type, numpy shape, fill) of a gemma3 text model, as hybrid_tensors."""
    e, L, hd, f = h["n_embd"], h["n_layer"], h["head_dim"], h["n_ff"]
    q, kv = h["n_head"] * hd, h["n_head_kv"] * hd
    out = [("token_embd.weight", T.Q6_K, (h["n_vocab"], e), "q"),
           ("output_norm.weight", T.F32, (e,), "ones")]
    for i in range(L):
        b, big = f"blk.{i}.", T.Q6_K if more_bits(i, L) else T.Q4_K
        out += [(b + "attn_norm.weight", T.F32, (e,), "ones"),
                (b + "attn_q.weight", T.Q4_K, (q, e), "q"),
                (b + "attn_k.weight", T.Q4_K, (kv, e), "q"),
                (b + "attn_v.weight", big, (kv, e), "q"),
                (b + "attn_q_norm.weight", T.F32, (hd,), "ones"),
                (b + "attn_k_norm.weight", T.F32, (hd,), "ones"),
                (b + "attn_output.weight", T.Q4_K, (e, q), "q"),
                (b + "post_attention_norm.weight", T.F32, (e,), "ones"),
                (b + "ffn_norm.weight", T.F32, (e,), "ones"),
                (b + "ffn_gate.weight", T.Q4_K, (f, e), "q"),
                (b + "ffn_up.weight", T.Q4_K, (f, e), "q"),
                (b + "ffn_down.weight", big, (e, f), "q"),
                (b + "post_ffw_norm.weight", T.F32, (e,), "ones")]
    return out


def write_gemma3(a, kv: dict) -> int:
    h = GEMMA3_SHAPES[a.arch, a.shape]
    w = gguf.GGUFWriter(a.out, "gemma3")
    w.add_name(f"synthetic-gemma3-{a.shape}-q4_k_m")
    w.add_file_type(15)
    w.add_context_length(a.ctx or h["ctx"])
    w.add_embedding_length(h["n_embd"])
    w.add_block_count(h["n_layer"])
    w.add_feed_forward_length(h["n_ff"])
    w.add_head_count(h["n_head"])
    w.add_head_count_kv(h["n_head_kv"])
    w.add_key_length(h["head_dim"])
    w.add_value_length(h["head_dim"])
    w.add_rope_freq_base(1e6)
    w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
    w.add_rope_scaling_factor(8.0)
    w.add_sliding_window(h["window"])
    w.add_layer_norm_rms_eps(1e-6)
    add_vocab_keys(w, kv, h["n_vocab"])
    return write_tensors(w, gemma3_tensors(h))


def write_mmproj(kind: str, text_width: int, out: str) -> int:
    """A vision projector of the real sizes (MMPROJ_SHAPES), for a text model of that width."""
    v = MMPROJ_SHAPES[kind]
    d, p, ff = v["width"], v["patch"], v["ff"]
    w = gguf.GGUFWriter(out, "clip")
    w.add_name(f"synthetic-mmproj-{kind}")
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    w.add_string("clip.projector_type", "gemma3" if kind == "gemma3" else "qwen3vl_merger")
    w.add_bool("clip.has_vision_encoder", True)
    w.add_bool("clip.use_gelu", True)
    side = v["image"] // p if kind == "gemma3" else v["pos_side"]
    for key, val in (("image_size", side * p), ("patch_size", p), ("embedding_length", d),
                     ("feed_forward_length", ff), ("block_count", v["layers"]),
                     ("projection_dim", text_width), ("attention.head_count", v["heads"])):
        w.add_uint32("clip.vision." + key, val)
    if kind != "gemma3":
        w.add_uint32("clip.vision.spatial_merge_size", 2)
    w.add_float32("clip.vision.attention.layer_norm_epsilon", 1e-6)
    w.add_array("clip.vision.image_mean", [0.5, 0.5, 0.5])
    w.add_array("clip.vision.image_std", [0.5, 0.5, 0.5])
    t = [("v.patch_embd.weight", T.F32 if kind == "gemma3" else T.F16, (d, 3, p, p), "r"),
         ("v.patch_embd.bias", T.F32, (d,), 0.0),
         ("v.position_embd.weight", T.F32, (side * side, d), "r")]
    if kind != "gemma3":
        t.insert(1, ("v.patch_embd.weight.1", T.F16, (d, 3, p, p), "r"))
    for i in range(v["layers"]):
        b = f"v.blk.{i}."
        t += [(b + "ln1.weight", T.F32, (d,), "ones"), (b + "ln1.bias", T.F32, (d,), 0.0)]
        if kind == "gemma3":
            for name in ("attn_q", "attn_k", "attn_v"):
                t += [(b + name + ".weight", T.F16, (d, d), "r"),
                      (b + name + ".bias", T.F32, (d,), 0.0)]
        else:
            t += [(b + "attn_qkv.weight", T.F16, (3 * d, d), "r"),
                  (b + "attn_qkv.bias", T.F32, (3 * d,), 0.0)]
        t += [(b + "attn_out.weight", T.F16, (d, d), "r"), (b + "attn_out.bias", T.F32, (d,), 0.0),
              (b + "ln2.weight", T.F32, (d,), "ones"), (b + "ln2.bias", T.F32, (d,), 0.0),
              (b + "ffn_up.weight", T.F16, (ff, d), "r"), (b + "ffn_up.bias", T.F32, (ff,), 0.0),
              (b + "ffn_down.weight", T.F16, (d, ff), "r"),
              (b + "ffn_down.bias", T.F32, (d,), 0.0)]
    t += [("v.post_ln.weight", T.F32, (d,), "ones"), ("v.post_ln.bias", T.F32, (d,), 0.0)]
    if kind == "gemma3":
        t += [("mm.soft_emb_norm.weight", T.F32, (d,), "ones"),
              ("mm.input_projection.weight", T.F16, (d, text_width), "r")]
    else:
        m = 4 * d
        t += [("mm.0.weight", T.F16, (m, m), "r"), ("mm.0.bias", T.F32, (m,), 0.0),
              ("mm.2.weight", T.F16, (text_width, m), "r"),
              ("mm.2.bias", T.F32, (text_width,), 0.0)]
    return write_tensors(w, t)


def write_tensors(w, tensors) -> int:
    """Tensor infos, then each tensor's data, one at a time; the bytes of tensors written."""
    for name, qtype, shape, fill in tensors:
        if qtype in (T.F32, T.F16):
            dtype = np.dtype(np.float32 if qtype == T.F32 else np.float16)
            w.add_tensor_info(name, shape, dtype, dtype.itemsize * int(np.prod(shape)))
        else:
            byte_shape = tensor_bytes(qtype, shape)
            w.add_tensor_info(name, byte_shape, np.dtype(np.uint8), int(np.prod(byte_shape)),
                              raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    rng = np.random.default_rng(0)
    for name, qtype, shape, fill in tensors:
        if fill == "r":                      # random, std 1 / sqrt(fan in)
            fan = int(np.prod(shape[1:])) if len(shape) > 1 else 1
            data = (rng.standard_normal(shape, np.float32) / np.sqrt(fan)).astype(
                np.float32 if qtype == T.F32 else np.float16)
        elif qtype == T.F32:
            data = np.ones(shape, np.float32) if fill == "ones" else \
                np.full(shape, fill, np.float32)
            if name.endswith("ffn_gate_inp.weight"):     # routing that varies by token
                data = (0.02 * rng.standard_normal(shape)).astype(np.float32)
        else:
            rows = int(np.prod(shape[:-1]))
            data = rand_blocks(rng, qtype, rows, shape[-1]).reshape(tensor_bytes(qtype, shape))
        w.write_tensor_data(data)
    w.close()
    return sum({T.F32: 4, T.F16: 2}[q] * int(np.prod(s)) if q in (T.F32, T.F16)
               else int(np.prod(tensor_bytes(q, s))) for _, q, s, _ in tensors)


def tensor_bytes(qtype, shape: tuple[int, ...]) -> tuple[int, ...]:
    """The byte shape of a quantized tensor of numpy shape `shape`."""
    nb, ne = BLOCK[qtype]
    if shape[-1] % ne:
        raise ValueError(f"{shape[-1]} columns are not whole {qtype.name} blocks")
    return (*shape[:-1], shape[-1] // ne * nb)


def write_hybrid(a, kv: dict) -> int:
    """A qwen35 / qwen35moe file, streamed: tensor infos first, then each tensor's data."""
    h = {**HYBRID_DEFAULTS, **HYBRID_SHAPES[a.arch, a.shape]}
    ctx = a.ctx or h["ctx"]
    w = gguf.GGUFWriter(a.out, a.arch)
    w.add_name(f"synthetic-{a.arch}-{a.shape}-q4_k_m")
    w.add_file_type(15)                      # MOSTLY_Q4_K_M
    w.add_context_length(ctx)
    w.add_embedding_length(h["n_embd"])
    w.add_block_count(h["n_layer"])
    if a.arch == "qwen35":
        w.add_feed_forward_length(h["n_ff"])
    else:
        w.add_expert_count(h["n_expert"])
        w.add_expert_used_count(h["n_expert_used"])
        w.add_expert_feed_forward_length(h["n_ff_exp"])
        w.add_expert_shared_feed_forward_length(h["n_ff_shexp"])
    w.add_head_count(h["n_head"])
    w.add_head_count_kv(h["n_head_kv"])
    w.add_key_length(h["head_dim"])
    w.add_value_length(h["head_dim"])
    w.add_rope_dimension_count(h["n_rot"])
    w.add_rope_dimension_sections(h["sections"])
    w.add_rope_freq_base(1e7)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_full_attention_interval(h["interval"])
    w.add_ssm_conv_kernel(h["conv"])
    w.add_ssm_state_size(h["d_state"])
    w.add_ssm_group_count(h["k_heads"])
    w.add_ssm_time_step_rank(h["v_heads"])
    w.add_ssm_inner_size(h["v_heads"] * h["d_state"])
    add_vocab_keys(w, kv, h["n_vocab"])
    return write_tensors(w, hybrid_tensors(a.arch, h))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--arch", default="qwen3",
                    choices=sorted({a for a, _ in [*SHAPES, *HYBRID_SHAPES, *MOE_SHAPES,
                                                   *GEMMA3_SHAPES]}))
    ap.add_argument("--shape", default="8b")
    ap.add_argument("--tokenizer", help="pickled tokenizer.* keys (a text model)")
    ap.add_argument("--mmproj", choices=sorted(MMPROJ_SHAPES),
                    help="write a vision projector of this kind instead")
    ap.add_argument("--text-width", type=int, help="with --mmproj: the text model's n_embd")
    ap.add_argument("--ctx", type=int, default=0, help="context_length (default: the "
                                                       "model's, 40960 for qwen3)")
    ap.add_argument("out")
    a = ap.parse_args()
    if a.mmproj:
        if not a.text_width:
            ap.error("--mmproj needs --text-width")
        n = write_mmproj(a.mmproj, a.text_width, a.out)
        print(f"wrote {a.out} ({n / 1e9:.2f} GB of tensors)")
        return 0
    if not a.tokenizer:
        ap.error("a text model needs --tokenizer")
    streamed = {**{k: write_hybrid for k in HYBRID_SHAPES}, **{k: write_moe for k in MOE_SHAPES},
                **{k: write_gemma3 for k in GEMMA3_SHAPES}}
    if (a.arch, a.shape) in streamed:
        with open(a.tokenizer, "rb") as f:
            kv = pickle.load(f)
        n = streamed[a.arch, a.shape](a, kv)
        print(f"wrote {a.out} ({n / 1e9:.2f} GB of tensors)")
        return 0
    a.ctx = a.ctx or 40960
    if (a.arch, a.shape) not in SHAPES:
        known = [s for r, s in [*SHAPES, *HYBRID_SHAPES, *MOE_SHAPES] if r == a.arch]
        ap.error(f"no shape {a.shape} for {a.arch}: {', '.join(known)}")
    e, n_layer, n_head, n_kv, hd, n_ff, n_vocab = SHAPES[a.arch, a.shape]
    with open(a.tokenizer, "rb") as f:
        kv = pickle.load(f)
    tokens = list(kv["tokenizer.ggml.tokens"][2])
    types = list(kv.get("tokenizer.ggml.token_type", (None, None, [1] * len(tokens)))[2])
    pad = n_vocab - len(tokens)
    if pad < 0:
        ap.error(f"the tokenizer has {len(tokens)} tokens, more than the shape's {n_vocab}")
    tokens += [f"<|unused_{i}|>" for i in range(pad)]
    types += [4] * pad                       # user-defined: never produced by the merges
    rng = np.random.default_rng(0)
    w = gguf.GGUFWriter(a.out, a.arch)
    w.add_name(f"synthetic-{a.arch}-{a.shape}-q4_k_m")
    w.add_file_type(15)                      # MOSTLY_Q4_K_M
    w.add_context_length(a.ctx)
    w.add_embedding_length(e)
    w.add_block_count(n_layer)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_kv)
    w.add_key_length(hd)
    w.add_value_length(hd)
    w.add_rope_freq_base(1e6)
    w.add_layer_norm_rms_eps(1e-6)
    for k, (t, sub, val) in kv.items():
        if k == "tokenizer.ggml.tokens":
            w.add_array(k, tokens)
        elif k == "tokenizer.ggml.token_type":
            w.add_array(k, types)
        elif k == "tokenizer.ggml.scores":
            w.add_array(k, list(val) + [0.0] * pad)
        elif t == gguf.GGUFValueType.ARRAY:
            w.add_array(k, val)
        elif t == gguf.GGUFValueType.STRING:
            w.add_string(k, val)
        else:
            w.add_key_value(k, val, t)
    ones = lambda n: np.ones(n, np.float32)  # noqa: E731
    w.add_tensor("token_embd.weight", rand_blocks(rng, T.Q4_K, n_vocab, e), raw_dtype=T.Q4_K)
    w.add_tensor("output_norm.weight", ones(e))
    w.add_tensor("output.weight", rand_blocks(rng, T.Q6_K, n_vocab, e), raw_dtype=T.Q6_K)
    for i in range(n_layer):
        b = f"blk.{i}."
        big = T.Q6_K if more_bits(i, n_layer) else T.Q4_K
        w.add_tensor(b + "attn_norm.weight", ones(e))
        w.add_tensor(b + "ffn_norm.weight", ones(e))
        w.add_tensor(b + "attn_q_norm.weight", ones(hd))
        w.add_tensor(b + "attn_k_norm.weight", ones(hd))
        for name, rows, cols, t in [
                ("attn_q", n_head * hd, e, T.Q4_K), ("attn_k", n_kv * hd, e, T.Q4_K),
                ("attn_v", n_kv * hd, e, big), ("attn_output", e, n_head * hd, T.Q4_K),
                ("ffn_gate", n_ff, e, T.Q4_K), ("ffn_up", n_ff, e, T.Q4_K),
                ("ffn_down", e, n_ff, big)]:
            w.add_tensor(b + name + ".weight", rand_blocks(rng, t, rows, cols), raw_dtype=t)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
