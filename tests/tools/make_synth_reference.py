"""Write tests/data/synth/<case>.npz and index.json: llama.cpp's logits on the synthetic models.

Run by hand where llama-cpp-python is installed, after make_synth_models.py (CI has no
llama-cpp-python; the tests only read what this writes):

    /work/llamacpp-venv/bin/python tests/tools/make_synth_reference.py

Each case runs one model file through llama.cpp's CPU backend (low-level API, 2 threads, no
flash attention, f16 KV cache, n_ubatch 512) at a given context size: the prompt in one
llama_decode with logits at every position, then N_CONT greedy tokens (argmax of the last
logits) decoded one at a time, the last one too, so every position of prompt + continuation
has logits. Stored per case (.npz): prompt_ids, continuation_ids, and over all
n_prompt + N_CONT positions the argmax id and the gap between the two best logits (argmax at
position n_prompt - 1 + i is continuation_ids[i]); the full logits after the prompt and at
the last position, and (cases made since the hybrid ones) logits_steps, the full logits
after the prompt and after each continuation token [N_CONT + 1, n_vocab]. index.json holds
each case's file, its sha256, the context size, the weight types, and the settings. Every tensor's gguf.quants.dequantize (what the tests use) is
checked bit for bit against ggml's own to_float first.
"""
from __future__ import annotations

import argparse
import ctypes
import hashlib
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data" / "synth"
N_CONT = 16
N_THREADS = 2
PROMPT = ("The quick brown fox jumps over the lazy dog, and then the cat sat on the mat in "
          "the house.")

# case name -> (model file stem, n_ctx). phi3 twice: LongRoPE's short factors while the
# context (padded to 256) stays within the file's original 256, the long ones past it.
CASES = {
    "qwen2-yarn-f16": ("qwen2-yarn-f16", 512),
    "qwen2-q8_0": ("qwen2-q8_0", 512),
    "qwen3-linear-f16": ("qwen3-linear-f16", 512),
    "phi3-longrope-f16-short": ("phi3-longrope-f16", 256),
    "phi3-longrope-f16-long": ("phi3-longrope-f16", 512),
    "gemma2-swa-f16": ("gemma2-swa-f16", 512),
    "gemma2-q4_k_m": ("gemma2-q4_k_m", 512),
    "gpt-oss-f16": ("gpt-oss-f16", 512),
    "gpt-oss-mxfp4": ("gpt-oss-mxfp4", 512),
    "mistral3-yarn-f16": ("mistral3-yarn-f16", 512),
    "llama-q2_k": ("llama-q2_k", 512),
    "llama-q3_k": ("llama-q3_k", 512),
    "llama-q5_1": ("llama-q5_1", 512),
    "llama-iq4_nl": ("llama-iq4_nl", 512),
    "llama-iq4_xs": ("llama-iq4_xs", 512),
    "llama-bf16": ("llama-bf16", 512),
    "llama-q4_0": ("llama-q4_0", 512),
    "llama-q4_k_m": ("llama-q4_k_m", 512),
    "qwen3next-f16": ("qwen3next-f16", 512),
    "qwen35-f16": ("qwen35-f16", 512),
    "qwen35moe-f16": ("qwen35moe-f16", 512),
    "qwen35-q8_0": ("qwen35-q8_0", 512),
    "olmo2-f16": ("olmo2-f16", 512),
    "granite-f16": ("granite-f16", 512),
}


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


