"""Quantization and size of a model file, as the window shows them."""
from __future__ import annotations

from app import modelinfo
from tests.helpers.fake_engine import write_gguf


def test_file_type_names_the_quant(tmp_path):
    p = write_gguf(tmp_path / "q.gguf", file_type=15)           # MOSTLY_Q4_K_M
    assert modelinfo.describe(p)["quant"] == "Q4_K_M"
    p = write_gguf(tmp_path / "f.gguf", file_type=0, tensor_type="F32")    # ALL_F32
    assert modelinfo.describe(p)["quant"] == "F32"


def test_without_file_type_the_dominant_tensor_type(tmp_path):
    p = write_gguf(tmp_path / "d.gguf", file_type=None, tensor_type="Q4_0")
    info = modelinfo.describe(p)
    assert info["quant"] == "Q4_0" and info["file_bytes"] == (tmp_path / "d.gguf").stat().st_size


def test_unreadable_files(tmp_path):
    assert modelinfo.describe(str(tmp_path / "none.gguf")) == {"quant": "?", "file_bytes": 0}
    p = tmp_path / "t.gguf"
    p.write_text("text")
    assert modelinfo.describe(str(p)) == {"quant": "?", "file_bytes": 4}


def test_quant_name_fallbacks():
    assert modelinfo.quant_name(None, {"Q8_0": 10, "F32": 50}) == "F32"
    assert modelinfo.quant_name(9999, {"Q6_K": 1}) == "Q6_K"
    assert modelinfo.quant_name(None, {}) == "?"
