"""What the window shows about a model file beyond the engine's status: its quantization and
size on disk. Read once per file (path, size and mtime) and kept."""
from __future__ import annotations

import os
import threading
from collections import Counter

_cache: dict[tuple[str, int, int], dict] = {}
_lock = threading.Lock()


def quant_name(file_type: int | None, tensor_bytes: dict[str, int]) -> str:
    """`general.file_type` as llama.cpp names it (Q4_K_M, F16...), else the tensor type that
    holds the most bytes."""
    import gguf

    if file_type is not None:
        try:
            name = gguf.LlamaFileType(int(file_type)).name
        except ValueError:
            name = ""
        if name and name != "GUESSED":
            return name.removeprefix("MOSTLY_").removeprefix("ALL_")
    if tensor_bytes:
        return max(tensor_bytes.items(), key=lambda kv: kv[1])[0]
    return "?"


def describe(path: str) -> dict:
    """{"quant", "file_bytes"} for a GGUF file; "?" where the file cannot be read."""
    try:
        st = os.stat(path)
    except OSError:
        return {"quant": "?", "file_bytes": 0}
    key = (os.path.abspath(path), st.st_size, int(st.st_mtime_ns))
    with _lock:
        if key in _cache:
            return dict(_cache[key])
    info = {"quant": "?", "file_bytes": st.st_size}
    try:
        from engine.formats.gguf_file import GGUFFile, ModelFileError
    except ImportError:                   # pragma: no cover - engine always ships with app
        return info
    try:
        g = GGUFFile(path)
    except (ModelFileError, OSError):
        return info
    try:
        sizes: Counter[str] = Counter()
        for t in g.tensors.values():
            sizes[t.type_name] += t.nbytes
        info["quant"] = quant_name(g.get("general.file_type"), dict(sizes))
    finally:
        g.close()
    with _lock:
        _cache[key] = dict(info)
    return info
