"""The arena's shared VRAM pool: device memory that every Hotseat process of the arena keeps
mapped, used by one process at a time, the token's holder.

Allocating and freeing device memory is slow: on an H200's driver vkAllocateMemory costs
about 23 ms per GiB and vkFreeMemory as much, whatever the block size or the number of
threads, so a swap that frees one model's memory in one process and allocates the next
model's in another costs about 45 ms per GiB before a byte is copied, more than the copy
itself (21 ms per GiB). Importing memory another process exported costs about 11 ms per
GiB and freeing that import 10 ms per GiB: mapping is the cost. So the memory is mapped
once and kept:

- The holder's allocator takes device blocks from this pool (`take`): a block it has mapped
  and nobody uses, else one in the arena's manifest that it has not mapped yet (its fd is
  fetched from a member that has it, over that member's socket, and imported), else a new
  exportable block, which it adds to the manifest. An emptied block comes back (`give`),
  still mapped. Only the holder uses the pool's memory: a process uses a block only while
  it holds the token, so the processes' buffers overlap in time-shared memory, and a cold
  process holds nothing of it in use (its KV cache went to host memory at the release).
- The manifest (`pool.json` in the arena directory) lists the pool's blocks: id, size,
  memory type. Only the holder writes it.
- Each process serves the fds of the blocks it has mapped on a Unix socket
  (`members/<pid>.sock`, in the arena's private directory): a request is one JSON line
  `{"ids": [...]}`, the answer one JSON line `{"ids": [...]}` of those it has, with their
  fds attached (SCM_RIGHTS).
- The memory is given back to the device when every process has dropped it (`drop_idle`):
  at a yield, when game mode gives the GPU up, when the token is left free with nobody
  asking for it, and at exit. The driver frees the memory with its last mapping.
"""
from __future__ import annotations

import json
import logging
import os
import secrets
import socket
import threading
import time

from ..gpu import vk
from .arena import MEMBERS_DIR, open_private, prepare_dir

log = logging.getLogger(__name__)

POOL_FILE = "pool.json"
POOL_ENV = "HOTSEAT_SHARED_POOL"   # "0": each process allocates and frees its own memory
POOL_BLOCK = 1 << 30           # blocks are at least this large, so models' arenas fit them
MAX_REQUEST = 1 << 16


def enabled(dev: vk.Device) -> bool:
    """Whether an arena member on `dev` uses the shared pool: where the driver shares
    memory as opaque fds, unless $HOTSEAT_SHARED_POOL is 0."""
    off = os.environ.get(POOL_ENV, "").strip().lower() in ("0", "no", "false", "off")
    return dev.shares_memory and not off


