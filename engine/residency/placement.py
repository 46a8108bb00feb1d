"""Where a model's weights live: which tensors the GPU reads from host memory (cpu_moe, like
llama.cpp's --n-cpu-moe with a fraction), and how every tensor is packed into the weight
arenas, split by rows past the device's storage-buffer range.

Placement moves bytes, not work: the graphs and their results are the same wherever a
tensor sits.
"""
from __future__ import annotations

import math
from typing import Callable, NamedTuple

from ..formats.gguf_file import GGUFFile, ModelFileError
from ..gpu import vk

ARENA_BYTES = 1 << 30          # weights are packed into buffers of at most this size


class PlacementError(ValueError):
    """A cpu_moe setting the model cannot take."""
    code = "placement"


class Placement(NamedTuple):
    """One part of a tensor in an arena: rows first..first+rows of tensor `name`, at
    `offset` in arena `arena` (a host arena when `host`), `nbytes` long, read from
    `file_offset` within the tensor's data."""
    name: str
    first: int
    rows: int
    arena: int
    offset: int
    nbytes: int
    file_offset: int
    host: bool


class Layout(NamedTuple):
    parts: list[Placement]
    device_arenas: list[int]     # bytes of each device arena
    host_arenas: list[int]       # bytes of each host arena (cpu_moe)


def host_tensors(cpu_moe: float, n_layer: int, experts: Callable[[int], list[str]] | None,
                 what: str) -> frozenset[str]:
    """The expert tensors cpu_moe places in host memory. Its integer part N takes every
    expert tensor of layers 0..N-1; its fraction takes that share of layer N's three
    (gate, up, down), rounded down to whole tensors in that order, a third written as
    0.33: 0.33 to 0.65 takes gate, 0.66 to 0.99 gate and up. Down stays on the device.
    experts(layer): the layer's expert tensor names, gate first (None: not a mixture of
    experts); what: the model, for messages."""
    if isinstance(cpu_moe, bool) or not isinstance(cpu_moe, (int, float)) \
            or not math.isfinite(cpu_moe) or cpu_moe < 0:
        raise PlacementError(f"cpu_moe must be a number >= 0, got {cpu_moe!r}")
    if cpu_moe == 0:
        return frozenset()
    if experts is None:
        raise PlacementError(f"cpu_moe {cpu_moe:g}: {what} is not a mixture-of-experts "
                             "model, it has no expert tensors")
    if cpu_moe > n_layer:
        raise PlacementError(f"cpu_moe {cpu_moe:g} is beyond the {n_layer} layers of {what}")
    whole = int(cpu_moe)
    names = [n for i in range(whole) for n in experts(i)]
    if cpu_moe > whole:
        layer = experts(whole)
        take = int((cpu_moe - whole) * len(layer) + 0.03)   # 0.33 is a third
        if take == 0:
            raise PlacementError(f"cpu_moe {cpu_moe:g}: the fraction places whole tensors "
                                 f"of layer {whole}, gate then up; .33 or more takes its "
                                 "gate")
        names += layer[:take]
    return frozenset(names)


def plan_layout(g: GGUFFile, names, on_host: frozenset[str], align: int, limit: int,
                arena_bytes: int = ARENA_BYTES) -> Layout:
    """Pack every tensor into arenas, the host-placed ones into host arenas; split tensors
    past `limit` (the storage-buffer range) by rows, expert tensors by whole experts.

    Every part takes its size rounded up to the alignment, so the arenas of each side add
    up to their tensors' padded bytes however the tensors are split between the sides."""
    limit = min(limit, arena_bytes)
    parts: list[Placement] = []
    sizes: dict[bool, list[int]] = {False: [], True: []}
    for n in names:
        t = g.tensor(n)
        host = n in on_host
        rows = t.n_elements // t.shape[0]
        row_bytes = t.nbytes // rows
        unit = t.shape[1] if len(t.shape) == 3 else 1      # rows of one expert
        if unit * row_bytes > limit:
            raise ModelFileError(g.path, f"tensor {n}: one expert's {unit * row_bytes} "
                                         f"bytes exceed the device's buffer range")
        per_part = max(unit, min(rows, limit // row_bytes) // unit * unit)
        arenas = sizes[host]
        for first in range(0, rows, per_part):
            count = min(per_part, rows - first)
            nbytes = count * row_bytes
            padded = -(-nbytes // align) * align
            if not arenas or (arenas[-1] + padded > arena_bytes and arenas[-1] > 0):
                arenas.append(0)
            parts.append(Placement(n, first, count, len(arenas) - 1, arenas[-1], nbytes,
                                   first * row_bytes, host))
            arenas[-1] += padded
    return Layout(parts, sizes[False], sizes[True])


def copy_sources(dev, g: GGUFFile, layout: Layout, name: str, import_pages: bool,
                 progress, done: int, total: int):
    """Where each weight arena's copies read from, on devices that copy (not unified
    memory): (per arena [(source buffer, [(src offset, dst offset, bytes)])], the file's
    pages imported where `import_pages` and the driver allow (a vk.HostImport, or None),
    [host-visible shadows filled now for every tensor the import does not cover])."""
    placements, sizes, _ = layout
    imp = None
    if import_pages:
        imp = vk.HostImport(dev, g.mapped, f"{name}/file")
        if not imp.chunks:
            imp.close()
            imp = None
    plan: list[dict] = [{} for _ in sizes]          # arena -> {source: regions}
    missing: list[list] = [[] for _ in sizes]
    for n, first, count, a, off, nbytes, src, host in placements:
        if host:
            continue
        t = g.tensor(n)
        spans = imp.spans(t.offset + src, nbytes) if imp is not None else None
        if spans is None:                      # not imported (or straddles a refused
            missing[a].append((n, off, nbytes, src))   # chunk): from the shadow
            continue
        dst = off
        for buf, src_off, k in spans:          # a tensor across two chunks: two copies
            plan[a].setdefault(id(buf), (buf, []))[1].append((src_off, dst, k))
            dst += k
    done += total - done - sum(p[2] for m in missing for p in m)
    shadows = []
    for a, parts in enumerate(missing):
        if not parts:
            continue
        size = sum(-(-p[2] // 16) * 16 for p in parts)
        shadow = dev.allocator.alloc(size, f"{name}/shadow.{a}", "shadow", host=True)
        shadows.append(shadow)
        regions, pos = [], 0
        for n, off, nbytes, src in parts:
            shadow.view[pos:pos + nbytes] = g.tensor(n).data[src:src + nbytes]
            regions.append((pos, off, nbytes))
            pos += -(-nbytes // 16) * 16
            done += nbytes
            if progress:
                progress(done, total)
        plan[a][id(shadow)] = (shadow, regions)
    return [list(p.values()) for p in plan], imp, shadows
