"""Embeddings: the GPU's final-normed hidden states against the numpy reference forward
(tests/helpers/reference.py), pooling, a batch against its inputs one by one, and the prompt
cache after an embedding."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.helpers.reference import ReferenceModel
from engine.formats.gguf_file import GGUFFile
from engine.residency import embed
from engine.residency.loop import generate
from engine.residency.model import Model
from engine.text.tokenizer import Tokenizer

pytestmark = pytest.mark.gpu

TEXTS = ["The quick brown fox jumps over the lazy dog.", "Paris is the capital of France.",
         "The quick brown fox jumps over the lazy dog."]


@pytest.fixture(scope="module")
def smollm2(dev, kc, smollm2_path):
    m = Model(dev, kc, smollm2_path, n_ctx=256)
    yield m
    m.close()


@pytest.fixture(scope="module")
def tokenizer(smollm2):
    return Tokenizer.from_gguf(smollm2.gguf)


def reference_hidden(path: str, ids: list[int]) -> np.ndarray:
    """The reference forward's input to the output head: the final-normed hidden states."""
    with GGUFFile(path) as g:
        ref = ReferenceModel(g, n_ctx=64)
        seen = []

        def head(x, *a, **k):
            seen.append(np.array(x, np.float64))
            return np.zeros((x.shape[0], 1), np.float32)
        ref.weights.output = head
        ref.forward(ids, 0)
    return seen[0]


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.sum(a * b, -1) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1))


def f32_hidden(model: Model, ids: list[int]) -> np.ndarray:
    """model.hidden(ids) with f32 products (the matrix units' f16 ones are checked apart)."""
    t = model.tuning
    saved = (t.ggml_numerics, t.coopmat)
    t.ggml_numerics = t.coopmat = False
    model._drop_graphs()
    try:
        return model.hidden(ids).astype(np.float64)
    finally:
        t.ggml_numerics, t.coopmat = saved
        model._drop_graphs()


def test_hidden_states_match_the_reference(smollm2, tokenizer, smollm2_path):
    """In plain f32 on both sides (as test_model.py's logits test: with llama.cpp's activation
    rounding the two part ways chaotically), every token's hidden state, and the pooled
    vectors."""
    ids = tokenizer.encode(TEXTS[0])
    got = f32_hidden(smollm2, ids)
    want = reference_hidden(smollm2_path, ids)
    assert got.shape == want.shape == (len(ids), smollm2.config.n_embd)
    assert np.sum((got - want) ** 2) / np.sum(want ** 2) < 1e-5
    for how, rows in (("mean", want), ("cls", want[:1]), ("last", want[-1:])):
        v = rows.mean(axis=0)
        v /= np.linalg.norm(v)
        e = embed.pool(got, how)
        assert abs(np.linalg.norm(e) - 1) < 1e-5
        assert np.abs(e - v).max() < 1e-3, how


def test_gemma3_hidden_states_match_the_reference(dev, kc, gemma3_path):
    """Gemma 3: its own norms, sliding-window layers and tied head (left out here)."""
    m = Model(dev, kc, gemma3_path, n_ctx=64)
    try:
        ids = Tokenizer.from_gguf(m.gguf).encode(TEXTS[1])
        got = f32_hidden(m, ids)
    finally:
        m.close()
    want = reference_hidden(gemma3_path, ids)
    assert got.shape == want.shape
    assert np.sum((got - want) ** 2) / np.sum(want ** 2) < 1e-5


SYNTH = Path(__file__).resolve().parents[2] / "data" / "synth"
SYNTH_FILES = ["llama-bf16", "gemma2-swa-f16", "gpt-oss-f16", "phi3-longrope-f16",
               "qwen2-yarn-f16", "qwen3-linear-f16", "mistral3-yarn-f16"]


@pytest.fixture(scope="module")
def written(tmp_path_factory) -> dict[str, str]:
    """The hybrid and mixture-of-experts architectures' small random files."""
    from tests.engine.arch.test_lfm2 import write_lfm2
    from tests.engine.arch.test_qwen3moe import write_qwen3moe

    d = tmp_path_factory.mktemp("embed")
    write_qwen3moe(str(d / "qwen3moe.gguf"))
    return {"lfm2": write_lfm2(str(d / "lfm2.gguf")), "qwen3moe": str(d / "qwen3moe.gguf")}


