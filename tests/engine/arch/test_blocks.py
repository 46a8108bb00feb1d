"""The architectures' one-token graphs take the fused decode products of engine/arch/blocks.py
wherever the math allows: the norm before q, k and v (and before a dense feed-forward's gate
and up) goes into those products' reading of x (mul_mat_vec's XFORM 1), and SwiGLU into the
down product (XFORM 2). Recorded on each synthetic file of tests/data/synth with a GPU's
decode paths (mul_mat_vec, device numerics), counting the products by XFORM; the graph
without the fusions is recorded beside it and must take more dispatches."""
from __future__ import annotations

import collections

import pytest

from engine.gpu.builder import Builder
from engine.residency.model import Model
from tests.helpers import synth_reference as sr

pytestmark = pytest.mark.gpu

# what each architecture's layers fuse: (attention through blocks.attention, a dense feed-
# forward through blocks.ffn, its activation SiLU); the others keep their separate norms:
# gpt-oss's and the Qwen3.5 MoE's experts read the normed x itself, Qwen3.5's gated attention
# and delta-net layers share one norm
LAYERS = {
    "llama": ("all", "all", True), "qwen2": ("all", "all", True), "qwen3": ("all", "all", True),
    "mistral3": ("all", "all", True), "phi3": ("all", "all", True),
    "gemma2": ("all", "all", False), "gpt-oss": ("all", "none", False),
    "qwen35": ("none", "all", True), "qwen35moe": ("none", "none", False),
    "qwen3next": ("none", "none", False),
}


def one_per_architecture() -> list[str]:
    seen, names = set(), []
    for name in sr.case_names():
        arch = name.split("-")[0]          # the file names start with the architecture's
        if arch not in seen:
            seen.add(arch)
            names.append(name)
    return names


@pytest.mark.parametrize("name", one_per_architecture())
def test_one_token_graph_fuses_where_the_math_allows(dev, kc, name, monkeypatch):
    case = sr.load_case(name)
    m = Model(dev, kc, str(case.model_path), n_ctx=case.n_ctx, name=name)
    xforms: collections.Counter = collections.Counter()
    matvec = Builder._matvec

    def counted(self, w, x, y, accumulate, x_row, xform=0, x2=None, eps=0.0):
        xforms[xform] += 1
        return matvec(self, w, x, y, accumulate, x_row, xform, x2, eps)

    monkeypatch.setattr(Builder, "_matvec", counted)
    try:
        m.tuning.coopmat = False
        m.tuning.matvec, m.tuning.ggml_numerics = True, False
        g = m._record(1, greedy=True)
        fused, got = g.n_ops, dict(xforms)
        g.close()
        m.tuning.fuse_decode = False
        g = m._record(1, greedy=True)
        plain = g.n_ops
        g.close()
        arch = m.gguf.arch
    finally:
        m.close()
    attn, ffn, silu = LAYERS[arch]
    n = m.config.n_layer
    n_attn = n if attn == "all" else 0
    n_ffn = n if ffn == "all" else 0
    assert got.get(1, 0) == 3 * n_attn + 2 * n_ffn, (arch, got)
    assert got.get(2, 0) == (n_ffn if silu else 0), (arch, got)
    assert fused == plain - (n_attn + n_ffn) - (n_ffn if silu else 0), (arch, fused, plain)
    print(f"{arch}: {plain / n:.1f} -> {fused / n:.1f} dispatches a layer (whole graph / "
          f"{n} layers)")
