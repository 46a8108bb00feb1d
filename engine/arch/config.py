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

import dataclasses
import math
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from shaders.registry import MOE_MAX_EXPERT, MOE_MAX_USED

from ..formats.gguf_file import GGUFFile, ModelFileError
from ..gpu.rope import Rope
from ..gpu.runstate import Extra


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
    rope: Rope                 # with the scaling the file declares

    # GGUF keys (under the architecture's prefix) an architecture may default differently;
    # None: the key is required
    DEFAULTS: ClassVar[dict] = {"context_length": 2048, "rope.freq_base": 10000.0,
                                "attention.layer_norm_rms_epsilon": 1e-5}
    # llama.cpp's graph for the architecture passes the `rope_freqs` tensor's per-pair
    # factors to its rope (llama 3.1 and later, mistral3)
    ROPE_FREQS: ClassVar[bool] = False
    # the graph passes LongRoPE's short or long factors (phi3): it takes `longrope` scaling
    LONGROPE: ClassVar[bool] = False
    # the key n_ff comes from (gpt-oss declares only its experts' length)
    FF_KEY: ClassVar[str] = "feed_forward_length"

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

        if g.get(f"{a}.rope.scaling.type") == "longrope" and not cls.LONGROPE:
            raise ModelFileError(g.path, f"LongRoPE scaling is not supported for {a}",
                                 reason="rope")
        n_embd = int(g.require(f"{a}.embedding_length"))
        n_head = int(g.require(f"{a}.attention.head_count"))
        head_dim = int(g.get(f"{a}.attention.key_length", n_embd // max(n_head, 1)))
        n_head_kv = g.get(f"{a}.attention.head_count_kv", n_head)
        n_ctx_train = int(key("context_length"))
        rope_base = float(key("rope.freq_base"))
        rope_dims = int(g.get(f"{a}.rope.dimension_count", head_dim))
        return dict(
            n_layer=int(g.require(f"{a}.block_count")),
            n_embd=n_embd,
            n_head=n_head,
            # per-layer lists (hybrids) are read by the architecture's extra()
            n_head_kv=n_head_kv if isinstance(n_head_kv, (list, tuple)) else int(n_head_kv),
            head_dim=head_dim,
            n_ff=int(g.require(f"{a}.{cls.ff_key(g)}")),
            n_vocab=cls.vocab_size(g),
            n_ctx_train=n_ctx_train,
            rope_base=rope_base,
            rope_dims=rope_dims,
            rms_eps=float(key("attention.layer_norm_rms_epsilon")),
            tied_output="output.weight" not in g.tensors,
            rope=rope_from_gguf(g, rope_base, rope_dims, n_ctx_train,
                                "rope_freqs.weight" if cls.ROPE_FREQS else None),
        )

    @classmethod
    def ff_key(cls, g: GGUFFile) -> str:
        """The key n_ff is read from (one Config may serve dense and MoE architectures)."""
        return cls.FF_KEY

    @staticmethod
    def vocab_size(g: GGUFFile) -> int:
        """`vocab_size`, else the tokenizer's token count, else the embedding's rows."""
        n = g.get(f"{g.arch}.vocab_size")
        if n:
            return int(n)
        tokens = g.get("tokenizer.ggml.tokens")
        return len(tokens) if tokens else g.tensor("token_embd.weight").shape[1]

    def io_shapes(self) -> dict[str, tuple[int, ...]]:
        """The embedding, the final norm and the output projection (unless tied), with
        their ggml shapes (row length first)."""
        shapes = {"token_embd.weight": (self.n_embd, self.n_vocab),
                  "output_norm.weight": (self.n_embd,)}
        if not self.tied_output:
            shapes["output.weight"] = (self.n_embd, self.n_vocab)
        return shapes

    def attention_shapes(self, layer: int, qk_norm: str = "",
                         norm: bool = True) -> dict[str, tuple[int, ...]]:
        """Layer `layer`'s input norm (unless norm is False) and Q, K, V and output
        projections; with qk_norm, the norms of q and k ("head": per head, "whole": over
        the whole projection)."""
        b, e, q, kv = f"blk.{layer}.", self.n_embd, self.n_head * self.head_dim, \
            self.n_head_kv * self.head_dim
        shapes = {b + "attn_q.weight": (e, q), b + "attn_k.weight": (e, kv),
                  b + "attn_v.weight": (e, kv), b + "attn_output.weight": (q, e)}
        if norm:
            shapes[b + "attn_norm.weight"] = (e,)
        if qk_norm:
            whole = qk_norm == "whole"
            shapes.update({b + "attn_q_norm.weight": (q if whole else self.head_dim,),
                           b + "attn_k_norm.weight": (kv if whole else self.head_dim,)})
        return shapes

    def ffn_shapes(self, layer: int, norm: bool = True) -> dict[str, tuple[int, ...]]:
        """Layer `layer`'s feed-forward norm (unless norm is False) and gate, up and down
        projections."""
        b, e, f = f"blk.{layer}.", self.n_embd, self.n_ff
        shapes = {b + "ffn_gate.weight": (e, f), b + "ffn_up.weight": (e, f),
                  b + "ffn_down.weight": (f, e)}
        if norm:
            shapes[b + "ffn_norm.weight"] = (e,)
        return shapes

    def rope_tables(self) -> tuple[Rope, ...]:
        """Every rope the layers use (RunState precomputes their angles): the file's one."""
        return (self.rope,)

    def attn_windows(self) -> tuple[int, ...]:
        """The sliding windows of the attention layers (0: full causal), one mask each."""
        return (0,)

    def expert_tensors(self, layer: int) -> list[str]:
        """The expert tensors of one layer, in the order a fractional cpu_moe places them
        (gate first); none where the model has no experts."""
        return []

    def state(self) -> Extra:
        """What the forward pass needs beyond a KV cache on every layer and llama's
        activations (RunState allocates it): nothing."""
        return Extra()

    def tensor_types(self) -> dict[str, tuple[str, ...]]:
        """The tensors that must be of given types (read as F32 rows, say): none."""
        return {}

    @classmethod
    def extra(cls, g: GGUFFile, common: dict) -> dict:
        """The architecture's own fields (and overrides of the common ones)."""
        return {}

    def problems(self) -> list[str]:
        """What this architecture cannot run, beyond the common checks."""
        return []

    def at_context(self, n_ctx: int) -> "Config":
        """The configuration a model runs with at context size n_ctx (the Model takes it):
        itself, but where the file's hyperparameters depend on it (phi3's LongRoPE)."""
        return self

    def validate(self, path: str) -> None:
        check_hyperparameters(self, path, self.problems())


def swa_layers(g: GGUFFile, n_layer: int, default_pattern: int = 2) -> tuple[bool, ...]:
    """Which layers attend through a sliding window, as llama.cpp's set_swa_pattern reads
    `attention.sliding_window_pattern`: a flag per layer, or n (every n-th layer global, the
    others sliding; 0: all sliding)."""
    pattern = g.get(f"{g.arch}.attention.sliding_window_pattern", default_pattern)
    if isinstance(pattern, (list, tuple)):
        return tuple(bool(p) for p in pattern[:n_layer])
    n = int(pattern)
    return tuple(n == 0 or i % n < n - 1 for i in range(n_layer))


def rope_from_gguf(g: GGUFFile, base: float, n_dims: int, n_ctx_train: int,
                   factors: str | None = None) -> Rope:
    """The rope llama.cpp sets up from a file's keys (llama-model.cpp's hparams, then
    llama-context.cpp's cparams): `rope.scaling.type` (linear by default; none; yarn),
    `rope.scaling.factor` (or `rope.scale_linear`), YaRN's original context, betas and log
    multiplier, `rope.scaling.attn_factor`, and per-pair frequency factors from the tensor
    `factors` where the architecture's graph reads them. LongRoPE (phi3) is its factors and
    attention factor alone: the architecture passes the factors it picks."""
    a = g.arch
    f32 = np.float32
    scaling = str(g.get(f"{a}.rope.scaling.type", "linear"))
    if scaling not in ("none", "linear", "yarn", "longrope"):
        raise ModelFileError(g.path, f"rope scaling {scaling!r} is not supported (supported: "
                                     "none, linear, yarn, longrope)", reason="rope")
    factor = float(g.get(f"{a}.rope.scaling.factor", g.get(f"{a}.rope.scale_linear", 0.0)))
    freq_scale = 1.0 if factor == 0.0 or scaling == "none" else float(f32(1.0) / f32(factor))
    n_ctx_orig = int(g.get(f"{a}.rope.scaling.original_context_length", n_ctx_train))
    ext_factor, attn_factor = 0.0, f32(1.0)
    beta_fast = float(g.get(f"{a}.rope.scaling.yarn_beta_fast", 0.0) or 32.0)
    beta_slow = float(g.get(f"{a}.rope.scaling.yarn_beta_slow", 0.0) or 1.0)
    if scaling == "yarn" and freq_scale != 1.0:
        ext_factor = 1.0
        # llama-context.cpp's YaRN attention factor; the rope then multiplies by
        # 1 + 0.1 ln(factor) itself, so it is divided out here
        log_mul = float(g.get(f"{a}.rope.scaling.yarn_log_multiplier", 0.0))
        s = f32(1.0) / f32(freq_scale)

        def mscale(m: float) -> f32:
            return f32(1.0) if s <= 1 else f32(0.1) * f32(m) * f32(math.log(s)) + f32(1)
        attn_factor = mscale(1.0) / mscale(log_mul) if log_mul else mscale(1.0)
        attn_factor = attn_factor * (f32(1.0) / (f32(1.0) + f32(0.1) * f32(math.log(s))))
    attn_factor = attn_factor * f32(g.get(f"{a}.rope.scaling.attn_factor", 1.0))
    freq_factors: tuple[float, ...] = ()
    if factors is not None and factors in g.tensors:
        t = g.tensor(factors)
        if t.type_name != "F32" or t.n_elements != n_dims // 2:
            raise ModelFileError(g.path, f"tensor {factors} must be F32 of {n_dims // 2} "
                                         f"values", reason="incomplete")
        freq_factors = tuple(float(x) for x in np.frombuffer(t.data, np.float32))
    return Rope(base, n_dims, freq_scale, ext_factor, float(attn_factor), beta_fast,
                beta_slow, n_ctx_orig, freq_factors)


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


# -- what most architectures share, used as they are or named in their modules ---------------

EXPERT_TENSORS = ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps")   # cpu_moe's placement order


class SlidingWindows:
    """For a Config whose is_local(i) layers attend to the last `window` tokens only, with a
    rope of their own base (rope_base_local) and the file's scaling (gemma2, gpt-oss)."""

    def local_rope(self) -> Rope:
        return dataclasses.replace(self.rope, base=self.rope_base_local)

    def layer_rope(self, i: int) -> Rope:
        return self.local_rope() if self.is_local(i) else self.rope

    def layer_window(self, i: int) -> int:
        return self.window if self.is_local(i) else 0

    def rope_tables(self) -> tuple[Rope, ...]:
        return tuple({self.layer_rope(i): None for i in range(self.n_layer)})

    def attn_windows(self) -> tuple[int, ...]:
        return tuple(sorted({self.layer_window(i) for i in range(self.n_layer)}))


def whole_rope_problems(c: Config) -> list[str]:
    """For a graph that turns every pair of a head: a partial rope is not read."""
    if c.rope_dims != c.head_dim:
        return [f"rope dimension_count {c.rope_dims} (head dim {c.head_dim})"]
    return []


def moe_problems(c: Config) -> list[str]:
    """What a mixture of experts' counts may not be (the router kernel's bounds)."""
    extra = []
    if not 0 < c.n_expert <= MOE_MAX_EXPERT:
        extra.append(f"expert_count {c.n_expert}")
    if not 0 < c.n_expert_used <= min(c.n_expert, MOE_MAX_USED):
        extra.append(f"expert_used_count {c.n_expert_used}")
    return extra


class Experts:
    """For a Config of a mixture of experts whose graph turns every pair of a head
    (qwen3moe, gpt-oss): its expert tensors and the counts the kernels take."""

    def expert_tensors(self, layer: int) -> list[str]:
        return [f"blk.{layer}.{n}.weight" for n in EXPERT_TENSORS]

    def state(self) -> Extra:
        return Extra(n_expert=self.n_expert, n_expert_used=self.n_expert_used)

    def problems(self) -> list[str]:
        return super().problems() + moe_problems(self) + whole_rope_problems(self)
