"""What the window shows about a model file beyond the engine's status: its quantization and
size on disk.

The engine has already parsed a loaded model's file and reports its `file_type` in status();
where it does (every loaded model of this engine), nothing is read here but a stat. Otherwise
(an older engine, or a file with no `general.file_type`) only the header is walked, skipping
values without decoding them: the whole-file parse with gguf-py takes seconds (the
vocabulary), this walk milliseconds. Results are kept per file (path, size and mtime).
"""
from __future__ import annotations

import mmap
import os
import struct
import threading
from collections import Counter

_cache: dict[tuple[str, int, int], dict] = {}
_lock = threading.Lock()

# GGUF metadata value types: fixed sizes, then string (8) and array (9)
_SCALAR = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q",
           11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9
_MAX_KV, _MAX_TENSORS = 1 << 16, 1 << 20


def quant_name(file_type: int | None, tensor_bytes: dict[str, int]) -> str:
    """`general.file_type` as llama.cpp names it (Q4_K_M, F16...), else the tensor type that
    holds the most bytes."""
    import gguf

    if file_type is not None:
        try:
            name = gguf.LlamaFileType(int(file_type)).name
        except (ValueError, TypeError):
            name = ""
        if name and name != "GUESSED":
            return name.removeprefix("MOSTLY_").removeprefix("ALL_")
    if tensor_bytes:
        return max(tensor_bytes.items(), key=lambda kv: kv[1])[0]
    return "?"


class _Walk:
    """Bounds-checked reads over a mapped header; IndexError past the end."""

    def __init__(self, buf, size: int):
        self.buf, self.size, self.pos = buf, size, 0

    def take(self, n: int) -> int:
        if n < 0 or n > self.size - self.pos:
            raise IndexError("past the end of the file")
        start, self.pos = self.pos, self.pos + n
        return start

    def unpack(self, fmt: str):
        return struct.unpack_from(fmt, self.buf, self.take(struct.calcsize(fmt)))[0]

    def text(self) -> str:
        n = self.unpack("<Q")
        start = self.take(n)
        return bytes(self.buf[start:start + n]).decode("utf-8", "replace")

    def skip(self, vtype: int, depth: int = 0) -> None:
        if vtype in _SCALAR:
            self.take(struct.calcsize(_SCALAR[vtype]))
        elif vtype == _STRING:
            self.take(self.unpack("<Q"))
        elif vtype == _ARRAY and depth < 4:
            itype, count = self.unpack("<I"), self.unpack("<Q")
            if itype in _SCALAR:
                self.take(count * struct.calcsize(_SCALAR[itype]))
            elif count > self.size - self.pos:
                raise IndexError("array count past the end of the file")
            else:
                for _ in range(count):
                    self.skip(itype, depth + 1)
        else:
            raise ValueError(f"unknown value type {vtype}")


def read_quant(path: str, tensors_too: bool = True) -> str:
    """The quantization name from the header alone: `general.file_type` if present, else
    (tensors_too) the tensor type holding the most bytes. ValueError for a file that is not
    a readable GGUF header."""
    import gguf

    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        w = _Walk(buf, len(buf))
        try:
            if bytes(buf[0:4]) != b"GGUF":
                raise ValueError("not a GGUF file")
            w.pos = 8                                  # magic, version
            n_tensors, n_kv = w.unpack("<Q"), w.unpack("<Q")
            if n_kv > _MAX_KV or n_tensors > _MAX_TENSORS:
                raise ValueError("absurd header counts")
            file_type = None
            for _ in range(n_kv):
                key, vtype = w.text(), w.unpack("<I")
                if key == "general.file_type" and vtype in _SCALAR and vtype != 6:
                    file_type = w.unpack(_SCALAR[vtype])
                    break                              # the one key needed
                w.skip(vtype)
            if file_type is not None or not tensors_too:
                return quant_name(file_type, {})
            sizes: Counter[str] = Counter()
            for _ in range(n_tensors):
                w.text()
                n_dims = w.unpack("<I")
                if n_dims > 4:
                    raise ValueError("corrupt tensor info")
                n = 1
                for _ in range(n_dims):
                    n *= w.unpack("<Q")
                ggml_type = w.unpack("<I")
                w.take(8)                              # the data offset
                try:
                    qtype = gguf.GGMLQuantizationType(ggml_type)
                except ValueError:
                    continue
                block, nbytes = gguf.GGML_QUANT_SIZES[qtype]
                sizes[qtype.name] += n // block * nbytes
            return quant_name(None, dict(sizes))
        except (IndexError, struct.error) as exc:
            raise ValueError(f"truncated header ({exc})") from None


def describe(path: str, file_type: int | None = None, known: bool = False) -> dict:
    """{"quant", "file_bytes"} for a GGUF file; "?" where the file cannot be read.

    known: the caller (the engine's status) has already read `general.file_type` (given as
    file_type, None where the file has none), so the header is only walked for the tensor
    types, and only when file_type is None."""
    try:
        st = os.stat(path)
    except OSError:
        return {"quant": "?", "file_bytes": 0}
    if known and file_type is not None:
        return {"quant": quant_name(file_type, {}), "file_bytes": st.st_size}
    key = (os.path.abspath(path), st.st_size, int(st.st_mtime_ns))
    with _lock:
        if key in _cache:
            return dict(_cache[key])
    info = {"quant": "?", "file_bytes": st.st_size}
    try:
        info["quant"] = read_quant(path)
    except (OSError, ValueError):
        return info
    with _lock:
        _cache[key] = dict(info)
    return info


def is_mmproj(path: str) -> bool:
    """Whether a file's name says it is a vision projector (mmproj*.gguf, as the GGUFs of
    vision models ship it beside the model)."""
    name = os.path.basename(path).lower()
    return name.startswith("mmproj") and name.endswith(".gguf")


def mmproj_beside(path: str) -> str | None:
    """The vision projector in a model file's folder: the one mmproj*.gguf there, or of
    several, the one whose name holds the most of the model's (None: none there)."""
    folder = os.path.dirname(os.path.abspath(path))
    try:
        names = sorted(n for n in os.listdir(folder) if is_mmproj(n))
    except OSError:
        return None
    if not names or is_mmproj(path):
        return None
    stem = os.path.splitext(os.path.basename(path))[0].lower()

    def shared(name: str) -> int:                 # the longest common prefix, past "mmproj-"
        rest = os.path.splitext(name)[0].lower()[len("mmproj"):].lstrip("-_.")
        return len(os.path.commonprefix([rest, stem]))
    return os.path.join(folder, max(names, key=shared))
