"""Pieces of the small random GGUF files the tests write with gguf-py's GGUFWriter."""
from __future__ import annotations


def add_spm_vocab(w, n_vocab: int) -> None:
    """A small SentencePiece vocabulary with byte fallback: <unk>, <s>, </s>, the 256 byte
    tokens and n_vocab - 259 words, for the engine's tokenizer."""
    words = [f"\u2581{chr(97 + i % 26)}{i}" for i in range(n_vocab - 3 - 256)]
    w.add_tokenizer_model("llama")
    w.add_token_list(["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + words)
    w.add_token_scores([-float(i) for i in range(n_vocab)])
    w.add_token_types([3, 3, 3] + [6] * 256 + [1] * len(words))
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)


def add_qwen3moe_keys(w, *, n_layer: int, n_embd: int, n_head: int, n_head_kv: int,
                      head_dim: int, n_expert: int, n_used: int, n_ff_exp: int) -> None:
    """The hyperparameters of a qwen3moe file (rope base 1e6, rms eps 1e-6, context 4096)."""
    a = "qwen3moe"
    for key, v in (("block_count", n_layer), ("context_length", 4096),
                   ("embedding_length", n_embd), ("feed_forward_length", 4 * n_ff_exp),
                   ("expert_feed_forward_length", n_ff_exp), ("expert_count", n_expert),
                   ("expert_used_count", n_used), ("attention.head_count", n_head),
                   ("attention.head_count_kv", n_head_kv), ("attention.key_length", head_dim),
                   ("attention.value_length", head_dim), ("rope.dimension_count", head_dim)):
        w.add_uint32(f"{a}.{key}", v)
    w.add_float32(f"{a}.rope.freq_base", 1e6)
    w.add_float32(f"{a}.attention.layer_norm_rms_epsilon", 1e-6)
