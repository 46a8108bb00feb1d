"""Write engine/tools/reference/llamacpp_<model>.json: llama.cpp's greedy output for plain
and chat prompts.

Run by hand where llama-cpp-python is installed (CI has none; the tests only read the JSON):

    python tests/tools/make_llamacpp_reference.py            # both bundled models
    python tests/tools/make_llamacpp_reference.py --model gemma3

Every case records the exact prompt ids llama.cpp was fed, 64 greedy ids (pure argmax of
the last logits after each llama_decode; stopped early only by an end-of-generation token,
which is kept as the last id), their text, the top 10 logits after the prompt and the top 20
log-probabilities after it (a float64 log-softmax of all of llama.cpp's float32 logits, the
numbers `hotseat precision` measures engines against).

Plain prompts are tokenized as the shared references are: add_special=True,
parse_special=False. Chat prompts for SmolLM2 are rendered with the GGUF chat template the
way llama-cpp-python's create_chat_completion renders it (its Jinja2ChatFormatter, then
tokenize(add_bos=not added_special, special=True)); Gemma's file has no template, so its
chat prompts use llama.cpp's built-in "gemma" template (llama_chat_apply_template) with BOS.
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
sys.path.insert(0, str(ROOT))

OUT = ROOT / "engine" / "tools" / "reference"      # package data: hotseat precision reads it
N_GREEDY = 64
N_CTX = 2048
N_TOP_LOGPROBS = 20

LONG = """\
The history of the printing press is, in many ways, the history of modern Europe. Before
Johannes Gutenberg built his press in Mainz around 1440, books were copied by hand, usually
by monks working in scriptoria, and a single Bible could take a scribe more than a year to
finish. Books were therefore rare and expensive, and literacy was confined to the clergy and
a small part of the nobility. Gutenberg combined several existing technologies: the screw
press used for wine and olive oil, oil-based inks, and above all movable metal type cast in
a hand mould from an alloy of lead, tin and antimony. Within fifty years, presses were
operating in more than two hundred and fifty European cities, and an estimated twenty million
volumes had been printed. The consequences were enormous. Scientific results could be shared
quickly and accurately, so that astronomers in Kraków and Padua worked from identical tables.
Martin Luther's pamphlets spread across Germany in weeks, which helped the Reformation take
hold before the authorities could respond. Vernacular languages became standardized as
printers chose one spelling over another, and cheap almanacs, ballads and news sheets created
a new reading public among merchants and artisans. Historians still debate how quickly these
changes happened and how much credit belongs to the press itself, but few doubt that it
changed the way knowledge was produced, stored and passed on. In the end, the most important
effect of the printing press may have been that"""

PLAIN = [
    ("france", "The capital of France is Paris, and the capital of Germany is"),
    ("short", "Hello"),
    ("story", "Once upon a time, in a small village by the sea, there lived"),
    ("long", LONG),
    ("unicode", "Café, naïve, façade — in Japanese, 日本語 means \"Japanese\"; in Russian, "
                "привет means"),
    ("code", "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n"),
    ("list", "Shopping list:\n1. Apples\n2. Bread\n3."),
    ("math", "Question: What is 12 times 7?\nAnswer:"),
]

CHAT = [
    ("greeting", [{"role": "user", "content": "Hi! How are you today?"}]),
    ("system", [{"role": "system", "content": "You are a terse assistant. Answer in one line."},
                {"role": "user", "content": "What is the boiling point of water at sea level?"}]),
    ("multiturn", [{"role": "user", "content": "My name is Ada."},
                   {"role": "assistant", "content": "Nice to meet you, Ada!"},
                   {"role": "user", "content": "What is my name?"}]),
    ("code", [{"role": "user", "content": "Write a Python function that reverses a string."}]),
    ("list", [{"role": "user", "content": "List three primary colors."}]),
    ("unicode", [{"role": "user", "content": "Translate to French: «Good morning, my friend» 🙂"}]),
]


def _logits(llm) -> np.ndarray:
    """The last row llama_decode produced (logits_all=False keeps only that one)."""
    return np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(llm.n_vocab(),)).copy()


def _top_logprobs(logits: np.ndarray, k: int) -> list[list]:
    """The k most likely (id, log-probability), best first: log-softmax in float64."""
    x = logits.astype(np.float64)
    m = x.max()
    lse = m + np.log(np.exp(x - m).sum())
    order = np.argsort(-x, kind="stable")[:k]
    return [[int(i), float(x[i] - lse)] for i in order]


def _greedy(llm, prompt_ids: list[int]) -> tuple[list[int], list[list], list[list], bool]:
    """Argmax ids after prompt_ids, the top 10 (id, logit) and top 20 (id, log-probability)
    after the prompt, whether EOG hit."""
    import llama_cpp

    vocab = llama_cpp.llama_model_get_vocab(llm._model.model)
    llm.reset()
    llm.eval(prompt_ids)
    logits = _logits(llm)
    order = np.argsort(-logits, kind="stable")[:10]
    top10 = [[int(i), float(logits[i])] for i in order]
    top20 = _top_logprobs(logits, N_TOP_LOGPROBS)
    out: list[int] = []
    while len(out) < N_GREEDY:
        tok = int(np.argmax(logits))
        out.append(tok)
        if llama_cpp.llama_vocab_is_eog(vocab, tok):
            return out, top10, top20, True
        if len(out) < N_GREEDY:
            llm.eval([tok])
            logits = _logits(llm)
    return out, top10, top20, False


def _render_jinja(llm, messages: list[dict]) -> tuple[str, bool]:
    """As Llama.__init__ builds its chat_template.default handler, and the handler renders."""
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter

    eos_id, bos_id = llm.token_eos(), llm.token_bos()
    fmt = Jinja2ChatFormatter(
        template=llm.metadata["tokenizer.chat_template"],
        eos_token=llm._model.token_get_text(eos_id) if eos_id != -1 else "",
        bos_token=llm._model.token_get_text(bos_id) if bos_id != -1 else "",
        stop_token_ids=[eos_id])
    result = fmt(messages=messages)
    return result.prompt, not result.added_special


def _render_builtin(template: str, messages: list[dict]) -> str:
    """llama.cpp's own llama_chat_apply_template with a built-in template name."""
    import llama_cpp

    msgs = (llama_cpp.llama_chat_message * len(messages))(
        *[llama_cpp.llama_chat_message(m["role"].encode(), m["content"].encode())
          for m in messages])
    size = 4096
    while True:
        buf = ctypes.create_string_buffer(size)
        n = llama_cpp.llama_chat_apply_template(template.encode(), msgs, len(messages), True,
                                                buf, size)
        if n < 0:
            raise RuntimeError(f"llama_chat_apply_template({template!r}) failed: {n}")
        if n <= size:
            return buf.raw[:n].decode()
        size = n


