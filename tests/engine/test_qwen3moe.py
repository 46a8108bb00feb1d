"""qwen3moe on the GPU engine, on a small random model written here: against the numpy
reference, and the same outputs for every expert placement (cpu_moe) with the bytes moved."""
from __future__ import annotations

import numpy as np
import pytest

from engine.gguf_file import GGUFFile
from engine.model import Model, PlacementError

pytestmark = pytest.mark.gpu

N_LAYER, N_EMBD, N_HEAD, N_HEAD_KV, HEAD_DIM = 3, 128, 4, 2, 32
N_EXPERT, N_USED, N_FF_EXP, N_VOCAB = 8, 2, 64, 256
PROMPT = [1, 17, 200, 33, 4, 91, 150, 7, 62]
EXPERTS = ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps")


def write_qwen3moe(path: str, seed: int = 0) -> None:
    """Random weights in a mix of types: F32 embeddings, norms and router; Q8_0, Q4_0 and F16
    attention; Q8_0 gate, Q4_1 up and F16 down experts; a Q8_0 head. Every tensor's size is
    a multiple of 256 bytes, so the weight arenas hold no padding."""
    import gguf
    from gguf.quants import quantize

    rng = np.random.default_rng(seed)
    Q = gguf.GGMLQuantizationType
    w = gguf.GGUFWriter(path, "qwen3moe")
    a = "qwen3moe"
    w.add_uint32(f"{a}.block_count", N_LAYER)
    w.add_uint32(f"{a}.context_length", 4096)
    w.add_uint32(f"{a}.embedding_length", N_EMBD)
    w.add_uint32(f"{a}.feed_forward_length", 4 * N_FF_EXP)
    w.add_uint32(f"{a}.expert_feed_forward_length", N_FF_EXP)
    w.add_uint32(f"{a}.expert_count", N_EXPERT)
    w.add_uint32(f"{a}.expert_used_count", N_USED)
    w.add_uint32(f"{a}.attention.head_count", N_HEAD)
    w.add_uint32(f"{a}.attention.head_count_kv", N_HEAD_KV)
    w.add_uint32(f"{a}.attention.key_length", HEAD_DIM)
    w.add_uint32(f"{a}.attention.value_length", HEAD_DIM)
    w.add_uint32(f"{a}.rope.dimension_count", HEAD_DIM)
    w.add_float32(f"{a}.rope.freq_base", 1e6)
    w.add_float32(f"{a}.attention.layer_norm_rms_epsilon", 1e-6)
    # a small SentencePiece vocabulary, for the facade's tokenizer
    tokens = ["<unk>", "<s>", "</s>"] + [f"\u2581{chr(97 + i % 26)}{i}" for i in range(N_VOCAB - 3)]
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores([-float(i) for i in range(N_VOCAB)])
    w.add_token_types([3, 3, 3] + [1] * (N_VOCAB - 3))
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)

    def mat(*shape, scale=1.0):
        return (rng.standard_normal(shape) * scale / np.sqrt(shape[-1])).astype(np.float32)

    def add(name, arr, qtype=None):
        if qtype is None:
            w.add_tensor(name, arr)
        elif qtype == Q.F16:
            w.add_tensor(name, arr.astype(np.float16))
        else:
            w.add_tensor(name, quantize(arr, qtype), raw_dtype=qtype)

    add("token_embd.weight", rng.standard_normal((N_VOCAB, N_EMBD)).astype(np.float32))
    add("output_norm.weight", 1 + 0.1 * rng.standard_normal(N_EMBD).astype(np.float32))
    add("output.weight", mat(N_VOCAB, N_EMBD, scale=4.0), Q.Q8_0)
    for i in range(N_LAYER):
        p = f"blk.{i}."
        add(p + "attn_norm.weight", 1 + 0.1 * rng.standard_normal(N_EMBD).astype(np.float32))
        add(p + "attn_q.weight", mat(N_HEAD * HEAD_DIM, N_EMBD), Q.Q8_0)
        add(p + "attn_k.weight", mat(N_HEAD_KV * HEAD_DIM, N_EMBD), Q.Q4_0)
        add(p + "attn_v.weight", mat(N_HEAD_KV * HEAD_DIM, N_EMBD), Q.Q8_0)
        add(p + "attn_q_norm.weight", 1 + 0.1 * rng.standard_normal(HEAD_DIM).astype(np.float32))
        add(p + "attn_k_norm.weight", 1 + 0.1 * rng.standard_normal(HEAD_DIM).astype(np.float32))
        add(p + "attn_output.weight", mat(N_EMBD, N_HEAD * HEAD_DIM), Q.F16)
        add(p + "ffn_norm.weight", 1 + 0.1 * rng.standard_normal(N_EMBD).astype(np.float32))
        add(p + "ffn_gate_inp.weight", mat(N_EXPERT, N_EMBD, scale=3.0))
        add(p + "ffn_gate_exps.weight", mat(N_EXPERT, N_FF_EXP, N_EMBD), Q.Q8_0)
        add(p + "ffn_up_exps.weight", mat(N_EXPERT, N_FF_EXP, N_EMBD), Q.Q4_1)
        add(p + "ffn_down_exps.weight", mat(N_EXPERT, N_EMBD, N_FF_EXP), Q.F16)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.fixture(scope="module")
def moe_path(tmp_path_factory) -> str:
    path = str(tmp_path_factory.mktemp("qwen3moe") / "tiny-qwen3moe.gguf")
    write_qwen3moe(path)
    return path


def nmse(got, want) -> float:
    want = np.asarray(want, np.float64)
    return float(np.sum((np.asarray(got, np.float64) - want) ** 2) / np.sum(want ** 2))


def expert_names(layers) -> list[str]:
    return [f"blk.{i}.{n}.weight" for i in layers for n in EXPERTS]


def run(m: Model, prompt: list[int], n: int) -> tuple[np.ndarray, list[int]]:
    """The prompt's last logits, then n greedy tokens from an empty cache."""
    m.cache_tokens = []
    logits = m.eval(prompt, 0, greedy=False)
    m.cache_tokens = []
    return logits, list(m.generate(prompt, n))
