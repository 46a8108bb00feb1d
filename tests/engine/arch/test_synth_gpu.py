"""qwen2, qwen3, phi3 and mistral3 on the GPU engine, llama with every new weight type
(Q2_K, Q3_K, Q5_1, IQ4_NL, IQ4_XS, BF16, Q4_0, Q4_K_M) and gemma2 in Q4_K_M (GeGLU on the int8
decode path), against llama.cpp's logits on the synthetic models (tests/data/synth; the
comparison is tests/helpers/synth_reference.py).

Each case loads the GGUF into a real Model at llama.cpp's context size (phi3's LongRoPE
factors depend on it) and runs the teacher-forced sequence. Every prompt position's logits
come from a pass of up to four tokens ending there (the earlier positions already in the KV
cache, so one-token decode and small prefill passes both count); the prompt's last position
is also one pass of the whole prompt; then each continuation token is one decode step.
"""
from __future__ import annotations

import numpy as np
import pytest

from engine.formats.gguf_file import GGUFFile
from engine.residency.model import Model
from tests.helpers import synth_reference as sr

pytestmark = pytest.mark.gpu

ARCHS = ("qwen2", "qwen3", "phi3", "mistral3", "olmo2", "granite")
WEIGHT_TYPES = ("q2_k", "q3_k", "q5_1", "iq4_nl", "iq4_xs", "bf16", "q4_0", "q4_k_m")
QUANTIZED = {f"llama-{t}" for t in WEIGHT_TYPES} | {"gemma2-q4_k_m"}
CASES = [n for n in sr.case_names() if n.split("-")[0] in ARCHS or n in QUANTIZED]
PASS = 4                # most tokens of the passes that compute each prompt position


def test_every_case_of_these_architectures_and_types_is_here():
    if not CASES:
        pytest.skip(f"{sr.DATA / 'index.json'} missing")
    archs = {n.split("-")[0] for n in CASES}
    assert archs == set(ARCHS) | {"llama", "gemma2"}
    assert {n for n in CASES if n.split("-")[0] not in ARCHS} == QUANTIZED
    assert {"phi3-longrope-f16-short", "phi3-longrope-f16-long"} <= set(CASES)


def run_case(dev, kc, case: sr.Case, paths: str = "device") -> tuple[np.ndarray, Model]:
    """paths "gpu": a discrete GPU's decode without matrix units (mul_mat_vec with the norms
    and the GLU fused into its products, device numerics) on every device."""
    model = Model(dev, kc, str(case.model_path), n_ctx=case.n_ctx)
    if paths == "gpu":
        model.tuning.coopmat = False
        model.tuning.matvec, model.tuning.ggml_numerics = True, False
    try:
        def prefill(prompt: list[int]) -> np.ndarray:
            rows = []
            for i in range(len(prompt)):
                s = max(0, i + 1 - PASS)
                rows.append(model.run(prompt[s:i + 1], s, greedy=False))
            rows[-1] = model.run(prompt, 0, greedy=False)
            return np.stack(rows)

        logits = sr.logits_by_steps(case, prefill,
                                    lambda tok, pos: model.run([tok], pos, greedy=False))
    except BaseException:
        model.close()
        raise
    return logits, model


@pytest.mark.parametrize("paths", ["device", "gpu"])
@pytest.mark.parametrize("name", CASES)
def test_gpu_matches_llamacpp(dev, kc, name, paths):
    case = sr.load_case(name)
    sr.check_file(case)
    logits, model = run_case(dev, kc, case, paths)
    try:
        figures = sr.compare(case, logits)
    finally:
        model.close()
    print(f"{name}: tie margin {case.tie}, ties at {figures['ties']}, cosines "
          f"{figures['cos_prompt_last']:.6f} {figures['cos_last']:.6f}, max |diff| "
          f"{figures['max_diff']:.4f}")


# -- what the configurations read -------------------------------------------------------------

def _config(stem: str):
    from engine import arch

    g = GGUFFile(sr.DATA / f"{stem}.gguf")
    try:
        return arch.for_file(g).Config.from_gguf(g)
    finally:
        g.close()


