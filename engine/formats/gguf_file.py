"""GGUF files, read through a memmap.

The one module that reads the GGUF layout: the rest of the engine sees plain Python values
and `TensorInfo` records whose `data` is a read-only numpy view straight into the mapped
file (uploads copy from it, nothing is read twice). gguf-py supplies the tensor types and
their block sizes, and dequantizes.

Every problem with a file becomes a `ModelFileError` whose message names the file and the
problem in one line; the CLI prints it and exits with status 2.

`_parse` walks the header, metadata and tensor infos with bounds checks on every count and
length, and decodes the values as it goes, the same values gguf-py's `ReaderField.contents()`
gives. gguf-py's own reader is not used: it trusts every count (on a truncated file it reads
short arrays without complaint, and an array count of 2**40 loops forever), and it keeps a
numpy view per part of every value, ~500,000 objects and ~150 MiB for SmolLM2's vocabulary,
whose churn at each load left the Python allocator's arenas pinned and RSS growing.
"""
from __future__ import annotations

import mmap
import os
import re
import stat
import struct
from dataclasses import dataclass

import numpy as np

GGUF_MAGIC = b"GGUF"
MAX_TENSORS = 1 << 20        # far beyond any real model; larger counts mean a corrupt header
MAX_KV = 1 << 16
MAX_DIM = 1 << 40            # no tensor has a dimension past this
MAX_DIMS = 4                 # GGML_MAX_DIMS
MAX_ARRAY_DEPTH = 8          # arrays of arrays: real files nest one level, if at all
DEFAULT_ALIGNMENT = 32

# GGUF metadata value types (gguf.GGUFValueType): fixed sizes, then the two variable ones.
_SCALAR_SIZE = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_STRING, _ARRAY, _UINT32 = 8, 9, 4
_MIN_SIZE = {**_SCALAR_SIZE, _STRING: 8, _ARRAY: 12}   # smallest encoding of one value
_SCALAR_FORMAT = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
                  10: "<Q", 11: "<q", 12: "<d"}
_SCALAR_DTYPE = {0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4",
                 7: "?", 10: "<u8", 11: "<i8", 12: "<f8"}


class ModelFileError(Exception):
    """A model file that cannot be used; str() is one line naming the file. `reason` says
    what kind of problem it is, for front ends to word it: "not_gguf", "truncated",
    "corrupt", "version", "tensor_type", "architecture", "incomplete" (a tensor or key
    missing), "not_found", "directory", "permission", or "" (another)."""
    code = "model_file"

    def __init__(self, path: str | os.PathLike, problem: str, reason: str = ""):
        self.path = os.fspath(path)
        self.reason = reason
        # One line whatever the problem text holds (exception messages may span several).
        self.problem = re.sub(r"\s*[\r\n]+\s*", " ", str(problem)).strip()
        super().__init__(f"{self.path}: {self.problem}")


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


def _check_header(path: str, head: bytes, size: int) -> tuple[int, int]:
    """Magic, version and counts: what gguf-py would turn into a confusing exception."""
    if size == 0:
        raise ModelFileError(path, "empty file (0 bytes), not a GGUF model",
                             "not_gguf")
    if head[:4] != GGUF_MAGIC[:len(head)]:
        # never the bytes themselves: a path can name any readable file (/etc/shadow)
        raise ModelFileError(path, "not a GGUF file (it does not start with the GGUF magic)",
                             "not_gguf")
    if size < 24:
        raise ModelFileError(path, f"truncated file: {size} bytes, shorter than a GGUF header",
                             "truncated")
    version, n_tensors, n_kv = struct.unpack("<IQQ", head[4:24])
    if version not in (2, 3):
        if version & 0xFFFF == 0 and (version >> 24) in (2, 3):
            raise ModelFileError(path, f"unsupported GGUF version: big-endian file (version "
                                       f"{version >> 24}); only little-endian files are read",
                                 "version")
        raise ModelFileError(path, f"unsupported GGUF version {version} (expected 2 or 3)",
                             "version")
    if n_tensors > MAX_TENSORS or n_kv > MAX_KV:
        raise ModelFileError(path, f"absurd header counts ({n_tensors} tensors, {n_kv} "
                                   "metadata keys): corrupt file", "corrupt")
    return n_tensors, n_kv


