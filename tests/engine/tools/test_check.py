"""`hotseat check FILE` over a real subprocess: the report, --json, the exit status (0 runs,
2 won't), one line on stderr for a file that is not a GGUF."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from engine.residency.check import Target, check_file
from tests.conftest import ROOT
from tests.engine.residency.test_check import write_model


def hotseat(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.pop("HOTSEAT_FLASH_ATTN", None)
    return subprocess.run([sys.executable, "-m", "engine.cli", "check", *args],
                          capture_output=True, text=True, timeout=120, cwd=ROOT, env=env)


def one_line_error(r: subprocess.CompletedProcess, *words: str) -> str:
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("hotseat: error: ")
    for w in words:
        assert w in lines[0], lines[0]
    return lines[0]


@pytest.mark.gpu
def test_json_is_the_devices_check(smollm2_path, dev):
    r = hotseat(smollm2_path, "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    from engine.api import default_budget

    want = check_file(smollm2_path, 2048, Target.of_device(dev, "auto", default_budget(dev)))
    assert out == json.loads(json.dumps(want))
    assert out["runs"] is True and out["problems"] == []
    assert out["device"]["measured"] is True and out["device"]["name"] == dev.name
    assert set(out) >= {"path", "architecture", "weight_types", "context", "vram", "ram",
                        "problems", "notes", "runs"}
    assert set(out["vram"]) == {"weights_bytes", "kv_bytes", "recurrent_bytes", "compute_bytes",
                                "total_bytes"}


def test_no_device_and_ctx(smollm2_path):
    r = hotseat(smollm2_path, "--json", "--no-device", "--ctx", "512")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out == json.loads(json.dumps(check_file(smollm2_path, 512, Target.typical())))
    assert out["device"]["measured"] is False and out["context"]["n_ctx"] == 512


def test_the_report_for_people(smollm2_path):
    r = hotseat(smollm2_path, "--no-device")
    assert r.returncode == 0, r.stderr
    report = check_file(smollm2_path, 2048)
    text = r.stdout
    assert "architecture  llama" in text and "runs          yes" in text
    for t, n in report["weight_types"].items():
        assert f"{t} in {n}" in text
    assert f"{report['context']['trained']} trained; 2048 here" in text
    mib = report["vram"]["total_bytes"] / (1 << 20)
    assert f"VRAM warm     {mib:.1f} MiB" in text


def test_a_file_that_wont_run_lists_every_problem(tmp_path):
    path = tmp_path / "ds.gguf"
    written = write_model(path, arch="deepseek2", matrix_type="IQ1_S")
    n = sum(t == "IQ1_S" for t in written.values())
    r = hotseat(str(path), "--no-device")
    assert r.returncode == 2, r.stderr
    assert "runs          no:" in r.stdout
    assert "  - architecture deepseek2 is not supported" in r.stdout
    assert f"  - tensor type IQ1_S in {n} tensors" in r.stdout
    r = hotseat(str(path), "--no-device", "--json")
    assert r.returncode == 2
    out = json.loads(r.stdout)
    assert out["runs"] is False and len(out["problems"]) == 2
    assert out["unsupported_types"] == {"IQ1_S": n}


def test_a_hybrid_architecture_is_sized_with_its_recurrent_states():
    """qwen35moe runs, and the report names its recurrent states (conv and delta-rule) apart
    from the KV cache and the compute buffers, as the Config sizes them."""
    from engine.arch.qwen35 import Config
    from engine.formats.gguf_file import GGUFFile

    path = ROOT / "tests" / "data" / "synth" / "qwen35moe-f16.gguf"
    r = hotseat(str(path), "--no-device", "--ctx", "4096")
    assert r.returncode == 0, r.stderr
    v = check_file(str(path), 4096)["vram"]
    with GGUFFile(str(path)) as g:
        assert v["recurrent_bytes"] == Config.from_gguf(g).recurrent_bytes() > 0
    assert v["total_bytes"] == v["weights_bytes"] + v["kv_bytes"] + v["recurrent_bytes"] \
        + v["compute_bytes"]
    kib = v["recurrent_bytes"] / 1024
    assert f", recurrent states {kib:.1f} KiB, compute " in r.stdout
    assert "runs          yes" in r.stdout


def test_garbage_and_truncated_files_exit_2_with_one_line(tmp_path, smollm2_path):
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"\x00" * 4096)
    one_line_error(hotseat(str(junk), "--no-device"), "junk.gguf", "not a GGUF file")
    cut = tmp_path / "cut.gguf"
    with open(smollm2_path, "rb") as f:
        cut.write_bytes(f.read(1 << 20))
    one_line_error(hotseat(str(cut), "--no-device"), "cut.gguf", "truncated")
    r = hotseat(str(cut), "--no-device", "--json")
    one_line_error(r, "truncated")
    out = json.loads(r.stdout)
    assert out["runs"] is False and out["error"]["reason"] == "truncated"
    assert out["problems"] == [out["error"]["message"].split(": ", 1)[1]]
