"""llama.cpp's CPU backend, in process through llama-cpp-python, as a benchmark peer.

Used where llama-server's prebuilt Vulkan build cannot run a model on this machine (its CPU
library needs instructions this CPU lacks). Prefill and decode are timed the same way as
hotseat's own: the same prompt ids from an empty cache, then greedy decode steps.
"""
from __future__ import annotations

import os
import statistics
import time


def available() -> bool:
    import importlib.util

    return importlib.util.find_spec("llama_cpp") is not None


def bench_llama_cpp(model: str, prompt: list[int], n_gen: int, repeats: int,
                    n_threads: int | None = None) -> dict:
    try:
        import llama_cpp
        import numpy as np
    except ImportError:
        raise ValueError("llama-cpp-python is not installed (pip install llama-cpp-python, "
                         "built with CMAKE_ARGS=-DGGML_NATIVE=ON)") from None
    threads = n_threads or os.cpu_count() or 1
    llm = llama_cpp.Llama(model_path=model, n_ctx=max(2048, len(prompt) + n_gen + 8),
                          n_batch=512, n_gpu_layers=0, n_threads=threads, verbose=False)
    try:
        def run() -> tuple[float, float]:
            llm.reset()
            t0 = time.perf_counter()
            llm.eval(prompt)
            t1 = time.perf_counter()
            tok = int(np.argmax(llm.scores[llm.n_tokens - 1]))
            for _ in range(n_gen):
                llm.eval([tok])
                tok = int(np.argmax(llm.scores[llm.n_tokens - 1]))
            t2 = time.perf_counter()
            return len(prompt) / (t1 - t0), n_gen / (t2 - t1) if n_gen else 0.0

        run()                                               # warm-up
        samples = [run() for _ in range(repeats)]
    finally:
        llm.close()
    return {"device": f"CPU ({threads} threads, llama-cpp-python {llama_cpp.__version__})",
            "prefill_samples": [s[0] for s in samples],
            "decode_samples": [s[1] for s in samples],
            "prefill_tokens_per_s": statistics.median(s[0] for s in samples),
            "decode_tokens_per_s": statistics.median(s[1] for s in samples)}
