"""engine/arch/qwen35.py's Config for qwen3next, qwen35 and qwen35moe: what it reads from the
synthetic files llama.cpp ran (tests/data/synth), the tensors it expects there, the state
sizes, and keys missing or wrong named in the error."""
from __future__ import annotations

import numpy as np
import pytest

from engine.arch import ARCHITECTURES, config, for_file, qwen35
from engine.formats.gguf_file import GGUFFile, ModelFileError
from tests.helpers import synth_reference as sr

FILES = ["qwen3next-f16", "qwen35-f16", "qwen35moe-f16", "qwen35-q8_0"]


def _config(stem: str) -> qwen35.Config:
    with GGUFFile(sr.DATA / f"{stem}.gguf") as g:
        c = qwen35.Config.from_gguf(g)
        c.validate(g.path)
        return c


@pytest.mark.parametrize("stem", FILES)
def test_the_tensors_expected_are_the_files_trunk(stem):
    """Every tensor the Config expects is in the file with that shape, and every tensor of
    the file outside the MTP block (after the trunk, not run) is expected."""
    with GGUFFile(sr.DATA / f"{stem}.gguf") as g:
        c = qwen35.Config.from_gguf(g)
        shapes = c.tensor_shapes()
        trunk = {n: t.shape for n, t in g.tensors.items()
                 if not n.startswith(f"blk.{c.n_layer}.")}
        assert shapes == trunk
        for name, allowed in c.tensor_types().items():
            assert g.tensors[name].type_name in allowed


def test_qwen3next():
    c = _config("qwen3next-f16")
    assert c.layer_kinds() == ("delta", "attention", "delta", "attention")
    assert (c.kv_layers, c.delta_layers, c.n_layer_nextn) == ((1, 3), (0, 2), 0)
    assert (c.n_k_heads, c.n_v_heads, c.ssm_d_state, c.head_v_dim, c.conv_kernel) == \
        (2, 4, 32, 32, 4)
    assert c.conv_channels == 2 * 64 + 128 and c.key_dim == 64
    assert [c.k_head(h) for h in range(4)] == [0, 0, 1, 1]              # grouped
    assert (c.n_expert, c.n_expert_used, c.n_ff, c.n_ff_shexp) == (4, 2, 64, 64)
    assert (c.head_dim, c.rope_dims, c.rope_sections) == (64, 16, ())
    assert c.rope_positions() == (True,) * 8
    assert c.expert_tensors(0) == [f"blk.0.{n}.weight" for n in config.EXPERT_TENSORS]
    # the shared expert's gate as conversions store it, [n_embd, 1]; 1-D in qwen35moe-f16
    assert c.shexp_gate_2d and c.tensor_shapes()["blk.0.ffn_gate_inp_shexp.weight"] == (128, 1)
    assert not _config("qwen35moe-f16").shexp_gate_2d


def test_qwen35_dense_with_an_mtp_block():
    c = _config("qwen35-f16")
    assert (c.n_layer, c.n_layer_nextn) == (4, 1)
    assert c.layer_kinds() == ("delta",) * 3 + ("attention",)
    assert [c.k_head(h) for h in range(4)] == [0, 1, 0, 1]              # tiled
    assert (c.moe, c.n_ff, c.rope_sections) == (False, 192, (3, 3, 2, 0))
    assert c.rope_positions() == (True,) * 8
    assert c.expert_tensors(0) == []


def test_qwen35moe_layers_from_the_list():
    c = _config("qwen35moe-f16")
    assert (c.kv_layers, c.delta_layers) == ((1,), (0, 2, 3))
    assert (c.n_expert, c.n_expert_used, c.n_ff, c.n_ff_shexp) == (4, 2, 64, 64)


def test_state_sizes():
    """Per delta-net layer: (conv_kernel - 1) x conv channels of conv inputs and a d x d
    matrix per value head, f32; KV of the attention layers at f16."""
    c = _config("qwen35moe-f16")
    assert c.conv_state_bytes() == 4 * 3 * 256
    assert c.delta_state_bytes() == 4 * 4 * 32 * 32
    assert c.recurrent_bytes() == 3 * (4 * 3 * 256 + 4 * 4 * 32 * 32)
    assert c.kv_bytes(1000) == 2 * 2 * 1000 * 1 * 64 * 1


