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
BLOCK = {T.Q4_K: (144, 256), T.Q6_K: (210, 256), T.Q8_0: (34, 32)}


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
    return a.reshape(rows, cols // ne * nb)


def more_bits(i: int, n: int) -> bool:
    """llama.cpp's use_more_bits for Q4_K_M's attn_v and ffn_down."""
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--arch", default="qwen3", choices=sorted({a for a, _ in SHAPES}))
    ap.add_argument("--shape", default="8b")
    ap.add_argument("--tokenizer", required=True, help="pickled tokenizer.* keys")
    ap.add_argument("--ctx", type=int, default=40960)
    ap.add_argument("out")
    a = ap.parse_args()
    if (a.arch, a.shape) not in SHAPES:
        ap.error(f"no shape {a.shape} for {a.arch}: "
                 f"{', '.join(s for r, s in SHAPES if r == a.arch)}")
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
