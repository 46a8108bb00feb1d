"""gemma2 and gpt-oss on the GPU engine against llama.cpp's stored logits on the synthetic
models (tests/data/synth): each file loaded as the app loads it (engine.residency.model.Model),
the sequence teacher-forced, compared by tests/helpers/synth_reference.py (every position's
argmax, ties aside, and the cosine of whole logit rows).

Logits at every prompt position: the engine gives the last token's per pass, so the prompt's
positions 0..n-2 come from decode steps, one token at a time from position 0, and the last
from one prefill of the whole prompt (in the model's chunks), whose cache the continuation's
decode steps then read. Prefill (per-token or flash attention, the windows' masks) and decode
(split attention) both run with the architectures' options.
"""
from __future__ import annotations

import numpy as np
import pytest

from engine.residency.model import Model
from tests.helpers import synth_reference as sr

pytestmark = pytest.mark.gpu

ARCHS = ("gemma2", "gpt-oss")
CASES = [n for n in sr.case_names() if n.split("-")[0] in ARCHS or n.startswith("gpt-oss")]


def prompt_logits(m: Model, ids: list[int]) -> np.ndarray:
    """[len(ids), n_vocab]: rows 0..n-2 by decode steps, the last by one prefill."""
    rows = [m.eval([t], i, greedy=False) for i, t in enumerate(ids[:-1])]
    rows.append(m.eval(ids, 0, greedy=False))
    return np.stack(rows)


def teacher_forced(m: Model, case: sr.Case, between=None) -> np.ndarray:
    """[n_tokens, n_vocab]; between(i) runs before continuation step i."""
    def step(tok: int, pos: int) -> np.ndarray:
        if between is not None:
            between(pos - len(case.prompt_ids))
        return m.eval([tok], pos, greedy=False)
    return sr.logits_by_steps(case, lambda ids: prompt_logits(m, ids), step)


@pytest.fixture(scope="module", params=CASES or [None])
def case(request) -> sr.Case:
    if request.param is None:
        pytest.skip(f"{sr.DATA / 'index.json'} missing")
    return sr.load_case(request.param)


@pytest.mark.parametrize("paths", ["plain", "flash", "gpu", "device"])
def test_follows_llamacpp(dev, kc, case, paths):
    """lavapipe's paths (per-token prefill attention, two-pass split decode attention,
    llama.cpp's rounding); tiled (flash) prefill attention; a discrete GPU's decode paths
    without matrix units (mul_mat_vec, one-pass split attention, device numerics); and the
    device's own choice (with matrix units: mul_mat_cm and flash_attn_cm)."""
    sr.check_file(case)
    m = Model(dev, kc, str(case.model_path), n_ctx=case.n_ctx, name=case.name,
              flash_attn="on" if paths == "flash" else "off")
    if paths != "device":              # the same paths on every device
        m.tuning.coopmat = False
        m.tuning.matvec, m.tuning.ggml_numerics = (True, False) if paths == "gpu" \
            else (False, True)
    try:
        if paths != "device":
            assert m.uses_flash_attn == (paths == "flash")
            assert m.paths.decode_attention == ("attn_decode" if paths == "gpu" else
                                                "flash_attn" if paths == "flash" else
                                                "attention")
        logits = teacher_forced(m, case)
    finally:
        m.close()
    figures = sr.compare(case, logits)
    print(f"{case.name} ({paths}): tie margin {case.tie}, ties at {figures['ties']}, "
          f"cosines {figures['cos_prompt_last']:.6f} {figures['cos_last']:.6f}, "
          f"max |diff| {figures['max_diff']:.4f}")


@pytest.mark.parametrize("name", [n for n in CASES if n.startswith("gpt-oss")])
def test_release_restore_midway_keeps_kv_bit_for_bit(dev, kc, name):
    """gpt-oss released fully (KV to host memory, the device freed) and restored in the
    middle of the continuation: the KV comes back bit for bit and every later logit is the
    one of a run without the cycle."""
    case = sr.load_case(name)
    m = Model(dev, kc, str(case.model_path), n_ctx=case.n_ctx, name=name)
    try:
        plain = teacher_forced(m, case)
        m.cache_tokens = []
        kv = {}

        def cycle(i: int) -> None:
            if i != len(case.continuation_ids) // 2:
                return
            kv["before"] = m.kv_checksum()
            m.release(full=True)
            assert m.state == "cold" and sum(m.device_bytes().values()) == 0
            assert m.kv_checksum() == kv["before"]           # the host shadow
            m.restore()
            kv["after"] = m.kv_checksum()
        cycled = teacher_forced(m, case, between=cycle)
    finally:
        m.close()
    assert kv["after"] == kv["before"]
    assert np.array_equal(cycled, plain)
    sr.compare(case, cycled)


def test_every_case_of_both_architectures_is_run():
    archs = {sr.load_case(n).model_path.name.split("-")[0] for n in CASES}
    assert {"gemma2", "gpt"} <= archs and any("mxfp4" in n for n in CASES)


# -- gemma3's final logit soft-cap (the same op as gemma2's) --------------------------------

