"""Many models in one `hotseat serve` under a host budget, over HTTP: Gemma 3 and SmolLM2
under several names and a synthetic llama, one warm at a time (`--budget-mib`), every cold
one's KV shadowed (`--evict-kv`) under `--host-budget-mib`, asked in turn for rounds. The
server's anonymous memory (RssAnon) grows by at most the host budget and a margin over what
it holds with one warm model, every answer is a fresh single-model run's, and /api/models
shows the tiers.

Here five models, three rounds, and a host budget of 0 (every cold model's KV on disk);
HOTSEAT_STRESS=1 runs the full size: twelve models, thirty rounds, a 600 MiB budget."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from engine.api import Engine
from engine.facade import Request
from engine.text.sampling import SamplingParams
from tests.engine.server.test_access import SERVING
from tests.engine.server.test_serve import request

pytestmark = [pytest.mark.gpu, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[3]
STRESS = bool(os.environ.get("HOTSEAT_STRESS"))
N_GEMMA, N_SMOL, ROUNDS, HOST_MIB = (4, 7, 30, 600) if STRESS else (2, 2, 3, 0)
MARGIN_MIB = 200
CTX = 256
PROMPT = "Name a fruit that is yellow."


def rss_anon(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) << 10 for line in f if line.startswith("RssAnon:"))


def chat(url: str, name: str) -> dict:
    got, _, out = request(url, "POST", "/v1/chat/completions", key=None,
                          body={"model": name, "max_tokens": 8, "temperature": 0,
                                "messages": [{"role": "user", "content": PROMPT}]})
    assert got == 200, out
    return out


def test_many_models_stay_under_the_host_budget(smollm2_path, gemma3_path, tmp_path):
    synth = str(ROOT / "tests" / "data" / "synth" / "llama-q5_1.gguf")
    files = {"gemma": gemma3_path, "smol": smollm2_path, "synth": synth}
    models = [("gemma", "")] + [("gemma", f"gemma-{i}") for i in range(1, N_GEMMA)] + \
        [("smol", f"smol-{i}") for i in range(N_SMOL)] + [("synth", "synth")]
    # each file's answer from a fresh engine that holds it alone, and the largest warm size
    fresh, warm = {}, 0
    for kind, path in files.items():
        with Engine(n_ctx=CTX, prompt_cache=False) as eng:
            name = eng.load(path, name=kind)
            fresh[kind] = eng.generate(Request(name, messages=[{"role": "user", "content": PROMPT}],
                                               max_tokens=8,
                                               sampling=SamplingParams(temperature=0.0))).text
            warm = max(warm, eng.status()[0]["warm_bytes"])
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HOTSEAT_CACHE_DIR": str(tmp_path / "c")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "engine.cli", "serve", "--port", "0", "--ctx", str(CTX),
         "-m", gemma3_path, "--budget-mib", str((warm >> 20) + 32), "--evict-kv",
         "--host-budget-mib", str(HOST_MIB)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT, env=env)
    try:
        m = SERVING.match(proc.stdout.readline().strip())
        assert m is not None
        url = f"http://127.0.0.1:{m.group(3)}"
        models[0] = ("gemma", m.group(1))               # the name serve gave it
        assert chat(url, m.group(1))["choices"][0]["message"]["content"] == fresh["gemma"]
        base = rss_anon(proc.pid)            # one warm model, after its first request
        for kind, name in models[1:]:
            got, _, out = request(url, "POST", "/api/models", key=None,
                                  body={"path": files[kind], "name": name})
            assert got == 201, out
        peak = base
        for _ in range(ROUNDS):
            for kind, name in models:
                out = chat(url, name)
                assert out["choices"][0]["message"]["content"] == fresh[kind], name
                peak = max(peak, rss_anon(proc.pid))
        got, _, listing = request(url, "GET", "/api/models", key=None)
        _, _, vram = request(url, "GET", "/api/vram", key=None)
    finally:
        proc.terminate()
        proc.wait(120)
    grown = peak - base
    print(f"\n{len(models)} models, {ROUNDS} rounds: RssAnon {base >> 20} MiB with one warm, "
          f"peak {peak >> 20} MiB (+{grown >> 20}); shadows {vram['host_used_bytes'] >> 20} "
          f"MiB in RAM, {vram['host_disk_bytes'] >> 20} MiB on disk")
    assert grown <= (HOST_MIB + MARGIN_MIB) << 20
    entries = {e["name"]: e for e in listing["models"]}
    assert len(entries) == len(models)
    assert sum(e["ram_bytes"] for e in entries.values()) == vram["host_used_bytes"]
    assert vram["host_used_bytes"] <= HOST_MIB << 20
    if HOST_MIB == 0:                          # every cold model's KV on disk
        assert all(e["disk_bytes"] > 0 for e in entries.values() if e["state"] == "cold")
        assert vram["host_disk_bytes"] == sum(e["disk_bytes"] for e in entries.values()) > 0
