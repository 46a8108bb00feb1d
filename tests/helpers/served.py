"""`hotseat serve` as a separate process, for tests that drive it as a client would."""
from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
from typing import Iterator

from tests.conftest import ROOT

SERVING = re.compile(r"^hotseat serving (.+) on http://(\S+):(\d+) \(device: .+\)$")


@contextlib.contextmanager
def served(*args: str, start_s: float = 240) -> Iterator[str]:
    """`hotseat serve --port 0 ARGS...` running; yields its base URL (http://127.0.0.1:PORT).
    Stopped with SIGINT at the end, as a user's Ctrl-C."""
    env = {k: v for k, v in os.environ.items() if k not in ("HOTSEAT_API_KEY", "OLLAMA_HOST")}
    env["PYTHONPATH"] = str(ROOT)
    proc = subprocess.Popen([sys.executable, "-m", "engine.cli", "serve", "--port", "0", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=ROOT, env=env)
    watchdog = threading.Timer(start_s, proc.kill)
    watchdog.start()
    try:
        line = proc.stdout.readline().strip()
    finally:
        watchdog.cancel()
    m = SERVING.match(line)
    try:
        assert m is not None, (line, proc.stderr.read() if proc.poll() is not None else "")
        yield f"http://127.0.0.1:{m.group(3)}"
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
