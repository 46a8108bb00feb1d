"""Each weight type added to the engine, through a whole model: a small random qwen3moe whose
embeddings, attention, experts and head all hold that type loads (the loader takes the type)
and its logits follow tests/helpers/reference.py in float32. (With llama.cpp's activation
rounding, such a random model's logits move by 1e-4 to 1e-1 in NMSE on the last bit of a
rounding or a near-tie in the router, existing types alike, so that rounding is held to the
reference per product instead: test_kernels.py's test_products_round_like_ggml_cpu.)"""
from __future__ import annotations

import numpy as np
import pytest

from engine.formats.gguf_file import GGUFFile
from engine.residency.model import Model
from tests.engine.gpu.test_kernels import RANDOM_BLOCKS, quantized
from tests.helpers.tiny_gguf import add_qwen3moe_keys, add_spm_vocab

pytestmark = pytest.mark.gpu

# rows of 256 weights: every type's blocks fit
N_LAYER, N_EMBD, N_HEAD, N_HEAD_KV, HEAD_DIM = 2, 256, 4, 2, 64
N_EXPERT, N_USED, N_FF_EXP, N_VOCAB = 4, 2, 256, 320
PROMPT = [1, 17, 200, 33, 4, 91, 150]
NEW_TYPES = ("Q5_1", "BF16", "Q3_K", "Q2_K", "IQ4_NL", "IQ4_XS", "MXFP4", "IQ3_XXS", "IQ3_S",
             "IQ2_XXS", "IQ2_XS", "IQ2_S")


def write_model(path: str, wtype: str, seed: int = 5) -> None:
    import gguf
    from gguf.quants import quantize

    rng = np.random.default_rng(seed)
    qt = gguf.GGMLQuantizationType[wtype]
    w = gguf.GGUFWriter(path, "qwen3moe")
    add_qwen3moe_keys(w, n_layer=N_LAYER, n_embd=N_EMBD, n_head=N_HEAD, n_head_kv=N_HEAD_KV,
                      head_dim=HEAD_DIM, n_expert=N_EXPERT, n_used=N_USED, n_ff_exp=N_FF_EXP)
    add_spm_vocab(w, N_VOCAB)

    def mat(name, *shape):
        """shape in numpy order, the row length last; weights of about 1 / sqrt(row length),
        so activations keep their size through the layers"""
        rows, n = int(np.prod(shape[:-1])), shape[-1]
        if wtype in RANDOM_BLOCKS:           # random blocks, their f16 scales brought down
            raw, deq = quantized(wtype, rows, n, rng)
            blocks = raw.reshape(-1, gguf.GGML_QUANT_SIZES[qt][1])
            for off in RANDOM_BLOCKS[wtype]:
                d = blocks[:, off:off + 2].copy().view(np.float16) / (deq.std() * np.sqrt(n))
                blocks[:, off:off + 2] = d.astype(np.float16).view(np.uint8)
        else:
            raw = quantize((rng.standard_normal((rows, n)) / np.sqrt(n)).astype(np.float32), qt)
        w.add_tensor(name, raw.reshape(*shape[:-1], -1), raw_dtype=qt)

    def norm(name, n):
        w.add_tensor(name, 1 + 0.1 * rng.standard_normal(n).astype(np.float32))

    mat("token_embd.weight", N_VOCAB, N_EMBD)
    norm("output_norm.weight", N_EMBD)
    mat("output.weight", N_VOCAB, N_EMBD)
    for i in range(N_LAYER):
        p = f"blk.{i}."
        norm(p + "attn_norm.weight", N_EMBD)
        mat(p + "attn_q.weight", N_HEAD * HEAD_DIM, N_EMBD)
        mat(p + "attn_k.weight", N_HEAD_KV * HEAD_DIM, N_EMBD)
        mat(p + "attn_v.weight", N_HEAD_KV * HEAD_DIM, N_EMBD)
        norm(p + "attn_q_norm.weight", HEAD_DIM)
        norm(p + "attn_k_norm.weight", HEAD_DIM)
        mat(p + "attn_output.weight", N_EMBD, N_HEAD * HEAD_DIM)
        norm(p + "ffn_norm.weight", N_EMBD)
        w.add_tensor(p + "ffn_gate_inp.weight",
                     (rng.standard_normal((N_EXPERT, N_EMBD)) / 8).astype(np.float32))
        mat(p + "ffn_gate_exps.weight", N_EXPERT, N_FF_EXP, N_EMBD)
        mat(p + "ffn_up_exps.weight", N_EXPERT, N_FF_EXP, N_EMBD)
        mat(p + "ffn_down_exps.weight", N_EXPERT, N_EMBD, N_FF_EXP)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def nmse(got, want) -> float:
    want = np.asarray(want, np.float64)
    return float(np.sum((np.asarray(got, np.float64) - want) ** 2) / np.sum(want ** 2))


@pytest.mark.parametrize("wtype", NEW_TYPES)
def test_model_of_one_weight_type(dev, kc, tmp_path, wtype):
    from tests.helpers.reference import ReferenceModel

    path = str(tmp_path / f"tiny-{wtype}.gguf")
    write_model(path, wtype)
    m = Model(dev, kc, path, n_ctx=64)
    m.tuning.coopmat = False     # f32 products: not the matrix units' f16, nor a GPU's int8
    m.tuning.dot4 = False        # activations in decode (each checked apart)
    try:
        with GGUFFile(path) as g:
            assert {g.tensor(n).type_name for n in m.config.tensor_shapes()} >= {wtype}
            m.tuning.ggml_numerics = False
            ref = ReferenceModel(g, n_ctx=64, quantize_activations=False)
            # the GPU's f16 KV cache is the one difference
            assert nmse(m.eval(PROMPT, 0, greedy=False), ref.forward(PROMPT, 0)[-1]) < 1e-6
            got = m.eval([42], len(PROMPT), greedy=False)
            assert nmse(got, ref.forward([42], len(PROMPT))[-1]) < 1e-6
            m.tuning.ggml_numerics = True        # runs, to finite logits
            m.cache_tokens = []
            assert np.isfinite(m.eval(PROMPT, 0, greedy=False)).all()
    finally:
        m.close()