def make(name: str, path: str) -> dict:
    import llama_cpp
    from llama_cpp import Llama

    llm = Llama(model_path=path, n_ctx=N_CTX, n_gpu_layers=0, seed=0, logits_all=False,
                verbose=False)
    has_template = "tokenizer.chat_template" in llm.metadata
    cases = []

    def record(case: dict, prompt_ids: list[int]) -> None:
        ids, top10, top20, eog = _greedy(llm, prompt_ids)
        case.update(prompt_ids=prompt_ids, n_prompt_tokens=len(prompt_ids), greedy_ids=ids,
                    greedy_text=llm.detokenize(ids, special=True).decode("utf-8", "replace"),
                    stopped_at_eog=eog, last_logits_top10=top10, last_logprobs_top20=top20)
        cases.append(case)
        print(f"  {case['kind']:5s} {case['name']:10s} {len(prompt_ids):4d} prompt ids, "
              f"{len(ids)} greedy", file=sys.stderr)

    for case_name, text in PLAIN:
        ids = llm.tokenize(text.encode(), add_bos=True, special=False)
        record({"name": case_name, "kind": "plain", "text": text,
                "tokenize_args": "add_bos=True (add_special), special=False"}, ids)
    for case_name, messages in CHAT:
        if has_template:
            text, add_bos = _render_jinja(llm, messages)
            how = "GGUF chat template via llama-cpp-python's Jinja2ChatFormatter"
        else:
            text, add_bos = _render_builtin("gemma", messages), True
            how = "llama.cpp built-in template 'gemma' (llama_chat_apply_template)"
        ids = llm.tokenize(text.encode(), add_bos=add_bos, special=True)
        record({"name": case_name, "kind": "chat", "messages": messages, "text": text,
                "template": how, "tokenize_args": f"add_bos={add_bos}, special=True"}, ids)

    sha = hashlib.sha256(Path(path).read_bytes()).hexdigest()
    return {
        "model": name,
        "model_file": Path(path).name,
        "model_sha256": sha,
        "llama_cpp_python_version": llama_cpp.__version__,
        "settings": {"n_ctx": N_CTX, "n_gpu_layers": 0, "seed": 0, "flash_attn": False,
                     "type_k": "f16", "type_v": "f16", "sampling": "argmax of llama_get_logits"},
        "n_vocab": llm.n_vocab(),
        "n_greedy": N_GREEDY,
        "n_top_logprobs": N_TOP_LOGPROBS,
        "llama_print_system_info": llama_cpp.llama_print_system_info().decode().strip(),
        "cases": cases,
    }


def main() -> None:
    from engine.formats.bundled import gemma3_path, smollm2_path

    models = {"smollm2": smollm2_path, "gemma3": gemma3_path}
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", choices=sorted(models), action="append")
    args = ap.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    for name in args.model or list(models):
        print(name, file=sys.stderr)
        data = make(name, models[name]())
        out = OUT / f"llamacpp_{name}.json"
        out.write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n")
        print(f"wrote {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