def test_registered_runnable():
    """All three names load through engine/arch as this module (the GPU forward is
    tests/engine/arch/test_synth_hybrid.py's)."""
    for name in ("qwen3next-f16", "qwen35-f16", "qwen35moe-f16"):
        with GGUFFile(sr.DATA / f"{name}.gguf") as g:
            assert for_file(g) is qwen35 and ARCHITECTURES[g.arch] is qwen35


def test_rope_pairs_on_the_extra_position():
    c = _config("qwen35-f16")
    odd = qwen35.Config(**{**c.__dict__, "rope_sections": (3, 3, 1, 1)})
    assert odd.rope_positions() == (True,) * 5 + (False,) + (True,) * 2
    # the GPU forward turns every pair: such a file is refused, Qwen3.5's layout is not
    assert any("leave some rotated pairs unturned" in p for p in odd.problems())
    assert c.problems() == []


# -- keys missing or wrong ---------------------------------------------------------------------

def _keys(arch: str) -> dict:
    k = {"block_count": 4, "embedding_length": 128, "context_length": 4096,
         "attention.head_count": 2, "attention.head_count_kv": 1, "attention.key_length": 64,
         "attention.value_length": 64, "rope.dimension_count": 16,
         "attention.layer_norm_rms_epsilon": 1e-6, "vocab_size": 400, "ssm.conv_kernel": 4,
         "ssm.state_size": 32, "ssm.group_count": 2, "ssm.time_step_rank": 4,
         "ssm.inner_size": 128, "full_attention_interval": 4}
    if arch == "qwen35":
        k["feed_forward_length"] = 192
    else:
        k.update({"expert_count": 4, "expert_used_count": 2, "expert_feed_forward_length": 64,
                  "expert_shared_feed_forward_length": 64})
    if arch != "qwen3next":
        k["rope.dimension_sections"] = [3, 3, 2, 0]
    return k


