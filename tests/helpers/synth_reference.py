"""llama.cpp's stored logits on the synthetic models (tests/data/synth), and the one comparison
every forward pass is held to against them: the numpy reference's test uses it, and so can a
GPU architecture's.

    from tests.helpers import synth_reference as sr

    for case in sr.cases():                 # or sr.load_case("gemma2-swa-f16")
        sr.check_file(case)                 # the GGUF is the one llama.cpp ran
        logits = sr.logits_by_steps(case, prefill, step)   # or any [n_tokens, n_vocab]
        sr.compare(case, logits)            # AssertionError naming the step or the cosine

prefill(prompt_ids) -> [n_prompt, n_vocab] logits of a fresh sequence; step(token, pos) ->
[n_vocab] logits of one more token at pos (through the KV cache). llama.cpp ran the same way:
the prompt in one batch, then one token per decode.

The checks: at every position of prompt + continuation (teacher-forced: the continuation is
llama.cpp's greedy one), the same argmax as llama.cpp, except where llama.cpp's two best
logits are within a tie margin of each other; and cosine similarity >= MIN_COS of the whole
logit vector after the prompt and at the last position (and after every continuation token,
where the case stores those logits).

The margin: TIE for float weights (F16, BF16, F32), QUANT_TIE where some weight is quantized.
llama.cpp multiplies quantized weights by activations rounded to 8-bit blocks (Q8_0, Q8_1,
Q8_K); float activations move these models' logits by up to ~0.2, and so does rounding them
the same way (the reference's quantize_activations, the GPU path's Tuning.ggml_numerics):
its products agree with ggml's to 3e-7 row by row, and the first positions' logits to 2e-6,
but further on some values land on the other side of a rounding step from tiny differences
elsewhere (summation order, ggml's vectorised exp are candidates) and the flips add up.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

DATA = Path(__file__).resolve().parents[1] / "data" / "synth"
TIE = 0.05              # llama.cpp's top-2 gap under which either argmax counts
QUANT_TIE = 0.3         # the same where weights are quantized (see above)
MIN_COS = 0.999
FLOAT_TYPES = {"F32", "F16", "BF16"}


@dataclass(frozen=True)
class Case:
    name: str
    model_path: Path
    model_sha256: str
    n_ctx: int                      # llama.cpp's context size (phi3's LongRoPE depends on it)
    weight_types: dict
    prompt_ids: list[int]
    continuation_ids: list[int]     # llama.cpp's greedy tokens after the prompt
    argmax: np.ndarray              # [n_tokens] llama.cpp's argmax at each position
    top2_gap: np.ndarray            # [n_tokens] its best logit minus its second best
    logits_prompt_last: np.ndarray  # [n_vocab] after the prompt
    logits_last: np.ndarray         # [n_vocab] at the last position
    # [n_continuation + 1, n_vocab] after the prompt and after each continuation token (the
    # cases made since the hybrid ones); None in older files
    logits_steps: np.ndarray | None = None

    @property
    def quantized(self) -> bool:
        """Some weight llama.cpp multiplies with 8-bit-rounded activations."""
        return bool(set(self.weight_types) - FLOAT_TYPES)

    @property
    def tie(self) -> float:
        """llama.cpp's top-2 gap under which a different argmax is a tie, not an error."""
        return QUANT_TIE if self.quantized else TIE

    @property
    def tokens(self) -> list[int]:
        """Prompt and continuation: the sequence whose every position is checked."""
        return self.prompt_ids + self.continuation_ids


def index() -> dict:
    return json.loads((DATA / "index.json").read_text())


def load_case(name: str) -> Case:
    entry = next(c for c in index()["cases"] if c["name"] == name)
    return _case(entry)


def cases() -> list[Case]:
    return [_case(c) for c in index()["cases"]]


def case_names() -> list[str]:
    return [c["name"] for c in index()["cases"]] if (DATA / "index.json").exists() else []


def _case(entry: dict) -> Case:
    with np.load(DATA / entry["data"]) as z:
        return Case(name=entry["name"], model_path=DATA / entry["model_file"],
                    model_sha256=entry["model_sha256"], n_ctx=int(entry["n_ctx"]),
                    weight_types=entry["weight_types"], prompt_ids=z["prompt_ids"].tolist(),
                    continuation_ids=z["continuation_ids"].tolist(), argmax=z["argmax"],
                    top2_gap=z["top2_gap"], logits_prompt_last=z["logits_prompt_last"],
                    logits_last=z["logits_last"],
                    logits_steps=z["logits_steps"] if "logits_steps" in z.files else None)


