"""The import graph of engine/, app/ and shaders/: no circles, and imports only downward.

Every import counts: those inside functions (they run too, only later), and those under
`if TYPE_CHECKING:`, which never run but tie the modules together all the same (a reader and
a type checker follow them; a circle through them is still a circle). Importing a.b.c also
imports the packages a and a.b, so those count as imported too.
"""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("engine", "app", "shaders")

# Lower numbers sit lower; a module may import its own layer and the ones below it.
LAYERS = {
    "shaders": 0,            # the GLSL kernels, their registry and the build step
    "engine.formats": 1,     # GGUF files, bundled model files
    "engine.text": 2,        # tokenizers, chat templates, sampling
    "engine.gpu": 2,         # Vulkan, kernels, graphs, ops
    "engine.arch": 3,        # the model architectures
    "engine.vision": 3,      # vision encoders, images, their place in a prompt
    "engine.residency": 4,   # loaded models, the VRAM arbiter, the cross-process arena
    "engine.facade": 5,      # the facade's surface (a Protocol) and its shared types
    "engine.api": 5,         # the facade every front end uses
    "engine.args": 5,        # command-line options front ends share
    "engine.server": 6,      # the HTTP server
    "engine.tools": 6,       # benchmarks, peers, server clients, `hotseat yield`
    "engine.cli": 7,         # `hotseat`
    "app": 8,                # the tray app
}


def _modules() -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


MODULES = _modules()


def _is_package(name: str) -> bool:
    return MODULES[name].name == "__init__.py"


def _targets(name: str) -> set[str]:
    """The project modules `name` imports, with the packages that importing them runs."""
    tree = ast.parse(MODULES[name].read_text())
    package = name if _is_package(name) else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            found.add(mod)
            found.update(f"{mod}.{a.name}" for a in node.names)   # submodules by name
    out = set()
    for mod in found:
        if mod not in MODULES:
            continue
        parts = mod.split(".")
        for i in range(1, len(parts) + 1):                    # a.b.c runs a, a.b, a.b.c
            anc = ".".join(parts[:i])
            if anc in MODULES and not (name == anc or name.startswith(anc + ".")):
                out.add(anc)
    return out


GRAPH = {name: _targets(name) for name in MODULES}


def _layer(name: str) -> tuple[str, int] | None:
    best = None
    for prefix, rank in LAYERS.items():
        if (name == prefix or name.startswith(prefix + ".")) and \
                (best is None or len(prefix) > len(best[0])):
            best = (prefix, rank)
    return best


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_walk_sees_the_imports_it_should():
    # a guard on the walker itself: known edges, a lazy import and a relative one among them
    assert "engine.api" in GRAPH["engine.cli"]                   # inside a function
    assert "engine.gpu.builder" in GRAPH["engine.arch.llama"]    # `from ..gpu.builder import`
    assert "engine.gpu" in GRAPH["engine.arch.llama"]            # the package it runs
    assert "engine.arch.gemma3" in GRAPH["engine.arch"]          # `from . import gemma3`
    assert "engine.facade" in GRAPH["engine.server.metrics"]     # under `if TYPE_CHECKING:`
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_circles():
    assert _cycles(GRAPH) == []


def test_every_module_has_a_layer():
    assert [m for m in MODULES if m not in ("engine",) and _layer(m) is None] == []


def test_imports_go_only_downward():
    upward = []
    for name, targets in GRAPH.items():
        here = _layer(name)
        for t in targets:
            there = _layer(t)
            if here and there and there[1] > here[1]:
                upward.append(f"{name} ({here[0]}) imports {t} ({there[0]})")
    assert upward == []


def test_only_the_arbiter_releases_models():
    """A model's device memory is released in one place, the arbiter's `_free` (a model's
    own close() aside), so its books can never disagree with the device. Releases of
    anything else (the arena's token) take no arguments."""
    allowed = {"engine.residency.arbiter", "engine.residency.model"}
    found = []
    for name, path in MODULES.items():
        if name in allowed:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                    and node.func.attr == "release" and (node.args or node.keywords) \
                    and not ast.unparse(node.func.value).endswith("arbiter"):
                found.append(f"{name}:{node.lineno}: {ast.unparse(node)}")
    assert not found, "releases outside the arbiter:\n" + "\n".join(found)


LONG_LINES = 650      # "about 600"


def test_long_modules_say_why():
    """A module of more than about 600 lines states at its top why it is one module."""
    long = []
    for name, path in MODULES.items():
        text = path.read_text()
        doc = ast.get_docstring(ast.parse(text)) or ""
        if text.count("\n") > LONG_LINES and "Why this module is long:" not in doc:
            long.append(f"{name} ({text.count(chr(10))} lines)")
    assert not long, "split these, or say why they are one module: " + ", ".join(long)


def test_the_servers_route_mixins_share_no_names():
    """Server's handlers come from mixins, one per API; a name defined in two of them would
    silently resolve to the first in the MRO (Ollama's embeddings once ran /v1's helper)."""
    from engine.server.app import Server

    seen: dict[str, str] = {}
    clashes = []
    for base in Server.__mro__[1:]:
        if base is object:
            continue
        for name in vars(base):
            if name.startswith("__"):
                continue
            if name in seen:
                clashes.append(f"{name} in {seen[name]} and {base.__name__}")
            seen.setdefault(name, base.__name__)
    assert not clashes, "; ".join(clashes)
