"""The model architectures, one module each, picked by a GGUF file's `general.architecture`.

Each module reads top to bottom: a `Config` from GGUF keys, the tensors by their GGUF names,
`forward()` composed of the blocks in blocks.py. contract.py states what the engine reads of a
module (`Architecture`). tests/helpers/reference.py is the numpy forward pass of all of them,
written apart from them, that the tests check them against.
"""
from __future__ import annotations

from ..formats.gguf_file import GGUFFile, ModelFileError
from .contract import Architecture
from . import (gemma2, gemma3, gpt_oss, granite, lfm2, llama, mistral3, olmo2, phi3, qwen2, qwen3,
               qwen3moe, qwen35)

ARCHITECTURES: dict[str, Architecture] = {
    "llama": llama, "gemma3": gemma3, "lfm2": lfm2, "qwen3moe": qwen3moe,
    "qwen2": qwen2, "qwen3": qwen3, "mistral3": mistral3, "phi3": phi3, "gemma2": gemma2,
    "gpt-oss": gpt_oss, "qwen3next": qwen35, "qwen35": qwen35, "qwen35moe": qwen35,
    "olmo2": olmo2, "granite": granite}


def for_file(gguf: GGUFFile) -> Architecture:
    """The architecture module of a GGUF file; a ModelFileError when it is not one of ours."""
    arch = gguf.arch
    if arch not in ARCHITECTURES:
        raise ModelFileError(gguf.path, f"unsupported architecture {arch!r} (supported: "
                                        f"{', '.join(ARCHITECTURES)})", "architecture")
    return ARCHITECTURES[arch]
