"""Write tests/data/tokenizer_extra_<model>.json: llama.cpp's own tokenization of hard texts.

Run by hand where llama-cpp-python is installed (CI has none; the tests only read the JSON):

    python tests/tools/make_tokenizer_reference.py            # both bundled models
    python tests/tools/make_tokenizer_reference.py --model gemma3

Every case records llama_tokenize() under the three flag sets engine.tokenizer.encode()
is tested with, the llama_token_to_piece(special=True) bytes of its ids and
llama_detokenize() of them. A digest of every piece in the vocabulary (special on and off)
and the EOG set come along, so the whole id -> bytes table is checked too.
"""
from __future__ import annotations

import argparse
import ctypes
import hashlib
import json
import random
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

OUT = ROOT / "tests" / "data"

# Texts picked to hit every branch of the pre-tokenizers, the special-token partition and
# SentencePiece's byte fallback.
HAND_CASES = [
    "", " ", "  ", "   ", " " * 17, " " * 40, "\t", "\t\t\t", " \t \t", "\n", "\n\n", "\n" * 33,
    "\r\n", "\r\n\r\n", "\r", " \r\n \n\t", "a \n b", "a  \n\n  b", "end   ", "   start",
    "  both  ", "x\u00a0y", "\u3000全角\u3000", "a\u2028b\u2029c", "\x85next line",
    "tab\tseparated\tvalues\t", "trailing tab\t", "\t\tindented", "mixed \t\t  \n\t  runs",
    "don't I'll we've they're she'd it's I'M DON'T WE'VE", "'s 've 're 'll 'd 'm 't",
    "rock'n'roll O'Neil y'all ''quoted'' '", "It's 5 o'clock", "l'homme c'est",
    "1", "12", "123", "1234", "12345678901234567890", "3.14159 -42 +7 1e-10 0x1F 0b1010",
    "1,000,000.00", "２０２４年", "٠١٢٣٤٥٦٧٨٩", "x² + y³ = z¹⁰", "½ ¼ ¾ ⅓", "Ⅻ ⅷ", "①②③",
    "Hello, world!", "HELLO WORLD", "hello\nworld", "Hello,World!How are you?",
    "Café naïve résumé façade coöperate", "e\u0301 a\u0300 n\u0303", "Å vs A\u030a",
    "Привет, мир! Как дела?", "Γειά σου Κόσμε", "שלום עולם", "مرحبا بالعالم ١٢٣",
    "नमस्ते दुनिया", "สวัสดีชาวโลก", "안녕하세요 세계", "你好，世界！", "こんにちは、世界。カタカナ",
    "日本語のテキストと中文文本 and English", "Ελληνικά русский English 中文 العربية",
    "Emoji: 😀😃🤖🚀 👍🏽 👨\u200d👩\u200d👧\u200d👦 🏳️\u200d🌈", "🇫🇷🇩🇪🇯🇵", "1️⃣ #️⃣",
    "❤️❤\ufe0e", "🫨🫠🪿", "😀😀😀😀😀😀😀😀",
    "zero\u200bwidth", "\ufeffBOM", "soft\u00adhyphen", "rtl\u200fmark\u200e", "\x00nul",
    "\x01\x02\x1b[0m\x1f\x7f", "private \ue000\uf8ff", "\uffff\U0010ffff", "\U000e0041tag",
    "𑼄𑼅𑼆 kawi", "𞓐𞓑 nag", "\U00031350\U00031351", "\U0002ebf0", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝐛𝐨𝐥𝐝",
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|>system\nYou are helpful.<|im_end|>", "<|endoftext|>", "a<|endoftext|>b",
    "<|im_start|><|im_start|>", "<|im_start", "|im_end|>", " <|im_end|> ", "<|im_end|>\n\n",
    "<start_of_turn>user\nhi<end_of_turn>\n<start_of_turn>model\n", "<bos>text<eos>",
    "<pad><unk><mask>[multimodal]", "</s> <s> </s>", "a</s>b", "<reponame>x<file_sep>y",
    "<fim_prefix>def f():<fim_suffix>\n<fim_middle>", "<start_of_image>", "<unused0><unused99>",
    "<table><tr><td>x</td></tr></table>", "<h1>Title</h1><code>x</code>", "<html><body>",
    "<div>\n\n\n\n</div>", "<b><i>bold italic</i></b>", "< table >", "<0x41><0x0A>",
    "def foo(x):\n    return x ** 2  # square\n\n\nclass A:\n\tpass\n",
    '{"key": [1, 2.5, null, true], "nested": {"a": "b\\n"}}',
    "int main(void) {\n\tprintf(\"%d\\n\", 42);\n\treturn 0;\n}\n",
    "# Title\n\n- item *one*\n- item **two**\n\n> quote\n\n```py\nx = 1\n```\n",
    "https://example.com/path?query=1&x=y#frag user@example.org",
    "SGVsbG8gV29ybGQhIFRoaXMgaXMgYmFzZTY0Lw==", "0123456789abcdefABCDEF" * 3,
    "!!!???...---___***", "....", "!?", "a.b,c;d:e", "$100 + 50% = #hashtag @mention ^~|`",
    "(parens) [brackets] {braces} <angles>", "naïve_snake_case and camelCaseWord",
    "ALLCAPS lowercase MiXeD CamelCaseWord snake_case_word kebab-case-word",
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
    "▁already escaped ▁space", "▁▁", "  leading and trailing  ",
]

