"""`hotseat ps`, `load`, `unload`, `pin`, `unpin`, `evict`, `warm` against a real
`hotseat serve` started as a subprocess on a free port; no command here generates."""
from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.gpu

KEY = "cli-key"
CTX = 256
BUDGET_MIB = 1024                         # room for both models warm: swaps are test_serve's
SERVING = re.compile(r"^hotseat serving (.+) on (http://\S+) \(device: .+\)$")


def hotseat(*args: str, url: str | None = None, key: str | None = KEY,
            timeout: float = 300) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("HOTSEAT_URL", "HOTSEAT_API_KEY")}
    env["PYTHONPATH"] = str(ROOT)
    if url is not None:
        env["HOTSEAT_URL"] = url
    if key is not None:
        env["HOTSEAT_API_KEY"] = key
    return subprocess.run([sys.executable, "-m", "engine.cli", *args], capture_output=True,
                          text=True, timeout=timeout, cwd=ROOT, env=env)


def ok(r: subprocess.CompletedProcess) -> str:
    assert r.returncode == 0, (r.returncode, r.stderr)
    assert r.stderr == ""
    return r.stdout


def one_line_error(r: subprocess.CompletedProcess, *words: str) -> str:
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert r.stdout == ""
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("hotseat: error: "), lines[0]
    for w in words:
        assert w in lines[0], lines[0]
    return lines[0]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def served():
    """(url, first model's name) of `hotseat serve --port 0`, stopped with SIGINT after."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.pop("HOTSEAT_API_KEY", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "engine.cli", "serve", "--port", "0", "--ctx", str(CTX),
         "--budget-mib", str(BUDGET_MIB), "--api-key", KEY],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT, env=env)
    watchdog = threading.Timer(180, proc.kill)          # a server that never says it serves
    watchdog.start()
    try:
        line = proc.stdout.readline().strip()
    finally:
        watchdog.cancel()
    m = SERVING.match(line)
    if m is None:
        proc.kill()
        pytest.fail(f"hotseat serve did not start: {line!r} {proc.stderr.read()}")
    try:
        yield m.group(2), m.group(1)
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            rc = proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise
        assert rc == 0, proc.stderr.read()


def ps(url: str) -> dict:
    return json.loads(ok(hotseat("ps", "--json", url=url)))


def test_no_server():
    url = f"http://127.0.0.1:{free_port()}"
    want = f"hotseat: error: no hotseat server at {url} (start one with hotseat serve)"
    assert one_line_error(hotseat("ps", "--url", url)) == want
    assert one_line_error(hotseat("pin", "x", url=url)) == want          # $HOTSEAT_URL
    assert one_line_error(hotseat("load", "smollm2", url=url + "/")) == want


def test_ps(served):
    url, first = served
    out = ps(url)
    (m,) = out["models"]
    assert m["name"] == first and m["arch"] == "llama" and m["n_ctx"] == CTX
    assert m["state"] == "warm" and m["pinned"] is False and m["device_bytes"]["weights"] > 0
    assert out["vram"]["budget_bytes"] == BUDGET_MIB << 20
    assert out["vram"]["granted_bytes"] == m["device_bytes_total"]

    lines = ok(hotseat("ps", "--url", url, "--api-key", KEY, key=None)).splitlines()
    assert lines[0].split() == ["NAME", "ARCH", "STATE", "PINNED", "VRAM", "VISION", "HOST",
                                "SHADOW", "RAM", "DISK", "CONTEXT"]
    vram, shadow = m["device_bytes_total"] / (1 << 20), m["host_shadow_bytes"] / (1 << 20)
    # warm: no KV shadow, and RAM only where a discrete GPU keeps a copy of the weights
    ram = m["ram_bytes"] / (1 << 20)
    assert m["disk_bytes"] == 0 and m["ram_bytes"] <= m["host_shadow_bytes"]
    assert lines[1].split() == [first, "llama", "warm", "no", f"{vram:.0f}", "MiB", "-",
                                f"{shadow:.0f}", "MiB", f"{ram:.0f}", "MiB", "0", "MiB",
                                str(CTX)]
    assert lines[0].index("STATE") == lines[1].index("warm")            # columns line up
    assert lines[2].startswith(f"VRAM budget {BUDGET_MIB} MiB: {vram:.0f} MiB granted, ")
    host = out["vram"]["host_budget_bytes"] / (1 << 20)
    assert lines[3] == f"host budget {host:.0f} MiB: {ram:.0f} MiB of shadows in RAM, " \
                       "0 MiB on disk"
    lines = lines[:3] + lines[4:]
    # the GPU arena (the tests' own, see tests/conftest.py): this server holds the token
    arena = out["arena"]
    assert arena["state"] == "holder" and arena["dir"] == os.environ["HOTSEAT_ARENA"]
    pid = arena["pid"]
    assert lines[3] == f"GPU arena {arena['dir']}: this server (pid {pid}) holds the GPU"
    assert lines[4].split() == ["PID", "STATE", "UNTIL", "PROCESS"]
    row = next(line for line in lines[5:] if line.split()[0] == str(pid))
    assert row.split() == [str(pid), "holder", "serve", url, "(this", "server)"]


def test_load_evict_warm_pin_unload(served):
    url, first = served
    out = ok(hotseat("load", "smollm2", "--name", "second", url=url))
    assert out.startswith("loaded second (llama, context 256): warm; VRAM ")
    one_line_error(hotseat("load", "smollm2", "--name", "second", url=url), "already loaded")
    assert [m["name"] for m in ps(url)["models"]] == [first, "second"]

    # the server's default is weights-only: the KV stays on the device
    assert ok(hotseat("evict", "second", url=url)).startswith("evicted second in ")
    second = ps(url)["models"][1]
    assert second["state"] == "cold" and "weights" not in second["device_bytes"]
    assert second["device_bytes"]["kv"] > 0
    answer = json.loads(ok(hotseat("evict", "second", "--full", "--json", url=url)))
    assert answer["state"] == "cold" and answer["device_bytes_total"] < 1 << 20
    assert answer["transfer"]["op"] == "release"
    row = ok(hotseat("ps", url=url)).splitlines()[2].split()
    assert row[:6] == ["second", "llama", "cold", "no", "0", "MiB"]

    out = ok(hotseat("warm", "second", url=url))
    assert re.match(r"warmed second \(restored \d+ MiB in [0-9.]+ s\): warm; VRAM ", out), out
    assert ok(hotseat("warm", "second", url=url)).startswith("warmed second (already warm)")

    assert ok(hotseat("pin", "second", url=url)).startswith("pinned second: warm, pinned; ")
    assert ps(url)["models"][1]["pinned"] is True
    one_line_error(hotseat("evict", "second", url=url), "second is pinned")
    assert ok(hotseat("unpin", "second", url=url)).startswith("unpinned second: warm; ")
    assert ps(url)["models"][1]["pinned"] is False

    assert ok(hotseat("unload", "second", url=url)) == "unloaded second\n"
    assert [m["name"] for m in ps(url)["models"]] == [first]
    one_line_error(hotseat("unload", "second", url=url), "'second' does not exist")


def test_server_errors_are_one_line(served, tmp_path):
    url, first = served
    one_line_error(hotseat("ps", url=url, key=None), "missing or wrong API key")
    one_line_error(hotseat("ps", "--api-key", "wrong", url=url), "missing or wrong API key")
    for cmd in ("pin", "unpin", "evict", "warm"):
        one_line_error(hotseat(cmd, "no-such-model", url=url), "'no-such-model' does not exist")
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"this is not a gguf file" * 10)
    one_line_error(hotseat("load", str(junk), url=url), "junk.gguf")
    # a relative path is the client's: sent to the server as an absolute one
    r = subprocess.run([sys.executable, "-m", "engine.cli", "load", "junk.gguf"],
                       capture_output=True, text=True, timeout=300, cwd=tmp_path,
                       env=dict(os.environ, PYTHONPATH=str(ROOT), HOTSEAT_URL=url,
                                HOTSEAT_API_KEY=KEY))
    one_line_error(r, str(junk))
    assert [m["name"] for m in ps(url)["models"]] == [first]


def test_ps_says_why_game_mode_gave_the_gpu_up():
    """The lines `hotseat ps` adds for game mode, from the status the server gives."""
    import time

    from engine.tools.client import format_arena, format_game, format_ps

    t = time.mktime((2030, 1, 1, 21, 5, 7, 0, 0, -1))
    rec = {"t": t, "kind": "released", "free_bytes": 300 << 20, "need_bytes": 5 << 30,
           "reason": "another program is using the GPU's memory: 300 MiB was left free",
           "checked": {"t": t + 60, "model": "m", "free_bytes": 1 << 30,
                       "need_bytes": 5 << 30}}
    arena = {"enabled": False, "state": "cold", "pid": 9, "gave_up": rec}
    assert format_arena(arena) == "GPU arena: not joined (the server runs with --no-arena)\n"
    assert format_game(arena) == (
        "Game mode: gave the GPU up at 21:05:07: another program is using the GPU's memory: "
        "300 MiB was left free (last request, for m at 21:06:07: 1024 MiB free, 5120 MiB "
        "needed)\n")
    assert format_game(None) == format_game({"state": "holder", "gave_up": None}) == ""
    vram = {"budget_bytes": 8 << 30, "granted_bytes": 0, "allocated_bytes": 0,
            "device": "GPU", "game_mode": {"watching": True, "margin_bytes": 512 << 20},
            "host_budget_bytes": 4 << 30, "host_used_bytes": 0, "host_disk_bytes": 0}
    assert format_ps([], vram).splitlines()[-2].endswith(
        "; game mode keeps 512 MiB free for other programs")
    vram["game_mode"]["watching"] = False
    assert "game mode" not in format_ps([], vram)
