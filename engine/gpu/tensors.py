"""Weights and views as the ops see them: a `Tensor` is a GGUF tensor resident in one or
more weight arenas (split by rows past the storage-buffer range); a `View` is a strided
window of an activation buffer."""
from __future__ import annotations

from dataclasses import dataclass

from . import vk


@dataclass(eq=False)
class Tensor:
    """A device tensor: its GGUF type, ggml shape (row length first) and where it lives.

    `parts` lists (first row, row count, arena index, byte offset, byte count): a tensor
    larger than the device's storage-buffer range is bound in row-aligned parts. The bytes
    live in the model's weight arenas (`arenas`), shared by all its tensors.
    """
    wtype: str
    shape: tuple[int, ...]
    parts: list[tuple[int, int, int, int, int]]
    arenas: list[vk.Buffer]

    def bindings(self) -> list[tuple[tuple[vk.Buffer, int, int], int, int]]:
        """((buffer, offset, range), first row, row count) per part."""
        return [((self.arenas[a], off, n), first, count)
                for first, count, a, off, n in self.parts]

    def binding(self) -> tuple[vk.Buffer, int, int]:
        if len(self.parts) != 1:
            raise ValueError("tensor is split into parts")
        return self.bindings()[0][0]

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
