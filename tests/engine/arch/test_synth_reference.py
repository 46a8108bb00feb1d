"""The numpy reference forward pass against llama.cpp on the synthetic models: the
architectures (qwen2, qwen3, phi3, gemma2, gpt-oss, mistral3) and weight types (Q2_K, Q3_K,
Q5_1, IQ4_NL, IQ4_XS, BF16, MXFP4) that no small real model here has.

The files and llama.cpp's logits come from tests/tools/make_synth_models.py and
make_synth_reference.py; tests/helpers/synth_reference.py holds the comparison (every
position's argmax, ties aside, and the cosine of whole logit rows), which GPU architecture
tests can use on the same data.
"""
from __future__ import annotations

import numpy as np
import pytest

from engine.arch.reference import ReferenceModel
from engine.formats.gguf_file import GGUFFile
from engine.text.tokenizer import Tokenizer
from tests.helpers import synth_reference as sr

CASES = sr.case_names()


@pytest.fixture(scope="module", params=CASES or [None])
def case(request) -> sr.Case:
    if request.param is None:
        pytest.skip(f"{sr.DATA / 'index.json'} missing")
    return sr.load_case(request.param)


def test_file_is_the_one_llamacpp_ran(case):
    sr.check_file(case)


def _check(case: sr.Case, rounds_activations: bool) -> None:
    model = ReferenceModel(GGUFFile(case.model_path), n_ctx=case.n_ctx,
                           quantize_activations=rounds_activations)
    logits = sr.logits_by_steps(case, lambda ids: model.forward(ids, 0),
                                lambda tok, pos: model.forward([tok], pos)[0])
    figures = sr.compare(case, logits)
    print(f"{case.name}{' (rounded activations)' if rounds_activations else ''}: tie margin "
          f"{case.tie}, ties at {figures['ties']}, cosines {figures['cos_prompt_last']:.6f} "
          f"{figures['cos_last']:.6f}, max |diff| {figures['max_diff']:.4f}")


def test_reference_matches_llamacpp(case):
    """Float activations, the reference's default."""
    _check(case, rounds_activations=False)


def test_reference_rounding_as_llamacpp_matches(case):
    """Activations rounded to 8-bit blocks before quantized products, as llama.cpp's CPU
    backend does (what ggml_numerics mirrors on the GPU), on the new weight types too."""
    if not case.quantized:
        pytest.skip("float weights: nothing rounded to 8 bits")
    _check(case, rounds_activations=True)


def test_one_batch_matches_steps(case):
    """The whole sequence in one forward() gives what prefill and single steps give."""
    model = ReferenceModel(GGUFFile(case.model_path), n_ctx=case.n_ctx)
    whole = model.forward(case.tokens, 0)
    model.reset()
    steps = sr.logits_by_steps(case, lambda ids: model.forward(ids, 0),
                               lambda tok, pos: model.forward([tok], pos)[0])
    np.testing.assert_allclose(whole, steps, atol=1e-3)


def test_tokenizer_reads_the_small_vocabulary(case):
    tok = Tokenizer.from_gguf(GGUFFile(case.model_path))
    assert tok.encode(sr.index()["prompt_text"]) == case.prompt_ids
    assert tok.decode(case.prompt_ids) == sr.index()["prompt_text"]


def test_every_type_and_architecture_is_covered():
    names = {c["name"]: c for c in sr.index()["cases"]}
    archs = {GGUFFile(sr.DATA / c["model_file"]).arch for c in names.values()}
    assert archs >= {"qwen2", "qwen3", "phi3", "gemma2", "gpt-oss", "mistral3", "llama"}
    types = set().union(*(c["weight_types"] for c in names.values()))
    assert types >= {"Q2_K", "Q3_K", "Q5_1", "IQ4_NL", "IQ4_XS", "BF16", "MXFP4", "F16"}


# -- what the reference reads from each file (the values make_synth_models.py wrote) ------------

def _model(stem: str, n_ctx: int = 512) -> ReferenceModel:
    return ReferenceModel(GGUFFile(sr.DATA / f"{stem}.gguf"), n_ctx=n_ctx)


def test_config_qwen2_yarn():
    m = _model("qwen2-yarn-f16")
    c = m.config
    assert (c.rope_scaling, c.rope_freq_scale, c.yarn_ext_factor, c.n_ctx_orig) == \
        ("yarn", 0.25, 1.0, 4096)
    assert c.rope_neox and (c.yarn_beta_fast, c.yarn_beta_slow) == (32.0, 1.0)
    # get_mscale(4) / (1 + 0.1 ln 4): rope_yarn multiplies the 1 + 0.1 ln 4 back in
    assert c.yarn_attn_factor == pytest.approx(1.0, abs=1e-6)
    assert m.weights.blk[0].attn_k_b is not None
    assert m.weights.output is not m.weights.token_embd


def test_config_qwen3_linear():
    m = _model("qwen3-linear-f16")
    c = m.config
    assert (c.n_head, c.n_head_kv, c.head_dim, c.rope_scaling, c.rope_freq_scale) == \
        (3, 1, 128, "linear", 0.5)
    assert c.yarn_ext_factor == 0.0 and c.attn_scale == pytest.approx(128 ** -0.5)
    assert m.weights.blk[1].attn_q_norm.shape == (128,)
    assert m.weights.output is m.weights.token_embd


def test_config_phi3_longrope():
    short, long = _model("phi3-longrope-f16", 256), _model("phi3-longrope-f16", 512)
    c = short.config
    assert (c.rope_scaling, c.n_ctx_orig, c.rope_freq_scale, c.yarn_ext_factor) == \
        ("longrope", 256, 1.0, 0.0)
    assert c.yarn_attn_factor == pytest.approx(np.sqrt(1 + np.log(4) / np.log(256)), rel=1e-6)
    assert short.rope_factors is short.weights.rope_factors_short
    assert long.rope_factors is long.weights.rope_factors_long
    assert short.weights.blk[0].attn_qkv is not None and short.weights.blk[0].attn_q is None
    assert c.swa_layers == (False, False)


def test_config_gemma2():
    m = _model("gemma2-swa-f16")
    c = m.config
    assert (c.swa_layers, c.n_swa, c.rope_base, c.rope_base_swa) == \
        ((True, False), 12, 10000.0, 1000.0)
    assert (c.attn_softcap, c.final_softcap, c.embd_scale) == (2.0, 10.0, 16.0)
    assert c.attn_scale == pytest.approx(128 ** -0.5)       # head_dim, not n_embd / n_head
    assert m.weights.output is m.weights.token_embd


def test_config_gpt_oss():
    m = _model("gpt-oss-mxfp4")
    c = m.config
    assert (c.swa_layers, c.n_swa, c.n_expert, c.n_expert_used) == ((True, False), 16, 4, 2)
    assert (c.rope_scaling, c.rope_freq_scale, c.rope_freq_scale_swa) == \
        ("yarn", 1 / 32, 1 / 32)
    assert m.weights.blk[0].attn_sinks.shape == (c.n_head,)
    assert m.weights.blk[0].ffn_gate_exps.w.shape == (4, 64, 256)


def test_config_mistral3():
    c = _model("mistral3-yarn-f16").config
    assert not c.rope_neox
    assert (c.yarn_beta_fast, c.yarn_beta_slow, c.attn_temp_scale, c.n_ctx_orig) == \
        (16.0, 2.0, 0.5, 16)
    # log multiplier 1: get_mscale(16, 1) / get_mscale(16, 1) / (1 + 0.1 ln 16)
    assert c.yarn_attn_factor == pytest.approx(1 / (1 + 0.1 * np.log(16)), rel=1e-6)
