"""Everything that stands in for the engine has the facade's whole surface: the Engine, the
UI tests' FakeEngine and the tray endpoint's wrapper each have every method of
engine.facade.EngineAPI, with the same parameters (names, order, defaults, kinds).

A second copy of "how to call the engine" that drifted is how the tray's endpoint came to
answer X-Hotseat-Wait with a 500: its wrapper's generate() had no `wait`.
"""
from __future__ import annotations

import inspect

import pytest

# the tray's wrapper needs Qt, which a machine running only the engine's tests may lack
pytest.importorskip("PySide6", reason="the tray's wrapper (app.bridge) needs PySide6")

from app.bridge.observed import ObservedEngine  # noqa: E402
from engine.api import Engine
from engine.facade import EngineAPI
from tests.helpers.fake_engine import FakeEngine

STAND_INS = {"Engine": Engine, "FakeEngine": FakeEngine, "ObservedEngine": ObservedEngine}


def protocol_methods() -> dict[str, object]:
    return {n: v for n, v in vars(EngineAPI).items()
            if not n.startswith("_") and inspect.isfunction(v)}


def parameters(fn) -> list[tuple]:
    """What a caller sees of a signature: each parameter's name, kind and default (the
    annotations are the Protocol's business)."""
    return [(p.name, p.kind.name, p.default)
            for p in inspect.signature(fn).parameters.values()]


def differences(cls) -> list[str]:
    out = []
    for name, proto in protocol_methods().items():
        impl = inspect.getattr_static(cls, name, None)
        if impl is None:
            out.append(f"{name}: missing")
        elif not callable(impl):
            out.append(f"{name}: not a method")
        elif parameters(impl) != parameters(proto):
            out.append(f"{name}: {parameters(impl)} != {parameters(proto)}")
    if not hasattr(cls, "device_name"):
        out.append("device_name: missing")
    return out


def test_the_protocol_is_the_whole_surface():
    """What the front ends call is all in it (a method added to Engine alone would let
    callers reach past the facade unseen)."""
    methods = set(protocol_methods())
    assert {"load", "unload", "warm", "evict", "pin", "unpin", "generate", "prompt_tokens",
            "tokenizer", "status", "vram", "arena_status", "yielded_until", "yield_gpu",
            "set_budget", "default_budget", "set_full_release", "set_idle_evict",
            "subscribe", "set_flash_attn", "set_arena_label", "device_job", "trim",
            "close"} <= methods


@pytest.mark.parametrize("name", STAND_INS)
def test_every_method_has_the_protocols_parameters(name):
    assert differences(STAND_INS[name]) == []


def test_the_fake_and_the_wrapper_are_engines():
    fake = FakeEngine()
    assert isinstance(fake, EngineAPI)
    assert isinstance(ObservedEngine(fake, bridge=None), EngineAPI)
    assert ObservedEngine(fake, bridge=None).device_name == fake.device_name


def test_the_wrapper_passes_everything_through():
    """Each method the wrapper does not observe is the engine's, called as it was called."""
    fake = FakeEngine()
    wrapped = ObservedEngine(fake, bridge=None)
    assert wrapped.set_budget(123 << 20) == 123 << 20 and fake.budget == 123 << 20
    assert wrapped.set_budget(budget_bytes=None) == fake.default_budget() == fake.budget
    wrapped.set_idle_evict(seconds=30)
    assert fake.idle_s == 30
    assert wrapped.yielded_until() is None
    until = wrapped.yield_gpu(60)
    assert wrapped.yielded_until() == until == fake.yielded_until()


class _NoWait(FakeEngine):
    def generate(self, request, on_text=None):              # no cancel
        raise AssertionError


class _OtherDefault(FakeEngine):
    def warm(self, name, wait=0.0):
        raise AssertionError


class _KeywordOnly(FakeEngine):
    def evict(self, name, *, full=None):
        raise AssertionError


class _Swapped(FakeEngine):
    def prompt_tokens(self, name, messages=None, prompt=None):
        raise AssertionError


_Missing = type("_Missing", (), {k: v for k, v in vars(FakeEngine).items()
                                 if k != "yielded_until"})


@pytest.mark.parametrize("cls, method", [(_NoWait, "generate"), (_OtherDefault, "warm"),
                                         (_KeywordOnly, "evict"), (_Swapped, "prompt_tokens"),
                                         (_Missing, "yielded_until")])
def test_a_stand_in_that_differs_is_found(cls, method):
    found = differences(cls)
    assert len(found) == 1 and found[0].startswith(f"{method}: "), found


def test_the_server_knows_only_the_facade():
    """No module of the HTTP server imports the concrete engine (engine.api): it serves any
    EngineAPI (the tray's wrapper, the test fake); cli.py hands it the real one."""
    import ast
    from pathlib import Path

    server = Path(__file__).parents[2] / "engine" / "server"
    for path in sorted(server.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                target = "." * node.level + (node.module or "")
                assert target not in ("..api", "engine.api"), f"{path.name} imports {target}"
