"""Engine errors in words for people, by their code (and a model file's reason), from the
errors the engine really raises."""
from __future__ import annotations

import os

import pytest

from app.errors import BY_CODE, BY_FILE_REASON, describe
from engine.facade import ModelExists
from engine.formats.gguf_file import GGUFFile, ModelFileError
from engine.residency.arbiter import BudgetError, PinnedError
from engine.residency.gamemode import GaveUp
from engine.residency.placement import PlacementError
from tests.helpers.fake_engine import write_gguf


def file_error(path) -> ModelFileError:
    with pytest.raises(ModelFileError) as err:
        GGUFFile(os.fspath(path)).close()
    return err.value


def test_model_files_by_reason(tmp_path):
    good = write_gguf(tmp_path / "good.gguf")
    data = open(good, "rb").read()
    (tmp_path / "text.gguf").write_text("this is not a model\n")
    (tmp_path / "empty.gguf").write_bytes(b"")
    (tmp_path / "cut.gguf").write_bytes(data[:len(data) // 2])
    (tmp_path / "v9.gguf").write_bytes(data[:4] + (9).to_bytes(4, "little") + data[8:])
    (tmp_path / "folder.gguf").mkdir()
    cases = {"text.gguf": "not_gguf", "empty.gguf": "not_gguf", "cut.gguf": "truncated",
             "v9.gguf": "version", "folder.gguf": "directory", "missing.gguf": "not_found"}
    for name, reason in cases.items():
        exc = file_error(tmp_path / name)
        summary, details = describe(exc)
        assert exc.reason == reason, (name, exc)
        assert summary == BY_FILE_REASON[reason], name
        assert details == str(exc) and name in details


def test_missing_parts_and_unknown_architectures(tmp_path):
    from engine import arch

    g = GGUFFile(write_gguf(tmp_path / "odd.gguf", arch="mamba"))
    try:
        with pytest.raises(ModelFileError) as err:
            g.tensor("output.weight")
        assert describe(err.value)[0] == "The file is missing parts a model needs (a damaged " \
                                         "or unusual GGUF file)"
        with pytest.raises(ModelFileError) as err:
            arch.for_file(g)
        assert describe(err.value)[0] == "This model's architecture is not supported yet"
    finally:
        g.close()


@pytest.mark.parametrize("exc, summary", [
    (ModelExists("a model named 'a' is already loaded"),
     "A model with this name is already loaded"),
    (BudgetError("VRAM budget exceeded pinning a"),
     "Not enough VRAM in the budget (unpin a model, or raise the budget in Preferences)"),
    (PlacementError("cpu_moe 2: x (llama) is not a mixture-of-experts model, it has no "
                    "expert tensors"),
     "This model has no experts to keep in RAM (cpu_moe is for mixture-of-experts models)"),
    (GaveUp("another program is using the GPU's memory: 300 MiB of VRAM is free"),
     "Another app is using the GPU's memory: Hotseat gave the GPU up and comes back once it "
     "is free (game mode)"),
])
def test_engine_errors_by_code(exc, summary):
    assert describe(exc) == (summary, str(exc))


def test_errors_without_words_show_the_engine_text():
    # a pinned model's refusal, an unknown name, a file problem of no known kind
    assert describe(PinnedError("a is pinned; unpin it before evicting it")) == \
        ("a is pinned; unpin it before evicting it",) * 2
    assert describe(KeyError("no model named 'x' is loaded")) == \
        ("no model named 'x' is loaded",) * 2
    assert describe(ModelFileError("/m/x.gguf", "something\nelse")) == \
        ("/m/x.gguf: something else",) * 2
    assert describe(RuntimeError("")) == ("RuntimeError",) * 2


def test_every_worded_code_is_an_engine_code():
    """The codes worded here are the ones the engine's (and the bridge's) errors carry."""
    from app.bridge.messages import NoEngine

    carried = {c.code for c in (ModelExists, BudgetError, PlacementError, NoEngine, GaveUp)}
    assert set(BY_CODE) == carried
