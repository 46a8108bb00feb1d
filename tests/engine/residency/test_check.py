"""`check_file` (engine/residency/check.py): whether a GGUF will run, before any load.

Its figures are checked against what gguf-py's own reader says of the file, against sizes
worked out here from the file's keys, and on lavapipe against what a real load reports;
its refusals on files written here with gguf-py (an architecture no module reads, a tensor
type no kernel takes, missing and misshapen tensors) and on the synthetic models of
tests/data/synth, whichever of their architectures are registered now.
"""
from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from engine.arch import ARCHITECTURES
from engine.formats.gguf_file import ModelFileError
from engine.residency.check import Target, check_file
from shaders.registry import WEIGHT_TYPES
from tests.helpers.tiny_gguf import add_spm_vocab

SYNTH = Path(__file__).resolve().parents[2] / "data" / "synth"

N_EMBD, N_FF, N_HEAD, N_HEAD_KV, HEAD_DIM, N_LAYER, N_VOCAB = 256, 256, 4, 2, 64, 2, 320
N_CTX_TRAIN = 4096


def write_model(path, arch: str = "llama", matrix_type: str = "F16", drop: str = "",
                misshape: str = "", extra: dict[str, str] | None = None) -> dict[str, str]:
    """A 2-layer llama-shaped model (an SPM tokenizer of byte tokens) under the name `arch`,
    its matrices in matrix_type (random bytes where gguf-py cannot quantize to it), without
    tensor `drop`, with `misshape` one row short, and `extra` tensors (name -> type) no
    llama reads. The type of every tensor written, by name."""
    import gguf
    from gguf.quants import quantize

    rng = np.random.default_rng(7)
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name(f"check test {arch}")
    w.add_context_length(N_CTX_TRAIN)
    w.add_embedding_length(N_EMBD)
    w.add_block_count(N_LAYER)
    w.add_feed_forward_length(N_FF)
    w.add_head_count(N_HEAD)
    w.add_head_count_kv(N_HEAD_KV)
    w.add_layer_norm_rms_eps(1e-5)
    add_spm_vocab(w, N_VOCAB)
    written: dict[str, str] = {}

    def mat(name: str, rows: int, cols: int, type_name: str = matrix_type) -> None:
        if name == drop:
            return
        rows -= name == misshape
        qt = gguf.GGMLQuantizationType[type_name]
        data = (rng.standard_normal((rows, cols)) / np.sqrt(cols)).astype(np.float32)
        if type_name == "F16":
            w.add_tensor(name, data.astype(np.float16))
        else:
            try:
                raw = quantize(data, qt)
            except NotImplementedError:          # IQ1_S and such: any bytes do here
                block, nbytes = gguf.GGML_QUANT_SIZES[qt]
                raw = rng.integers(0, 256, (rows, cols // block * nbytes), dtype=np.uint8)
            w.add_tensor(name, raw, raw_dtype=qt)
        written[name] = type_name

    def norm(name: str) -> None:
        if name != drop:
            w.add_tensor(name, np.ones(N_EMBD, np.float32))
            written[name] = "F32"

    mat("token_embd.weight", N_VOCAB, N_EMBD)
    norm("output_norm.weight")
    mat("output.weight", N_VOCAB, N_EMBD)
    q, kv = N_HEAD * HEAD_DIM, N_HEAD_KV * HEAD_DIM
    for i in range(N_LAYER):
        p = f"blk.{i}."
        norm(p + "attn_norm.weight")
        mat(p + "attn_q.weight", q, N_EMBD)
        mat(p + "attn_k.weight", kv, N_EMBD)
        mat(p + "attn_v.weight", kv, N_EMBD)
        mat(p + "attn_output.weight", N_EMBD, q)
        norm(p + "ffn_norm.weight")
        mat(p + "ffn_gate.weight", N_FF, N_EMBD)
        mat(p + "ffn_up.weight", N_FF, N_EMBD)
        mat(p + "ffn_down.weight", N_EMBD, N_FF)
    for name, type_name in (extra or {}).items():
        mat(name, 4, 256, type_name)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return written


def padded(n: int, align: int = 256) -> int:
    return -(-n // align) * align


def kv_bytes(n_layer: int, n_ctx: int, n_head_kv: int, head_dim: int) -> int:
    """An f16 K and V row of n_head_kv * head_dim per position and layer."""
    return 2 * n_layer * n_ctx * n_head_kv * head_dim * 2


def reader_facts(path: str) -> tuple[Counter, dict, dict]:
    """gguf-py's own reading of the file: tensor types by count, tensor bytes by name, and
    the scalar metadata."""
    import gguf

    r = gguf.GGUFReader(path)
    types = Counter(t.tensor_type.name for t in r.tensors)
    sizes = {t.name: int(t.n_bytes) for t in r.tensors}
    keys = {}
    for f in r.fields.values():
        if len(f.types) == 1 and f.types[0] != gguf.GGUFValueType.STRING:
            keys[f.name] = f.contents()
    return types, sizes, keys


# -- a file that will run ----------------------------------------------------------------------

def test_smollm2_will_run_and_says_what_it_takes(smollm2_path):
    r = check_file(smollm2_path, 2048)
    assert r["runs"] and r["problems"] == [], r["problems"]
    types, sizes, keys = reader_facts(smollm2_path)
    assert r["architecture"] == "llama"
    assert r["weight_types"] == dict(types)
    assert r["context"] == {"trained": keys["llama.context_length"], "n_ctx": 2048}
    # every tensor is read (tied output) and packed at 256-byte alignment, none split at a
    # typical GPU's buffer range
    assert r["vram"]["weights_bytes"] == sum(padded(n) for n in sizes.values())
    n_kv = keys["llama.attention.head_count_kv"]
    head_dim = keys["llama.embedding_length"] // keys["llama.attention.head_count"]
    assert r["vram"]["kv_bytes"] == kv_bytes(keys["llama.block_count"], 2048, n_kv, head_dim)
    assert 0 < r["vram"]["compute_bytes"] < r["vram"]["kv_bytes"]
    assert r["vram"]["total_bytes"] == sum(r["vram"][k] for k in
                                           ("weights_bytes", "kv_bytes", "recurrent_bytes",
                                            "compute_bytes"))
    assert r["ram"] == {"weights_bytes": r["vram"]["weights_bytes"],
                        "kv_full_context_bytes": r["vram"]["kv_bytes"], "recurrent_bytes": 0,
                        "upper_bound_bytes": r["vram"]["weights_bytes"] + r["vram"]["kv_bytes"]}
    # the KV cache follows the context asked for; the weights do not
    r512 = check_file(smollm2_path, 512)
    assert r512["vram"]["kv_bytes"] * 4 == r["vram"]["kv_bytes"]
    assert r512["vram"]["weights_bytes"] == r["vram"]["weights_bytes"]
    assert r512["context"]["n_ctx"] == 512
    json.dumps(r)                                    # what --json prints


def test_a_small_buffer_range_splits_tensors_into_more_padded_parts(smollm2_path):
    """lavapipe's 128 MiB storage range splits nothing of SmolLM2; a 1 MiB range splits its
    embedding by rows, and each part is padded on its own."""
    typical = check_file(smollm2_path, 2048)["vram"]["weights_bytes"]
    small = Target("small", 256, 1 << 20, Target.typical().tuning)
    split = check_file(smollm2_path, 2048, small)["vram"]["weights_bytes"]
    assert split > typical
    _, sizes, _ = reader_facts(smollm2_path)
    assert split - typical < 256 * sum(-(-n // (1 << 20)) for n in sizes.values())


def test_a_file_of_our_own_writing_will_run(tmp_path):
    path = tmp_path / "tiny.gguf"
    written = write_model(path)
    r = check_file(str(path), 512)
    assert r["runs"], r["problems"]
    assert r["weight_types"] == dict(Counter(written.values()))
    _, sizes, _ = reader_facts(str(path))
    assert r["vram"]["weights_bytes"] == sum(padded(n) for n in sizes.values())
    assert r["vram"]["kv_bytes"] == kv_bytes(N_LAYER, 512, N_HEAD_KV, HEAD_DIM)
    assert r["context"] == {"trained": N_CTX_TRAIN, "n_ctx": 512}


# -- files that will not run -------------------------------------------------------------------

def test_an_unknown_architecture_and_type_are_both_named(tmp_path):
    path = tmp_path / "ds.gguf"
    written = write_model(path, arch="deepseek2", matrix_type="IQ1_S")
    n = sum(t == "IQ1_S" for t in written.values())
    r = check_file(str(path), 2048)
    assert not r["runs"]
    assert r["problems"][0].startswith("architecture deepseek2 is not supported (supported: ")
    assert all(a in r["problems"][0] for a in ARCHITECTURES)
    assert r["problems"][1:] == [f"tensor type IQ1_S in {n} tensors"]
    assert r["unsupported_types"] == {"IQ1_S": n}
    assert r["vram"] is None and r["ram"] is None
    assert r["context"]["trained"] == N_CTX_TRAIN


def test_an_unsupported_type_in_a_registered_architecture(tmp_path):
    path = tmp_path / "tq.gguf"
    written = write_model(path, matrix_type="TQ1_0")
    n = sum(t == "TQ1_0" for t in written.values())
    r = check_file(str(path), 2048)
    assert not r["runs"]
    assert r["problems"] == [f"tensor type TQ1_0 in {n} tensors"]


def test_an_unsupported_type_the_model_does_not_read_is_only_noted(tmp_path):
    path = tmp_path / "extra.gguf"
    write_model(path, extra={"mtp.0.weight": "IQ1_S"})
    r = check_file(str(path), 2048)
    assert r["runs"], r["problems"]
    assert r["weight_types"]["IQ1_S"] == 1
    assert r["notes"] == ["tensor type IQ1_S in 1 tensor the model does not read"]


def test_missing_and_misshapen_tensors_are_all_listed(tmp_path):
    path = tmp_path / "broken.gguf"
    write_model(path, drop="blk.1.ffn_up.weight", misshape="blk.0.attn_k.weight",
                matrix_type="IQ1_S")
    r = check_file(str(path), 2048)
    assert not r["runs"]
    assert r["missing_tensors"] == ["blk.1.ffn_up.weight"]
    kv = N_HEAD_KV * HEAD_DIM
    assert r["wrong_shapes"] == {"blk.0.attn_k.weight": {"shape": [N_EMBD, kv - 1],
                                                         "expected": [N_EMBD, kv]}}
    assert len(r["problems"]) == 3, r["problems"]
    assert r["problems"][0].startswith("tensor type IQ1_S in ")
    assert r["problems"][1] == "missing 1 tensor: blk.1.ffn_up.weight"
    assert r["problems"][2].startswith("1 tensor of the wrong shape: blk.0.attn_k.weight")
    assert r["vram"] is None


def test_context_out_of_range_and_past_training(tmp_path):
    path = tmp_path / "tiny.gguf"
    write_model(path)
    r = check_file(str(path), 8)
    assert not r["runs"] and r["problems"] == ["context size 8 out of range (16 to 1048576)"]
    r = check_file(str(path), 2 * N_CTX_TRAIN)
    assert r["runs"]
    assert r["notes"] == [f"the context {2 * N_CTX_TRAIN} is longer than the {N_CTX_TRAIN} "
                          "it was trained on"]


def test_over_the_budget_will_not_run(smollm2_path):
    need = check_file(smollm2_path, 2048)["vram"]["total_bytes"]
    t = Target.typical()
    tight = Target(t.name, t.storage_align, t.max_storage_range, t.tuning, need - 1)
    r = check_file(smollm2_path, 2048, tight)
    assert not r["runs"]
    assert len(r["problems"]) == 1 and "more than the budget" in r["problems"][0]
    assert check_file(smollm2_path, 2048, Target(t.name, t.storage_align, t.max_storage_range,
                                                 t.tuning, need))["runs"]


def _synth_cases() -> list[dict]:
    index = json.loads((SYNTH / "index.json").read_text())
    seen: dict[str, dict] = {}
    for case in index["cases"]:
        seen.setdefault(case["model_file"], case)
    return list(seen.values())


@pytest.mark.parametrize("case", _synth_cases(), ids=lambda c: c["model_file"])
def test_the_synthetic_models(case):
    """Those of registered architectures run; the others name their architecture. The type
    counts are the ones the file's maker recorded."""
    path = SYNTH / case["model_file"]
    r = check_file(str(path), case["n_ctx"])
    assert r["weight_types"] == case["weight_types"]
    arch = r["architecture"]
    if arch not in ARCHITECTURES:
        assert not r["runs"] and r["vram"] is None
        assert r["problems"][0].startswith(f"architecture {arch} is not supported")
        return
    if not set(case["weight_types"]) <= set(WEIGHT_TYPES):
        assert not r["runs"]
        return
    assert r["runs"], r["problems"]
    _, sizes, _ = reader_facts(str(path))
    assert 0 < r["vram"]["weights_bytes"] <= sum(padded(n) for n in sizes.values())
    assert r["vram"]["total_bytes"] == sum(r["vram"][k] for k in
                                           ("weights_bytes", "kv_bytes", "recurrent_bytes",
                                            "compute_bytes"))
    assert r["vram"]["kv_bytes"] > 0 and r["vram"]["compute_bytes"] > 0


# -- files that are not models -----------------------------------------------------------------

def test_garbage_and_truncated_files_raise_as_a_load_does(tmp_path, smollm2_path):
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"not a model at all\n" * 10)
    with pytest.raises(ModelFileError) as e:
        check_file(str(junk), 2048)
    assert e.value.reason == "not_gguf"
    cut = tmp_path / "cut.gguf"
    with open(smollm2_path, "rb") as f:
        cut.write_bytes(f.read(1 << 20))
    with pytest.raises(ModelFileError) as e:
        check_file(str(cut), 2048)
    assert e.value.reason == "truncated"
    with pytest.raises(ModelFileError) as e:
        check_file(str(tmp_path / "absent.gguf"), 2048)
    assert e.value.reason == "not_found"


# -- against a real load (lavapipe) ------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("model", ["smollm2", "gemma3"])
def test_the_figures_are_what_a_real_load_reports(request, model):
    """Gemma 3 adds sliding-window layers and a second rope table to the run state."""
    from engine.api import Engine

    path = request.getfixturevalue(f"{model}_path")
    with Engine() as eng:
        before = eng.check(path)
        small = eng.check(path, n_ctx=512)
        assert before["runs"] and before["device"]["measured"]
        assert before["device"]["budget_bytes"] == eng.vram()["budget_bytes"]
        eng.load(path, name="a")
        eng.load(path, name="b", n_ctx=512)
        st = {s["name"]: s for s in eng.status()}
        for name, r in (("a", before), ("b", small)):
            assert r["vram"]["total_bytes"] == st[name]["warm_bytes"]
            assert r["vram"]["total_bytes"] == sum(st[name]["device_bytes"].values())
            assert r["vram"]["kv_bytes"] == st[name]["device_bytes"]["kv"]
            assert r["ram"]["weights_bytes"] == st[name]["host_shadow_bytes"]
        # tiled prompt attention adds its masks to the run state: the check follows the
        # engine's setting
        eng.set_flash_attn("on")
        flash = eng.check(path)
        eng.warm("a")
        st = {s["name"]: s for s in eng.status()}
        assert flash["vram"]["total_bytes"] == st["a"]["warm_bytes"] \
            > before["vram"]["total_bytes"]
