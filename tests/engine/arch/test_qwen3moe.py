"""qwen3moe on the GPU engine, on a small random model written here: against the numpy
reference, and the same outputs for every expert placement (cpu_moe) with the bytes moved."""
from __future__ import annotations

import numpy as np
import pytest

from engine.facade import Request
from engine.formats.gguf_file import GGUFFile
from engine.residency.loop import generate
from engine.residency.model import Model, PlacementError
from tests.helpers.tiny_gguf import add_qwen3moe_keys, add_spm_vocab

pytestmark = pytest.mark.gpu

N_LAYER, N_EMBD, N_HEAD, N_HEAD_KV, HEAD_DIM = 3, 128, 4, 2, 32
N_EXPERT, N_USED, N_FF_EXP, N_VOCAB = 8, 2, 64, 320
PROMPT = [1, 17, 200, 33, 4, 91, 150, 7, 62]
EXPERTS = ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps")


def write_qwen3moe(path: str, seed: int = 2) -> None:
    """Random weights in a mix of types: F32 embeddings, norms and router; Q8_0, Q4_0 and F16
    attention; Q8_0 gate, Q4_1 up and F16 down experts; a Q8_0 head. Every tensor's size is
    a multiple of 256 bytes, so the weight arenas hold no padding."""
    import gguf
    from gguf.quants import quantize

    rng = np.random.default_rng(seed)
    Q = gguf.GGMLQuantizationType
    w = gguf.GGUFWriter(path, "qwen3moe")
    add_qwen3moe_keys(w, n_layer=N_LAYER, n_embd=N_EMBD, n_head=N_HEAD, n_head_kv=N_HEAD_KV,
                      head_dim=HEAD_DIM, n_expert=N_EXPERT, n_used=N_USED, n_ff_exp=N_FF_EXP)
    add_spm_vocab(w, N_VOCAB)      # for the facade's tokenizer

    def mat(*shape, scale=1.0):
        return (rng.standard_normal(shape) * scale / np.sqrt(shape[-1])).astype(np.float32)

    def add(name, arr, qtype=None):
        if qtype is None:
            w.add_tensor(name, arr)
        elif qtype == Q.F16:
            w.add_tensor(name, arr.astype(np.float16))
        else:
            w.add_tensor(name, quantize(arr, qtype), raw_dtype=qtype)

    add("token_embd.weight", rng.standard_normal((N_VOCAB, N_EMBD)).astype(np.float32))
    add("output_norm.weight", 1 + 0.1 * rng.standard_normal(N_EMBD).astype(np.float32))
    add("output.weight", mat(N_VOCAB, N_EMBD, scale=4.0), Q.Q8_0)
    for i in range(N_LAYER):
        p = f"blk.{i}."
        add(p + "attn_norm.weight", 1 + 0.1 * rng.standard_normal(N_EMBD).astype(np.float32))
        add(p + "attn_q.weight", mat(N_HEAD * HEAD_DIM, N_EMBD), Q.Q8_0)
        add(p + "attn_k.weight", mat(N_HEAD_KV * HEAD_DIM, N_EMBD), Q.Q4_0)
        add(p + "attn_v.weight", mat(N_HEAD_KV * HEAD_DIM, N_EMBD), Q.Q8_0)
        add(p + "attn_q_norm.weight", 1 + 0.1 * rng.standard_normal(HEAD_DIM).astype(np.float32))
        add(p + "attn_k_norm.weight", 1 + 0.1 * rng.standard_normal(HEAD_DIM).astype(np.float32))
        add(p + "attn_output.weight", mat(N_EMBD, N_HEAD * HEAD_DIM), Q.F16)
        add(p + "ffn_norm.weight", 1 + 0.1 * rng.standard_normal(N_EMBD).astype(np.float32))
        add(p + "ffn_gate_inp.weight", mat(N_EXPERT, N_EMBD, scale=3.0))
        add(p + "ffn_gate_exps.weight", mat(N_EXPERT, N_FF_EXP, N_EMBD), Q.Q8_0)
        add(p + "ffn_up_exps.weight", mat(N_EXPERT, N_FF_EXP, N_EMBD), Q.Q4_1)
        add(p + "ffn_down_exps.weight", mat(N_EXPERT, N_EMBD, N_FF_EXP), Q.F16)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.fixture(scope="module")