class _Cursor:
    """Bounds-checked little-endian reads; `where` names the part being read, for messages."""

    def __init__(self, path: str, buf, size: int):
        self.path, self.buf, self.size = path, buf, size
        self.view = memoryview(buf)
        self.pos = 24
        self.where = "header"

    def error(self, problem: str, reason: str = "corrupt") -> ModelFileError:
        return ModelFileError(self.path, f"{problem} (in {self.where}, at byte {self.pos})",
                              reason)

    def take(self, n: int) -> int:
        if n > self.size - self.pos:
            raise self.error(f"truncated or corrupt file: {n} bytes needed, "
                             f"{self.size - self.pos} left", "truncated")
        start = self.pos
        self.pos += n
        return start

    def u32(self) -> int:
        return struct.unpack_from("<I", self.buf, self.take(4))[0]

    def u64(self) -> int:
        return struct.unpack_from("<Q", self.buf, self.take(8))[0]

    def text(self) -> str:
        n = self.u64()
        start = self.take(n)
        try:
            return bytes(self.buf[start:start + n]).decode("utf-8")
        except UnicodeDecodeError:
            raise self.error("name is not valid UTF-8: corrupt file") from None

    def string(self) -> str:
        n = self.u64()
        start = self.take(n)
        try:
            return self.view[start:start + n].tobytes().decode("utf-8")
        except UnicodeDecodeError:
            raise self.error("string value is not valid UTF-8: corrupt file") from None

    def value(self, vtype: int, depth: int = 0):
        """One metadata value as gguf-py's contents() gives it: nested arrays flattened."""
        if vtype in _SCALAR_SIZE:
            return struct.unpack_from(_SCALAR_FORMAT[vtype], self.buf,
                                      self.take(_SCALAR_SIZE[vtype]))[0]
        if vtype == _STRING:
            return self.string()
        if vtype != _ARRAY:
            raise self.error(f"unknown metadata value type {vtype}: corrupt file")
        itype, count = self.u32(), self.u64()
        if itype not in _MIN_SIZE:
            raise self.error(f"unknown array item type {itype}: corrupt file")
        if itype == _ARRAY and depth + 1 >= MAX_ARRAY_DEPTH:
            raise self.error(f"arrays nested over {MAX_ARRAY_DEPTH} deep: corrupt file")
        # Bound the count by the bytes left before looping over it.
        if count * _MIN_SIZE[itype] > self.size - self.pos:
            raise self.error(f"truncated or corrupt file: array of {count} items cannot "
                             f"fit in the {self.size - self.pos} bytes left", "truncated")
        if itype in _SCALAR_SIZE:
            start = self.take(count * _SCALAR_SIZE[itype])
            return np.frombuffer(self.buf, _SCALAR_DTYPE[itype], count, start).tolist()
        if itype == _STRING:
            return [self.string() for _ in range(count)]
        out: list = []
        for _ in range(count):
            out += self.value(itype, depth + 1)
        return out


def _parse(path: str, buf, size: int, version: int, n_tensors: int, n_kv: int
           ) -> tuple[dict[str, object], list[tuple[str, tuple[int, ...], int, int, int]]]:
    """The metadata, and per tensor (name, shape, type, absolute offset, bytes), of a file
    whose whole layout is checked here (see the module docstring)."""
    c = _Cursor(path, buf, size)
    try:
        return _parse_with(c, path, size, version, n_tensors, n_kv)
    finally:
        c.view.release()        # so that the mmap can close, whatever a traceback holds


