"""Recorded graphs: kernels dispatched into one command buffer, replayed with one submit.

`Graph.op()` binds buffers, packs push constants from keyword arguments, and inserts a
memory barrier only when the op touches a buffer written since the last barrier or writes
one read since then, so independent ops (the q, k and v projections) run back to back.
"""
from __future__ import annotations

from . import vk
from .kernels import KernelCache

SETS_PER_POOL = 256


MAX_PROFILED_OPS = 4095


class Graph:
    """With profile=True a timestamp follows every op; `profile()` gives per-op GPU times."""

    def __init__(self, dev: vk.Device, kernels: KernelCache, label: str = "graph",
                 profile: bool = False):
        self.dev, self.kernels, self.label = dev, kernels, label
        self.cmd = vk.CommandList(dev)
        self._ts = vk.TimestampPool(dev, MAX_PROFILED_OPS + 1) if profile else None
        self._op_names: list[str] = []
        if self._ts:
            self.cmd.reset_timestamps(self._ts)
            self.cmd.timestamp(self._ts, 0)
        self._pools: list[vk.DescriptorArena] = []
        self._pool_left = 0
        self._dirty: set[int] = set()       # ids of buffers written since the last barrier
        self._read: set[int] = set()        # and of those only read since then
        self._writes: dict[int, int] = {}   # id of a buffer -> the count of writes recorded
        self._n_writes = 0                  # when it was last written
        self.n_ops = 0
        self.finished = False
        self.replays = 0                    # submits so far (profile() reads the last one's)

    def _descriptor_set(self, kernel, bindings):
        if self._pool_left == 0:
            self._pools.append(vk.DescriptorArena(self.dev, SETS_PER_POOL, SETS_PER_POOL * 6))
            self._pool_left = SETS_PER_POOL
        self._pool_left -= 1
        return self._pools[-1].make_set(kernel, bindings)

    def op(self, name: str, buffers: list, groups: tuple[int, int, int], wtype: str | None = None,
           spec: dict[str, int] | None = None, indirect: tuple[vk.Buffer, int] | None = None,
           writes: tuple[int, ...] = (), **push) -> None:
        """buffers: Buffer, or (Buffer, byte_offset, byte_range) for a window of one;
        writes: bindings a mode of the kernel writes beside those its spec names."""
        kernel, ks = self.kernels.get(name, wtype, **(spec or {}))
        if len(buffers) != ks.n_buffers:
            raise TypeError(f"{name} binds {ks.n_buffers} buffers, got {len(buffers)}")
        bindings = [b if isinstance(b, tuple) else (b, 0, b.nbytes) for b in buffers]
        for b in bindings:
            if b[0].released:
                raise ValueError(f"{name}: buffer {b[0].label} is released")
        touched = {id(b[0]) for b in bindings}
        written = {id(bindings[i][0]) for i in ks.writes + writes}
        # read after write, and write after read: an op must not overwrite what an op
        # since the last barrier may still be reading
        if touched & self._dirty or written & self._read:
            self.cmd.barrier()
            self._dirty, self._read = set(), set()
        self._dirty |= written
        self._read |= touched - written
        for i in written:
            self._wrote(i)
        ds = self._descriptor_set(kernel, bindings)
        self.cmd.dispatch(kernel, ds, ks.pack(**push) if ks.push else b"", groups, indirect)
        self.n_ops += 1
        if self._ts and self.n_ops <= MAX_PROFILED_OPS:
            self._op_names.append(kernel.name)
            self.cmd.timestamp(self._ts, self.n_ops)

    def copy(self, src: vk.Buffer, src_off: int, dst: vk.Buffer, dst_off: int, nbytes: int):
        if {id(src), id(dst)} & self._dirty or id(dst) in self._read:
            self.cmd.barrier()
            self._dirty, self._read = set(), set()
        self.cmd.copy(src, src_off, dst, dst_off, nbytes)
        self._dirty.add(id(dst))
        self._wrote(id(dst))
        self._read.add(id(src))

    def fill(self, dst: vk.Buffer, value: int) -> None:
        if id(dst) in self._dirty or id(dst) in self._read:
            self.cmd.barrier()
            self._dirty, self._read = set(), set()
        self.cmd.fill(dst, value)
        self._dirty.add(id(dst))
        self._wrote(id(dst))

    def _wrote(self, buf_id: int) -> None:
        self._n_writes += 1
        self._writes[buf_id] = self._n_writes

    def last_write(self, buf: vk.Buffer) -> int:
        """A stamp of buf's last write recorded in this graph (by an op, a copy or a fill),
        0 if none: what was made from buf stays valid while the stamp stays the same."""
        return self._writes.get(id(buf), 0)

    def barrier(self) -> None:
        self.cmd.barrier()
        self._dirty, self._read = set(), set()

    def finish(self) -> "Graph":
        self.cmd.finish()
        self.finished = True
        return self

    def replay(self, wait: bool = True) -> None:
        if not self.finished:
            self.finish()
        self.dev.submit([self.cmd.cmd], wait=wait)
        self.replays += 1

    def profile(self) -> list[tuple[str, float]]:
        """(kernel variant, GPU ns) per op of the last replay."""
        if not self._ts:
            raise ValueError("graph was not recorded with profile=True")
        if not self.replays:
            raise ValueError(f"{self.label}: no replay to profile yet")
        ns = self._ts.read_ns(len(self._op_names) + 1)
        return [(n, float(ns[i + 1] - ns[i])) for i, n in enumerate(self._op_names)]

    def close(self) -> None:
        if self._ts:
            self._ts.close()
        self.cmd.close()
        for p in self._pools:
            p.close()
        self._pools = []


def run_once(dev: vk.Device, kernels: KernelCache, name: str, buffers: list,
             groups: tuple[int, int, int], **kw) -> None:
    """Record, submit and wait for a single op (tests and one-off work)."""
    g = Graph(dev, kernels, name)
    try:
        g.op(name, buffers, groups, **kw)
        g.replay()
    finally:
        g.close()
