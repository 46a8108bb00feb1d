"""The prompt cache across restarts (engine/residency/promptcache.py): kept on unload and on a
clean exit, given back at the next load of the same file with the same settings, and the
answer after it the fresh one; a file that is damaged or belongs to something else never
used; a folder that cannot be written costs the cache and nothing else; the folder's bound;
`hotseat cache ls|clear`; and `hotseat serve` stopped by SIGTERM and started again, over
HTTP."""
from __future__ import annotations

import errno
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from engine.api import Engine
from engine.facade import Request
from engine.residency import promptcache
from engine.text.sampling import SamplingParams
from tests.engine.server.test_access import SERVING
from tests.engine.server.test_serve import request

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[3]
GREEDY = SamplingParams(temperature=0.0)
PROMPT = "The three most useful things to pack for a week of hiking in the mountains are"


@pytest.fixture
def folder(tmp_path, monkeypatch) -> Path:
    d = tmp_path / "prompt-cache"
    monkeypatch.setenv("HOTSEAT_CACHE_DIR", str(d))
    monkeypatch.setenv("HOTSEAT_CACHE_MIB", "64")
    return d


def answer(eng: Engine, name: str = "m", prompt: str = PROMPT):
    return eng.generate(Request(name, prompt=prompt, max_tokens=12, sampling=GREEDY))


def first_run(path: str, prompt: str = PROMPT, name: str = "m"):
    """A fresh engine's answer; the engine closed (so its cache saved)."""
    with Engine(n_ctx=256) as eng:
        eng.load(path, name=name)
        return answer(eng, name, prompt)


def cached(eng: Engine, name: str = "m") -> int:
    return next(s["cached_tokens"] for s in eng.status() if s["name"] == name)


def test_a_restart_keeps_the_prompt_cache_and_the_answer(smollm2_path, folder):
    fresh = first_run(smollm2_path)
    assert fresh.timings["cached_tokens"] == 0
    (saved,) = folder.glob("*.kv")
    with Engine(n_ctx=256) as eng:
        eng.load(smollm2_path, name="other name")       # the file's identity, not its name
        n = cached(eng, "other name")
        assert n == len(fresh.prompt_tokens) + len(fresh.tokens) - 1
        again = answer(eng, "other name")
    assert again.timings["cached_tokens"] == len(fresh.prompt_tokens) - 1
    assert again.tokens == fresh.tokens and again.text == fresh.text
    assert saved.exists()                                # kept for the next start


def test_other_settings_or_another_file_do_not_take_it(smollm2_path, folder, tmp_path, caplog):
    first_run(smollm2_path)
    (saved,) = folder.glob("*.kv")
    with Engine(n_ctx=512) as eng:                     # another context size: another file
        eng.load(smollm2_path, name="m")
        assert cached(eng) == 0
    assert saved.exists() and len(list(folder.glob("*.kv"))) == 1   # nothing generated
    # the same bytes under a newer modification time: another identity, another file name
    copy = tmp_path / "copy.gguf"
    shutil.copyfile(smollm2_path, copy)
    with Engine(n_ctx=256) as eng:
        eng.load(str(copy), name="m")
        assert cached(eng) == 0
    # a cache file put where another file's would be: refused by its identity and removed
    with Engine(n_ctx=256) as eng:
        eng.load(str(copy), name="m")
        target = promptcache.path_for(eng._get("m").model)
    shutil.copyfile(saved, target)
    caplog.set_level(logging.WARNING, "hotseat")
    with Engine(n_ctx=256) as eng:
        eng.load(str(copy), name="m")
        assert cached(eng) == 0
        fresh = answer(eng)
    assert "made with another file" in caplog.text
    assert fresh.timings["cached_tokens"] == 0


@pytest.mark.parametrize("damage", ["truncated", "bit flipped", "not a cache",
                                    "prompt count"])