@pytest.mark.parametrize("case", SYNTH_FILES + ["lfm2", "qwen3moe"])
def test_every_architecture_gives_the_references_hidden_states(dev, kc, written, case):
    """Every architecture ends its forward pass in the head block (the model checks), and
    its hidden states are the reference's."""
    path = written.get(case) or str(SYNTH / f"{case}.gguf")
    m = Model(dev, kc, path, n_ctx=64)
    try:
        ids = [(7 * i + 3) % min(m.config.n_vocab, 200) for i in range(9)]
        got = f32_hidden(m, ids)
    finally:
        m.close()
    want = reference_hidden(path, ids)
    assert got.shape == want.shape
    assert np.sum((got - want) ** 2) / np.sum(want ** 2) < 1e-5     # measured: 3e-8..1.5e-7


def test_a_batch_equals_its_inputs_one_by_one(smollm2, tokenizer):
    seqs = [tokenizer.encode(t) for t in TEXTS]
    batch = embed.embed(smollm2, seqs, "mean")
    alone = [embed.embed(smollm2, [s], "mean")[0] for s in reversed(seqs)][::-1]
    # packed or alone, a token's sums are the same but for rounding: bit-close with ggml's
    # numerics, within the f16 inputs' rounding on the matrix units (1e-5 measured on an H200)
    atol = 1e-6 if smollm2.paths.numerics == "ggml" else 1e-4
    for a, b in zip(batch, alone):
        assert np.allclose(a, b, atol=atol)
    assert np.array_equal(batch[0], batch[2])            # identical texts, identical vectors
    assert float(np.dot(batch[0], batch[1])) < 0.999


def test_an_embedding_leaves_a_correct_prompt_cache(smollm2, tokenizer):
    """The embedding's pass writes KV from position 0: the prompt cache must then say so,
    and a generation after it gives what it gives from an empty cache."""
    prompt = tokenizer.encode("Once upon a time")
    smollm2.cache_tokens = []
    fresh = list(generate(smollm2, prompt, 6))
    embed.embed(smollm2, [tokenizer.encode(TEXTS[1])], "last")
    assert smollm2.cache_tokens == tokenizer.encode(TEXTS[1])
    assert list(generate(smollm2, prompt, 6)) == fresh
    # and with the cache holding the prompt's own prefix (a reuse through the embedding's KV)
    embed.embed(smollm2, [prompt[:3]], "mean")
    assert list(generate(smollm2, prompt, 6)) == fresh


def test_long_inputs_run_in_chunks(smollm2, tokenizer):
    """An input longer than a prefill pass is the same whether run in one pass or several."""
    ids = (tokenizer.encode(" ".join(TEXTS)) * 6)[:150]
    smollm2._last_pass = None                  # the first pass is a probe of 4 tokens
    chunked = smollm2.hidden(ids)
    assert np.allclose(chunked[:4], smollm2.hidden(ids[:4]), atol=1e-4)
    whole = smollm2.hidden(ids)
    assert cosines(chunked.astype(np.float64), whole.astype(np.float64)).min() > 0.9999


# -- packed batches: several inputs in one pass ----------------------------------------------

BATCH = ["Hi", "The quick brown fox jumps over the lazy dog.", "Paris is the capital of France.",
         "A", "Embeddings of a batch run as one prefill, each text from position 0, seeing only "
         "its own earlier tokens.", "Paris is the capital of France.", "ok then"]


def packed_against_alone(model: Model, seqs: list[list[int]]) -> None:
    """Every token's hidden state of the packed pass is the one it has run alone, and the
    pass is one."""
    before = model.hidden_passes
    packed = model.hidden_packed(seqs)
    assert model.hidden_passes == before + 1
    for ids, got in zip(seqs, packed):
        alone = model.hidden(ids).astype(np.float64)
        assert got.shape == alone.shape
        assert cosines(got.astype(np.float64), alone).min() >= 0.99999
        # f32 rounding; where prefill takes the matrix units, the packed pass and the input
        # alone are passes of other widths, whose f16 products round apart (measured up to
        # 3e-7 on the H200)
        bound = 1e-5 if model.tuning.fast_prefill else 1e-9
        assert np.sum((got - alone) ** 2) / np.sum(alone ** 2) < bound