def moe_path(tmp_path_factory) -> str:
    path = str(tmp_path_factory.mktemp("qwen3moe") / "tiny-qwen3moe.gguf")
    write_qwen3moe(path)
    return path


def nmse(got, want) -> float:
    want = np.asarray(want, np.float64)
    return float(np.sum((np.asarray(got, np.float64) - want) ** 2) / np.sum(want ** 2))


def expert_names(layers) -> list[str]:
    return [f"blk.{i}.{n}.weight" for i in layers for n in EXPERTS]


def run(m: Model, prompt: list[int], n: int) -> tuple[np.ndarray, list[int]]:
    """The prompt's last logits, then n greedy tokens from an empty cache."""
    m.cache_tokens = []
    logits = m.eval(prompt, 0, greedy=False)
    m.cache_tokens = []
    return logits, list(generate(m, prompt, n))


@pytest.fixture(scope="module")
def base_run(dev, kc, moe_path):
    """Logits and greedy tokens with every tensor on the device: what each placement gives."""
    m = Model(dev, kc, moe_path, n_ctx=64, name="all-on-device")
    try:
        yield run(m, PROMPT, 8) + (m.device_bytes(), m.warm_bytes())
    finally:
        m.close()


# -- the architecture --------------------------------------------------------------------------

def test_config_reads_the_qwen3moe_keys(moe_path):
    from engine.arch import qwen3moe

    with GGUFFile(moe_path) as g:
        c = qwen3moe.Config.from_gguf(g)
        assert (c.n_layer, c.n_embd, c.n_head, c.n_head_kv, c.head_dim) == \
            (N_LAYER, N_EMBD, N_HEAD, N_HEAD_KV, HEAD_DIM)
        assert (c.n_expert, c.n_expert_used, c.n_ff, c.n_vocab) == \
            (N_EXPERT, N_USED, N_FF_EXP, N_VOCAB)
        assert {n: g.tensor(n).shape for n in c.tensor_shapes()} == c.tensor_shapes()
        assert c.tensor_shapes()["blk.0.ffn_down_exps.weight"] == (N_FF_EXP, N_EMBD, N_EXPERT)
        c.validate(moe_path)


@pytest.mark.parametrize("ggml_numerics", [False, True])
def test_logits_match_numpy_reference(dev, kc, moe_path, ggml_numerics):
    """Prefill and one decode step against tests/helpers/reference.py: plain float32 (the GPU's f16
    KV cache is the only difference), and with llama.cpp's activation rounding on both sides
    (measured ~1e-13; one Q8 rounding step landing the other way on a last-bit difference in
    summation order costs ~1e-4, a wrong expert or weight far more)."""
    from tests.helpers.reference import ReferenceModel

    m = Model(dev, kc, moe_path, n_ctx=64)
    m.tuning.ggml_numerics = ggml_numerics
    m.tuning.coopmat = False   # f32 products: the matrix units' f16 ones are checked apart,
    m.tuning.dot4 = False      # and the int8 activations of a GPU's decode products
    try:
        with GGUFFile(moe_path) as g:
            ref = ReferenceModel(g, n_ctx=64, quantize_activations=ggml_numerics)
            tol = 1e-3 if ggml_numerics else 1e-6
            got = m.eval(PROMPT, 0, greedy=False)
            assert nmse(got, ref.forward(PROMPT, 0)[-1]) < tol
            got = m.eval([42], len(PROMPT), greedy=False)
            assert nmse(got, ref.forward([42], len(PROMPT))[-1]) < tol
    finally:
        m.close()


@pytest.mark.parametrize("ggml_numerics", [False, True])
def test_greedy_tokens_agree_with_reference(dev, kc, moe_path, ggml_numerics):
    from tests.helpers.reference import ReferenceModel

    m = Model(dev, kc, moe_path, n_ctx=64)
    m.tuning.ggml_numerics = ggml_numerics
    m.tuning.coopmat = False   # f32 products: the matrix units' f16 ones are checked apart
    try:
        with GGUFFile(moe_path) as g:
            want = ReferenceModel(g, n_ctx=64, quantize_activations=ggml_numerics) \
                .generate_greedy(PROMPT, 16)
        assert list(generate(m, PROMPT, 16)) == want
        # routing happened on the device: one decode graph, recorded once, served every step
        decode = m._decode[True, False]
        assert m.run([want[-1]], len(PROMPT) + 15, True) >= 0 and m._decode == {(True, False): decode}
    finally:
        m.close()


