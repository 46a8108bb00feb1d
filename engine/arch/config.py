"""The hyperparameters every architecture reads, once: `Config` takes the common GGUF keys
(as llama.cpp names and defaults them) and each architecture's subclass adds its own fields
through `extra()`. `validate()` turns a corrupt header into one clear ModelFileError.

    @dataclass(frozen=True)
    class Config(config.Config):
        window: int
        DEFAULTS = {**config.Config.DEFAULTS, "context_length": 32768}

        @classmethod
        def extra(cls, g, common): return {"window": int(g.get(...))}
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ..formats.gguf_file import GGUFFile, ModelFileError


@dataclass(frozen=True)
class Config:
    n_layer: int
    n_embd: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_ff: int
    n_vocab: int
    n_ctx_train: int
    rope_base: float
    rope_dims: int             # rotated dimensions of a head
    rms_eps: float
    tied_output: bool          # the output projection is the token embedding

    # GGUF keys (under the architecture's prefix) an architecture may default differently;
    # None: the key is required
    DEFAULTS: ClassVar[dict] = {"context_length": 2048, "rope.freq_base": 10000.0,
                                "attention.layer_norm_rms_epsilon": 1e-5}

    @classmethod
    def from_gguf(cls, g: GGUFFile) -> "Config":
        common = cls.common(g)
        return cls(**{**common, **cls.extra(g, common)})

    @classmethod
    def common(cls, g: GGUFFile) -> dict:
        a = g.arch

        def key(name: str):
            default = cls.DEFAULTS[name]
            return g.require(f"{a}.{name}") if default is None else g.get(f"{a}.{name}", default)

        n_embd = int(g.require(f"{a}.embedding_length"))
        n_head = int(g.require(f"{a}.attention.head_count"))
        head_dim = int(g.get(f"{a}.attention.key_length", n_embd // max(n_head, 1)))
        n_head_kv = g.get(f"{a}.attention.head_count_kv", n_head)
        return dict(
            n_layer=int(g.require(f"{a}.block_count")),
            n_embd=n_embd,
            n_head=n_head,
            # per-layer lists (hybrids) are read by the architecture's extra()
            n_head_kv=n_head_kv if isinstance(n_head_kv, (list, tuple)) else int(n_head_kv),
            head_dim=head_dim,
            n_ff=int(g.require(f"{a}.feed_forward_length")),
            n_vocab=cls.vocab_size(g),
            n_ctx_train=int(key("context_length")),
            rope_base=float(key("rope.freq_base")),
            rope_dims=int(g.get(f"{a}.rope.dimension_count", head_dim)),
            rms_eps=float(key("attention.layer_norm_rms_epsilon")),
            tied_output="output.weight" not in g.tensors,
        )

    @staticmethod
    def vocab_size(g: GGUFFile) -> int:
        """`vocab_size`, else the tokenizer's token count, else the embedding's rows."""
        n = g.get(f"{g.arch}.vocab_size")
        if n:
            return int(n)
        tokens = g.get("tokenizer.ggml.tokens")
        return len(tokens) if tokens else g.tensor("token_embd.weight").shape[1]

    @classmethod
    def extra(cls, g: GGUFFile, common: dict) -> dict:
        """The architecture's own fields (and overrides of the common ones)."""
        return {}

    def problems(self) -> list[str]:
        """What this architecture cannot run, beyond the common checks."""
        return []

    def validate(self, path: str) -> None:
        check_hyperparameters(self, path, self.problems())


def check_hyperparameters(c, path: str, extra: list[str] = ()) -> None:
    """One-line ModelFileError for hyperparameters no real model has (a corrupt header)."""
    problems = list(extra)
    if not 0 < c.n_layer <= 1024:
        problems.append(f"block_count {c.n_layer}")
    if c.n_embd <= 0 or c.n_embd % 32 or c.n_embd > 65536:
        problems.append(f"embedding_length {c.n_embd}")
    if c.n_head <= 0 or c.n_head_kv <= 0 or c.n_head % c.n_head_kv:
        problems.append(f"head counts {c.n_head}/{c.n_head_kv}")
    if c.head_dim <= 0 or c.head_dim % 4 or c.head_dim > 512:
        problems.append(f"head dim {c.head_dim}")
    if c.n_ff <= 0 or c.n_ff % 32 or c.n_ff > 1 << 20:
        problems.append(f"feed_forward_length {c.n_ff}")
    if not 0 < c.n_vocab <= 1 << 22:
        problems.append(f"vocab size {c.n_vocab}")
    if problems:
        raise ModelFileError(path, "absurd or unsupported hyperparameters: " + ", ".join(problems))
