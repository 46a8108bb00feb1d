"""Weights and views as the ops see them: a `Tensor` is a GGUF tensor resident in one or
more weight arenas (split by rows past the storage-buffer range); a `View` is a strided
window of an activation buffer."""
from __future__ import annotations

from dataclasses import dataclass, field

from . import vk

# Vulkan caps minStorageBufferOffsetAlignment at 256: a binding at a multiple of it is valid
# on every device (the weight arenas place every part on one)
BIND_ALIGN = 256


@dataclass(eq=False)
class Tensor:
    """A device tensor: its GGUF type, ggml shape (row length first) and where it lives.

    `parts` lists (first row, row count, arena index, byte offset, byte count): a tensor
    larger than the device's storage-buffer range is bound in row-aligned parts. The bytes
    live in the model's weight arenas (`arenas`), shared by all its tensors.

    `skip`, for a row slice (`row_slice`) whose first row does not start on a bindable
    offset: per part, the rows its binding holds before the part's own first row (the
    products then read from that row on: mul_mat's row_offset).
    """
    wtype: str
    shape: tuple[int, ...]
    parts: list[tuple[int, int, int, int, int]]
    arenas: list[vk.Buffer]
    skip: tuple[int, ...] = field(default=())

    def bindings(self) -> list[tuple[tuple[vk.Buffer, int, int], int, int]]:
        """((buffer, offset, range), first row, row count) per part."""
        return [((self.arenas[a], off, n), first, count)
                for first, count, a, off, n in self.parts]

    def skips(self) -> tuple[int, ...]:
        """Per part, the rows its binding holds before its first row (0 but in slices)."""
        return self.skip or (0,) * len(self.parts)

    def binding(self) -> tuple[vk.Buffer, int, int]:
        if len(self.parts) != 1 or any(self.skip):
            raise ValueError("tensor is split into parts")
        return self.bindings()[0][0]

    def row_slice(self, start: int, stop: int) -> "Tensor":
        """Rows [start, stop) of a 2-D weight, where they lie (no copy): a product with the
        slice writes its rows alone (phi3's fused Q | K | V and gate | up). Each part's
        binding starts at the slice's first row where that offset binds on every device,
        else at the part's own start, with the rows before it in `skip`."""
        if len(self.shape) != 2 or not 0 <= start < stop <= self.rows:
            raise ValueError(f"rows [{start}, {stop}) of a tensor of shape {self.shape}")
        parts, skip = [], []
        for (first, count, a, off, nbytes), held in zip(self.parts, self.skips()):
            lo, hi = max(start, first), min(stop, first + count)
            if lo >= hi:
                continue
            row_bytes = nbytes // (held + count)
            at = off + (held + lo - first) * row_bytes
            skipped = 0 if at % BIND_ALIGN == 0 else held + lo - first
            if skipped:
                at = off
            parts.append((lo - start, hi - lo, a, at, (hi - lo + skipped) * row_bytes))
            skip.append(skipped)
        return Tensor(self.wtype, (self.shape[0], stop - start), parts, self.arenas,
                      tuple(skip) if any(skip) else ())

    @property
    def rows(self) -> int:
        n = 1
        for d in self.shape[1:]:
            n *= d
        return n


@dataclass(frozen=True)
class View:
    """An f32 tensor inside a buffer, as ggml sees one: sizes `ne` and strides `nb` (in
    floats) per dim, dim 0 first; contiguous when nb is None."""
    buf: vk.Buffer
    ne: tuple[int, int, int]
    nb: tuple[int, int, int] | None = None
    offset: int = 0             # floats

    @property
    def strides(self) -> tuple[int, int, int]:
        if self.nb is not None:
            return self.nb
        return (1, self.ne[0], self.ne[0] * self.ne[1])

    @property
    def T(self) -> "View":
        """ggml_transpose: dims 0 and 1 swapped, no data moved."""
        (n0, n1, n2), (s0, s1, s2) = self.ne, self.strides
        return View(self.buf, (n1, n0, n2), (s1, s0, s2), self.offset)

    @property
    def transposed(self) -> bool:
        """Stored with dim 1 contiguous and dim 0 strided (one row along dim 0 is just a
        contiguous vector: a decode step's transposed B * x)."""
        s0, s1, _ = self.strides
        return s1 == 1 and s0 != 1 and self.ne[0] > 1