def kernel_of(variant: str) -> str:
    from shaders.registry import WEIGHT_TYPES

    return next((variant[:-len(t) - 1] for t in WEIGHT_TYPES if variant.endswith("_" + t)),
                variant)


def test_prefill_groups_tokens_by_expert(dev, kc, moe_path):
    """Prefill runs each expert as one product over its tokens (moe_group and moe_tiles, then
    mul_mat_moe), decode keeps the per-token product; both steps' logits agree with the
    per-token path's (the same sums: measured equal on lavapipe). The grouped products on
    matrix units (f16 inputs) are held to numpy in test_kernels; here the shader cores'."""
    prompt = [(37 * i + 5) % N_VOCAB for i in range(40)]
    runs = {}
    for grouped in (True, False):
        m = Model(dev, kc, moe_path, n_ctx=64, name=f"grouped={grouped}")
        m.tuning.moe_grouped = grouped
        m.tuning.moe_cm = m.tuning.moe_cm2 = False  # mul_mat_moe, as on lavapipe
        m.profile = True                            # graphs keep their ops' names
        try:
            logits = [m.run(prompt, 0, greedy=False), m.run([42], len(prompt), greedy=False)]
            ops = [[kernel_of(n) for n in g._op_names]
                   for g in (m._prefill[(len(prompt), False, False, False)],
                             m._decode[False, False])]
            runs[grouped] = logits, ops
        finally:
            m.close()
    (grouped, (prefill, decode)), (per_token, (prefill_pt, decode_pt)) = runs[True], runs[False]
    assert prefill.count("moe_group") == N_LAYER and "mul_mat_id" not in prefill
    assert prefill.count("moe_tiles") == N_LAYER       # one list for gate, up and down
    assert prefill.count("mul_mat_moe") == 3 * N_LAYER
    assert prefill_pt.count("mul_mat_id") == 3 * N_LAYER and "mul_mat_moe" not in prefill_pt
    assert decode == decode_pt and decode.count("mul_mat_id") == 3 * N_LAYER
    assert "moe_group" not in decode
    for got, want in zip(grouped, per_token):
        assert nmse(got, want) < 1e-12


# -- expert placement --------------------------------------------------------------------------

PLACEMENTS = [
    (0.5, ["blk.0.ffn_gate_exps.weight"]),
    (0.33, ["blk.0.ffn_gate_exps.weight"]),
    (0.66, ["blk.0.ffn_gate_exps.weight", "blk.0.ffn_up_exps.weight"]),
    (1, expert_names([0])),
    (1.5, expert_names([0]) + ["blk.1.ffn_gate_exps.weight"]),
    (N_LAYER, expert_names(range(N_LAYER))),
]


@pytest.mark.parametrize("cpu_moe,host", PLACEMENTS)
def test_placement_moves_exact_bytes_and_keeps_outputs(dev, kc, moe_path, base_run, cpu_moe,
                                                       host):
    base_logits, base_tokens, base_bytes, base_warm = base_run
    before = dev.allocator.totals()["host_weights"]
    m = Model(dev, kc, moe_path, n_ctx=64, cpu_moe=cpu_moe, name=f"cpu_moe={cpu_moe}")
    try:
        assert m.host_tensors == set(host)
        moved = sum(m.gguf.tensor(n).nbytes for n in host)
        assert moved % 256 == 0                     # no padding in the arenas (see above)
        got = m.device_bytes()
        assert got["weights"] == base_bytes["weights"] - moved
        assert {k: v for k, v in got.items() if k != "weights"} == \
            {k: v for k, v in base_bytes.items() if k != "weights"}
        assert m.warm_bytes() == base_warm - moved == sum(got.values())
        assert m.host_weight_bytes == moved
        assert dev.allocator.totals()["host_weights"] - before == moved
        for n, t in m.weights.items():             # the GPU reads them from host memory
            assert all(t.arenas[a].host == (n in host) for _, _, a, _, _ in t.parts), n
        logits, tokens = run(m, PROMPT, 8)
        assert np.array_equal(logits, base_logits) and tokens == base_tokens
    finally:
        m.close()
    assert dev.allocator.totals()["host_weights"] == before


