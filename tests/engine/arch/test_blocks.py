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

# the dense feed-forwards (blocks.ffn) and whether SwiGLU goes into their down product (the
# product fuses SiLU, not GELU); the experts of the MoE architectures read the normed x
# itself, so their norm stays a dispatch
DENSE_FFN = {"llama": True, "qwen2": True, "qwen3": True, "mistral3": True, "phi3": True,
             "gemma2": False, "gpt-oss": None, "qwen35": True, "qwen35moe": None,
             "qwen3next": None, "olmo2": True, "granite": True}
# no norm before the attention and the feed-forward: nothing to fuse into their products
NO_INPUT_NORMS = {"olmo2"}


def expected(arch: str, c) -> tuple[int, int]:
    """(products with the norm inside, down products with SwiGLU inside) in a one-token graph:
    q, k and v of every attention layer, the delta-net layers' input products (q | k | v, z,
    and beta and alpha, one product in qwen3next), a dense feed-forward's gate and up."""
    state = c.state()
    n_attn = c.n_layer if state.kv_layers is None else len(state.kv_layers)
    n_delta = len(state.delta_layers)
    n_ffn = c.n_layer if DENSE_FFN[arch] is not None else 0
    per_delta = 3 if arch == "qwen3next" else 4
    normed = 0 if arch in NO_INPUT_NORMS else 3 * n_attn + per_delta * n_delta + 2 * n_ffn
    return normed, n_ffn if DENSE_FFN[arch] else 0


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

    def counted(self, w, x, y, accumulate, x_row, xform=0, x2=None, eps=0.0, int8=True):
        xforms[xform] += 1
        return matvec(self, w, x, y, accumulate, x_row, xform, x2, eps, int8)

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
    normed, glu = expected(arch, m.config)
    assert got.get(1, 0) == normed and got.get(2, 0) == glu, (arch, got)
    # every layer's input norm and a dense feed-forward's are a dispatch less each, and so
    # is each SwiGLU
    n = m.config.n_layer
    norms = 0 if arch in NO_INPUT_NORMS else n + (n if DENSE_FFN[arch] is not None else 0)
    assert fused == plain - norms - glu, (arch, fused, plain)
    print(f"{arch}: {plain / n:.1f} -> {fused / n:.1f} dispatches a layer (whole graph / "
          f"{n} layers)")


def test_int8_decode_layer_is_seven_dispatches(dev, kc):
    """With int8 activations (mul_mat_vecq) a Llama layer's token is q, k and v (rope applied
    as they come out, k and v written into the caches), attention, the output product,
    gate and up paired, and down: no rope_qkv, rms_norm or silu_mul pass. Every matrix here
    has an int8 reader, so the logits' product takes int8 x too (Builder.int8_throughout)."""
    if not dev.dot4:
        pytest.skip("no VK_KHR_shader_integer_dot_product")
    case = sr.load_case("llama-q4_k_m")
    m = Model(dev, kc, str(case.model_path), n_ctx=case.n_ctx, name="int8-decode")
    try:
        m.tuning.coopmat = False
        m.tuning.matvec, m.tuning.ggml_numerics = True, False
        assert m.paths.decode_matmul == "mul_mat_vecq"
        m.profile = True                         # the graph names its ops
        m.rs.set_step([1], 0)
        g = m._record(1, greedy=True)
        g.replay()
        names = [name for name, _ in g.profile()]
        g.close()
    finally:
        m.close()
    kinds = ["attn" if n == "attn_decode" else "vecq" if n.startswith("mul_mat_vecq_") else n
             for n in names]
    layer = ["vecq"] * 3 + ["attn"] + ["vecq"] * 3
    assert kinds[0].startswith("get_rows") and kinds[-3:] == ["rms_norm", "vecq", "argmax"]
    assert kinds[1:-3] == layer * m.config.n_layer, names


def test_int8_decode_routes_inside_the_experts_product(dev, kc, monkeypatch):
    """With int8 activations a mixture of experts' one-token routing is made inside its
    gate and up product (mul_mat_vecq's ROUTE): no moe_router pass, and the logits the
    same bits as with the pass (HOTSEAT_ROUTE_EXPERTS=off, the setting that brings it back:
    Tuning's GPU settings, here set on the model's tuning); gpt-oss's MXFP4 experts, with
    its softmax over the chosen."""
    import numpy as np

    if not dev.dot4:
        pytest.skip("no VK_KHR_shader_integer_dot_product")
    case = sr.load_case("gpt-oss-mxfp4")
    prompt = [5, 17, 300, 42]
    runs = {}
    for route in (True, False):
        m = Model(dev, kc, str(case.model_path), n_ctx=64, name=f"route-{route}")
        try:
            m.tuning.coopmat = False
            m.tuning.matvec, m.tuning.ggml_numerics = True, False
            m.tuning.route_experts = route
            m.profile = True                     # the graph names its ops
            rows = [m.eval([t], i, greedy=False) for i, t in enumerate(prompt)]
            names = [name for name, _ in m._graph(1, False).profile()]
            runs[route] = (np.stack(rows), names, m.config.n_layer)
        finally:
            m.close()
    (fused, names, n_layer), (apart, names_apart, _) = runs[True], runs[False]
    assert "moe_router" not in names and names_apart.count("moe_router") == n_layer
    assert len(names) == len(names_apart) - n_layer
    assert np.array_equal(fused.view(np.uint32), apart.view(np.uint32))