def test_a_damaged_file_is_never_used(smollm2_path, folder, damage, caplog):
    fresh = first_run(smollm2_path)
    (saved,) = folder.glob("*.kv")
    raw = bytearray(saved.read_bytes())
    if damage == "truncated":
        raw = raw[:len(raw) // 2]
    elif damage == "bit flipped":
        raw[len(raw) - 100] ^= 0x10                      # inside the KV rows
    elif damage == "prompt count":                       # past its tokens, digest made anew
        header, data = promptcache._read(saved)
        header["prompt_tokens"] = len(header["tokens"]) + 1
        promptcache._write(saved, header, [np.frombuffer(data, np.uint8)])
        raw = bytearray(saved.read_bytes())
    else:
        raw = bytearray(b"{}" * 100)
    saved.write_bytes(bytes(raw))
    caplog.set_level(logging.WARNING, "hotseat")
    with Engine(n_ctx=256) as eng:
        eng.load(smollm2_path, name="m")
        assert cached(eng) == 0
        again = answer(eng)
    assert f"prompt cache {saved} ignored and removed" in caplog.text
    assert again.timings["cached_tokens"] == 0 and again.tokens == fresh.tokens


def test_a_folder_that_cannot_be_written_costs_only_the_cache(smollm2_path, tmp_path,
                                                              monkeypatch, caplog):
    """Its path runs through a file (root writes anywhere else); then a full disk."""
    blocker = tmp_path / "a file"
    blocker.write_text("")
    monkeypatch.setenv("HOTSEAT_CACHE_DIR", str(blocker / "prompt-cache"))
    monkeypatch.setenv("HOTSEAT_CACHE_MIB", "64")
    caplog.set_level(logging.WARNING, "hotseat")
    fresh = first_run(smollm2_path)
    assert "prompt cache of m not saved in" in caplog.text and "Not a directory" in caplog.text
    monkeypatch.setenv("HOTSEAT_CACHE_DIR", str(tmp_path / "full"))

    def full(*_):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    monkeypatch.setattr(promptcache, "_write", full)
    caplog.clear()
    assert first_run(smollm2_path).tokens == fresh.tokens
    assert "No space left on device" in caplog.text
    assert not list((tmp_path / "full").glob("*"))


def test_the_folder_bound_drops_the_least_recently_used(folder, monkeypatch):
    folder.mkdir(parents=True)
    now = time.time()
    for i, age in enumerate((300, 100, 200)):               # b is the most recent
        p = folder / f"{'abc'[i]}.kv"
        p.write_bytes(b"x" * (1 << 20))
        os.utime(p, (now - age, now - age))
    assert promptcache.trim(2 << 20) == [str(folder / "a.kv")]
    assert promptcache.trim(1 << 20) == [str(folder / "c.kv")]
    assert [Path(e["file"]).name for e in promptcache.entries()] == ["b.kv"]
    monkeypatch.setenv("HOTSEAT_CACHE_MIB", "-1")
    with pytest.raises(ValueError, match="HOTSEAT_CACHE_MIB must not be negative"):
        promptcache.limit_bytes()
    monkeypatch.setenv("HOTSEAT_CACHE_MIB", "lots")
    with pytest.raises(ValueError, match="HOTSEAT_CACHE_MIB must be a whole number of MiB"):
        promptcache.limit_bytes()


def hotseat(*args: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "engine.cli", *args], capture_output=True,
                          text=True, cwd=ROOT, env={**env, "PYTHONPATH": str(ROOT)}, timeout=300)


def test_serve_refuses_a_negative_host_budget():
    out = hotseat("serve", "--port", "0", "--host-budget-mib", "-1", env=dict(os.environ))
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.strip() == "hotseat: error: --host-budget-mib must not be negative, got -1"


def test_cache_ls_and_clear(smollm2_path, folder):
    first_run(smollm2_path, name="smol")
    env = dict(os.environ)
    out = hotseat("cache", "ls", "--json", env=env)
    assert out.returncode == 0, out.stderr
    listing = json.loads(out.stdout)
    (e,) = listing["entries"]
    assert e["model"] == "smol" and e["path"] == smollm2_path and e["tokens"] > 10
    assert listing["folder"] == str(folder) and listing["limit_bytes"] == 64 << 20
    text = hotseat("cache", "ls", env=env).stdout
    assert "1 prompt cache," in text and "smol" in text
    out = hotseat("cache", "clear", env=env)
    assert out.returncode == 0 and "removed 1 prompt cache from" in out.stdout
    assert not list(folder.glob("*.kv"))
    assert "0 prompt caches" in hotseat("cache", "ls", env=env).stdout


# -- the real server, stopped and started again ------------------------------------------------

def serve(path: str, env: dict) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen([sys.executable, "-m", "engine.cli", "serve", "--port", "0",
                             "--ctx", "2048", "-m", path], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=ROOT,
                            env={**env, "PYTHONPATH": str(ROOT)})
    line = proc.stdout.readline().strip()
    m = SERVING.match(line)
    assert m is not None, (line, proc.stderr.read() if proc.poll() is not None else "")
    return proc, f"http://127.0.0.1:{m.group(3)}"


def complete(url: str, prompt: str) -> dict:
    got, _, out = request(url, "POST", "/v1/completions", key=None,
                          body={"prompt": prompt, "max_tokens": 16, "temperature": 0})
    assert got == 200, out
    return out


@pytest.mark.slow
def test_serve_keeps_the_prompt_cache_across_a_restart(smollm2_path, folder):
    """A 1,000-token prompt, SIGTERM, a new start: the same prompt reuses all but its last
    token, and the answer is the same."""
    env = dict(os.environ)
    words = ("river", "stone", "lantern", "orchard", "violet", "harbor", "meadow", "copper")
    # 1,004 tokens
    prompt = " ".join(words[(i * 5) % 8] for i in range(1000)) + " The end. Then"
    procs = []
    try:
        proc, url = serve(smollm2_path, env)
        procs.append(proc)
        first = complete(url, prompt)
        n_prompt = first["usage"]["prompt_tokens"]
        assert 1000 <= n_prompt < 2048 - 16
        assert first["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(120) == 0
        assert len(list(folder.glob("*.kv"))) == 1
        proc, url = serve(smollm2_path, env)
        procs.append(proc)
        again = complete(url, prompt)
    finally:
        for p in procs:
            if p.poll() is None:
                p.terminate()
                p.wait(60)
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] >= 990
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] == n_prompt - 1
    assert again["choices"][0]["text"] == first["choices"][0]["text"]


def test_a_lost_device_does_not_stop_the_unload(smollm2_path, folder, caplog):
    """The KV of a device that failed is neither read nor saved, and the unload goes on."""
    from engine.facade import EngineFault
    from engine.gpu import vk

    caplog.set_level(logging.WARNING, "hotseat")
    with Engine(n_ctx=256) as eng:
        eng.load(smollm2_path, name="m")
        answer(eng)
        vk.inject("submit", "device_lost", nth=1)
        try:
            with pytest.raises(EngineFault):
                answer(eng, prompt=PROMPT + " and")
        finally:
            vk.clear_faults()
        eng.unload("m")
        assert eng.status() == []
    assert not list(folder.glob("*.kv"))