@pytest.mark.parametrize("full,in_place", [(False, True), (True, True), (True, False)])
def test_release_restore_with_host_experts(dev, kc, moe_path, base_run, full, in_place,
                                           monkeypatch):
    """Host-placed experts stay in host memory while the model is cold and are not copied
    on restore; in_place=False takes the discrete-GPU path (device weights restored from a
    host shadow, which holds only the device-placed tensors)."""
    monkeypatch.setattr(Model, "write_in_place", in_place)
    monkeypatch.setattr(Model, "pin_host", False)       # the shadow, not the file's pages
    base_logits, base_tokens, *_ = base_run
    m = Model(dev, kc, moe_path, n_ctx=64, cpu_moe=1.5, name=f"cycle{int(full)}{int(in_place)}")
    try:
        host = list(m.host_arenas)
        if not in_place:
            device = sum(p[5] for p in m._layout[0] if not p[7])     # every device tensor
            assert device <= sum(b.nbytes for b in m.shadow) <= m.weight_bytes
        logits, tokens = run(m, PROMPT, 8)
        assert np.array_equal(logits, base_logits) and tokens == base_tokens
        warm, kv = m.device_bytes(), m.kv_checksum()
        device_tensors = sum(t.nbytes for n, t in m.gguf.tensors.items() if n not in m.host_tensors)
        for _ in range(2):
            m.release(full=full)
            assert m.state == "cold" and m.device_bytes().get("weights", 0) == 0
            if full:
                assert sum(m.device_bytes().values()) == 0
            assert m.host_arenas == host and not any(b.released for b in host)
            assert m.kv_checksum() == kv
            info = m.restore()
            assert m.device_bytes() == warm and m.kv_checksum() == kv
            used_kv = len(m.cache_tokens) * m.rs.kv_row_bytes * 2 * N_LAYER
            assert info["bytes"] == device_tensors + (used_kv if full else 0)   # no experts
            assert m.host_arenas == host
            logits, tokens = run(m, PROMPT, 8)
            assert np.array_equal(logits, base_logits) and tokens == base_tokens
    finally:
        m.close()
    assert all(b.released for b in host)


def test_unsupported_placements(dev, kc, moe_path, smollm2_path):
    for bad, why in ((-0.5, "must be a number >= 0"), (float("nan"), "must be a number"),
                     (N_LAYER + 0.5, "beyond the 3 layers"), (N_LAYER + 1, "beyond"),
                     (1.32, "places whole tensors of layer 1")):
        with pytest.raises(PlacementError, match=why):
            Model(dev, kc, moe_path, n_ctx=64, cpu_moe=bad, warm=False)
    with pytest.raises(PlacementError, match=r"\(llama\) is not a mixture-of-experts model"):
        Model(dev, kc, smollm2_path, n_ctx=64, cpu_moe=1, warm=False)
    Model(dev, kc, smollm2_path, n_ctx=64, cpu_moe=0, warm=False).close()   # dense: 0 is fine


# -- the facade, the command line and the server ----------------------------------------------

def until_eog(tokens: list[int]) -> list[int]:
    return tokens[:tokens.index(2)] if 2 in tokens else tokens     # 2: </s>


def host_bytes(path: str, names) -> int:
    with GGUFFile(path) as g:
        return sum(g.tensor(n).nbytes for n in names)


