"""`hotseat serve` as a child process, for the tools (and tests) that drive several servers
taking turns on one GPU arena over HTTP.

    with ServeProcess(["smollm2"], ctx=256, arena_dir=d) as s:
        url = s.wait_ready()
        status, headers, body = s.request("POST", "/v1/completions", {"prompt": "Hi"})

Standard library only. The child's stderr goes to a temporary file (read by `stderr()`), so
a chatty child never blocks on a full pipe.
"""
from __future__ import annotations

import http.client
import json
import os
import queue
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from typing import Any

SERVING = re.compile(r"^hotseat serving (.+) on (http://\S+) \(device: (.+)\)$")


class ServeError(RuntimeError):
    """The child did not start, or went away."""


class ServeProcess:
    def __init__(self, models: list[str], *, ctx: int = 256, arena_dir: str | None = None,
                 ledger: str | None = None, extra: list[str] | tuple[str, ...] = (),
                 env: dict | None = None):
        cmd = [sys.executable, "-m", "engine.cli", "serve", "--port", "0", "--ctx", str(ctx)]
        for m in models:
            cmd += ["--model", m]
        cmd += list(extra)
        env = dict(os.environ if env is None else env)
        if arena_dir is not None:
            env["HOTSEAT_ARENA"] = arena_dir
        if ledger is not None:
            env["HOTSEAT_ARENA_LOG"] = ledger
        self._err = tempfile.TemporaryFile(mode="w+")
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=self._err,
                                     stdin=subprocess.DEVNULL, text=True, env=env)
        self._lines: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        self.url = ""
        self.device = ""
        self.names: list[str] = []

    @property
    def pid(self) -> int:
        return self.proc.pid

    def _read(self) -> None:
        for line in self.proc.stdout:
            self._lines.put(line.rstrip("\n"))
        self._lines.put(None)

    def stderr(self) -> str:
        self._err.seek(0)
        return self._err.read()

    def wait_ready(self, timeout: float = 300.0) -> str:
        """The server's URL, once it says it serves; ServeError if it exits first."""
        deadline = time.monotonic() + timeout
        while not self.url:
            try:
                line = self._lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise ServeError(f"hotseat serve (pid {self.pid}) did not start within "
                                 f"{timeout:g} s: {self.stderr()[-2000:]}") from None
            if line is None:
                self.proc.wait(10)
                raise ServeError(f"hotseat serve exited with status {self.proc.returncode}: "
                                 f"{self.stderr()[-2000:]}")
            m = SERVING.match(line)
            if m:
                self.names = m.group(1).split(", ")
                self.url, self.device = m.group(2), m.group(3)
        return self.url

    def request(self, method: str, path: str, body: Any = None,
                headers: dict | None = None, timeout: float = 600.0
                ) -> tuple[int, dict, Any]:
        """(status, headers, parsed JSON body) of one request."""
        u = urllib.parse.urlsplit(self.url)
        conn = http.client.HTTPConnection(u.hostname, u.port, timeout=timeout)
        try:
            data = None if body is None else json.dumps(body).encode()
            hdrs = {"Content-Type": "application/json", **(headers or {})}
            conn.request(method, path, body=data, headers=hdrs)
            resp = conn.getresponse()
            raw = resp.read()
            return resp.status, dict(resp.getheaders()), json.loads(raw) if raw else None
        finally:
            conn.close()

    def stream(self, path: str, body: dict, timeout: float = 600.0
               ) -> tuple[float | None, float, str]:
        """A streamed generation: (seconds to the first text, seconds in all, the text)."""
        u = urllib.parse.urlsplit(self.url)
        conn = http.client.HTTPConnection(u.hostname, u.port, timeout=timeout)
        t0 = time.perf_counter()
        first, text = None, []
        try:
            conn.request("POST", path, body=json.dumps({**body, "stream": True}).encode(),
                         headers={"Content-Type": "application/json"})
            resp = conn.getresponse()
            if resp.status != 200:
                raise ServeError(f"{path}: HTTP {resp.status}: {resp.read()[:500]!r}")
            for raw in resp:
                line = raw.decode("utf-8").strip()
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                obj = json.loads(line[6:])
                if "error" in obj:
                    raise ServeError(f"{path}: {obj['error'].get('message')}")
                for c in obj.get("choices", []):
                    piece = c.get("delta", {}).get("content") if "delta" in c else c.get("text")
                    if piece:
                        if first is None:
                            first = time.perf_counter() - t0
                        text.append(piece)
        finally:
            conn.close()
        return first, time.perf_counter() - t0, "".join(text)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL: no clean-up at all (the kernel drops its arena token)."""
        if self.alive():
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(30)

    def stop(self, timeout: float = 60.0) -> int:
        """SIGINT (a clean shutdown), SIGKILL after timeout; the exit status."""
        if self.alive():
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(30)
        self.proc.stdout.close()
        return self.proc.returncode

    def __enter__(self) -> "ServeProcess":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