PROSE = """\
The quick brown fox jumps over the lazy dog. It wasn't the first time; the dog, frankly,
didn't care. "Why?" asked the fox -- and the dog's answer (a yawn) said it all...

In 2024, roughly 8,100,000,000 people lived on Earth; 56.2% of them in cities. Prices rose
3.4% year-over-year, i.e. from $1,299.99 to $1,344.16 (approx.). See §4.2(b) & Appendix C.

Das Wetter in München ist heute schön, aber morgen wird es regnen. Ça va? Très bien, merci!
¿Dónde está la biblioteca? Łódź, Kraków, Gdańsk. Ærøskøbing. Þingvellir. İstanbul'da ıslak.
Москва — столица России. Київ — столиця України. Ελλάδα. Հայաստան. საქართველო.
東京は日本の首都です。北京是中国的首都。서울은 한국의 수도입니다。
ภาษาไทยไม่มีการเว้นวรรคระหว่างคำ. हिन्दी भाषा देवनागरी लिपि में लिखी जाती है।

    Indented block with    irregular   spacing	and	tabs.
		Two tabs, then text.
Line with trailing spaces.   
Windows line\r\nendings\r\nhere.

def tokenize(text: str) -> list[int]:
    '''Docstring with "quotes" and 'apostrophes'.'''
    return [ord(c) for c in text if c.isprintable()]  # comment: ok?

| col a | col b |
|-------|-------|
| 1     | 2     |
"""


def fuzz_cases(seed: int, count: int) -> list[str]:
    """Random strings over an alphabet of troublemakers (fixed seed: stable JSON)."""
    rng = random.Random(seed)
    atoms = [
        *"abcXYZ019 ", " ", " ", "  ", "\t", "\n", "\r\n", "'", "'s", "'ll", "'T", ".", ",", "!",
        "?", "-", "_", "$", "+", "<", ">", "|", "^", "~", "`", "é", "ß", "Ж", "ж", "λ", "中",
        "文", "の", "ア", "한", "ا", "١", "٣", "५", "²", "½", "Ⅻ", "\u0301", "\u200d", "\u00a0",
        "\u3000", "\u2003", "😀", "👍🏽", "🇫🇷", "️", "▁", "\x00", "\x1f", "\x7f", "\ue000",
        "don't", "hello", "World", "1234", "  ", "<|im_start|>", "<|im_end|>", "<|endoftext|>",
        "<start_of_turn>", "<end_of_turn>", "<bos>", "<eos>", "</s>", "<td>", "<h1>", "\n\n",
        "   ", "<0x41>", "[multimodal]", "<reponame>",
    ]
    out = []
    for _ in range(count):
        n = rng.randint(1, 24)
        out.append("".join(rng.choice(atoms) for _ in range(n)))
    return out


def unicode_cases() -> list[str]:
    """Code points across the planes, each where its class changes the split ("x'" is a
    contraction only after a letter): pins the Unicode table the pre-tokenizer uses."""
    def line(cps) -> str:
        return "\n".join(f"{chr(c)}'s {chr(c)}x 1{chr(c)}" for c in cps)

    sample = [c for c in range(0, 0x32400, 157) if not 0xD800 <= c < 0xE000]
    cases = [line(sample[i:i + 64]) for i in range(0, len(sample), 64)]
    # ranges assigned in Unicode 15.0/15.1 (newer than Python 3.11's unicodedata)
    newer = [0x1123F, 0x11240, 0x11B00, 0x11B09, 0x11F02, 0x11F04, 0x11F10, 0x11F12, 0x11F33,
             0x11F43, 0x11F4F, 0x11F50, 0x11F59, 0x1342F, 0x13441, 0x13446, 0x1B132, 0x1B155,
             0x1D2C0, 0x1D2D3, 0x1DF25, 0x1DF2A, 0x1E030, 0x1E06D, 0x1E4D0, 0x1E4EB, 0x1E4F0,
             0x1E4F9, 0x2B739, 0x2EBF0, 0x2EE5D, 0x31350, 0x323AF, 0x323B0, 0x10D40, 0x1E5D0]
    cases.append(line(newer))
    return cases


