"""The prompt cache on disk: a model's KV cache and the tokens it holds, kept in a file of the
user's cache folder so that it survives a restart of the server or of the machine.

The engine saves it when a model is unloaded (and so on a clean exit) and reads it back when
the same file is loaded again: the first request with the same prefix then reuses it, as it
would have before the restart (`cached_tokens`), and answers the same.

A file is used only where everything that made its KV is the same: the model file (its size,
modification time and a hash of its header), the context size and KV layout, the device and
the kernels' paths and sources. Anything else, or a file that is truncated or corrupt (a
digest over all of it), is ignored and removed with a log line. A folder that cannot be
written, or a full disk, costs the saved cache and nothing else: a warning, and the next
start recomputes. The folder holds at most `HOTSEAT_CACHE_MIB` (default 4096 MiB): the
least recently used files go first.

Layout: MAGIC, a u32 header length, the header (JSON: identity, settings, tokens, the KV
layers and the bytes of each), each layer's used rows, then a SHA-256 of all that.

Recurrent models (lfm2, the delta-net hybrids) keep their prompt cache in memory only: their
states belong to one position and are not written here.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import struct
import tempfile
import time
from pathlib import Path

import numpy as np

from ..gpu import vk

log = logging.getLogger("hotseat")

MAGIC = b"HOTSEAT-KV\x00\x01"
SUFFIX = ".kv"
SPILL = ".spill"                 # a KV shadow under the host budget (engine/residency/model.py)
DEFAULT_LIMIT_MIB = 4096
_SOURCES: str | None = None      # the kernels' digest, computed once


def cache_dir() -> Path:
    """$HOTSEAT_CACHE_DIR, else the user's cache folder (platformdirs) / prompt-cache."""
    if os.environ.get("HOTSEAT_CACHE_DIR"):
        return Path(os.environ["HOTSEAT_CACHE_DIR"])
    import platformdirs

    return Path(platformdirs.user_cache_dir("hotseat")) / "prompt-cache"


def limit_bytes() -> int:
    """The folder's bound: $HOTSEAT_CACHE_MIB (0: nothing is saved)."""
    value = os.environ.get("HOTSEAT_CACHE_MIB", str(DEFAULT_LIMIT_MIB))
    try:
        mib = int(value)
    except ValueError:
        raise ValueError(f"HOTSEAT_CACHE_MIB must be a whole number of MiB, got {value!r}") \
            from None
    if mib < 0:
        raise ValueError(f"HOTSEAT_CACHE_MIB must not be negative, got {mib}")
    return mib << 20


def kernels_digest() -> str:
    """A digest of the kernels' sources: other kernels may compute other KV bits."""
    global _SOURCES
    if _SOURCES is None:
        root = Path(__file__).resolve().parents[2] / "shaders"
        h = hashlib.sha256()
        for p in sorted(root.rglob("*")):
            if p.suffix in (".comp", ".glsl") or p.name == "registry.py":
                h.update(p.relative_to(root).as_posix().encode() + b"\0" + p.read_bytes())
        _SOURCES = h.hexdigest()
    return _SOURCES


def identity(model) -> dict:
    """What makes a model's KV: its file and the settings it runs with."""
    g = model.gguf
    st = os.stat(g.path)
    start = min((t.offset for t in g.tensors.values()), default=g.file_size)
    return {
        "file": {"size": st.st_size, "mtime_ns": st.st_mtime_ns,
                 "header_sha256": hashlib.sha256(g.mapped[:start].tobytes()).hexdigest()},
        "n_ctx": model.n_ctx,
        "device": model.dev.name,
        "paths": repr(model.paths),
        "numerics": bool(model.tuning.ggml_numerics),
        "flash_attn": bool(model.uses_flash_attn),
        "kernels": kernels_digest(),
    }


def path_for(model, spill: bool = False, ident: dict | None = None) -> Path:
    """The file of a model's cache, named by its identity (`ident`, where the caller has it
    already); spill: the file its KV shadow moves to under the host budget, this process's
    and this name's alone."""
    ident = identity(model) if ident is None else ident
    name = hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()
    if not spill:
        return cache_dir() / (name[:32] + SUFFIX)
    who = hashlib.sha256(model.name.encode()).hexdigest()[:8]
    return cache_dir() / f"{name[:32]}-{os.getpid()}-{who}{SPILL}"


def remove_stale_spills() -> int:
    """Remove the spill files of processes that are gone (a crash left them); how many."""
    folder = cache_dir()
    n = 0
    for p in folder.glob("*" + SPILL) if folder.is_dir() else ():
        try:
            pid = int(p.name.split("-")[1])
            os.kill(pid, 0)
        except ProcessLookupError:
            remove(p)
            n += 1
        except (ValueError, IndexError, PermissionError, OSError):
            pass
    return n