class SharedPool:
    """This process's view of the arena's pool on `dev` (see the module's docstring).
    `stats` counts blocks created, imported and dropped here, and the seconds spent."""

    def __init__(self, arena_dir: str, dev: vk.Device):
        self.dev = dev
        self.dir = arena_dir
        self.manifest_path = os.path.join(arena_dir, POOL_FILE)
        self.pid = os.getpid()
        self._lock = threading.Lock()
        self._mapped: dict[str, tuple[vk._Block, int]] = {}    # id -> (block, our fd of it)
        self._free: set[str] = set()                            # mapped, not in use here
        self.stats = {"created": 0, "imported": 0, "dropped": 0, "create_s": 0.0,
                      "import_s": 0.0, "drop_s": 0.0}
        members = prepare_dir(os.path.join(arena_dir, MEMBERS_DIR))
        # named apart from the member file; two engines of one process each have their own
        self.sock_path = os.path.join(members, f"{self.pid}.{secrets.token_hex(4)}.sock")
        try:
            os.unlink(self.sock_path)
        except FileNotFoundError:
            pass
        self._server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._server.bind(self.sock_path)
        os.chmod(self.sock_path, 0o600)
        self._server.listen(8)
        self._closed = False
        threading.Thread(target=self._serve, name="hotseat-pool", daemon=True).start()

    # -- the allocator's side (the holder, on the engine thread) --------------------------
    def take(self, type_index: int, size: int) -> vk._Block:
        """A block of at least `size` bytes of memory type `type_index`, mapped here."""
        with self._lock:
            fits = [i for i in self._free if self._mapped[i][0].type_index == type_index
                    and self._mapped[i][0].size >= size]
            if fits:
                best = min(fits, key=lambda i: self._mapped[i][0].size)
                self._free.discard(best)
                return self._mapped[best][0]
        manifest = self._read_manifest()
        wanted = [b for b in manifest if b["id"] not in self._mapped
                  and b["type"] == type_index and b["size"] >= size]
        if wanted:
            got = self._fetch([b["id"] for b in sorted(wanted, key=lambda b: b["size"])])
            for b in sorted(wanted, key=lambda b: b["size"]):
                fd = got.pop(b["id"], None)
                if fd is None:
                    continue
                block = self._import(b, fd)
                if block is not None:
                    for other in got.values():
                        os.close(other)
                    return block
            # the rest of the manifest's blocks that nobody serves are gone (their
            # processes dropped them or died): forget them
            live = self._fetchable_ids(manifest)
            manifest = [b for b in manifest if b["id"] in live or b["id"] in self._mapped]
        t0 = time.perf_counter()
        block = vk._Block(self.dev, type_index, max(POOL_BLOCK, size), export=True)
        try:
            fd = block.export_fd()
        except BaseException:
            block.close()
            raise
        block.pool_id = secrets.token_hex(8)
        with self._lock:
            self._mapped[block.pool_id] = (block, fd)
        self.stats["created"] += 1
        self.stats["create_s"] += time.perf_counter() - t0
        manifest.append({"id": block.pool_id, "size": block.size, "type": type_index})
        self._write_manifest(manifest)
        return block

    def give(self, block: vk._Block) -> None:
        """An emptied block back: it stays mapped for the next turn."""
        with self._lock:
            if block.pool_id in self._mapped:
                self._free.add(block.pool_id)

    def mapped_bytes(self) -> int:
        with self._lock:
            return sum(b.size for b, _ in self._mapped.values())

    def idle_bytes(self) -> int:
        """Mapped here and not in use: what the next allocations take first."""
        with self._lock:
            return sum(self._mapped[i][0].size for i in self._free)

    def drop_idle(self) -> int:
        """Unmap every block this process has mapped and does not use (its fd closed too);
        the bytes dropped. The device gets the memory back once no process maps it."""
        t0 = time.perf_counter()
        with self._lock:
            ids = list(self._free)
            dropped = [self._mapped.pop(i) for i in ids]
            self._free.clear()
        for block, fd in dropped:
            block.close()
            os.close(fd)
        if dropped:
            self.stats["dropped"] += len(dropped)
            self.stats["drop_s"] += time.perf_counter() - t0
        return sum(b.size for b, _ in dropped)

    def describe(self) -> dict:
        with self._lock:
            n, free = len(self._mapped), len(self._free)
            mapped = sum(b.size for b, _ in self._mapped.values())
        return {"mapped_bytes": mapped, "blocks": n, "idle_blocks": free, **self.stats}

    def close(self) -> None:
        """Drop every block (in use or not: the allocator is closing) and stop serving."""
        self._closed = True
        with self._lock:
            self._free = set(self._mapped)
        self.drop_idle()
        try:
            self._server.close()
            os.unlink(self.sock_path)
        except OSError:
            pass

    # -- the manifest -----------------------------------------------------------------------
    def _read_manifest(self) -> list[dict]:
        try:
            fd = open_private(self.manifest_path, os.O_RDONLY)
        except Exception:
            return []
        try:
            data = os.read(fd, 1 << 20)
        finally:
            os.close(fd)
        try:
            obj = json.loads(data.decode() or "{}")
        except ValueError:
            return []
        out = []
        for b in obj.get("blocks", []) if isinstance(obj, dict) else []:
            if isinstance(b, dict) and isinstance(b.get("id"), str) \
                    and type(b.get("size")) is int and type(b.get("type")) is int:
                out.append({"id": b["id"], "size": b["size"], "type": b["type"]})
        return out

    def _write_manifest(self, blocks: list[dict]) -> None:
        tmp = self.manifest_path + f".{self.pid}.tmp"
        fd = open_private(tmp, os.O_WRONLY | os.O_TRUNC)
        try:
            os.write(fd, json.dumps({"blocks": blocks}).encode())
        finally:
            os.close(fd)
        os.replace(tmp, self.manifest_path)

    # -- fds between processes --------------------------------------------------------------
    def _import(self, entry: dict, fd: int) -> vk._Block | None:
        t0 = time.perf_counter()
        keep = os.dup(fd)                      # the driver takes fd; ours serves others
        try:
            block = vk._Block(self.dev, entry["type"], entry["size"], fd=fd)
        except Exception as exc:               # refused: the fd is still ours to close
            log.warning("pool block %s not imported: %s", entry["id"], exc)
            os.close(fd)
            os.close(keep)
            return None
        block.pool_id = entry["id"]
        with self._lock:
            self._mapped[entry["id"]] = (block, keep)
        self.stats["imported"] += 1
        self.stats["import_s"] += time.perf_counter() - t0
        return block

    def _peers(self) -> list[str]:
        d = os.path.join(self.dir, MEMBERS_DIR)
        try:
            names = os.listdir(d)
        except FileNotFoundError:
            return []
        mine = os.path.basename(self.sock_path)
        return [os.path.join(d, n) for n in sorted(names) if n.endswith(".sock") and n != mine]

    def _ask(self, path: str, ids: list[str]) -> dict[str, int]:
        """Ask one member for fds of `ids`: {id: fd} of those it has."""
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(2.0)
        try:
            try:
                s.connect(path)
            except (ConnectionRefusedError, FileNotFoundError):
                try:                            # its process is gone
                    os.unlink(path)
                except OSError:
                    pass
                return {}
            s.sendall(json.dumps({"ids": ids}).encode() + b"\n")
            msg, fds, _, _ = socket.recv_fds(s, MAX_REQUEST, 64)
            try:
                have = json.loads(msg.decode()).get("ids", [])
            except ValueError:
                have = []
            if len(have) != len(fds):
                for fd in fds:
                    os.close(fd)
                return {}
            return dict(zip(have, fds))
        except OSError as exc:
            log.warning("pool member %s did not answer: %s", path, exc)
            return {}
        finally:
            s.close()

    def _fetch(self, ids: list[str]) -> dict[str, int]:
        out: dict[str, int] = {}
        for path in self._peers():
            missing = [i for i in ids if i not in out]
            if not missing:
                break
            out.update(self._ask(path, missing))
        return out

    def _fetchable_ids(self, manifest: list[dict]) -> set[str]:
        got = self._fetch([b["id"] for b in manifest if b["id"] not in self._mapped])
        for fd in got.values():
            os.close(fd)
        return set(got)

    def _serve(self) -> None:
        while not self._closed:
            try:
                conn, _ = self._server.accept()
            except OSError:
                return
            try:
                conn.settimeout(2.0)
                data = b""
                while not data.endswith(b"\n") and len(data) < MAX_REQUEST:
                    chunk = conn.recv(4096)
                    if not chunk:
                        break
                    data += chunk
                try:
                    ids = json.loads(data.decode()).get("ids", [])
                except (ValueError, AttributeError):
                    ids = []
                with self._lock:
                    have = [i for i in ids if isinstance(i, str) and i in self._mapped][:64]
                    fds = [os.dup(self._mapped[i][1]) for i in have]
                try:
                    socket.send_fds(conn, [json.dumps({"ids": have}).encode()], fds)
                finally:
                    for fd in fds:
                        os.close(fd)
            except OSError as exc:
                log.warning("pool request not answered: %s", exc)
            finally:
                conn.close()
