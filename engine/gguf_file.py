"""GGUF files, read through a memmap.

The one module that touches gguf-py's reader and its ReaderField indirection: the rest of
the engine sees plain Python values and `TensorInfo` records whose `data` is a read-only
numpy view straight into the mapped file (uploads copy from it, nothing is read twice).

Every problem with a file becomes a `ModelFileError` whose message names the file and the
problem in one line; the CLI prints it and exits with status 2.
"""
from __future__ import annotations

import os
import struct
from dataclasses import dataclass

import numpy as np

GGUF_MAGIC = b"GGUF"
MAX_TENSORS = 1 << 20        # far beyond any real model; larger counts mean a corrupt header
MAX_KV = 1 << 16
MAX_DIM = 1 << 40            # no tensor has a dimension past this


class ModelFileError(Exception):
    """A model file that cannot be used; str() is one line naming the file."""

    def __init__(self, path: str | os.PathLike, problem: str):
        self.path = os.fspath(path)
        self.problem = problem
        super().__init__(f"{self.path}: {problem}")


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]      # ggml order: shape[0] is the contiguous (row) length
    ggml_type: int              # gguf.GGMLQuantizationType value
    type_name: str
    offset: int                 # absolute byte offset in the file
    nbytes: int
    data: np.ndarray            # uint8 view into the memmap, nbytes long

    @property
    def n_elements(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n


def _check_header(path: str, size: int) -> None:
    """Catch what gguf-py would turn into a confusing exception or a huge allocation."""
    if size < 24:
        raise ModelFileError(path, f"truncated file ({size} bytes), not a GGUF model")
    with open(path, "rb") as f:
        head = f.read(24)
    if head[:4] != GGUF_MAGIC:
        raise ModelFileError(path, f"wrong magic {head[:4]!r}, expected b'GGUF': not a GGUF model")
    version, n_tensors, n_kv = struct.unpack("<IQQ", head[4:24])
    if version not in (2, 3):
        raise ModelFileError(path, f"unsupported GGUF version {version} (expected 2 or 3)")
    if n_tensors > MAX_TENSORS or n_kv > MAX_KV:
        raise ModelFileError(path, f"absurd header counts ({n_tensors} tensors, {n_kv} "
                                   "metadata keys): corrupt file")


def _explain(exc: Exception) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if "GGMLQuantizationType" in text:
        return f"unknown tensor type ({text})"
    if isinstance(exc, (IndexError, struct.error)) or "buffer" in text or "offset" in text:
        return f"truncated or corrupt file ({text})"
    return f"corrupt GGUF file ({text})"


class GGUFFile:
    """A GGUF model file: metadata as Python values, tensors as memmap views."""

    def __init__(self, path: str | os.PathLike):
        import gguf  # deferred: importing gguf-py costs ~100 ms

        self.path = os.fspath(path)
        if not os.path.exists(self.path):
            raise ModelFileError(self.path, "no such file")
        if os.path.isdir(self.path):
            raise ModelFileError(self.path, "is a directory, not a GGUF file")
        self.file_size = os.path.getsize(self.path)
        _check_header(self.path, self.file_size)
        try:
            reader = gguf.GGUFReader(self.path, "r")
        except MemoryError:
            raise ModelFileError(self.path, "absurd sizes in header: corrupt file") from None
        except Exception as exc:  # gguf-py raises bare ValueError/IndexError on bad input
            raise ModelFileError(self.path, _explain(exc)) from None
        self._reader = reader
        self.metadata: dict[str, object] = {}
        for key, field in reader.fields.items():
            try:
                self.metadata[key] = field.contents()
            except Exception as exc:
                raise ModelFileError(self.path, f"unreadable metadata key {key!r} ({exc})") from None
        self.tensors: dict[str, TensorInfo] = {}
        for t in reader.tensors:
            shape = tuple(int(d) for d in t.shape)
            if any(d <= 0 or d > MAX_DIM for d in shape):
                raise ModelFileError(self.path, f"tensor {t.name} has absurd shape {shape}")
            end = int(t.data_offset) + int(t.n_bytes)
            if end > self.file_size:
                raise ModelFileError(self.path, f"truncated file: tensor {t.name} ends at byte "
                                                f"{end} but the file has {self.file_size}")
            raw = np.asarray(t.data).reshape(-1).view(np.uint8)
            self.tensors[t.name] = TensorInfo(
                name=t.name, shape=shape, ggml_type=int(t.tensor_type),
                type_name=t.tensor_type.name, offset=int(t.data_offset),
                nbytes=int(t.n_bytes), data=raw)

    # -- metadata ---------------------------------------------------------------------------
    @property
    def arch(self) -> str:
        return str(self.require("general.architecture"))

    def get(self, key: str, default=None):
        return self.metadata.get(key, default)

    def require(self, key: str):
        if key not in self.metadata:
            raise ModelFileError(self.path, f"missing metadata key {key!r}")
        return self.metadata[key]

    # -- tensors ----------------------------------------------------------------------------
    def tensor(self, name: str) -> TensorInfo:
        try:
            return self.tensors[name]
        except KeyError:
            raise ModelFileError(self.path, f"missing tensor {name!r}") from None

    def dequantize(self, name: str) -> np.ndarray:
        """The tensor as float32 in numpy order (shape reversed from ggml's)."""
        import gguf

        t = self.tensor(name)
        qtype = gguf.GGMLQuantizationType(t.ggml_type)
        out = gguf.quants.dequantize(t.data, qtype)
        return np.asarray(out, dtype=np.float32).reshape(tuple(reversed(t.shape)))

    def close(self) -> None:
        # Dropping the reader releases the memmap once no TensorInfo view is alive.
        self._reader = None
        self.tensors = {}

    def __enter__(self) -> "GGUFFile":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