# -- saving ----------------------------------------------------------------------------------

def save(model, spill: bool = False) -> Path | None:
    """Write the model's KV cache and tokens to its file (a warning and None where it cannot
    be written); nothing for an empty cache or a recurrent model. A model whose KV shadow
    was spilled has its spill file kept as its cache. spill: to its spill file, from its
    host shadow, whatever the folder's bound."""
    if (model.recurrent and not spill) or not model.cache_tokens \
            or (not spill and not limit_bytes()):
        return None
    ident = identity(model)                     # hashes the file's header: once
    target = path_for(model, spill, ident)
    if model.kv_on_disk is not None:                    # it is in a file already
        try:
            os.replace(model.kv_on_disk, target)
        except OSError:
            return None
        model.kv_on_disk = str(target)
        trim()
        return target
    if model.rs is None and not model.kv_shadow:
        return None
    try:
        layers, used, chunks = _kv_rows(model)
    except vk.VulkanError as exc:            # a failed device: its KV is not to be trusted
        log.warning("prompt cache of %s not saved: %s", model.name, exc)
        return None
    if not used:
        return None
    header = {"model": model.name, "path": model.gguf.path, "identity": ident,
              "tokens": list(model.cache_tokens), "layers": layers, "row_bytes": used,
              "prompt_tokens": min(model.prompt_upto, len(model.cache_tokens)),
              "saved": time.time()}
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        _write(target, header, chunks)
    except OSError as exc:
        what = "KV shadow of %s not moved to disk in %s (it stays in RAM): %s" if spill \
            else "prompt cache of %s not saved in %s: %s"
        log.warning(what, model.name, target.parent,
                    os.strerror(exc.errno) if exc.errno else exc)
        return None
    if not spill:
        trim()
    return target


def _kv_rows(model) -> tuple[list[str], int, list[np.ndarray]]:
    """(layer names, bytes per layer, each layer's used rows) from the device or from the
    host shadow."""
    if model.rs is not None:
        used = len(model.cache_tokens) * model.rs.kv_row_bytes
        pairs = model._kv_buffers()
        return [n for n, _ in pairs], used, \
            vk.download_many(model.dev, [(buf, used) for _, buf in pairs]) if used else []
    host, used, layers = model.kv_shadow
    if host is None:
        return list(layers), 0, []
    return list(layers), used, [np.asarray(host.view[i * used:(i + 1) * used])
                                for i in range(len(layers))]


def _write(target: Path, header: dict, chunks: list[np.ndarray]) -> None:
    """Into a temporary file of the same folder, then renamed over the target: a reader
    never sees half a file."""
    head = json.dumps(header).encode()
    h = hashlib.sha256()
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".part-")
    try:
        with os.fdopen(fd, "wb") as f:
            for part in [MAGIC, struct.pack("<I", len(head)), head] + \
                    [memoryview(c).cast("B") for c in chunks]:
                h.update(part)
                f.write(part)
            f.write(h.digest())
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def save_states(model, arrays: dict[str, np.ndarray]) -> Path | None:
    """A recurrent model's states under the host budget: an .npz beside its KV's spill
    file (a warning and None where it cannot be written)."""
    target = path_for(model, spill=True).with_suffix(".states" + SPILL)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".part-")
        try:
            with os.fdopen(fd, "wb") as f:
                np.savez(f, **arrays)
            os.replace(tmp, target)
        except BaseException:
            remove(tmp)
            raise
    except OSError as exc:
        log.warning("recurrent states of %s not moved to disk in %s (they stay in RAM): %s",
                    model.name, target.parent, os.strerror(exc.errno) if exc.errno else exc)
        return None
    return target


def load_states(path: str | Path) -> dict[str, np.ndarray] | None:
    """save_states()' arrays; None (with a log line) where the file is gone or damaged."""
    try:
        with np.load(path, allow_pickle=False) as z:
            return {k: z[k] for k in z.files}
    except (OSError, ValueError, KeyError) as exc:
        log.warning("recurrent states %s lost: %s", path, exc)
        return None


# -- loading ---------------------------------------------------------------------------------

