"""The lfm2 hybrid (short convolutions and attention) on a small random GGUF: against the numpy
reference, through warm/cold cycles with its recurrent state, and with the prompt cache."""
from __future__ import annotations

import numpy as np
import pytest

from tests.helpers.reference import ReferenceModel
from engine.formats.gguf_file import GGUFFile
from engine.gpu import vk
from engine.residency import model as model_mod
from engine.residency.loop import Timings, generate
from engine.residency.model import Model

pytestmark = pytest.mark.gpu

N_EMBD, N_HEAD, N_HEAD_KV, N_FF, N_VOCAB, L_CACHE = 64, 4, 2, 128, 96, 3
HEAD_COUNT_KV = [0, 0, N_HEAD_KV, 0, N_HEAD_KV]      # conv, conv, attention, conv, attention
CONV_LAYERS = [i for i, k in enumerate(HEAD_COUNT_KV) if k == 0]
PROMPT = [5, 17, 3, 88, 41, 9, 60, 2, 77, 23, 14, 51, 30, 8, 66, 45, 12, 90, 36, 71]
CHUNK = 8                # prefill chunk for these tests: the prompt takes three


def write_lfm2(path: str, seed: int = 0, conv_dtype=np.float32) -> str:
    """Random weights in the layout llama.cpp's lfm2 loader expects; odd layers and the
    embeddings in Q8_0, one F16 matrix, the rest F32."""
    import gguf
    from gguf.quants import quantize

    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(path, "lfm2")
    w.add_block_count(len(HEAD_COUNT_KV))
    w.add_context_length(4096)
    w.add_embedding_length(N_EMBD)
    w.add_feed_forward_length(N_FF)
    w.add_head_count(N_HEAD)
    w.add_head_count_kv(HEAD_COUNT_KV)
    w.add_rope_freq_base(1e6)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_shortconv_l_cache(L_CACHE)

    def mat(name: str, rows: int, cols: int, qtype: str = "F32") -> None:
        """A [rows, cols] numpy matrix: ggml shape (cols, rows)."""
        a = (rng.standard_normal((rows, cols)) / np.sqrt(cols)).astype(np.float32)
        if qtype == "Q8_0":
            t = gguf.GGMLQuantizationType.Q8_0
            w.add_tensor(name, quantize(a, t), raw_dtype=t)
        else:
            w.add_tensor(name, a.astype(np.float16) if qtype == "F16" else a)

    def norm(name: str, n: int) -> None:
        w.add_tensor(name, (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32))

    mat("token_embd.weight", N_VOCAB, N_EMBD, "Q8_0")
    norm("token_embd_norm.weight", N_EMBD)
    hd = N_EMBD // N_HEAD
    for i, kv in enumerate(HEAD_COUNT_KV):
        p, q = f"blk.{i}.", "Q8_0" if i % 2 else "F32"
        norm(p + "attn_norm.weight", N_EMBD)
        if kv == 0:
            mat(p + "shortconv.in_proj.weight", 3 * N_EMBD, N_EMBD, q)
            w.add_tensor(p + "shortconv.conv.weight",
                         (rng.standard_normal((N_EMBD, L_CACHE)) * 0.5).astype(conv_dtype))
            mat(p + "shortconv.out_proj.weight", N_EMBD, N_EMBD, q)
        else:
            mat(p + "attn_q.weight", N_HEAD * hd, N_EMBD, q)
            mat(p + "attn_k.weight", kv * hd, N_EMBD, q)
            mat(p + "attn_v.weight", kv * hd, N_EMBD, q)
            norm(p + "attn_q_norm.weight", hd)
            norm(p + "attn_k_norm.weight", hd)
            mat(p + "attn_output.weight", N_EMBD, N_HEAD * hd, q)
        norm(p + "ffn_norm.weight", N_EMBD)
        mat(p + "ffn_gate.weight", N_FF, N_EMBD, q)
        mat(p + "ffn_up.weight", N_FF, N_EMBD, q)
        mat(p + "ffn_down.weight", N_EMBD, N_FF, "F16" if i == 2 else q)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture(scope="module")
def lfm2_path(tmp_path_factory) -> str:
    return write_lfm2(str(tmp_path_factory.mktemp("lfm2") / "lfm2-tiny.gguf"))


@pytest.fixture
def small_chunks(monkeypatch):
    monkeypatch.setattr(model_mod.Model, "chunk", CHUNK)      # on every device


def nmse(got, want) -> float:
    want = np.asarray(want, np.float64)
    return float(np.sum((np.asarray(got, np.float64) - want) ** 2) / np.sum(want ** 2))


def recording_argmax(seen: list):
    """A sampler that keeps every logits vector it is given and picks the argmax."""
    def sample(logits, history):
        seen.append(np.array(logits))
        return int(np.argmax(logits))
    return sample


