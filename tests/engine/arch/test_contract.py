"""Every registered architecture is what engine/arch/contract.py says: a `Config` with every
member of `ModelConfig` (the Protocol's parameters, as tests/engine/test_facade.py checks the
engine's), and a `forward(b, c, rs, n)`. And the engine reads nothing else of a config: a
model whose config answers only the Protocol's names loads, checks, generates and gives its
hidden states as the real one does."""
from __future__ import annotations

import dataclasses
import inspect
import typing

import numpy as np
import pytest

from engine import arch as architectures
from engine.arch import config
from engine.arch.contract import Architecture, ModelConfig
from engine.formats.gguf_file import GGUFFile
from engine.gpu.runstate import Extra, RunState
from engine.residency.check import check_file
from engine.residency.loop import generate
from engine.residency.model import Model
from tests.helpers import synth_reference as sr

MODULES = sorted({m.__name__: m for m in architectures.ARCHITECTURES.values()}.items())


def protocol_methods(proto) -> dict[str, object]:
    return {n: v for n, v in vars(proto).items() if not n.startswith("_") and
            (inspect.isfunction(v) or isinstance(v, (classmethod, staticmethod)))}


def parameters(fn) -> list[tuple]:
    """What a caller sees of a signature: each parameter's name, kind and default."""
    fn = fn.__func__ if isinstance(fn, (classmethod, staticmethod)) else fn
    return [(p.name, p.kind.name, p.default)
            for p in inspect.signature(fn).parameters.values()]


@pytest.mark.parametrize("name,module", MODULES, ids=[n for n, _ in MODULES])
def test_each_module_is_an_architecture(name, module):
    cls = module.Config
    assert issubclass(cls, config.Config) and dataclasses.is_dataclass(cls)
    fields = {f.name for f in dataclasses.fields(cls)}
    assert set(typing.get_type_hints(ModelConfig)) - {"Config"} <= fields
    for method, proto in protocol_methods(ModelConfig).items():
        impl = inspect.getattr_static(cls, method, None)     # as defined, not bound
        assert impl is not None, f"{name}.Config.{method}: missing"
        assert isinstance(impl, classmethod) == isinstance(proto, classmethod), \
            f"{name}.Config.{method}: classmethod or not"
        assert parameters(impl) == parameters(proto), f"{name}.Config.{method}"
    assert parameters(module.forward) == parameters(Architecture.forward)


def test_the_registry_maps_each_file_architecture_to_a_module():
    for arch, module in architectures.ARCHITECTURES.items():
        assert module in {m for _, m in MODULES}, arch


# -- the engine reads only the contract ------------------------------------------------------

NAMES = set(typing.get_type_hints(ModelConfig)) | set(protocol_methods(ModelConfig))


class Strict:
    """A config as the engine may see it: the Protocol's names, and an AttributeError naming
    any other, which it also keeps in `outside` (a hasattr() would swallow the error)."""
    outside: list[str] = []

    def __init__(self, real):
        object.__setattr__(self, "_real", real)

    def __getattr__(self, name: str):
        if name not in NAMES:
            Strict.outside.append(name)
            raise AttributeError(f"the engine read {name!r} of a config: not in the contract")
        value = getattr(self._real, name)
        if name == "at_context":
            return lambda n_ctx: Strict(value(n_ctx))
        return value


def strict(module):
    """The module as an Architecture whose Config answers only the Protocol's names; its
    forward takes the real config back."""
    class Config:
        @staticmethod
        def from_gguf(g: GGUFFile):
            return Strict(module.Config.from_gguf(g))

    def forward(b, c, rs, n):
        module.forward(b, c._real, rs, n)
    return type(module.__name__, (), {"Config": Config, "forward": staticmethod(forward)})


# a dense llama, the hybrid of attention and delta-net layers with experts, sliding windows
CASES = ["llama-q5_1", "qwen35moe-f16", "gemma2-swa-f16"]


@pytest.mark.gpu
@pytest.mark.parametrize("case", CASES)
def test_the_engine_reads_only_the_contract(dev, kc, case, monkeypatch):
    c = sr.load_case(case)
    path, prompt = str(c.model_path), c.prompt_ids[:12]

    def run() -> tuple[list[int], np.ndarray, dict]:
        m = Model(dev, kc, path, n_ctx=c.n_ctx)
        try:
            tokens = list(generate(m, prompt, 4))
            hidden = m.hidden(prompt[:5])
            m.release(full=True)
            m.restore()
            assert list(generate(m, prompt, 4)) == tokens
            report = check_file(path, c.n_ctx)
            return tokens, hidden, report
        finally:
            m.close()

    want = run()
    with GGUFFile(path) as g:
        arch = g.arch
    monkeypatch.setitem(architectures.ARCHITECTURES, arch,
                        strict(architectures.ARCHITECTURES[arch]))
    Strict.outside.clear()
    got = run()
    assert not Strict.outside, Strict.outside
    assert got[0] == want[0]
    assert np.array_equal(got[1], want[1])
    assert got[2] == want[2] and not got[2]["problems"]


def test_the_declared_state_sizes_the_run_state():
    """What a Config's state() declares is what RunState counts: the KV layers, the
    recurrent states."""
    for case in ("llama-q5_1", "qwen35-f16", "qwen3next-f16", "gpt-oss-f16"):
        path = str(sr.load_case(case).model_path)
        with GGUFFile(path) as g:
            c = architectures.for_file(g).Config.from_gguf(g)
        state = c.state()
        assert isinstance(state, Extra) and isinstance(c, ModelConfig)
        kv_layers = c.n_layer if state.kv_layers is None else len(state.kv_layers)
        assert kv_layers + len(state.delta_layers) == c.n_layer
        args = dict(n_layer=c.n_layer, n_embd=c.n_embd, n_head=c.n_head,
                    q_dim=c.n_head * c.head_dim, kv_dim=c.n_head_kv * c.head_dim, n_ff=c.n_ff,
                    n_vocab=c.n_vocab, n_ctx=64, max_tokens=8, **dataclasses.asdict(state))
        per_delta = 4 * (state.delta_conv_dim * (state.delta_width - 1)
                         + state.delta_heads * state.delta_head_dim ** 2)
        assert RunState.recurrent_bytes(**args) == len(state.delta_layers) * per_delta
