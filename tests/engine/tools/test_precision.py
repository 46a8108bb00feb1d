"""hotseat precision: the step rule and the gap figure on crafted logits, and the check
itself on SmolLM2 against llama.cpp's stored answers."""
from __future__ import annotations

import json

import numpy as np
import pytest

from engine.tools import precision


def test_a_step_agrees_on_the_same_id_or_a_near_tie():
    logits = np.array([0.0, 5.0, 4.9, 3.0])
    assert precision.step_verdict(logits, 1) == ("same", 0.0)
    verdict, gap = precision.step_verdict(logits, 2)
    assert verdict == "tie" and gap == pytest.approx(0.1)
    verdict, gap = precision.step_verdict(logits, 3)
    assert verdict == "differs" and gap == pytest.approx(2.0)


def test_top20_log_probabilities_are_compared_as_such():
    case = {"name": "t", "prompt_ids": [1, 2], "greedy_ids": [3],
            "last_logits_top10": [[3, 9.0]], "last_logprobs_top20": [[3, -0.5], [5, -1.5]]}
    logits = np.log(np.array([0.1, 0.1, 0.1, 0.4, 0.1, 0.2]))     # log-probabilities already
    row = precision.check_case(lambda ids, pos: logits + 7.0, case, 0)
    assert row["gap_distance"] == pytest.approx(max(abs(np.log(0.4) + 0.5),
                                                    abs(np.log(0.2) + 1.5)))


def test_gap_distance_ignores_a_shift_of_all_logits():
    """Older data (top-10 logits): log-probability differences, so adding a constant (the
    normaliser) changes nothing."""
    case = {"name": "t", "prompt_ids": [1, 2], "greedy_ids": [3],
            "last_logits_top10": [[3, 9.0], [5, 7.5], [0, 7.0]]}
    logits = np.zeros(8)
    logits[[3, 5, 0]] = [109.0, 107.5, 106.75]      # +100, one gap off by 0.25
    row = precision.check_case(lambda ids, pos: logits, case, 0)
    assert row["steps"] == 1 and row["same"] == 1 and not row["differs"]
    assert row["gap_distance"] == pytest.approx(0.25)


@pytest.mark.gpu
def test_smollm2_agrees_with_llamacpp_on_its_first_prompts(dev, kc, smollm2_path):
    with open(f"{precision.DATA}/llamacpp_smollm2.json") as f:
        data = json.load(f)
    report = precision.check_model(dev, kc, smollm2_path, data, steps=4, prompts=2,
                                   server=None)
    rows = report["cases"]
    assert [r["name"] for r in rows] == [c["name"] for c in data["cases"][:2]]
    for r in rows:
        assert r["steps"] == 4 and r["same"] + r["ties"] == 4 and not r["differs"]
        # llama.cpp's CPU build rounds activations its own way: logits differ by tenths
        assert 0.0 < r["gap_distance"] < 1.0
    assert report["ok"] and report["peer_gap_distance"] is None


@pytest.mark.gpu
def test_the_int8_decode_path_keeps_smollm2s_greedy_steps(dev, kc, smollm2_path):
    """A GPU's decode path (int8 activations where the weight type has a reader, as on the
    H200): the prompts whose teacher-forced steps moved when the output product rounded x
    to int8 while the Q4_1 layers keep it f32 (four steps past the tie rule among them;
    one, short's fourth, on f32 x) agree with llama.cpp at every step but that one."""
    from engine.residency.model import Model

    if not dev.dot4:
        pytest.skip("no VK_KHR_shader_integer_dot_product")
    with open(f"{precision.DATA}/llamacpp_smollm2.json") as f:
        data = json.load(f)["cases"]
    cases: dict = {}
    for c in data:                        # the first of each name (two prompts share some)
        cases.setdefault(c["name"], c)
    m = Model(dev, kc, smollm2_path, n_ctx=precision.context_for(data), name="int8-precision")
    try:
        m.tuning.matvec, m.tuning.ggml_numerics = True, False
        assert m.paths.decode_matmul == "mul_mat_vecq"
        rows = [precision.check_case(lambda ids, pos: m.eval(ids, pos, greedy=False),
                                     cases[name], 0) for name in ("short", "long", "unicode")]
    finally:
        m.close()
    assert [r["steps"] for r in rows] == [64, 64, 64]
    assert [[i for i, _ in r["differs"]] for r in rows] == [[4], [], []]


def test_a_file_without_stored_answers_is_refused_clearly():
    with pytest.raises(ValueError, match="pass --data"):
        precision._data_for("/models/other.gguf", None)


def test_the_reference_data_ships_with_the_package():
    """`hotseat precision` reads llama.cpp's answers from inside the engine package (an
    installed one has no tests/), declared as package data."""
    import fnmatch
    import tomllib
    from pathlib import Path

    root = Path(__file__).parents[3]
    data = Path(precision.DATA).resolve()
    assert data.is_relative_to(root / "engine")
    files = sorted(p.name for p in data.glob("llamacpp_*.json"))
    assert files == ["llamacpp_gemma3.json", "llamacpp_smollm2.json"]
    globs = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"][
        "package-data"]["engine.tools"]
    rel = [str((data / f).relative_to(root / "engine" / "tools")) for f in files]
    assert all(any(fnmatch.fnmatch(r, g) for g in globs) for r in rel)