# -- against the numpy reference ---------------------------------------------------------------

def test_config_and_tensors(lfm2_path):
    from engine.arch import lfm2

    with GGUFFile(lfm2_path) as g:
        c = lfm2.Config.from_gguf(g)
    assert c.conv_layers == (0, 1, 3) and c.kv_layers == (2, 4)
    assert c.d_conv == L_CACHE - 1 and c.n_head_kv == N_HEAD_KV and c.tied_output
    shapes = c.tensor_shapes()
    assert shapes["blk.0.shortconv.conv.weight"] == (L_CACHE, N_EMBD)
    assert shapes["blk.1.shortconv.in_proj.weight"] == (N_EMBD, 3 * N_EMBD)
    assert "blk.0.attn_q.weight" not in shapes and "blk.2.shortconv.conv.weight" not in shapes


@pytest.mark.parametrize("ggml_numerics", [False, True])
def test_logits_match_reference(dev, kc, lfm2_path, small_chunks, ggml_numerics):
    """A prompt prefilled in three chunks, then decode steps, against tests/helpers/reference.py:
    plain f32 (the engine's f16 KV cache alone leaves ~1e-9), and llama.cpp's activation
    rounding on both sides."""
    tol = 1e-4 if ggml_numerics else 1e-7
    m = Model(dev, kc, lfm2_path, n_ctx=128, name=f"lfm2-ref{int(ggml_numerics)}")
    m.tuning.ggml_numerics = ggml_numerics
    m.tuning.coopmat = False   # f32 products: the matrix units' f16 ones are checked apart,
    m.tuning.dot4 = False      # and the int8 activations of a GPU's decode products
    try:
        with GGUFFile(lfm2_path) as g:
            ref = ReferenceModel(g, n_ctx=128, quantize_activations=ggml_numerics)
        want = ref.forward(PROMPT, 0)[-1]
        got = m.eval(PROMPT, 0, greedy=False)
        assert nmse(got, want) < tol
        pos = len(PROMPT)
        for tok in (7, 81, 40):
            want, got = ref.forward([tok], pos)[-1], m.eval([tok], pos, greedy=False)
            assert nmse(got, want) < tol, pos
            pos += 1
    finally:
        m.close()


def test_greedy_matches_reference(dev, kc, lfm2_path, small_chunks):
    m = Model(dev, kc, lfm2_path, n_ctx=128, name="lfm2-greedy")
    m.tuning.ggml_numerics = False
    m.tuning.coopmat = False
    try:
        with GGUFFile(lfm2_path) as g:
            want = ReferenceModel(g, n_ctx=128).generate_greedy(PROMPT, 16)
        assert list(generate(m, PROMPT, 16)) == want
    finally:
        m.close()


def test_conv_state_is_the_last_inputs(dev, kc, lfm2_path, small_chunks):
    """The device conv state after a chunked prefill equals the reference's, layer by layer
    (ggml layout: per channel, the last d_conv values of B * x)."""
    m = Model(dev, kc, lfm2_path, n_ctx=128, name="lfm2-state")
    m.tuning.ggml_numerics = False
    m.tuning.coopmat = False
    try:
        with GGUFFile(lfm2_path) as g:
            ref = ReferenceModel(g, n_ctx=128)
        ref.forward(PROMPT, 0)
        m.eval(PROMPT, 0)
        for i in CONV_LAYERS:
            # downloaded: a discrete GPU keeps the state where the host cannot map it
            got = vk.download(dev, m.rs.conv_state[i]).view(np.float32).reshape(N_EMBD,
                                                                                L_CACHE - 1)
            assert nmse(got.T, ref.state.conv[i]) < 1e-7, i    # f16 KV upstream of layer 3
    finally:
        m.close()


def test_conv_kernel_must_be_f32(dev, kc, tmp_path):
    from engine.formats.gguf_file import ModelFileError

    path = write_lfm2(str(tmp_path / "lfm2-f16conv.gguf"), conv_dtype=np.float16)
    with pytest.raises(ModelFileError, match="shortconv.conv.weight has type F16, expected F32"):
        Model(dev, kc, path, n_ctx=64)


# -- residency ---------------------------------------------------------------------------------

