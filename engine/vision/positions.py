"""M-RoPE positions: where a model's rope turns each pair by one of a token's position
components (t, h, w, e), as Qwen3.5's interleaved multi-section rope does, an image's soft
tokens take 2-D positions and the text after it moves on by the image's longer side, not by
its token count (llama.cpp's mtmd: image token i of a grid nx x ny from position p0 is at
(p0, p0 + i // nx, p0 + i % nx, 0), and the next token at p0 + max(nx, ny); text at p is at
(p, p, p, 0)). So after an image a token's position is not its cache slot.

The engine keeps one rope table row per slot (RunState.rope_table): `Positions` gives the rows
of a pass from the plain table (row p: every pair turned by p), each pair's (cos, sin) taken
from the row of the position component that pair turns by."""
from __future__ import annotations

import numpy as np

from .config import Geometry


class Positions:
    """The position counter after each slot of a model's cache, and the rope rows of a pass.
    components: per rotated pair, the component it turns by (0 t, 1 h, 2 w, 3 e)."""

    def __init__(self, n_ctx: int, components: tuple[int, ...]):
        self.next = np.zeros(n_ctx, np.int64)
        self.components = np.asarray(components, np.int64)

    def rows(self, table: np.ndarray, pos0: int, n: int, image: Geometry | None,
             first: int = 0) -> np.ndarray:
        """[n, pairs, 2] (cos, sin) for slots pos0..pos0+n: n text tokens, or (image) n soft
        tokens of an image from its token `first` on; the counter after them kept for the
        next pass."""
        pos = self.advance(pos0, n, image, first)
        pairs = np.arange(len(self.components))
        return table[pos[:, self.components], pairs]

    def advance(self, pos0: int, n: int, image: Geometry | None, first: int = 0) -> np.ndarray:
        """The (t, h, w, e) positions [n, 4] of those slots, the counter moved past them."""
        at = pos0 - first                      # the slot where the image starts (text: pos0)
        start = int(self.next[at - 1]) if at > 0 else 0
        i = np.arange(n) + first
        pos = np.zeros((n, 4), np.int64)                     # t, h, w, e (0)
        if image is None:
            pos[:, 0] = pos[:, 1] = pos[:, 2] = start + np.arange(n)
            self.next[pos0:pos0 + n] = start + np.arange(n) + 1
        else:
            if first + n > image.n_tokens:
                raise ValueError(f"soft tokens {first}..{first + n} of an image of "
                                 f"{image.n_tokens}")
            pos[:, 0] = start
            pos[:, 1] = start + i // image.nx
            pos[:, 2] = start + i % image.nx
            self.next[pos0:pos0 + n] = start + max(image.nx, image.ny)
        return pos


def imrope_components(sections: tuple[int, ...], pairs: int) -> tuple[int, ...]:
    """ggml's interleaved multi-section rope (IMROPE): pair k (sector k % sum(sections)) turns
    by h where sector % 3 == 1 and sector < 3 * sections[1], by w where it is 2 and below
    3 * sections[2], by t where it is 0 and below 3 * sections[0], else by e."""
    t, h, w = sections[:3]
    total = max(sum(sections), 1)
    out = []
    for k in range(pairs):
        s = k % total
        out.append(1 if s % 3 == 1 and s < 3 * h else 2 if s % 3 == 2 and s < 3 * w
                   else 0 if s % 3 == 0 and s < 3 * t else 3)
    return tuple(out)