def _parse_with(c: _Cursor, path: str, size: int, version: int, n_tensors: int, n_kv: int):
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    buf = c.buf
    # gguf-py's reader lists the header's fields as metadata too
    metadata: dict[str, object] = {"GGUF.version": version, "GGUF.tensor_count": n_tensors,
                                   "GGUF.kv_count": n_kv}
    alignment = DEFAULT_ALIGNMENT
    for i in range(n_kv):
        c.where = f"metadata entry {i + 1} of {n_kv}"
        key = c.text()
        c.where = f"metadata key {key!r}"
        if key in metadata:
            raise c.error(f"duplicate metadata key {key!r}: corrupt file")
        vtype = c.u32()
        if key == "general.alignment":
            if vtype != _UINT32:
                raise c.error(f"general.alignment has value type {vtype}, expected uint32")
            alignment = c.u32()
            if alignment == 0 or alignment & (alignment - 1):
                raise c.error(f"general.alignment {alignment} is not a power of two")
            metadata[key] = alignment
        else:
            metadata[key] = c.value(vtype)

    infos = []
    names: set[str] = set()
    for i in range(n_tensors):
        c.where = f"tensor info {i + 1} of {n_tensors}"
        name = c.text()
        c.where = f"tensor info {name!r}"
        if name in names:
            raise c.error(f"duplicate tensor name {name!r}: corrupt file")
        names.add(name)
        n_dims = c.u32()
        if n_dims > MAX_DIMS:
            raise c.error(f"tensor {name!r} has {n_dims} dimensions (at most {MAX_DIMS}): "
                          "corrupt file")
        shape = struct.unpack_from(f"<{n_dims}Q", buf, c.take(8 * n_dims))
        infos.append((name, shape, c.u32(), c.u64()))
    data_start = -(-c.pos // alignment) * alignment

    tensors = []
    for name, shape, ggml_type, offset in infos:
        if ggml_type not in GGML_QUANT_SIZES:
            raise ModelFileError(path, f"tensor {name!r} has unknown tensor type id {ggml_type} "
                                       "(corrupt file, or a type newer than this gguf-py)",
                                 "tensor_type")
        if any(d == 0 for d in shape):
            raise ModelFileError(path, f"tensor {name!r} has an empty dimension: shape {shape}",
                                 "corrupt")
        if any(d > MAX_DIM for d in shape):
            raise ModelFileError(path, f"tensor {name!r} has absurd shape {shape}", "corrupt")
        type_name = GGMLQuantizationType(ggml_type).name
        block, block_bytes = GGML_QUANT_SIZES[ggml_type]
        row = shape[0] if shape else 1
        if row % block:
            raise ModelFileError(path, f"tensor {name!r} shape {shape}: rows of {row} are not "
                                       f"whole {type_name} blocks of {block}", "corrupt")
        n = 1
        for d in shape:
            n *= d
        nbytes = n // block * block_bytes
        if offset % alignment:
            raise ModelFileError(path, f"tensor {name!r} data offset {offset} is not a multiple "
                                       f"of the alignment {alignment}: corrupt file", "corrupt")
        end = data_start + offset + nbytes
        if end > size:
            raise ModelFileError(path, f"truncated or corrupt file: tensor {name!r} ({type_name} "
                                       f"{shape}) ends at byte {end}, past the end of the file "
                                       f"({size} bytes)", "truncated")
        tensors.append((name, tuple(int(d) for d in shape), ggml_type, data_start + offset,
                        nbytes))
    return metadata, tensors


def _os_reason(exc: OSError) -> str:
    return "permission" if isinstance(exc, PermissionError) else ""


def _open_checked(path: str) -> tuple[int, dict, list]:
    """Stat, header and layout checks; the file size, metadata and tensor records."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise ModelFileError(path, "no such file", "not_found") from None
    except OSError as exc:
        raise ModelFileError(path, f"cannot open: {exc.strerror or exc}",
                             _os_reason(exc)) from None
    if stat.S_ISDIR(st.st_mode):
        raise ModelFileError(path, "is a directory, not a GGUF file", "directory")
    if not stat.S_ISREG(st.st_mode):
        # A pipe or device would block or stream forever; a model is a plain file.
        raise ModelFileError(path, "not a regular file, so not a GGUF model", "not_gguf")
    size = st.st_size
    try:
        with open(path, "rb") as f:
            head = f.read(24)
            n_tensors, n_kv = _check_header(path, head, size)
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
                metadata, tensors = _parse(path, buf, min(size, len(buf)),
                                           struct.unpack_from("<I", head, 4)[0], n_tensors,
                                           n_kv)
    except OSError as exc:
        raise ModelFileError(path, f"cannot read: {exc.strerror or exc}",
                             _os_reason(exc)) from None
    return size, metadata, tensors


class GGUFFile:
    """A GGUF model file: metadata as Python values, tensors as memmap views."""

    def __init__(self, path: str | os.PathLike):
        from gguf.constants import GGMLQuantizationType

        self.path = os.fspath(path)
        self.file_size, self.metadata, infos = _open_checked(self.path)
        try:
            self._data: np.memmap | None = np.memmap(self.path, dtype=np.uint8, mode="r")
        except (OSError, ValueError) as exc:
            raise ModelFileError(self.path, f"cannot map: {exc}") from None
        self.tensors: dict[str, TensorInfo] = {}
        for name, shape, ggml_type, offset, nbytes in infos:
            self.tensors[name] = TensorInfo(
                name=name, shape=shape, ggml_type=ggml_type,
                type_name=GGMLQuantizationType(ggml_type).name, offset=offset, nbytes=nbytes,
                data=self._data[offset:offset + nbytes].view(np.ndarray))

    # -- metadata ---------------------------------------------------------------------------
    @property
    def arch(self) -> str:
        return str(self.require("general.architecture"))

    def get(self, key: str, default=None):
        return self.metadata.get(key, default)

    def require(self, key: str):
        if key not in self.metadata:
            raise ModelFileError(self.path, f"missing metadata key {key!r}", "incomplete")
        return self.metadata[key]

    # -- tensors ----------------------------------------------------------------------------
    @property
    def mapped(self) -> np.ndarray:
        """The whole file as a read-only uint8 memmap (tensor offsets index into it)."""
        return self._data

    def tensor(self, name: str) -> TensorInfo:
        try:
            return self.tensors[name]
        except KeyError:
            raise ModelFileError(self.path, f"missing tensor {name!r}", "incomplete") from None

    def dequantize(self, name: str) -> np.ndarray:
        """The tensor as float32 in numpy order (shape reversed from ggml's)."""
        import gguf

        t = self.tensor(name)
        qtype = gguf.GGMLQuantizationType(t.ggml_type)
        out = gguf.quants.dequantize(t.data, qtype)
        return np.asarray(out, dtype=np.float32).reshape(tuple(reversed(t.shape)))

    def close(self) -> None:
        # Dropping the memmap unmaps the file once no TensorInfo view is alive.
        self._data = None
        self.tensors = {}

    def __enter__(self) -> "GGUFFile":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