def write_gemma3(path: str, final_softcap: float, seed: int = 3) -> None:
    """A tiny random gemma3 (2 layers, tied) declaring final_logit_softcapping."""
    import gguf

    rng = np.random.default_rng(seed)
    e, n_head, n_kv, hd, ff, vocab = 256, 4, 2, 64, 256, 300
    w = gguf.GGUFWriter(path, "gemma3")
    for key, v in (("block_count", 2), ("context_length", 4096), ("embedding_length", e),
                   ("feed_forward_length", ff), ("attention.head_count", n_head),
                   ("attention.head_count_kv", n_kv), ("attention.key_length", hd),
                   ("attention.value_length", hd), ("attention.sliding_window", 512)):
        w.add_uint32(f"gemma3.{key}", v)
    w.add_float32("gemma3.rope.freq_base", 10000.0)
    w.add_float32("gemma3.attention.layer_norm_rms_epsilon", 1e-6)
    w.add_float32("gemma3.final_logit_softcapping", final_softcap)

    def mat(name, rows, n, gain=1.0):
        w.add_tensor(name, (rng.standard_normal((rows, n)) * gain / np.sqrt(n)).astype(np.float32))

    def norm(name, n):
        w.add_tensor(name, 1 + 0.1 * rng.standard_normal(n).astype(np.float32))

    mat("token_embd.weight", vocab, e, gain=4.0)       # large logits, so that the cap bites
    norm("output_norm.weight", e)
    for i in range(2):
        p = f"blk.{i}."
        norm(p + "attn_norm.weight", e)
        mat(p + "attn_q.weight", n_head * hd, e)
        mat(p + "attn_k.weight", n_kv * hd, e)
        mat(p + "attn_v.weight", n_kv * hd, e)
        norm(p + "attn_q_norm.weight", hd)
        norm(p + "attn_k_norm.weight", hd)
        mat(p + "attn_output.weight", e, n_head * hd)
        norm(p + "post_attention_norm.weight", e)
        norm(p + "ffn_norm.weight", e)
        mat(p + "ffn_gate.weight", ff, e)
        mat(p + "ffn_up.weight", ff, e)
        mat(p + "ffn_down.weight", e, ff)
        norm(p + "post_ffw_norm.weight", e)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_gemma3_final_softcap_follows_the_reference(dev, kc, tmp_path):
    """A gemma3 file with final_logit_softcapping loads (it was refused) and its capped
    logits follow tests/helpers/reference.py in float32, after a prompt and a decode step."""
    from tests.helpers.reference import ReferenceModel
    from engine.formats.gguf_file import GGUFFile

    cap, prompt = 3.0, [5, 17, 200, 33, 4, 91, 150]
    path = str(tmp_path / "gemma3-softcap.gguf")
    write_gemma3(path, cap)
    m = Model(dev, kc, path, n_ctx=64)
    m.tuning.ggml_numerics = False
    try:
        with GGUFFile(path) as g:
            ref = ReferenceModel(g, n_ctx=64)
            want = ref.forward(prompt, 0)[-1]
            got = m.eval(prompt, 0, greedy=False)
            want2 = ref.forward([42], len(prompt))[-1]
        got2 = m.eval([42], len(prompt), greedy=False)
    finally:
        m.close()
    raw = np.arctanh(np.clip(want / cap, -1 + 1e-7, 1 - 1e-7)) * cap
    assert np.abs(raw).max() > 2 * cap                 # the cap changes these logits
    for a, b in ((got, want), (got2, want2)):
        assert np.abs(a).max() <= cap
        assert np.sum((a - b) ** 2) / np.sum(b ** 2) < 1e-6


# -- what the GPU configs read, against the reference's reading of the same files -----------

@pytest.mark.parametrize("name", ["gemma2-swa-f16", "gpt-oss-mxfp4"])
def test_config_reads_what_the_reference_reads(name):
    """Windows, rope bases and scalings (gpt-oss's YaRN attention factor from the shared
    rope_from_gguf against the reference's llama-context.cpp reading), scales, soft-caps,
    experts: each from its own reading of the GGUF keys."""
    from engine import arch
    from tests.helpers.reference import Config as RefConfig
    from engine.formats.gguf_file import GGUFFile

    with GGUFFile(sr.DATA / f"{name}.gguf") as g:
        c, r = arch.for_file(g).Config.from_gguf(g), RefConfig.from_gguf(g)
    assert (c.swa_layers, c.window) == (r.swa_layers, r.n_swa)
    assert (c.rope_base, c.rope_base_local) == (r.rope_base, r.rope_base_swa)
    assert (c.rope.freq_scale, c.rope.ext_factor) == (r.rope_freq_scale, r.yarn_ext_factor)
    assert (c.rope.beta_fast, c.rope.beta_slow, c.rope.n_ctx_orig) == \
        (r.yarn_beta_fast, r.yarn_beta_slow, r.n_ctx_orig)
    assert c.rope.attn_factor == r.yarn_attn_factor
    assert (c.n_ff, c.n_head, c.n_head_kv, c.head_dim) == (r.n_ff or c.n_ff, r.n_head,
                                                           r.n_head_kv, r.head_dim)
    if name.startswith("gemma2"):
        assert (c.attn_softcap, c.final_softcap) == (r.attn_softcap, r.final_softcap)
        assert c.attn_scale == pytest.approx(r.attn_scale) and c.tied_output
    else:
        assert (c.n_expert, c.n_expert_used, c.n_ff) == (r.n_expert, r.n_expert_used, 64)
        assert c.rope.ext_factor == 1.0 and c.rope.freq_scale == 1 / 32
        assert not c.tied_output