class LlamaCpp:
    """One model and context through llama-cpp-python's C bindings."""

    def __init__(self, path: Path, n_ctx: int):
        import llama_cpp as L

        self.L = L
        mp = L.llama_model_default_params()
        mp.n_gpu_layers = 0
        self.model = L.llama_model_load_from_file(str(path).encode(), mp)
        if not self.model:
            raise RuntimeError(f"llama.cpp cannot load {path}")
        cp = L.llama_context_default_params()
        cp.n_ctx, cp.n_batch, cp.n_ubatch = n_ctx, 512, 512
        cp.n_threads = cp.n_threads_batch = N_THREADS
        cp.flash_attn_type = L.LLAMA_FLASH_ATTN_TYPE_DISABLED
        self.ctx = L.llama_init_from_model(self.model, cp)
        if not self.ctx:
            raise RuntimeError(f"llama.cpp cannot make a context for {path}")
        self.vocab = L.llama_model_get_vocab(self.model)
        self.n_vocab = L.llama_vocab_n_tokens(self.vocab)
        self.n_past = 0

    def tokenize(self, text: str) -> list[int]:
        L = self.L
        raw = text.encode()
        buf = (L.llama_token * (len(raw) + 8))()
        n = L.llama_tokenize(self.vocab, raw, len(raw), buf, len(buf), True, False)
        if n < 0:
            raise RuntimeError("tokenize failed")
        return list(buf[:n])

    def decode(self, tokens: list[int]) -> np.ndarray:
        """Logits [len(tokens), n_vocab] of tokens placed after the cached ones."""
        L = self.L
        batch = L.llama_batch_init(len(tokens), 0, 1)
        try:
            batch.n_tokens = len(tokens)
            for i, t in enumerate(tokens):
                batch.token[i] = t
                batch.pos[i] = self.n_past + i
                batch.n_seq_id[i] = 1
                batch.seq_id[i][0] = 0
                batch.logits[i] = 1
            rc = L.llama_decode(self.ctx, batch)
            if rc != 0:
                raise RuntimeError(f"llama_decode returned {rc}")
            self.n_past += len(tokens)
            return np.stack([np.ctypeslib.as_array(L.llama_get_logits_ith(self.ctx, i),
                                                   shape=(self.n_vocab,)).copy()
                             for i in range(len(tokens))])
        finally:
            L.llama_batch_free(batch)

    def close(self) -> None:
        self.L.llama_free(self.ctx)
        self.L.llama_model_free(self.model)


def run_case(path: Path, n_ctx: int) -> dict:
    llm = LlamaCpp(path, n_ctx)
    try:
        prompt = llm.tokenize(PROMPT)
        rows = list(llm.decode(prompt))                 # [n_prompt] x [n_vocab]
        cont: list[int] = []
        while len(cont) < N_CONT:
            cont.append(int(np.argmax(rows[-1])))
            rows.extend(llm.decode(cont[-1:]))
        logits = np.stack(rows).astype(np.float32)      # [n_prompt + N_CONT, n_vocab]
    finally:
        llm.close()
    top2 = np.sort(logits, axis=1)[:, -2:]
    return {"prompt_ids": np.array(prompt, np.int32), "continuation_ids": np.array(cont, np.int32),
            "argmax": logits.argmax(axis=1).astype(np.int32),
            "top2_gap": (top2[:, 1] - top2[:, 0]).astype(np.float32),
            "logits_prompt_last": logits[len(prompt) - 1], "logits_last": logits[-1],
            "logits_steps": logits[len(prompt) - 1:]}


def dequant_diff(path: Path) -> float:
    """Largest difference over every tensor of the file between ggml's own to_float (from
    llama-cpp-python's libggml-base) and gguf.quants.dequantize, which the tests use."""
    import gguf
    import llama_cpp

    class Traits(ctypes.Structure):         # struct ggml_type_traits
        _fields_ = [("type_name", ctypes.c_char_p), ("blck_size", ctypes.c_int64),
                    ("blck_size_interleave", ctypes.c_int64), ("type_size", ctypes.c_size_t),
                    ("is_quantized", ctypes.c_bool), ("to_float", ctypes.c_void_p),
                    ("from_float_ref", ctypes.c_void_p)]

    lib = ctypes.CDLL(str(Path(llama_cpp.__file__).parent / "lib" / "libggml-base.so"))
    lib.ggml_get_type_traits.restype = ctypes.POINTER(Traits)
    to_float_t = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)
    worst = 0.0
    for t in gguf.GGUFReader(str(path)).tensors:
        if t.tensor_type == gguf.GGMLQuantizationType.F32:
            continue
        raw = np.ascontiguousarray(np.array(t.data).view(np.uint8))
        ours = np.asarray(gguf.quants.dequantize(np.array(t.data), t.tensor_type), np.float32)
        theirs = np.empty(ours.size, np.float32)
        to_float_t(lib.ggml_get_type_traits(int(t.tensor_type)).contents.to_float)(
            raw.ctypes.data, theirs.ctypes.data, ours.size)
        worst = max(worst, float(np.abs(ours.reshape(-1) - theirs).max()))
    return worst