def load(model, path: str | Path | None = None) -> int:
    """Give a cold model, whose run state is not made yet, the KV cache and tokens of its
    file (or of `path`: its spill file), which the next restore uploads; the tokens taken.
    A file that does not belong to it, or is damaged, is removed with a log line."""
    if (model.recurrent and path is None) or model.rs is not None \
            or model.kv_shadow is not None:
        return 0
    want = identity(model)                      # hashes the file's header: once
    path = Path(path) if path is not None else path_for(model, ident=want)
    if not path.exists():
        return 0
    try:
        header, data = _read(path)
        got = header["identity"]
        if got != want:
            why = ", ".join(k for k in sorted(set(got) | set(want)) if got.get(k) != want.get(k))
            raise _Unusable(f"made with another {why}")
        layers, used, tokens = header["layers"], int(header["row_bytes"]), header["tokens"]
        if not 0 < len(tokens) <= model.n_ctx or len(data) != used * len(layers):
            raise _Unusable("its sizes do not add up")
        expected = [f"{kind}{i}" for kind in "kv" for i in _kv_layers(model)]
        if layers != expected or used != len(tokens) * _row_bytes(model):
            raise _Unusable("its KV layout is not this model's")
        # the first tokens prompt passes computed (Model.reusable); none for a file without it
        prompt = header.get("prompt_tokens", 0)
        if type(prompt) is not int or not 0 <= prompt <= len(tokens):
            raise _Unusable(f"its count of prompt tokens ({prompt!r}) does not fit its tokens")
    except (_Unusable, OSError, ValueError, KeyError, TypeError) as exc:
        log.warning("prompt cache %s ignored and removed: %s", path, exc)
        remove(path)
        return 0
    host = model.dev.allocator.alloc(len(data), f"{model.name}/kv_shadow", "shadow", host=True)
    host.view[:len(data)] = np.frombuffer(data, np.uint8)
    model.kv_shadow = (host, used, layers)
    model.cache_tokens = list(tokens)
    model.prompt_upto = prompt
    os.utime(path)                                      # recently used: trimmed last
    return len(tokens)


class _Unusable(ValueError):
    pass


def _read(path: Path) -> tuple[dict, bytes]:
    raw = path.read_bytes()
    if len(raw) < len(MAGIC) + 4 + 32 or not raw.startswith(MAGIC):
        raise _Unusable("not a prompt cache file, or truncated")
    body, digest = raw[:-32], raw[-32:]
    if hashlib.sha256(body).digest() != digest:
        raise _Unusable("its digest does not match: truncated or damaged")
    n = struct.unpack_from("<I", body, len(MAGIC))[0]
    start = len(MAGIC) + 4
    header = json.loads(body[start:start + n])
    return header, body[start + n:]


def _kv_layers(model) -> list[int]:
    """The attention layers whose K and V the run state will hold."""
    kv = model.config.state().kv_layers
    return list(range(model.config.n_layer)) if kv is None else list(kv)


def _row_bytes(model) -> int:
    return 2 * model.config.n_head_kv * model.config.head_dim      # f16 K (or V) of a token


def remove(path: str | Path) -> None:
    try:
        Path(path).unlink()
    except OSError:
        pass


# -- the folder ------------------------------------------------------------------------------

def entries() -> list[dict]:
    """Every cache file, most recently used first: its model, tokens, bytes and age."""
    out = []
    folder = cache_dir()
    for p in folder.glob("*" + SUFFIX) if folder.is_dir() else ():
        st = p.stat()
        entry = {"file": str(p), "bytes": st.st_size, "used": st.st_mtime}
        try:
            with open(p, "rb") as f:
                head = f.read(len(MAGIC) + 4)
                n = struct.unpack_from("<I", head, len(MAGIC))[0]
                header = json.loads(f.read(n))
            entry.update(model=header.get("model"), path=header.get("path"),
                         tokens=len(header.get("tokens", ())))
        except (OSError, ValueError, struct.error):
            entry.update(model=None, path=None, tokens=None)
        out.append(entry)
    return sorted(out, key=lambda e: -e["used"])


def trim(limit: int | None = None) -> list[str]:
    """Remove the least recently used files until the folder holds at most `limit` bytes
    (limit_bytes() by default); the files removed."""
    limit = limit_bytes() if limit is None else limit
    files = entries()
    total = sum(e["bytes"] for e in files)
    gone = []
    while files and total > limit:
        e = files.pop()                                 # the least recently used
        remove(Path(e["file"]))
        total -= e["bytes"]
        gone.append(e["file"])
    return gone


def clear() -> int:
    """Remove every cache file (and what an interrupted save left); how many."""
    folder = cache_dir()
    if not folder.is_dir():
        return 0
    n = 0
    for p in list(folder.glob("*" + SUFFIX)) + list(folder.glob(".part-*")):
        remove(p)
        n += p.suffix == SUFFIX
    return n