def test_engine_reports_host_weights_and_grants_device_bytes(moe_path, base_run):
    from engine.api import Engine
    from engine.text.sampling import SamplingParams

    _, base_tokens, base_bytes, base_warm = base_run
    moved = host_bytes(moe_path, expert_names([0]) + ["blk.1.ffn_gate_exps.weight"])
    greedy = SamplingParams(temperature=0.0)
    with Engine(n_ctx=64) as eng:
        eng.load(moe_path, name="moe", cpu_moe=1.5)
        (s,) = eng.status()
        assert s["arch"] == "qwen3moe" and s["cpu_moe"] == 1.5
        assert s["host_weight_bytes"] == moved
        assert s["device_bytes"]["weights"] == base_bytes["weights"] - moved
        assert s["warm_bytes"] == base_warm - moved == eng.arbiter.held("moe")
        vram = eng.vram()
        assert vram["host_weight_bytes"] == moved and vram["granted_bytes"] == base_warm - moved
        want = until_eog(base_tokens)
        for _ in range(2):
            out = eng.generate(Request("moe", tokens=PROMPT, max_tokens=8, sampling=greedy))
            assert out.tokens == want
            eng.evict("moe", full=True)
            (s,) = eng.status()
            assert s["state"] == "cold" and sum(s["device_bytes"].values()) == 0
            assert s["host_weight_bytes"] == moved and eng.arbiter.held("moe") == 0


def test_cli_generate_takes_cpu_moe(dev, kc, moe_path):
    from tests.engine.test_cli import _one_line_error, hotseat

    r = hotseat("generate", "-m", moe_path, "-p", "a0 b1 c2", "--temperature", "0", "-n", "6",
                "--ctx", "64", "--cpu-moe", "0.5", "--json")
    assert r.returncode == 0, r.stderr
    out = __import__("json").loads(r.stdout)
    m = Model(dev, kc, moe_path, n_ctx=64)
    try:
        assert out["tokens"] == until_eog(list(generate(m, out["prompt_tokens"], 6)))
    finally:
        m.close()
    _one_line_error(hotseat("generate", "-m", moe_path, "-p", "a0", "--cpu-moe", "7"),
                    "cpu_moe 7 is beyond the 3 layers")
    _one_line_error(hotseat("generate", "-p", "a0", "--cpu-moe", "1"),
                    "is not a mixture-of-experts model")


def test_serve_and_client_load_take_cpu_moe(moe_path):
    import json
    import signal
    import subprocess
    import sys

    from tests.conftest import ROOT
    from tests.engine.server.test_serve import assert_error, request
    from tests.engine.tools.test_client import KEY, SERVING, hotseat, ok, one_line_error

    env = dict(__import__("os").environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen(
        [sys.executable, "-m", "engine.cli", "serve", "-m", moe_path, "--port", "0", "--ctx",
         "64", "--api-key", KEY, "--cpu-moe", "1"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT, env=env)
    try:
        line = proc.stdout.readline().strip()
        served = SERVING.match(line)
        assert served, (line, proc.stderr.read() if proc.poll() is not None else "")
        url = served.group(2)
        (first,) = json.loads(ok(hotseat("ps", "--json", url=url)))["models"]
        assert first["cpu_moe"] == 1.0
        assert first["host_weight_bytes"] == host_bytes(moe_path, expert_names([0]))
        m = json.loads(ok(hotseat("load", moe_path, "--name", "half", "--cpu-moe", "0.5",
                                  "--json", url=url)))
        gate = host_bytes(moe_path, ["blk.0.ffn_gate_exps.weight"])
        assert m["cpu_moe"] == 0.5 and m["host_weight_bytes"] == gate
        assert m["device_bytes"]["weights"] == first["device_bytes"]["weights"] \
            + first["host_weight_bytes"] - gate
        text = ok(hotseat("load", moe_path, "--name", "third", "--cpu-moe", "3", url=url))
        assert "experts in host memory" in text
        one_line_error(hotseat("load", moe_path, "--name", "x", "--cpu-moe", "9", url=url),
                       "beyond the 3 layers")
        for bad in ("1", -1, True):
            got, _, body = request(url, "POST", "/api/models",
                                   {"path": moe_path, "name": "y", "cpu_moe": bad}, key=KEY)
            assert_error(400, got, body, "cpu_moe", "invalid_value")
        _, _, vram = request(url, "GET", "/api/vram", key=KEY)
        assert vram["host_weight_bytes"] == first["host_weight_bytes"] + gate + \
            host_bytes(moe_path, expert_names(range(N_LAYER)))
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