def all_cases() -> list[str]:
    cases = list(HAND_CASES)
    cases.append(PROSE)
    cases.extend(p for p in PROSE.split("\n\n") if p)
    cases.extend(fuzz_cases(seed=1234, count=300))
    seen: set[str] = set()
    return [c for c in cases if not (c in seen or seen.add(c))]


CONVERSATIONS = [
    [{"role": "user", "content": "Hello!"}],
    [{"role": "system", "content": "You are terse."},
     {"role": "user", "content": "What is 2+2?"}],
    [{"role": "user", "content": "Name a colour."},
     {"role": "assistant", "content": "Blue."},
     {"role": "user", "content": "  Another one, please.  "}],
    [{"role": "system", "content": " Answer in French. "},
     {"role": "user", "content": "Café? 😀 <b>bold</b>\n\nTwo lines."},
     {"role": "assistant", "content": "Oui, un café."},
     {"role": "user", "content": "Merci <|im_end|> <end_of_turn>"}],
]


def chat_cases(v: "LlamaVocab", template: str | None, bos: str, eos: str) -> list[dict]:
    """Prompts as llama.cpp renders them, and the ids llama-server would feed the model.

    "gguf": the file's Jinja template through llama-cpp-python's formatter, with the ids
    create_chat_completion uses (add_bos=False, special=True) beside llama-server's
    (leading BOS text dropped when the vocab adds BOS, then add_special and parse_special).
    "chatml" / "gemma": llama_chat_apply_template's built-ins, tokenized as llama-server does.
    """
    from llama_cpp import llama_chat_format

    lib = v.lib
    add_bos = bool(lib.llama_vocab_get_add_bos(v.vocab))
    out = []
    for messages in CONVERSATIONS:
        for add_gen in (True, False):
            if template:
                fmt = llama_chat_format.Jinja2ChatFormatter(
                    template=template, eos_token=eos, bos_token=bos, add_generation_prompt=add_gen)
                res = fmt(messages=messages)
                text = res.prompt
                server_text = text[len(bos):] if add_bos and bos and text.startswith(bos) else text
                out.append({"template": "gguf", "messages": messages,
                            "add_generation_prompt": add_gen, "text": text,
                            "ids_llama_cpp_python": v.tokenize(text, not res.added_special, True),
                            "ids": v.tokenize(server_text, True, True)})
            for name in ("chatml", "gemma"):
                arr = (lib.llama_chat_message * len(messages))(*[
                    lib.llama_chat_message(m["role"].encode(), m["content"].encode())
                    for m in messages])
                buf = ctypes.create_string_buffer(1 << 16)
                n = lib.llama_chat_apply_template(name.encode(), arr, len(messages), add_gen,
                                                  buf, 1 << 16)
                text = buf.raw[:n].decode("utf-8")
                out.append({"template": name, "messages": messages,
                            "add_generation_prompt": add_gen, "text": text,
                            "ids": v.tokenize(text, True, True)})
    return out


class LlamaVocab:
    """The C tokenizer functions of llama-cpp-python, without a context."""

    def __init__(self, path: str):
        import llama_cpp

        self.lib = llama_cpp
        self.llm = llama_cpp.Llama(model_path=path, vocab_only=True, verbose=False)
        self.vocab = llama_cpp.llama_model_get_vocab(self.llm.model)
        self.n_vocab = llama_cpp.llama_vocab_n_tokens(self.vocab)

    def tokenize(self, text: str, add_special: bool, parse_special: bool) -> list[int]:
        data = text.encode("utf-8")
        cap = len(data) + 8
        buf = (self.lib.llama_token * cap)()
        n = self.lib.llama_tokenize(self.vocab, data, len(data), buf, cap, add_special,
                                    parse_special)
        if n < 0:
            raise RuntimeError(f"llama_tokenize failed ({n}) for {text!r}")
        return list(buf[:n])

    def piece(self, token: int, special: bool) -> bytes:
        buf = ctypes.create_string_buffer(64)
        n = self.lib.llama_token_to_piece(self.vocab, token, buf, 64, 0, special)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = self.lib.llama_token_to_piece(self.vocab, token, buf, -n, 0, special)
        return buf.raw[:n]

    def detokenize(self, ids: list[int]) -> bytes:
        arr = (self.lib.llama_token * max(1, len(ids)))(*ids)
        cap = 64 + 64 * len(ids)
        buf = ctypes.create_string_buffer(cap)
        n = self.lib.llama_detokenize(self.vocab, arr, len(ids), buf, cap, False, False)
        if n < 0:
            raise RuntimeError("llama_detokenize buffer too small")
        return buf.raw[:n]


