"""What an architecture is to the engine, as Protocols: a module with a `Config` read from a
GGUF file and a `forward` that records one pass on a Builder. engine/residency (the Model,
`hotseat check`) reads nothing else of it; tests/engine/arch/test_contract.py checks every
registered module against these signatures.

`config.Config` gives the defaults (one rope table, full causal attention, no experts,
nothing beyond a KV cache on every layer); an architecture overrides what its graph needs.
"""
from __future__ import annotations

from typing import Protocol, runtime_checkable

from ..formats.gguf_file import GGUFFile
from ..gpu.builder import Builder
from ..gpu.rope import Rope
from ..gpu.runstate import Extra, RunState


@runtime_checkable
class ModelConfig(Protocol):
    """The hyperparameters a forward pass runs on, and what the engine sizes from them."""
    n_layer: int
    n_embd: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_ff: int                  # with experts: one expert's
    n_vocab: int
    n_ctx_train: int
    rms_eps: float
    tied_output: bool          # the output projection is the token embedding
    rope: Rope

    @classmethod
    def from_gguf(cls, g: GGUFFile) -> "ModelConfig":
        """Read from the file's keys (ModelFileError where one is missing or unreadable)."""
        ...

    def validate(self, path: str) -> None:
        """One ModelFileError naming what this graph cannot run."""
        ...

    def at_context(self, n_ctx: int) -> "ModelConfig":
        """The configuration at a context size (phi3's LongRoPE picks its factors by it)."""
        ...

    def tensor_shapes(self) -> dict[str, tuple[int, ...]]:
        """Every tensor the forward pass reads, with its ggml shape (row length first)."""
        ...

    def tensor_types(self) -> dict[str, tuple[str, ...]]:
        """The tensors that must be of given weight types."""
        ...

    def rope_tables(self) -> tuple[Rope, ...]:
        """Every rope the layers use: RunState precomputes their angles."""
        ...

    def attn_windows(self) -> tuple[int, ...]:
        """The attention layers' sliding windows (0: full causal), one mask each."""
        ...

    def expert_tensors(self, layer: int) -> list[str]:
        """A layer's expert tensors, in the order a fractional cpu_moe places them."""
        ...

    def state(self) -> Extra:
        """What the pass needs beyond a KV cache on every layer: RunState allocates it."""
        ...


class Architecture(Protocol):
    """One module of engine/arch, registered in engine/arch/__init__.py by the names a GGUF
    file's `general.architecture` gives it."""
    Config: type[ModelConfig]

    @staticmethod
    def forward(b: Builder, c: ModelConfig, rs: RunState, n: int) -> None:
        """Record the pass of tokens rs.ids[:n] at positions step.pos0..: the last token's
        logits into rs.logits, through engine/arch/blocks.py's head (which gives every
        token's hidden states instead in an embeddings pass, b.hidden)."""
        ...