def check_file(case: Case) -> None:
    """The stored GGUF is byte for byte the one llama.cpp's logits come from."""
    digest = hashlib.sha256(case.model_path.read_bytes()).hexdigest()
    assert digest == case.model_sha256, f"{case.model_path.name}: sha256 {digest} is not " \
                                        f"the indexed {case.model_sha256}"


def logits_by_steps(case: Case, prefill: Callable[[list[int]], np.ndarray],
                    step: Callable[[int, int], np.ndarray]) -> np.ndarray:
    """[n_tokens, n_vocab]: prefill(prompt), then step(token, position) for each continuation
    token in turn, the last one included (its logits are the last position's)."""
    rows = list(np.asarray(prefill(case.prompt_ids), dtype=np.float32))
    assert len(rows) == len(case.prompt_ids), "prefill must return a row per prompt token"
    for i, tok in enumerate(case.continuation_ids):
        rows.append(np.asarray(step(tok, len(case.prompt_ids) + i), dtype=np.float32))
    return np.stack(rows)


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.astype(np.float64), b.astype(np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def compare(case: Case, logits: np.ndarray, tie: float | None = None) -> dict:
    """Assert logits [n_tokens, n_vocab] agree with llama.cpp's, argmax differences allowed
    where its top-2 gap is under tie (default case.tie); return the figures (positions that
    were ties, the two cosines, the largest logit difference at the two stored rows)."""
    tie = case.tie if tie is None else tie
    n = len(case.tokens)
    assert logits.shape == (n, len(case.logits_last)), f"logits {logits.shape}, expected " \
                                                       f"({n}, {len(case.logits_last)})"
    ours = logits.argmax(axis=1)
    differ = np.nonzero(ours != case.argmax)[0]
    wrong = [int(i) for i in differ if case.top2_gap[i] >= tie]
    figures = {
        "ties": [int(i) for i in differ if case.top2_gap[i] < tie],
        "cos_prompt_last": cosine(logits[len(case.prompt_ids) - 1], case.logits_prompt_last),
        "cos_last": cosine(logits[-1], case.logits_last),
        "max_diff": float(max(np.abs(logits[len(case.prompt_ids) - 1]
                                     - case.logits_prompt_last).max(),
                              np.abs(logits[-1] - case.logits_last).max())),
    }
    assert not wrong, (f"{case.name}: argmax differs from llama.cpp's at positions {wrong} "
                       f"(ours {ours[wrong].tolist()}, llama.cpp's {case.argmax[wrong].tolist()}"
                       f", its top-2 gaps {case.top2_gap[wrong].round(3).tolist()})")
    keys = ["cos_prompt_last", "cos_last"]
    if case.logits_steps is not None:       # every step of the continuation, where stored
        steps = logits[len(case.prompt_ids) - 1:]
        figures["cos_steps_min"] = min(cosine(a, b) for a, b in zip(steps, case.logits_steps))
        keys.append("cos_steps_min")
    for key in keys:
        assert figures[key] >= MIN_COS, f"{case.name}: {key} {figures[key]:.6f} < {MIN_COS}"
    return figures


def rewrite(src: str, dst: str, kv: dict | None = None, tensors: dict | None = None,
            drop: tuple[str, ...] = ()) -> str:
    """A copy of the synthetic GGUF `src` with keys changed (strings) and tensors added,
    replaced (an array, or (raw bytes, ggml type) for a quantized one) or dropped; the other
    tensors as they are, in their own types."""
    import gguf

    plain = (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16)
    r = gguf.GGUFReader(str(DATA / f"{src}.gguf"))
    w = gguf.GGUFWriter(dst, r.fields["general.architecture"].contents())
    kv = kv or {}
    for name, f in r.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture" or name in kv:
            continue
        sub = f.types[-1] if f.types[0] == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(name, f.contents(), f.types[0], sub)
    for name, value in kv.items():
        w.add_string(name, value)
    tensors = dict(tensors or {})
    for t in r.tensors:
        if t.name not in drop:
            kept = (np.array(t.data), None if t.tensor_type in plain else t.tensor_type)
            tensors.setdefault(t.name, kept)
    for name, value in tensors.items():
        data, qtype = value if isinstance(value, tuple) else (value, None)
        w.add_tensor(name, data, raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dst