def test_phi3_picks_longrope_factors_by_context():
    """The long factors once the context padded to 256 exceeds the original 256, as
    llama.cpp's get_rope_factors; both from the file, with its attention factor."""
    c = _config("phi3-longrope-f16")
    g = GGUFFile(sr.DATA / "phi3-longrope-f16.gguf")
    short = tuple(float(v) for v in g.dequantize("rope_factors_short.weight"))
    long = tuple(float(v) for v in g.dequantize("rope_factors_long.weight"))
    g.close()
    assert short != long
    assert c.rope_short.freq_factors == short and c.rope_long.freq_factors == long
    assert c.at_context(256).rope == c.rope_short
    assert c.at_context(200).rope == c.rope_short
    assert c.at_context(257).rope == c.rope_long
    assert c.rope.attn_factor == pytest.approx(np.sqrt(1 + np.log(4) / np.log(256)), rel=1e-6)
    assert (c.rope.freq_scale, c.rope.ext_factor, c.rope.n_ctx_orig) == (1.0, 0.0, 256)


def test_llama_like_options():
    q2, q3, m3 = (_config(s) for s in ("qwen2-yarn-f16", "qwen3-linear-f16",
                                       "mistral3-yarn-f16"))
    assert (q2.qkv_bias, q2.out_bias, q2.NEOX, q2.QK_NORM) == (True, False, True, "")
    assert (q3.qkv_bias, q3.NEOX, q3.QK_NORM, q3.head_dim, q3.n_head) == \
        (False, True, "head", 128, 3)
    assert (m3.qkv_bias, m3.NEOX, m3.attn_temp_scale, m3.attn_temp_floor) == \
        (False, False, 0.5, 16)
    assert q2.attn_temp_scale == q3.attn_temp_scale == 0.0
    assert "blk.1.attn_k.bias" in q2.tensor_shapes()
    assert "blk.1.attn_q_norm.weight" in q3.tensor_shapes()


# -- files these architectures cannot run: one clear line ---------------------------------------

@pytest.mark.parametrize("src,change,message", [
    ("qwen3-linear-f16", dict(tensors={"output.bias": np.zeros(400, np.float32)}),
     r"bias tensors this graph does not add \(output.bias\)"),
    ("phi3-longrope-f16", dict(tensors={"blk.0.attn_qkv.bias": np.zeros(512, np.float32)}),
     r"bias tensors this graph does not add \(attn_qkv.bias\)"),
    ("qwen2-yarn-f16", dict(tensors={"blk.1.attn_k.bias": np.zeros(128, np.float16)}),
     "tensor blk.1.attn_k.bias has type F16, expected F32"),
    ("qwen2-yarn-f16", dict(kv={"qwen2.rope.scaling.type": "longrope"}),
     "LongRoPE scaling is not supported for qwen2"),
    ("phi3-longrope-f16", dict(drop=("blk.1.attn_qkv.weight",)),
     "missing tensor 'blk.1.attn_qkv.weight'"),
    ("olmo2-f16", dict(kv={"olmo2.attention.sliding_window": "4096"}),
     r"sliding-window layers \(Olmo 3's, window 4096\)"),
    ("granite-f16", dict(tensors={"blk.0.ffn_up.bias": np.zeros(256, np.float32)}),
     r"bias tensors this graph does not add \(ffn_up.bias\)"),
])
def test_unsupported_files_say_why(dev, kc, tmp_path, src, change, message):
    from engine.formats.gguf_file import ModelFileError

    path = sr.rewrite(src, str(tmp_path / f"{src}.gguf"), **change)
    with pytest.raises(ModelFileError, match=message) as e:
        Model(dev, kc, path, n_ctx=256)
    assert "\n" not in str(e.value)


def test_an_unchanged_copy_loads(dev, kc, tmp_path):
    """The copies above fail for their change alone."""
    for src in ("qwen2-yarn-f16", "phi3-longrope-f16", "olmo2-f16", "granite-f16"):
        Model(dev, kc, sr.rewrite(src, str(tmp_path / f"{src}.gguf")), n_ctx=256).close()
