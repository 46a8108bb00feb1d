"""The numpy reference forward pass against llama.cpp on the synthetic models: the
architectures (qwen2, qwen3, phi3, gemma2, gpt-oss, mistral3, and the gated delta-net hybrids
qwen3next, qwen35, qwen35moe) and weight types (Q2_K, Q3_K, Q5_1, IQ4_NL, IQ4_XS, BF16,
MXFP4) that no small real model here has.

The files and llama.cpp's logits come from tests/tools/make_synth_models.py and
make_synth_reference.py; tests/helpers/synth_reference.py holds the comparison (every
position's argmax, ties aside, and the cosine of whole logit rows), which GPU architecture
tests can use on the same data.
"""
from __future__ import annotations

import numpy as np
import pytest

from tests.helpers.reference import HYBRID_ARCHS, ReferenceModel
from tests.helpers.reference_hybrid import HybridConfig, open_model
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
    model = open_model(GGUFFile(case.model_path), n_ctx=case.n_ctx,
                       quantize_activations=rounds_activations)
    logits = sr.logits_by_steps(case, lambda ids: model.forward(ids, 0),
                                lambda tok, pos: model.forward([tok], pos)[0])
    figures = sr.compare(case, logits)
    print(f"{case.name}{' (rounded activations)' if rounds_activations else ''}: tie margin "
          f"{case.tie}, ties at {figures['ties']}, cosines {figures['cos_prompt_last']:.6f} "
          f"{figures['cos_last']:.6f}, max |diff| {figures['max_diff']:.4f}"
          + (f", every step's cosine >= {figures['cos_steps_min']:.6f}"
             if "cos_steps_min" in figures else ""))


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
    model = open_model(GGUFFile(case.model_path), n_ctx=case.n_ctx)
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
    assert archs >= {"qwen2", "qwen3", "phi3", "gemma2", "gpt-oss", "mistral3", "llama",
                     *HYBRID_ARCHS}
    types = set().union(*(c["weight_types"] for c in names.values()))
    assert types >= {"Q2_K", "Q3_K", "Q5_1", "IQ4_NL", "IQ4_XS", "BF16", "MXFP4", "F16", "Q8_0"}


# -- the hybrids' recurrent states -------------------------------------------------------------

HYBRID_CASES = [c for c in CASES if c.split("-")[0] in HYBRID_ARCHS]


@pytest.mark.parametrize("name", HYBRID_CASES)
def test_hybrid_state_carries_a_split_prompt(name):
    """The prompt in two forward() calls (conv and delta-net states carried from the first)
    gives the logits of one call."""
    case = sr.load_case(name)
    model = open_model(GGUFFile(case.model_path), n_ctx=case.n_ctx)
    whole = model.forward(case.prompt_ids, 0)
    for cut in (1, 5, len(case.prompt_ids) - 1):
        first = model.forward(case.prompt_ids[:cut], 0)
        rest = model.forward(case.prompt_ids[cut:], cut)
        np.testing.assert_allclose(np.concatenate([first, rest]), whole, atol=1e-4,
                                   err_msg=f"{name}: prompt cut at {cut}")


@pytest.mark.parametrize("name", HYBRID_CASES)
def test_hybrid_release_and_restore_mid_generation(name):
    """Half-way through llama.cpp's continuation the sequence state is copied out and put into
    a fresh model, as a release and restore would; the rest still agrees with llama.cpp."""
    case = sr.load_case(name)
    n_prompt, half = len(case.prompt_ids), len(case.continuation_ids) // 2
    first = open_model(GGUFFile(case.model_path), n_ctx=case.n_ctx)
    rows = list(first.forward(case.prompt_ids, 0))
    for i, tok in enumerate(case.continuation_ids[:half]):
        rows.append(first.forward([tok], n_prompt + i)[0])
    saved = first.snapshot()
    first.forward([0, 1, 2], n_prompt + half)          # the released model goes on elsewhere
    second = open_model(GGUFFile(case.model_path), n_ctx=case.n_ctx)
    second.restore(saved)
    for i, tok in enumerate(case.continuation_ids[half:], start=half):
        rows.append(second.forward([tok], n_prompt + i)[0])
    sr.compare(case, np.stack(rows))


def test_hybrid_state_cannot_rewind():
    case = sr.load_case(HYBRID_CASES[0])
    model = open_model(GGUFFile(case.model_path), n_ctx=case.n_ctx)
    model.forward(case.prompt_ids[:8], 0)
    with pytest.raises(ValueError, match="recurrent states are at 8"):
        model.forward(case.prompt_ids[4:8], 4)


@pytest.mark.parametrize("name", ["qwen3next-f16", "qwen35-f16"])
def test_hybrid_value_heads_read_the_right_key_heads(name):
    """The stored logits tell the two head layouts apart: qwen3next's value head h reads key
    head h // 2 (grouped), qwen35's h % 2 (tiled); the other layout fails the comparison."""
    case = sr.load_case(name)
    model = open_model(GGUFFile(case.model_path), n_ctx=case.n_ctx)
    h = np.arange(model.config.n_v_heads)
    assert model._k_head.tolist() == (h // 2 if name.startswith("qwen3next") else h % 2).tolist()
    model._k_head = h % 2 if name.startswith("qwen3next") else h // 2
    logits = sr.logits_by_steps(case, lambda ids: model.forward(ids, 0),
                                lambda tok, pos: model.forward([tok], pos)[0])
    with pytest.raises(AssertionError, match="argmax differs"):
        sr.compare(case, logits)


def test_config_hybrids():
    c = _model("qwen3next-f16").config
    assert c.recurrent == (True, False, True, False)            # full_attention_interval 2
    assert (c.n_k_heads, c.n_v_heads, c.d_state, c.head_v_dim, c.d_conv) == (2, 4, 32, 32, 4)
    assert (c.n_rot, c.rope_sections, c.n_expert, c.n_expert_used) == (16, (), 4, 2)
    dense = _model("qwen35-f16")
    c = dense.config
    assert c.n_layer == 4 and len(dense.weights.blk) == 4       # the MTP block is not run
    assert c.recurrent == (True, True, True, False)             # full_attention_interval 4
    assert c.rope_sections == (3, 3, 2, 0) and c.turning_pairs().all() and c.n_expert == 0
    c = _model("qwen35moe-f16").config
    assert c.recurrent == (True, False, True, True)             # attention.recurrent_layers
    # sections that leave pairs to the extra position (0 for text): those do not turn
    odd = HybridConfig(**{**c.__dict__, "rope_sections": (3, 3, 1, 1)})
    assert odd.turning_pairs().tolist() == [True] * 5 + [False] + [True] * 2


# -- what the reference reads from each file (the values make_synth_models.py wrote) ------------

def _model(stem: str, n_ctx: int = 512) -> ReferenceModel:
    return open_model(GGUFFile(sr.DATA / f"{stem}.gguf"), n_ctx=n_ctx)


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