def pieces_digest(v: LlamaVocab, special: bool) -> str:
    h = hashlib.sha256()
    for i in range(v.n_vocab):
        p = v.piece(i, special)
        h.update(len(p).to_bytes(4, "little"))
        h.update(p)
    return h.hexdigest()


def build(model: str) -> dict:
    import llama_cpp

    from engine.formats.bundled import BUNDLED

    path = BUNDLED[model]()
    v = LlamaVocab(path)
    lib = v.lib
    cases = []
    for text in all_cases():
        ids = v.tokenize(text, False, False)
        cases.append({
            "text": text,
            "ids": ids,
            "ids_add_special": v.tokenize(text, True, False),
            "ids_parse_special": v.tokenize(text, False, True),
            "ids_add_parse_special": v.tokenize(text, True, True),
            "pieces_hex": [v.piece(i, True).hex() for i in ids],
            "detokenized_hex": v.detokenize(ids).hex(),
        })
    # the Unicode sweep only needs plain ids: the flags change nothing else there
    sweep = [{"text": text, "ids": v.tokenize(text, False, False)} for text in unicode_cases()]
    meta = v.llm.metadata
    tokens = [v.piece(i, True).decode("utf-8", "replace") for i in range(v.n_vocab)]
    bos = tokens[lib.llama_vocab_bos(v.vocab)] if lib.llama_vocab_bos(v.vocab) >= 0 else ""
    eos = tokens[lib.llama_vocab_eos(v.vocab)] if lib.llama_vocab_eos(v.vocab) >= 0 else ""
    chats = chat_cases(v, meta.get("tokenizer.chat_template"), bos, eos)
    return {
        "model": model,
        "model_file": Path(path).name,
        "llama_cpp_python_version": llama_cpp.__version__,
        "note": "written by tests/tools/make_tokenizer_reference.py; ids: llama_tokenize("
                "add_special=False, parse_special=False); ids_add_special: (True, False); "
                "ids_parse_special: (False, True); ids_add_parse_special: (True, True); "
                "pieces_hex: llama_token_to_piece(special=True) of ids; detokenized_hex: "
                "llama_detokenize(ids, remove_special=False, unparse_special=False); "
                "pieces_sha256*: sha256 over every id of u32le(len) + piece",
        "n_vocab": v.n_vocab,
        "bos_id": lib.llama_vocab_bos(v.vocab),
        "eos_id": lib.llama_vocab_eos(v.vocab),
        "eot_id": lib.llama_vocab_eot(v.vocab),
        "add_bos": bool(lib.llama_vocab_get_add_bos(v.vocab)),
        "add_eos": bool(lib.llama_vocab_get_add_eos(v.vocab)),
        "eog_ids": [i for i in range(v.n_vocab) if lib.llama_vocab_is_eog(v.vocab, i)],
        "pieces_sha256_special": pieces_digest(v, True),
        "pieces_sha256_plain": pieces_digest(v, False),
        "cases": cases,
        "unicode_cases": sweep,
        "chat_cases": chats,
    }


def dump(data: dict) -> str:
    """JSON with one case per line: small diffs when llama.cpp changes."""
    lists = ("cases", "unicode_cases", "chat_cases")
    head = {k: v for k, v in data.items() if k not in lists}
    out = json.dumps(head, ensure_ascii=False, indent=1)[:-2]
    for key in lists:
        rows = ",\n".join(json.dumps(c, ensure_ascii=False) for c in data[key])
        out += f',\n "{key}": [\n{rows}\n]'
    return out + "\n}\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", choices=["smollm2", "gemma3", "all"], default="all")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    models = ["smollm2", "gemma3"] if args.model == "all" else [args.model]
    args.out.mkdir(parents=True, exist_ok=True)
    for model in models:
        data = build(model)
        path = args.out / f"tokenizer_extra_{model}.json"
        path.write_text(dump(data), encoding="utf-8")
        print(f"{path}: {len(data['cases'])} cases")


if __name__ == "__main__":
    main()
