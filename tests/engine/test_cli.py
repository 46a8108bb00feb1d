"""The `hotseat` command line contract: JSON on stdout, one-line errors with exit status 2."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT, load_reference

pytestmark = pytest.mark.gpu


def hotseat(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "engine.cli", *args], capture_output=True,
                          text=True, timeout=timeout, cwd=ROOT, env=env)


def test_tokenize_json_matches_llama_cpp():
    ref = load_reference("smollm2-135m-instruct-q4_1.json")["prompts"]["plain"]
    r = hotseat("tokenize", ref["text"], "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == {"tokens": ref["prompt_ids"]}


def test_generate_json_greedy_plain():
    ref = load_reference("smollm2-135m-instruct-q4_1.json")["prompts"]["plain"]
    r = hotseat("generate", "--prompt", ref["text"], "--temperature", "0", "-n", "12", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["prompt_tokens"] == ref["prompt_ids"]
    assert out["tokens"] == ref["greedy_ids"][:12]
    assert ref["greedy_text"].startswith(out["text"]) and out["text"]
    assert out["timings"]["prefill_tokens_per_s"] > 0
    assert out["timings"]["decode_tokens_per_s"] > 0


def test_generate_json_chat_is_templated():
    r = hotseat("generate", "--prompt", "Say hi.", "--chat", "--temperature", "0", "-n", "6",
                "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    tok = hotseat("tokenize", "<|im_start|>user\nSay hi.<|im_end|>", "--parse-special",
                  "--json")
    inner = json.loads(tok.stdout)["tokens"]
    n = len(inner)
    # the template adds a system turn before the user turn and the assistant header after it
    assert any(out["prompt_tokens"][i:i + n] == inner for i in range(len(out["prompt_tokens"])))
    assert len(out["tokens"]) >= 1


def _one_line_error(r: subprocess.CompletedProcess, *words: str) -> None:
    assert r.returncode == 2, (r.returncode, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    for w in words:
        assert w in lines[0], lines[0]
    assert "Traceback" not in r.stderr


def test_bad_files_give_one_line_errors(tmp_path):
    garbage = tmp_path / "garbage.gguf"
    garbage.write_bytes(b"not a model at all" * 10)
    _one_line_error(hotseat("generate", "--model", str(garbage), "--prompt", "x"),
                    str(garbage), "magic")
    truncated = tmp_path / "truncated.gguf"
    from engine.formats.bundled import smollm2_path
    with open(smollm2_path(), "rb") as f:
        truncated.write_bytes(f.read(3_000_000))
    _one_line_error(hotseat("generate", "--model", str(truncated), "--prompt", "x"),
                    str(truncated), "truncated")
    _one_line_error(hotseat("tokenize", "--model", str(tmp_path / "nope.gguf"), "x"),
                    "no such file")


def test_bad_arguments_exit_2():
    r = hotseat("generate", "--prompt", "x", "-n", "-3")
    _one_line_error(r, "-n")


def test_the_parser_does_not_import_the_web_framework():
    """Every command's parser is built at start-up; aiohttp (the server's) is imported only
    where a server starts, so `hotseat tokenize` does not pay for it."""
    code = ("import sys; from engine.cli import build_parser; build_parser(); "
            "print('aiohttp' in sys.modules)")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "False"


def test_kernel_bench_concat_json():
    """Both concat paths timed on lfm2's shapes; the command checks both outputs first."""
    r = hotseat("kernel-bench", "concat", "--json", "-r", "3")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["kernel"] == "concat" and len(out["rows"]) >= 4
    for row in out["rows"]:
        assert row["tiled_us"] > 0 and row["generic_us"] > 0
        assert row["generic_over_tiled"] == pytest.approx(row["generic_us"] / row["tiled_us"])


def test_bench_profile_of_a_prompt_alone():
    """`bench --profile -n 0` times the prompt's widest pass kernel by kernel, and no decode
    graph (none ran); the shares of that pass add up to one."""
    r = hotseat("bench", "-p", "24", "-n", "0", "-r", "1", "--profile", "--no-arena", "--json")
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)["profile"]
    assert rows and {p["graph"] for p in rows} == {"pp24"}
    assert all(p["ms"] > 0 and p["calls"] >= 1 for p in rows)
    assert sum(p["share"] for p in rows) == pytest.approx(1.0)
    assert any(p["kernel"].startswith("mul_mat") for p in rows)
