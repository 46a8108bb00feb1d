"""The Builder of embeddings passes: a forward pass that ends in the final-normed hidden
states of every token instead of the last token's logits."""
from __future__ import annotations

from .builder import Builder


class HiddenBuilder(Builder):
    """A Builder whose forward pass ends in the final-normed hidden states of all its n
    tokens (in rs.xn) instead of the last token's logits: what llama.cpp's embeddings are
    made of. Several sequences may share a pass (seqs, where n_tokens > 1), each seeing
    only itself from position 0. Every architecture ends the same way (the output norm of
    the last row alone, then the head's product into rs.logits, maybe soft-capped there):
    that norm is taken over every row, and what writes the logits is left out."""

    def __init__(self, *args, n_tokens: int, **kw):
        super().__init__(*args, **kw)
        self.n_tokens = n_tokens
        # a pass may pack several sequences (the host writes step.seq_first); one of a single
        # token takes decode's attention, which has no such bound, so it must be alone
        self.seqs = int(n_tokens > 1)
        self._last_norm: tuple | None = None    # (out buffer, rows) of the latest norm
        self.heads = 0                          # head products left out

    def rms_norm(self, x, w, out, n, eps, row_offset=0) -> None:
        if n == 1 and row_offset == self.n_tokens - 1:     # the output norm
            n, row_offset = self.n_tokens, 0
        super().rms_norm(x, w, out, n, eps, row_offset)
        self._last_norm = (out, n)

    def matmul(self, w, x, y, n, accumulate=False, x_row=0) -> None:
        if y is not self.rs.logits:
            super().matmul(w, x, y, n, accumulate, x_row)
            return
        if self._last_norm != (self.rs.xn, self.n_tokens) or x is not self.rs.xn:
            raise RuntimeError("hidden states: the head's input is not the output norm of "
                               "every row in rs.xn")
        self.heads += 1

    def check(self) -> None:
        """Raise unless the forward pass ended as every architecture does (see above)."""
        if self.heads != 1:
            raise RuntimeError(f"hidden states: {self.heads} head products, expected one")

    def softcap(self, x, count, cap) -> None:
        if x is not self.rs.logits:
            super().softcap(x, count, cap)