@pytest.mark.parametrize("full,in_place", [(False, True), (True, True), (True, False)])
def test_warm_cold_cycles_keep_recurrent_state(dev, kc, lfm2_path, small_chunks, monkeypatch,
                                               full, in_place):
    """Three release/restore round trips, each followed by more generation from the prompt
    cache: every logit equals an uninterrupted run's, bit for bit (the same decode graph),
    which it cannot if the conv states were lost or stale. lavapipe's paths on every device:
    a decode step gives a token a prompt's bits there (Paths.steps_match_prompts), so each
    turn goes on from the restored states."""
    from dataclasses import replace

    monkeypatch.setattr(Model, "write_in_place", in_place)
    m = Model(dev, kc, lfm2_path, n_ctx=128, name=f"lfm2-cycle{int(full)}{int(in_place)}")
    m.tuning = replace(m.tuning, matvec=False, coopmat=False, ggml_numerics=True, dot4=False)
    assert m.paths.steps_match_prompts
    try:
        base_logits: list = []
        base = list(generate(m, PROMPT, 13, sample=recording_argmax(base_logits)))
        state_bytes = len(CONV_LAYERS) * (L_CACHE - 1) * N_EMBD * 4
        assert list(generate(m, PROMPT, 4)) == base[:4]     # not a prefix: starts afresh
        warm = m.device_bytes()
        assert warm["recurrent"] == state_bytes
        have = 4
        for _ in range(3):
            rec, kv = m.recurrent_checksum(), m.kv_checksum()
            m.release(full=full)
            assert m.state == "cold"
            cold = m.device_bytes()
            assert cold.get("weights", 0) == 0
            if full:
                assert sum(cold.values()) == 0 and "recurrent" not in cold
            else:
                assert cold["recurrent"] == state_bytes and cold["kv"] == warm["kv"]
            assert m.host_shadow_bytes() >= m.weight_bytes + state_bytes
            assert m.recurrent_checksum() == rec and m.kv_checksum() == kv
            m.restore()
            assert m.state == "warm" and m.device_bytes() == warm
            assert m.recurrent_checksum() == rec and m.kv_checksum() == kv
            seen: list = []
            t = Timings()
            got = list(generate(m, PROMPT + base[:have], 3, sample=recording_argmax(seen),
                                  timings=t))
            assert t.cached_tokens == len(PROMPT) + have - 1
            assert got == base[have:have + 3]
            for a, b in zip(seen, base_logits[have:have + 3]):
                assert np.array_equal(a, b)
            have += 3
    finally:
        m.close()
    assert sum(m.device_bytes().values()) == 0


def test_recurrent_state_changes_and_resets(dev, kc, lfm2_path, small_chunks):
    m = Model(dev, kc, lfm2_path, n_ctx=128, name="lfm2-reset")
    try:
        zero = m.recurrent_checksum()
        m.eval(PROMPT, 0)
        after = m.recurrent_checksum()
        assert after != zero
        m.eval([3], len(PROMPT))
        assert m.recurrent_checksum() != after
        m.eval(PROMPT, 0)                       # position 0 starts from a zero state
        assert m.recurrent_checksum() == after
        with pytest.raises(ValueError, match="recurrent state is at position"):
            m.eval([3], 4)
    finally:
        m.close()


def test_warm_bytes_estimate(dev, kc, lfm2_path, small_chunks):
    m = Model(dev, kc, lfm2_path, n_ctx=128, warm=False, name="lfm2-estimate")
    try:
        estimate = m.warm_bytes()
        m.restore()
        assert sum(m.device_bytes().values()) == estimate
        assert set(m.rs.k_cache) == {2, 4} and set(m.rs.conv_state) == set(CONV_LAYERS)
    finally:
        m.close()


# -- prompt cache --------------------------------------------------------------------------------

def test_prompt_cache_matches_fresh_model(dev, kc, lfm2_path, small_chunks):
    """Repeated, extended and diverging prompts on one model give what a fresh model gives;
    the cache is reused where all of it is a prefix of the new prompt, or up to the states'
    checkpoint CHECKPOINT_BACK tokens before the end of the last prompt."""
    m = Model(dev, kc, lfm2_path, n_ctx=128, name="lfm2-cache")
    try:
        first = list(generate(m, PROMPT, 6))
        t = Timings()
        assert list(generate(m, PROMPT, 6, timings=t)) == first
        # the cache ran past the prompt: the checkpoint
        assert t.cached_tokens == len(PROMPT) - model_mod.CHECKPOINT_BACK
        extended = PROMPT + first + [11, 19]
        t = Timings()
        got_ext = list(generate(m, extended, 6, timings=t))
        # all of the cache where a decode step gives a token a prompt's bits (lavapipe);
        # else the answer's tokens are computed again, from the checkpoint (Model.reusable)
        assert t.cached_tokens == (len(PROMPT) + 5 if m.paths.steps_match_prompts
                                   else len(PROMPT) - model_mod.CHECKPOINT_BACK)
        diverging = PROMPT[:9] + [1, 2, 3]
        t = Timings()
        got_div = list(generate(m, diverging, 6, timings=t))
        assert t.cached_tokens == 0
    finally:
        m.close()
    for prompt, got in ((PROMPT, first), (extended, got_ext), (diverging, got_div)):
        fresh = Model(dev, kc, lfm2_path, n_ctx=128, name="lfm2-fresh")
        try:
            assert list(generate(fresh, prompt, 6)) == got
        finally:
            fresh.close()