HEAD_NORMS = {"qwen3", "qwen3moe", "gemma3", "qwen35", "qwen35moe", "qwen3next", "lfm2"}


@pytest.mark.parametrize("name", [n for n in one_per_architecture()
                                  if n.split("-")[0] in HEAD_NORMS])
@pytest.mark.parametrize("n", [1, 4])
def test_head_norms_go_into_rope_qkv(dev, kc, name, n, monkeypatch):
    """Per-head q and k norms (qwen3's attn_q_norm, attn_k_norm) are rope_qkv's, in its pass:
    no rms_norm pass reads q or k, and every attention layer's rope_qkv takes them."""
    case = sr.load_case(name)
    m = Model(dev, kc, str(case.model_path), n_ctx=case.n_ctx, name=name)
    normed, roped = [], []
    rms_norm, rope_qkv = Builder.rms_norm, Builder.rope_qkv

    def rms(self, x, w, out, *a, **kw):
        normed.append(x)
        return rms_norm(self, x, w, out, *a, **kw)

    def rope(self, *a, head_norm=None, **kw):
        roped.append(head_norm is not None)
        return rope_qkv(self, *a, head_norm=head_norm, **kw)

    monkeypatch.setattr(Builder, "rms_norm", rms)
    monkeypatch.setattr(Builder, "rope_qkv", rope)
    try:
        m.rs.set_step([1] * n, 0)
        m._record(n, greedy=True).close()
        q, k = m.rs.q, m.rs.k
        state = m.config.state()
        n_attn = m.config.n_layer if state.kv_layers is None else len(state.kv_layers)
    finally:
        m.close()
    assert not [x for x in normed if x is q or x is k]
    assert roped == [True] * n_attn


def int8_decode(dev, kc, tmp_path, src: str, names: tuple[str, ...], prompt: list[int],
                **tuning) -> tuple[list, list[str], Model]:
    """src's synthetic file with the tensors whose names hold one of `names` in Q8_0 (a
    type mul_mat_vecq reads), each position of prompt decoded as one token on a GPU's
    decode paths (int8 activations, device numerics; Tuning's fields in `tuning` over
    those): (the logit rows, the one-token graph's op names, the closed model for its
    config) and the file's path in tmp_path."""
    import gguf
    import numpy as np
    from gguf.quants import quantize

    if not dev.dot4:
        pytest.skip("no VK_KHR_shader_integer_dot_product")
    q8 = gguf.GGMLQuantizationType.Q8_0
    tensors = {t.name: (quantize(np.array(t.data).astype(np.float32), q8), q8)
               for t in gguf.GGUFReader(str(sr.DATA / f"{src}.gguf")).tensors
               if t.name.endswith(".weight") and any(n in t.name for n in names)}
    path = sr.rewrite(src, str(tmp_path / f"{src}-q8.gguf"), tensors=tensors)
    m = Model(dev, kc, path, n_ctx=256, name=src)
    try:
        m.tuning.coopmat = False
        m.tuning.matvec, m.tuning.ggml_numerics = True, False
        for field, value in tuning.items():
            setattr(m.tuning, field, value)
        m.profile = True                         # the graph names its ops
        rows = [m.eval([t], i, greedy=False) for i, t in enumerate(prompt)]
        ops = [name for name, _ in m._graph(1, False).profile()]
    finally:
        m.close()
    return rows, ops, m


def assert_near_reference(path: str, prompt: list[int], rows: list, bound: float) -> None:
    """Each row's squared error against the numpy reference's logits of the same file,
    relative to the reference's, below bound."""
    import numpy as np

    from engine.formats.gguf_file import GGUFFile
    from tests.helpers.reference import HYBRID_ARCHS, ReferenceModel
    from tests.helpers.reference_hybrid import HybridModel

    with GGUFFile(path) as g:
        ref_model = HybridModel(g, n_ctx=256) if g.arch in HYBRID_ARCHS else \
            ReferenceModel(g, n_ctx=256, quantize_activations=False)
        want = ref_model.forward(prompt, 0)
    for got, ref in zip(rows, want):
        got = np.asarray(got, np.float64)
        assert np.sum((got - ref) ** 2) / np.sum(ref ** 2) < bound