def description(stem: str) -> str:
    """What the file exercises, from make_synth_models.py."""
    sys.path.insert(0, str(Path(__file__).parent))
    import make_synth_models as m

    pure_q8 = {"qwen35-q8_0": m.make_qwen35, "qwen2-q8_0": m.make_qwen2}
    if stem in pure_q8:
        return " ".join(pure_q8[stem].__doc__.split()) + " Every matrix Q8_0 (llama.cpp's, pure)."
    if stem in m.QUANT_MODELS:
        return f"llama, every matrix (token embedding and output too) {m.QUANT_MODELS[stem][1]}"
    doc = " ".join(m.ARCH_MODELS.get(stem, m.make_gpt_oss).__doc__.split())
    doc = doc.split(" experts: ")[0]        # make_gpt_oss's argument, not the model
    return doc if stem in m.ARCH_MODELS else doc + " Experts MXFP4 (llama.cpp's), the rest F16."


def weight_types(path: Path) -> dict[str, int]:
    import gguf

    counts: dict[str, int] = {}
    for t in gguf.GGUFReader(str(path)).tensors:
        counts[t.tensor_type.name] = counts.get(t.tensor_type.name, 0) + 1
    return dict(sorted(counts.items()))


def main() -> None:
    import llama_cpp

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=DATA)
    ap.add_argument("--only", action="append", help="case names to redo (default: all)")
    args = ap.parse_args()
    llama_cpp.llama_backend_init()
    quiet = llama_cpp.llama_log_callback(lambda *a: None)     # kept alive while llama.cpp runs
    llama_cpp.llama_log_set(quiet, ctypes.c_void_p(0))
    index_path = args.data / "index.json"
    before = json.loads(index_path.read_text()) if index_path.exists() else {}
    old = before.get("cases", [])
    cases = {c["name"]: c for c in old if args.only and c["name"] in CASES}
    for name, (stem, n_ctx) in CASES.items():
        if args.only and name not in args.only:
            continue
        path = args.data / f"{stem}.gguf"
        data = run_case(path, n_ctx)
        np.savez_compressed(args.data / f"{name}.npz", **data)
        gaps = data["top2_gap"]
        print(f"{name:26s} {len(data['prompt_ids'])} prompt ids, continuation "
              f"{data['continuation_ids'].tolist()}, {int((gaps < 0.05).sum())} gaps < 0.05",
              file=sys.stderr)
        diff = dequant_diff(path)
        if diff:
            raise RuntimeError(f"{path.name}: gguf.quants and ggml dequantize {diff} apart")
        cases[name] = {"name": name, "model_file": path.name, "model_sha256": sha256(path),
                       "n_ctx": n_ctx, "data": f"{name}.npz", "n_prompt": len(data["prompt_ids"]),
                       "n_continuation": N_CONT, "weight_types": weight_types(path),
                       "exercises": description(stem),
                       "gguf_quants_equals_ggml_to_float": True}
    ggml = ctypes.CDLL(str(Path(llama_cpp.__file__).parent / "lib" / "libggml-base.so"))
    ggml.ggml_version.restype = ggml.ggml_commit.restype = ctypes.c_char_p
    index = {
        "llama_cpp_python_version": llama_cpp.__version__,
        # the commit CMake read from the vendored llama.cpp checkout when the wheel was built
        "ggml_version": ggml.ggml_version().decode(),
        "ggml_commit": ggml.ggml_commit().decode(),
        "system_info": llama_cpp.llama_print_system_info().decode().strip(),
        "settings": {"backend": "CPU", "n_threads": N_THREADS, "n_batch": 512, "n_ubatch": 512,
                     "flash_attn": False, "type_k": "f16", "type_v": "f16",
                     "prompt": "one llama_decode, logits at every position",
                     "continuation": "argmax of the last logits, one llama_decode per token"},
        "prompt_text": PROMPT,
        "cases": [cases[n] for n in CASES if n in cases],
        # make_synth_vision.py's entries, kept as they are
        "vision_cases": before.get("vision_cases", []),
    }
    index_path.write_text(json.dumps(index, indent=1) + "\n")
    print(f"wrote {index_path}", file=sys.stderr)


if __name__ == "__main__":
    main()