def _write(path, arch: str = "qwen35", drop: tuple = (), tensors: tuple = (), **over) -> str:
    """A header-only file of the architecture (and one tiny tensor): the keys of _keys with
    `drop` left out and `over` (dots as double underscores) replaced."""
    import gguf

    keys = {**_keys(arch), **{k.replace("__", "."): v for k, v in over.items()}}
    w = gguf.GGUFWriter(str(path), arch)
    for k, v in keys.items():
        if k in drop:
            continue
        name = f"{arch}.{k}"
        if isinstance(v, list):
            w.add_array(name, v)
        elif isinstance(v, float):
            w.add_float32(name, v)
        else:
            w.add_uint32(name, v)
    w.add_tensor("token_embd.weight", np.zeros((400, 128), np.float32))
    for t in tensors:
        w.add_tensor(t, np.zeros(128, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return str(path)


def _problem(path: str) -> str:
    with GGUFFile(path) as g:
        with pytest.raises(ModelFileError) as e:
            qwen35.Config.from_gguf(g).validate(g.path)
    return e.value.problem


def test_a_written_header_reads(tmp_path):
    for arch in qwen35.ARCHS:
        with GGUFFile(_write(tmp_path / f"{arch}.gguf", arch)) as g:
            c = qwen35.Config.from_gguf(g)
            c.validate(g.path)
            assert c.arch == arch and c.delta_layers == (0, 1, 2)


@pytest.mark.parametrize("arch,key", [
    ("qwen35", "ssm.conv_kernel"), ("qwen35", "ssm.inner_size"), ("qwen35", "ssm.state_size"),
    ("qwen35", "ssm.time_step_rank"), ("qwen35", "ssm.group_count"),
    ("qwen35", "rope.dimension_sections"), ("qwen35", "feed_forward_length"),
    ("qwen35", "attention.layer_norm_rms_epsilon"), ("qwen35moe", "expert_used_count"),
    ("qwen35moe", "expert_count"), ("qwen3next", "expert_feed_forward_length"),
])
def test_a_missing_key_is_named(tmp_path, arch, key):
    assert _problem(_write(tmp_path / "m.gguf", arch, drop=(key,))) == \
        f"missing metadata key '{arch}.{key}'"


@pytest.mark.parametrize("arch,over,named", [
    ("qwen35", {"ssm__time_step_rank": 3}, "ssm.time_step_rank 3 (value heads) is not a "
                                           "multiple of ssm.group_count 2"),
    ("qwen35", {"ssm__inner_size": 96}, "ssm.inner_size 96 is not ssm.time_step_rank 4 heads"),
    ("qwen35", {"ssm__conv_kernel": 1}, "ssm.conv_kernel 1"),
    ("qwen35", {"rope__dimension_count": 80}, "rope.dimension_count 80 (head dim 64)"),
    ("qwen35", {"rope__dimension_sections": [0, 0, 0, 0]}, "rope.dimension_sections [0, 0, 0"),
    ("qwen35moe", {"expert_used_count": 5}, "expert_used_count 5"),
    ("qwen35moe", {"expert_shared_feed_forward_length": 0},
     "expert_shared_feed_forward_length 0"),
    ("qwen3next", {"nextn_predict_layers": 4}, "nextn_predict_layers 4 leaves no trunk"),
])
def test_a_wrong_value_is_named(tmp_path, arch, over, named):
    assert named in _problem(_write(tmp_path / "w.gguf", arch, **over))


def test_a_short_layer_list_is_named(tmp_path):
    path = _write(tmp_path / "l.gguf", "qwen35moe",
                  attention__recurrent_layers=[True, False])
    assert "qwen35moe.attention.recurrent_layers must list 4 layers" in _problem(path)


def test_an_old_fused_ssm_in_is_named(tmp_path):
    path = _write(tmp_path / "s.gguf", "qwen3next", tensors=("blk.0.ssm_in.weight",))
    assert "fused ssm_in" in _problem(path)


# -- tests/tools/make_bench_model.py's hybrid shapes -------------------------------------------

@pytest.mark.parametrize("arch", ["qwen35", "qwen35moe"])
def test_bench_model_tiny_shapes_have_every_tensor(tmp_path, arch):
    """The bench writer's tiny shapes (the real ones differ only in sizes): every tensor the
    Config expects, of its shape, in Q4_K_M's types; hotseat check sizes the file."""
    import pickle
    import sys
    from argparse import Namespace
    from pathlib import Path

    from engine.residency.check import check_file

    root = Path(__file__).resolve().parents[3]
    tok = root.parent / "shared" / "tools" / "smollm2_tokenizer.pkl"
    if not tok.exists():
        pytest.skip(f"{tok} missing")
    sys.path.insert(0, str(root / "tests" / "tools"))
    import make_bench_model as mb

    out = tmp_path / f"{arch}.gguf"
    with open(tok, "rb") as f:
        mb.write_hybrid(Namespace(arch=arch, shape="tiny", ctx=4096, out=str(out)),
                        pickle.load(f))
    r = check_file(str(out), 4096)
    assert r["problems"] == [] and r["runs"]
    assert set(r["weight_types"]) == {"Q4_K", "Q6_K", "F32"}
    with GGUFFile(str(out)) as g:
        assert set(g.tensors) == set(qwen35.Config.from_gguf(g).tensor_shapes())
        assert g.tensors["token_embd.weight"].type_name == "Q4_K"
        # the 4B ties its output to the embedding; the 35B-A3B has a Q6_K one
        assert ("output.weight" in g.tensors) == (arch == "qwen35moe")
        # llama.cpp's use_more_bits of 4 layers: 2 and 3 (attn_qkv or attn_v, ffn_down*)
        types = {n: g.tensors[f"blk.{n}"].type_name for n in
                 ("0.attn_qkv.weight", "2.attn_qkv.weight", "3.attn_v.weight",
                  "1.attn_gate.weight", "3.attn_k.weight")}
        assert types == {"0.attn_qkv.weight": "Q4_K", "2.attn_qkv.weight": "Q6_K",
                         "3.attn_v.weight": "Q6_K", "1.attn_gate.weight": "Q4_K",
                         "3.attn_k.weight": "Q4_K"}
