"""Fixtures shared by every test: the bundled model files and the reference data beside the checkout."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

# numpy's BLAS threads fight the Vulkan CPU driver for the same cores; one is faster here
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")


@pytest.fixture(scope="session", autouse=True)
def _private_arena(tmp_path_factory):
    """The front ends join the user's GPU arena by default: tests (and the processes they
    start, which inherit the environment) get one of their own instead."""
    if os.environ.get("HOTSEAT_ARENA"):
        yield
        return
    os.environ["HOTSEAT_ARENA"] = str(tmp_path_factory.mktemp("hotseat") / "arena")
    try:
        yield
    finally:
        os.environ.pop("HOTSEAT_ARENA", None)

@pytest.fixture(scope="session", autouse=True)
def _no_prompt_cache(tmp_path_factory):
    """The engine keeps prompt caches across restarts in the user's cache folder: tests
    (and their processes) keep none, so that no test sees another's; the prompt cache's
    own tests turn it on in folders of their own."""
    saved = {k: os.environ.get(k) for k in ("HOTSEAT_CACHE_DIR", "HOTSEAT_CACHE_MIB")}
    os.environ["HOTSEAT_CACHE_DIR"] = str(tmp_path_factory.mktemp("hotseat") / "prompt-cache")
    os.environ["HOTSEAT_CACHE_MIB"] = "0"
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


ROOT = Path(__file__).resolve().parents[1]
SHARED_REFERENCE = ROOT.parent / "shared" / "reference"
DATA = Path(__file__).resolve().parent / "data"
# llama.cpp's answers for the bundled models, which `hotseat precision` ships as package data
LLAMACPP = Path(__file__).resolve().parents[1] / "engine" / "tools" / "reference"


@pytest.fixture(scope="module")
def dev():
    """The Vulkan device (lavapipe where no GPU is present)."""
    from engine.gpu import vk

    d = vk.Device()
    yield d
    d.close()


@pytest.fixture(scope="module")
def kc(dev):
    from engine.gpu.kernels import KernelCache

    k = KernelCache(dev)
    yield k
    k.close()


@pytest.fixture(scope="session")
def smollm2_path() -> str:
    from engine.formats.bundled import smollm2_path
    return smollm2_path()


@pytest.fixture(scope="session")
def gemma3_path() -> str:
    from engine.formats.bundled import gemma3_path
    return gemma3_path()


def load_reference(name: str) -> dict:
    """A llama.cpp reference file: from ../shared/reference, else from tests/data."""
    for d in (SHARED_REFERENCE, DATA):
        p = d / name
        if p.exists():
            return json.loads(p.read_text())
    pytest.fail(f"reference data {name} not found in {SHARED_REFERENCE} or {DATA}")