def test_head_norms_on_int8_decode_follow_the_reference(dev, kc, tmp_path):
    """qwen3's per-head q and k norms on int8 decode, where Tuning.head_norm (off by
    default): q, k and v take mul_mat_vecq's products with each head normed and rotated by
    the subgroup that completes it (HNORM), so no rope_qkv pass follows; its attention
    matrices in Q8_0, each position decoded as one token. The logits against the numpy
    reference of the same file (int8 activations: about 1e-4), and against the default,
    the same products with the norms and rope in rope_qkv's pass: the same bits where
    rope_qkv sums a head's squares on one subgroup (lavapipe), as HNORM does; else their
    order moves the last bits of q and k, which the f16 cache and the next product's int8
    rounding may carry (bounded here at 1e-6)."""
    import numpy as np

    prompt = [5, 17, 300, 42, 7, 99, 3, 11]
    names = ("attn_q.", "attn_k.", "attn_v.")
    rows, ops, m = int8_decode(dev, kc, tmp_path, "qwen3-linear-f16", names, prompt,
                               head_norm=True)
    assert "rope_qkv" not in ops and ops.count("mul_mat_vecq_Q8_0") == 3 * m.config.n_layer
    assert_near_reference(m.path, prompt, rows, 2e-3)
    apart, ops_apart, _ = int8_decode(dev, kc, tmp_path, "qwen3-linear-f16", names, prompt)
    assert ops_apart.count("rope_qkv") == m.config.n_layer
    rows, apart = np.stack(rows).astype(np.float64), np.stack(apart).astype(np.float64)
    if m.tuning.norm_wg == dev.subgroup_size:
        assert np.array_equal(rows, apart)
    else:
        assert np.sum((rows - apart) ** 2) / np.sum(apart ** 2) < 1e-6


def test_shared_expert_on_int8_decode_follows_the_reference(dev, kc, tmp_path):
    """Qwen3.5's mixture with a shared expert on int8 decode: the norm goes into the
    router's, the shared gate's and both GLUs' reading of x (no rms_norm pass), the shared
    expert's SwiGLU and its sigmoid gate into its pair's pass (no silu_mul, no mul but the
    attention's output gate); the experts' and the shared expert's matrices in Q8_0, each
    position decoded as one token, the logits against the numpy reference of the same file
    (int8 activations on this file, with the norm and the shared expert's passes apart as
    well: up to 2.8e-3; its gate left out: 0.14 and more)."""
    prompt = [5, 17, 300, 42, 7, 99]
    names = tuple(f"ffn_{j}_{e}." for j in ("gate", "up", "down") for e in ("exps", "shexp"))
    rows, ops, m = int8_decode(dev, kc, tmp_path, "qwen35moe-f16", names, prompt)
    state = m.config.state()
    n_attn = m.config.n_layer if state.kv_layers is None else len(state.kv_layers)
    assert "silu_mul" not in ops and "moe_router" not in ops, ops
    assert ops.count("mul") == n_attn and ops.count("rms_norm") == 1, ops     # the head's
    assert_near_reference(m.path, prompt, rows, 5e-3)


@pytest.mark.parametrize("src", ["qwen2-yarn-f16", "gpt-oss-mxfp4"])
def test_biased_projections_on_int8_decode_follow_the_reference(dev, kc, tmp_path, src):
    """q, k and v with their biases (qwen2's, gpt-oss's) take mul_mat_vecq's rope-fused
    products with the bias in the pass (no add, no rope_qkv), and gpt-oss's output bias and
    its experts' biases and clamped SwiGLU theirs (the router's bias stays an add): the
    attention matrices in Q8_0, each position decoded as one token, its logits against the
    numpy reference of the same file (int8 activations: about 1e-4; a bias left out gave
    0.3 and more)."""
    prompt = [5, 17, 300, 42, 7, 99, 3, 11]
    rows, ops, m = int8_decode(dev, kc, tmp_path, src,
                               ("attn_q.", "attn_k.", "attn_v.", "attn_output."), prompt)
    n_layer, moe = m.config.n_layer, src.startswith("gpt-oss")
    assert "rope_qkv" not in ops and ops.count("add") == (n_layer if moe else 0), ops
    assert ops.count("mul_mat_vecq_MXFP4") == (2 * n_layer if moe else 0), ops
    assert_near_reference(m.path, prompt, rows, 2e-3)
