"""qwen2, qwen3, phi3 and mistral3 on the GPU engine, and llama with every new weight type
(Q2_K, Q3_K, Q5_1, IQ4_NL, IQ4_XS, BF16), against llama.cpp's logits on the synthetic models
(tests/data/synth; the comparison is tests/helpers/synth_reference.py).

Each case loads the GGUF into a real Model at llama.cpp's context size (phi3's LongRoPE
factors depend on it) and runs the teacher-forced sequence. Every prompt position's logits
come from a pass of up to four tokens ending there (the earlier positions already in the KV
cache, so one-token decode and small prefill passes both count); the prompt's last position
is also one pass of the whole prompt; then each continuation token is one decode step.
"""
from __future__ import annotations

import numpy as np
import pytest

from engine.formats.gguf_file import GGUFFile
from engine.residency.model import Model
from tests.helpers import synth_reference as sr

pytestmark = pytest.mark.gpu

ARCHS = ("qwen2", "qwen3", "phi3", "mistral3")
WEIGHT_TYPES = ("q2_k", "q3_k", "q5_1", "iq4_nl", "iq4_xs", "bf16")
CASES = [n for n in sr.case_names()
         if n.split("-")[0] in ARCHS or n in {f"llama-{t}" for t in WEIGHT_TYPES}]
PASS = 4                # most tokens of the passes that compute each prompt position


def test_every_case_of_these_architectures_and_types_is_here():
    if not CASES:
        pytest.skip(f"{sr.DATA / 'index.json'} missing")
    archs = {n.split("-")[0] for n in CASES}
    assert archs == set(ARCHS) | {"llama"}
    assert {n for n in CASES if n.startswith("llama-")} == {f"llama-{t}" for t in WEIGHT_TYPES}
    assert {"phi3-longrope-f16-short", "phi3-longrope-f16-long"} <= set(CASES)


def run_case(dev, kc, case: sr.Case) -> tuple[np.ndarray, Model]:
    model = Model(dev, kc, str(case.model_path), n_ctx=case.n_ctx)
    try:
        def prefill(prompt: list[int]) -> np.ndarray:
            rows = []
            for i in range(len(prompt)):
                s = max(0, i + 1 - PASS)
                rows.append(model.run(prompt[s:i + 1], s, greedy=False))
            rows[-1] = model.run(prompt, 0, greedy=False)
            return np.stack(rows)

        logits = sr.logits_by_steps(case, prefill,
                                    lambda tok, pos: model.run([tok], pos, greedy=False))
    except BaseException:
        model.close()
        raise
    return logits, model


@pytest.mark.parametrize("name", CASES)
def test_gpu_matches_llamacpp(dev, kc, name):
    case = sr.load_case(name)
    sr.check_file(case)
    logits, model = run_case(dev, kc, case)
    try:
        figures = sr.compare(case, logits)
    finally:
        model.close()
    print(f"{name}: tie margin {case.tie}, ties at {figures['ties']}, cosines "
          f"{figures['cos_prompt_last']:.6f} {figures['cos_last']:.6f}, max |diff| "
          f"{figures['max_diff']:.4f}")