@pytest.mark.parametrize("flash", ["off", "on"])
def test_a_packed_pass_equals_each_input_alone(dev, kc, smollm2_path, flash):
    """SmolLM2, per-token attention and the tiled flash path (mask per token)."""
    m = Model(dev, kc, smollm2_path, n_ctx=256, flash_attn=flash)
    try:
        assert m.uses_flash_attn == (flash == "on")
        tok = Tokenizer.from_gguf(m.gguf)
        seqs = [tok.encode(t, add_special=True) for t in BATCH]
        assert len(set(map(len, seqs))) > 3
        packed_against_alone(m, seqs)
    finally:
        m.close()


def test_gemma3_packed_pass_equals_each_input_alone(dev, kc, gemma3_path):
    """Gemma 3: sliding-window and global layers, two rope bases."""
    m = Model(dev, kc, gemma3_path, n_ctx=256)
    try:
        tok = Tokenizer.from_gguf(m.gguf)
        packed_against_alone(m, [tok.encode(t, add_special=True) for t in BATCH])
    finally:
        m.close()


@pytest.mark.parametrize("case", ["gemma2-swa-f16", "gpt-oss-f16", "mistral3-yarn-f16",
                                  "qwen3moe"])
def test_synthetic_packed_pass_equals_each_input_alone(dev, kc, written, case):
    """Small windows that cut through the packed sequences (gemma2-swa), sinks and windows
    (gpt-oss), the attention temperature's positions (mistral3), routed experts grouped
    over the whole pass (qwen3moe)."""
    m = Model(dev, kc, written.get(case) or str(SYNTH / f"{case}.gguf"), n_ctx=128)
    try:
        v = min(m.config.n_vocab, 200)
        seqs = [[(5 * i + 3 * j + 1) % v for j in range(n)] for i, n in
                enumerate([3, 17, 1, 30, 9, 2])]
        packed_against_alone(m, seqs)
    finally:
        m.close()


def test_a_batch_takes_the_passes_it_plans(smollm2, tokenizer):
    """16 texts at a fixed width: as many passes as plan() says (whole inputs in order), the
    vectors those of each text alone; then a chat answers as from an empty cache."""
    texts = [f"{BATCH[i % len(BATCH)]} #{i}" for i in range(16)]
    seqs = [tokenizer.encode(t, add_special=True) for t in texts]
    prompt = tokenizer.encode("Once upon a time")
    smollm2.cache_tokens = []
    fresh = list(generate(smollm2, prompt, 6))
    longest = max(map(len, seqs))
    for width, passes in ((256, 1), (64, None), (longest, None)):
        want = embed.plan([len(s) for s in seqs], width)
        assert [i for p in want for i in p] == list(range(16))
        assert all(sum(len(seqs[i]) for i in p) <= width for p in want)
        if passes is not None:
            assert len(want) == passes
        before = smollm2.hidden_passes
        got = embed.embed(smollm2, seqs, "mean", width=width)
        assert smollm2.hidden_passes - before == len(want)
        alone = [embed.pool(smollm2.hidden(s), "mean") for s in seqs]
        assert min(float(np.dot(a, b)) for a, b in zip(got, alone)) >= 0.99999
    assert smollm2.cache_tokens == seqs[want[-1][0]]
    assert list(generate(smollm2, prompt, 6)) == fresh


def test_recurrent_models_run_a_batch_one_by_one(dev, kc, written):
    m = Model(dev, kc, written["lfm2"], n_ctx=64)
    try:
        seqs = [[3, 5, 7], [9, 11], [13, 2, 4, 6]]
        before = m.hidden_passes
        got = embed.embed(m, seqs, "mean")
        assert m.hidden_passes - before == 3
        with pytest.raises(ValueError):
            m.hidden_packed(seqs)
        for s, g in zip(seqs, got):
            assert float(np.dot(g, embed.pool(m.hidden(s), "mean"))) >= 0.99999
    finally:
        m.close()
