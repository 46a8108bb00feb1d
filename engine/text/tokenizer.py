"""Tokenizers that give the same ids as llama.cpp, for its two common vocab types.

`gpt2` vocabularies are byte-level BPE: the text is split into words by the pre-tokenizer
that llama.cpp picks from `tokenizer.ggml.pre`, each word's UTF-8 bytes are mapped to
printable characters and merged by rank. `llama` vocabularies are SentencePiece: spaces
become U+2581 and adjacent pieces are merged by score, with `<0xXX>` byte fallback.

Both follow llama.cpp's src/llama-vocab.cpp and src/unicode.cpp step by step, quirks
included (special-token partitioning first, its hand-written splitters for the GPT-2 and
Llama 3 regexes, the "collapsed" text it feeds std::regex for the others), because a token
id that differs from llama.cpp's is a prompt the model was never shown.

Why this module is long: both algorithms and the pre-tokenizer splitters are ported in the
order llama.cpp has them, so that they can be read side by side with it.

Character classes come from Python's unicodedata (Unicode 14.0) plus the few letters, digits
and punctuation that llama.cpp's Unicode 15.1 table adds.
"""
from __future__ import annotations

import codecs
import heapq
import re
import unicodedata

from ..formats.gguf_file import GGUFFile, ModelFileError

# llama_token_attr bits
ATTR_UNKNOWN = 1 << 0
ATTR_UNUSED = 1 << 1
ATTR_NORMAL = 1 << 2
ATTR_CONTROL = 1 << 3
ATTR_USER_DEFINED = 1 << 4
ATTR_BYTE = 1 << 5
ATTR_LSTRIP = 1 << 7
ATTR_RSTRIP = 1 << 8

# tokenizer.ggml.token_type -> attr (llama_token_type order: undefined, normal, unknown,
# control, user-defined, unused, byte)
_TYPE_ATTR = {0: 0, 1: ATTR_NORMAL, 2: ATTR_UNKNOWN, 3: ATTR_CONTROL, 4: ATTR_USER_DEFINED,
              5: ATTR_UNUSED, 6: ATTR_BYTE}

# -- unicode classes, as llama.cpp's unicode_cpt_flags ----------------------------------------

F_NUMBER = 0x0002
F_LETTER = 0x0004
F_SEPARATOR = 0x0008
F_ACCENT_MARK = 0x0010
F_PUNCTUATION = 0x0020
F_SYMBOL = 0x0040
F_CONTROL = 0x0080
F_WHITESPACE = 0x0100
_WLN = F_WHITESPACE | F_LETTER | F_NUMBER

_CATEGORY_FLAG = {"N": F_NUMBER, "L": F_LETTER, "Z": F_SEPARATOR, "M": F_ACCENT_MARK,
                  "P": F_PUNCTUATION, "S": F_SYMBOL, "C": F_CONTROL}
# The White_Space property (what \s matches in the regex module llama.cpp's table comes from).
_WHITESPACE = frozenset(chr(c) for c in [*range(0x09, 0x0E), 0x20, 0x85, 0xA0, 0x1680,
                                         *range(0x2000, 0x200B), 0x2028, 0x2029, 0x202F,
                                         0x205F, 0x3000])
# llama.cpp's table is Unicode 15.1, Python 3.11's unicodedata is 14.0: the letters, digits
# and punctuation assigned since (letters and digits confirmed code point by code point
# against llama.cpp; the punctuation is Unicode 15.0's new Po ranges).
_NEWER_UNICODE = (
    (0x1123F, 0x11240, F_LETTER), (0x11B00, 0x11B09, F_PUNCTUATION), (0x11F02, 0x11F02, F_LETTER),
    (0x11F04, 0x11F10, F_LETTER), (0x11F12, 0x11F33, F_LETTER), (0x11F43, 0x11F4F, F_PUNCTUATION),
    (0x11F50, 0x11F59, F_NUMBER), (0x1342F, 0x1342F, F_LETTER), (0x13441, 0x13446, F_LETTER),
    (0x1B132, 0x1B132, F_LETTER), (0x1B155, 0x1B155, F_LETTER), (0x1D2C0, 0x1D2D3, F_NUMBER),
    (0x1DF25, 0x1DF2A, F_LETTER), (0x1E030, 0x1E06D, F_LETTER), (0x1E4D0, 0x1E4EB, F_LETTER),
    (0x1E4F0, 0x1E4F9, F_NUMBER), (0x2B739, 0x2B739, F_LETTER), (0x2EBF0, 0x2EE5D, F_LETTER),
    (0x31350, 0x323AF, F_LETTER),
)
_flag_cache: dict[str, int] = {}


def cpt_flags(ch: str) -> int:
    """llama.cpp's category flags of one code point (unassigned ones count as control)."""
    f = _flag_cache.get(ch)
    if f is None:
        cat = unicodedata.category(ch)
        f = _CATEGORY_FLAG[cat[0]]
        if cat == "Cn":
            cp = ord(ch)
            for lo, hi, flag in _NEWER_UNICODE:
                if lo <= cp <= hi:
                    f = flag
                    break
        if ch in _WHITESPACE:
            f |= F_WHITESPACE
        _flag_cache[ch] = f
    return f


def _flags_of(s: str) -> list[int]:
    # one trailing 0 stands for llama.cpp's "out of range" flags past the fragment's end
    get = _flag_cache.get
    out = [get(c) or cpt_flags(c) for c in s]
    out.append(0)
    return out


def _tolower(ch: str) -> str:
    return ch.lower()[0]


def _byte_to_unicode() -> list[str]:
    """GPT-2's map of the 256 byte values to printable code points."""
    keep = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    table = [""] * 256
    for b in keep:
        table[b] = chr(b)
    n = 0
    for b in range(256):
        if not table[b]:
            table[b] = chr(256 + n)
            n += 1
    return table


BYTE_TO_UNICODE = _byte_to_unicode()
UNICODE_TO_BYTE = {c: b for b, c in enumerate(BYTE_TO_UNICODE)}

# -- pre-tokenizer regexes, as llama.cpp lists them per tokenizer.ggml.pre ------------------

GPT2_RE = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
LLAMA3_RE = (r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?"
             r"\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
LLAMA3_RE_ORIG = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?"
                  r"[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_RE = (r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?"
            r"\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

_DEFAULT_RES = [r"[\p{P}\$\+<=>\^~\|]+", GPT2_RE, r"\p{N}+", r"[0-9][0-9][0-9]"]

# name -> (regexes, ignore_merges, add_bos default, clean_spaces)
_PRE: dict[str, tuple[list[str], bool, bool, bool]] = {}


def _pre(names: str, regexes: list[str], *, ignore_merges: bool = False, add_bos: bool = False,
         clean_spaces: bool = True) -> None:
    for name in names.split():
        _PRE[name] = (regexes, ignore_merges, add_bos, clean_spaces)


_pre("default", _DEFAULT_RES)
_pre("llama3 llama-v3 llama-bpe falcon3 falcon-h1 pixtral midm-2.0 lfm2 jina-v5-nano",
     [LLAMA3_RE], ignore_merges=True, add_bos=True)
_pre("dbrx smaug-bpe", [LLAMA3_RE])
_pre("glm4 chatglm-bpe", [LLAMA3_RE])
_pre("falcon", [r"[\p{P}\$\+<=>\^~\|`]+", GPT2_RE, r"[0-9][0-9][0-9]"])
_pre("gpt-2 phi-2 jina-es jina-de gigachat jina-v2-es jina-v2-de a.x-4.0 mellum modern-bert "
     "exaone4 mpt olmo jais jina-v1-en jina-v2-code roberta-bpe", [GPT2_RE])
_pre("trillion granite-docling", [GPT2_RE], clean_spaces=False)
_pre("starcoder refact codeshell exaone minerva-7b mellum2", [r"\p{N}", GPT2_RE])
_pre("smollm command-r", [r"\p{N}", GPT2_RE], clean_spaces=False)
_pre("qwen2 deepseek-r1-qwen kormo f2llmv2 hunyuan solar-open", [QWEN2_RE], clean_spaces=False)
_pre("stablelm2 megrez", [QWEN2_RE])
_pre("deepseek-coder", ["[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", "[一-龥ࠀ-一가-퟿]+", r"\p{N}"],
     clean_spaces=False)
_pre("bloom gpt3-finnish", [" ?[^(\\s|.,!?…。，、।۔،)]+"])
_pre("poro-chat", [" ?[^(\\s|.,!?…。，、।۔،)]+"], clean_spaces=False)


def _split_gpt2(text: str, offsets: list[int]) -> list[int]:
    """unicode_regex_split_custom_gpt2: the GPT-2 regex, by hand, over each fragment."""
    out: list[int] = []
    start = 0
    for length in offsets:
        s = text[start:start + length]
        start += length
        fl = _flags_of(s)
        n = length
        prev = 0
        pos = 0
        while pos < n:
            cpt = s[pos]
            flags = fl[pos]
            # 's|'t|'re|'ve|'m|'ll|'d
            if cpt == "'" and pos + 1 < n:
                nxt = s[pos + 1]
                if nxt in "stmd":
                    pos += 2
                    out.append(pos - prev)
                    prev = pos
                    continue
                if pos + 2 < n and (nxt + s[pos + 2]) in ("re", "ve", "ll"):
                    pos += 3
                    out.append(pos - prev)
                    prev = pos
                    continue
            flags2 = fl[pos + 1] if cpt == " " else flags
            if flags2 & F_LETTER:                       # ' ?\p{L}+'
                pos += cpt == " "
                while flags2 & F_LETTER:
                    pos += 1
                    flags2 = fl[pos]
            elif flags2 & F_NUMBER:                     # ' ?\p{N}+'
                pos += cpt == " "
                while flags2 & F_NUMBER:
                    pos += 1
                    flags2 = fl[pos]
            elif not (flags2 & _WLN) and flags2:        # ' ?[^\s\p{L}\p{N}]+'
                pos += cpt == " "
                while not (flags2 & _WLN) and flags2:
                    pos += 1
                    flags2 = fl[pos]
            else:
                n_ws = 0
                while fl[pos + n_ws] & F_WHITESPACE:
                    n_ws += 1
                if n_ws > 1 and pos + n_ws < n:         # '\s+(?!\S)'
                    pos += n_ws - 1
                elif n_ws > 0:                          # '\s+'
                    pos += n_ws
                else:                                   # no match: one code point alone
                    pos += 1
            if pos > prev:
                out.append(pos - prev)
            prev = pos
    return out


def _split_llama3(text: str, offsets: list[int]) -> list[int]:
    """unicode_regex_split_custom_llama3: the Llama 3 regex, by hand, over each fragment."""
    out: list[int] = []
    start = 0
    for length in offsets:
        s = text[start:start + length]
        start += length
        fl = _flags_of(s)
        n = length
        prev = 0
        pos = 0
        while pos < n:
            cpt = s[pos]
            flags = fl[pos]
            # (?i:'s|'t|'re|'ve|'m|'ll|'d)
            if cpt == "'" and pos + 1 < n:
                nxt = _tolower(s[pos + 1])
                if nxt in "stmd":
                    pos += 2
                    out.append(pos - prev)
                    prev = pos
                    continue
                if pos + 2 < n and (nxt + _tolower(s[pos + 2])) in ("re", "ve", "ll"):
                    pos += 3
                    out.append(pos - prev)
                    prev = pos
                    continue
            # [^\r\n\p{L}\p{N}]?\p{L}+
            if not (cpt == "\r" or cpt == "\n" or flags & F_NUMBER) and (
                    flags & F_LETTER or fl[pos + 1] & F_LETTER):
                pos += 1
                while fl[pos] & F_LETTER:
                    pos += 1
                out.append(pos - prev)
                prev = pos
                continue
            # \p{N}{1,3}
            if flags & F_NUMBER:
                ini = pos
                while fl[pos] & F_NUMBER:
                    pos += 1
                    if pos - ini >= 3:
                        out.append(pos - prev)
                        prev = ini = pos
                if pos > prev:
                    out.append(pos - prev)
                prev = pos
                continue
            # ' ?[^\s\p{L}\p{N}]+[\r\n]*' (llama.cpp tests the first flags, not flags2)
            flags2 = fl[pos + 1] if cpt == " " else flags
            if not (flags2 & _WLN) and flags:
                pos += cpt == " "
                while not (flags2 & _WLN) and flags2:
                    pos += 1
                    flags2 = fl[pos]
                while pos < n and s[pos] in "\r\n":
                    pos += 1
                out.append(pos - prev)
                prev = pos
                continue
            n_ws = 0
            last_rn = 0
            while fl[pos + n_ws] & F_WHITESPACE:
                if s[pos + n_ws] in "\r\n":
                    last_rn = pos + n_ws + 1
                n_ws += 1
            if last_rn > 0:                             # '\s*[\r\n]+'
                pos = last_rn
            elif n_ws > 1 and pos + n_ws < n:           # '\s+(?!\S)'
                pos += n_ws - 1
            elif n_ws > 0:                              # '\s+'
                pos += n_ws
            else:
                pos += 1
            if pos > prev:
                out.append(pos - prev)
            prev = pos
    return out


# unicode_regex_split's "collapsed" text: every code point >= 128 becomes one stand-in byte
# for its category, and \p{..} in the regex becomes a class of that byte plus ASCII members.
_COLLAPSE = {F_NUMBER: "\xd1", F_LETTER: "\xd2", F_PUNCTUATION: "\xd3", F_ACCENT_MARK: "\xd4",
             F_SYMBOL: "\xd5"}
_UCAT = {"\\p{N}": ("\xd1", "0-9"), "\\p{L}": ("\xd2", "A-Za-z"),
         "\\p{P}": ("\xd3", r"!-#%-*,-/:-;?-@\[-\]_\{\}"), "\\p{M}": ("\xd4", ""),
         "\\p{S}": ("\xd5", r"\$\+<->^`\|"), "\\p{Lu}": ("\xd2", "A-Za-z"),
         "\\p{Ll}": ("\xd2", "A-Za-z"), "\\p{Lt}": ("\xd2", "A-Za-z"),
         "\\p{Lm}": ("\xd2", "A-Za-z"), "\\p{Lo}": ("\xd2", "A-Za-z")}


def _collapse_char(c: str) -> str:
    if c < "\x80":
        return c
    f = cpt_flags(c)
    if f & F_WHITESPACE:
        return "\x0b"
    return _COLLAPSE.get(f & 0xFF, "\xd0")


def _collapse_regex(expr: str) -> str:
    out = []
    inside = False
    i = 0
    while i < len(expr):
        c = expr[i]
        if c == "[" and (i == 0 or expr[i - 1] != "\\"):
            out.append("[")
            inside = True
        elif inside and c == "]" and expr[i - 1] != "\\":
            out.append("]")
            inside = False
        elif c == "\\" and expr[i + 1:i + 3] == "p{" and i + 3 < len(expr):
            close = expr.find("}", i + 3)
            pat = expr[i:close + 1] if 0 <= close <= i + 10 else ""
            if pat in _UCAT:
                stand_in, ascii_members = _UCAT[pat]
                body = re.escape(stand_in) + ascii_members
                out.append(body if inside else f"[{body}]")
                i = close + 1
                continue
            out.append(c)
        else:
            out.append(c)
        i += 1
    return "".join(out)


class _PreTokenizer:
    """unicode_regex_split: each regex splits the fragments the previous one left."""

    def __init__(self, regexes: list[str]):
        self.steps: list = []
        for expr in regexes:
            if expr == GPT2_RE:
                self.steps.append(("custom", _split_gpt2))
            elif expr in (LLAMA3_RE, LLAMA3_RE_ORIG):
                self.steps.append(("custom", _split_llama3))
            elif any(cat in expr for cat in _UCAT):
                if any(ord(ch) >= 128 for ch in expr):
                    raise ValueError(f"regex mixes unicode categories and non-ASCII: {expr!r}")
                # re.ASCII: std::regex's \s, \w and \d know ASCII only
                self.steps.append(("collapsed", re.compile(_collapse_regex(expr), re.ASCII)))
            else:
                self.steps.append(("wide", re.compile(expr, re.ASCII)))

    def split(self, text: str) -> list[str]:
        offsets = [len(text)]
        collapsed = wide = None
        for kind, step in self.steps:
            if kind == "custom":
                offsets = step(text, offsets)
                continue
            if kind == "collapsed":
                if collapsed is None:
                    collapsed = "".join(map(_collapse_char, text))
                target = collapsed
            else:
                if wide is None:
                    wide = "".join("\x0b" if c >= "\x80" and cpt_flags(c) & F_WHITESPACE
                                   else c for c in text)
                target = wide
            offsets = _split_regex(target, step, offsets)
        words = []
        start = 0
        for length in offsets:
            words.append(text[start:start + length])
            start += length
        return words


def _split_regex(text: str, pattern: re.Pattern, offsets: list[int]) -> list[int]:
    """unicode_regex_split_stl: matches and the gaps between them, per fragment."""
    out: list[int] = []
    start = 0
    for length in offsets:
        seg = text[start:start + length]
        start += length
        at = 0
        for m in pattern.finditer(seg):
            if m.start() > at:
                out.append(m.start() - at)
            out.append(m.end() - m.start())
            at = m.end()
        if at < length:
            out.append(length - at)
    return out


# -- the tokenizer ------------------------------------------------------------------------

# llama.cpp finds these by their text when the GGUF does not name them
_EOT_TEXTS = ("<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>",
              "<|end_of_text|>", "<EOT>", "_<EOT>", "[EOT]", "<｜end▁of▁sentence｜>",
              "<end_of_utterance>")
_EOM_TEXTS = ("<|eom_id|>",)
_FIM_PAD_TEXTS = ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]")
_FIM_REP_TEXTS = ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>")
_FIM_SEP_TEXTS = ("<|file_sep|>",)
_EOG_TEXTS = frozenset((
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
    "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
    "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
    "<｜end▁of▁sentence｜>", "[e~["))
_OTHER_SPECIAL_TEXTS = (  # FIM tokens llama.cpp also forces to control
    "<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>", "<PRE>", "▁<PRE>",
    "<|code_prefix|>", "<|prefix|>", "<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>",
    "<｜fim▁hole｜>", "<SUF>", "▁<SUF>", "<|code_suffix|>", "<|suffix|>", "<|fim_middle|>",
    "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>", "<MID>", "▁<MID>", "<|code_middle|>",
    "<|middle|>")

_C_SPACE = " \t\n\v\f\r"          # C isspace()
_SURROGATE = re.compile("[\ud800-\udfff]")
_WORD_CACHE_MAX = 1 << 17


class Tokenizer:
    """Text <-> token ids exactly as llama.cpp's llama_tokenize / llama_token_to_piece."""

    def __init__(self, *, model: str, pre: str, tokens: list[str], token_types: list[int] | None,
                 scores: list[float] | None, merges: list[str] | None, bos_id: int | None,
                 eos_id: int | None, eot_id: int | None = None, eom_id: int | None = None,
                 unk_id: int | None = None, fim_ids: dict[str, int] | None = None,
                 add_bos: bool | None = None, add_eos: bool | None = None,
                 add_space_prefix: bool | None = None, model_name: str = ""):
        if model == "llama":
            self.kind = "spm"
        elif model == "gpt2":
            self.kind = "bpe"
        else:
            raise ValueError(f"unsupported tokenizer model {model!r} (supported: gpt2, llama)")
        n = len(tokens)
        if not n:
            raise ValueError("empty vocabulary")
        self.n_vocab = n
        self.model = model
        self.pre = pre

        # id -> text; empty texts get llama.cpp's placeholder so that the map stays 1:1
        self._tokens = [t if t else f"[EMPTY_{i}]" for i, t in enumerate(tokens)]
        self._to_id = {t: i for i, t in enumerate(self._tokens)}
        if len(self._to_id) != n:
            raise ValueError("duplicate token in vocabulary")
        if token_types is not None:
            if len(token_types) < n:
                raise ValueError(f"{len(token_types)} token types for {n} tokens")
            attr = [_TYPE_ATTR.get(t, 0) for t in token_types[:n]]
        else:
            attr = [ATTR_NORMAL] * n
        if scores is not None and len(scores) < n:
            raise ValueError(f"{len(scores)} token scores for {n} tokens")
        self._attr = attr
        self._scores = scores

        if self.kind == "bpe":
            regexes, self._ignore_merges, default_bos, self._clean_spaces = _PRE.get(
                pre or "default", (None, False, False, True))
            if regexes is None:
                raise ValueError(f"unsupported pre-tokenizer {pre!r}")
            self._pretok = _PreTokenizer(regexes)
            self._ranks: dict[tuple[str, str], int] = {}
            for rank, m in enumerate(merges or ()):
                cut = m.find(" ", 1)
                pair = (m[:cut], m[cut + 1:]) if cut >= 0 else ("", "")
                self._ranks.setdefault(pair, rank)
            default_prefix = False
            self._word_cache: dict[str, list[int]] = {}
            default_bos_id, default_eos_id, default_unk = 11, 11, None
            if pre in ("glm4", "chatglm-bpe"):
                default_bos_id = None
        else:
            if scores is None:
                raise ValueError("SentencePiece vocabulary without scores")
            self._ignore_merges = False
            self._clean_spaces = False
            default_bos = True
            default_prefix = True
            default_bos_id, default_eos_id, default_unk = 1, 2, 0
        # encode() prepends the space only for SentencePiece; decode() strips it for both
        self.add_space_prefix = default_prefix if add_space_prefix is None else bool(
            add_space_prefix)

        def in_range(i: int | None) -> int | None:
            return i if i is not None and 0 <= i < n else None

        def pick(given: int | None, default: int | None) -> int | None:
            # a GGUF id outside the vocabulary leaves llama.cpp's default in place
            i = in_range(given)
            return i if i is not None else in_range(default)

        self.bos_id = pick(bos_id, default_bos_id)
        self.eos_id = pick(eos_id, default_eos_id)
        self.unk_id = pick(unk_id, default_unk)
        self.add_bos = default_bos if add_bos is None else bool(add_bos)
        self.add_eos = False if add_eos is None else bool(add_eos)
        if self.add_bos and self.bos_id is None:
            raise ValueError("add_bos_token is true, but bos_token_id is not set")
        if self.add_eos and self.eos_id is None:
            raise ValueError("add_eos_token is true, but eos_token_id is not set")
        self.eot_id, self.eom_id = in_range(eot_id), in_range(eom_id)
        self._find_special_by_text(fim_ids or {})
        if "phi-3" in model_name.lower() or "phi3" in model_name.lower():
            self._phi3_strip()

        # special tokens, longest first, for the partition pass of encode()
        special = [i for i, a in enumerate(attr)
                   if a & (ATTR_CONTROL | ATTR_USER_DEFINED | ATTR_UNKNOWN)]
        special.sort(key=lambda i: -len(self._tokens[i].encode()))
        self._special_all = special
        self._special_user = [i for i in special
                              if not attr[i] & (ATTR_CONTROL | ATTR_UNKNOWN)]
        self._pieces: list[bytes | None] = [None] * n

    # -- construction -----------------------------------------------------------------------
    @classmethod
    def from_gguf(cls, g: GGUFFile) -> "Tokenizer":
        """The tokenizer described by a GGUF file's tokenizer.ggml.* keys."""
        def opt_int(key: str) -> int | None:
            v = g.get(key)
            return None if v is None else int(v)

        model = str(g.require("tokenizer.ggml.model"))
        fim = {}
        for name in ("pre", "suf", "mid", "pad", "rep", "sep"):
            v = opt_int(f"tokenizer.ggml.fim_{name}_token_id")
            if v is not None:
                fim[name] = v
        for old, name in (("prefix", "pre"), ("suffix", "suf"), ("middle", "mid")):
            v = opt_int(f"tokenizer.ggml.{old}_token_id")
            if v is not None:
                fim[name] = v
        try:
            return cls(
                model=model, pre=str(g.get("tokenizer.ggml.pre") or ""),
                tokens=g.require("tokenizer.ggml.tokens"),
                token_types=g.get("tokenizer.ggml.token_type"),
                scores=g.get("tokenizer.ggml.scores"),
                merges=g.get("tokenizer.ggml.merges"),
                bos_id=opt_int("tokenizer.ggml.bos_token_id"),
                eos_id=opt_int("tokenizer.ggml.eos_token_id"),
                eot_id=opt_int("tokenizer.ggml.eot_token_id"),
                eom_id=opt_int("tokenizer.ggml.eom_token_id"),
                unk_id=opt_int("tokenizer.ggml.unknown_token_id"),
                fim_ids=fim,
                add_bos=g.get("tokenizer.ggml.add_bos_token"),
                add_eos=g.get("tokenizer.ggml.add_eos_token"),
                add_space_prefix=g.get("tokenizer.ggml.add_space_prefix"),
                model_name=str(g.get("general.name") or ""))
        except ValueError as exc:
            raise ModelFileError(g.path, f"tokenizer: {exc}") from None

    def _find_special_by_text(self, fim_ids: dict[str, int]) -> None:
        """llama.cpp's text-based detection of EOT/EOM/FIM tokens and of the EOG set."""
        attr, to_id = self._attr, self._to_id

        def detect(current: int | None, texts) -> int | None:
            if current is not None:
                return current
            # llama.cpp takes the first hit of a hash-map walk; the lowest id is stable and
            # agrees with it on the bundled models
            hits = [to_id[t] for t in texts if t in to_id]
            if not hits:
                return None
            for i in hits:
                attr[i] |= ATTR_CONTROL
            return min(hits)

        def in_range(i):
            return i if i is not None and 0 <= i < self.n_vocab else None

        self.eot_id = detect(self.eot_id, _EOT_TEXTS)
        self.eom_id = detect(self.eom_id, _EOM_TEXTS)
        fim_pad = detect(in_range(fim_ids.get("pad")), _FIM_PAD_TEXTS)
        fim_rep = detect(in_range(fim_ids.get("rep")), _FIM_REP_TEXTS)
        fim_sep = detect(in_range(fim_ids.get("sep")), _FIM_SEP_TEXTS)
        for t in _OTHER_SPECIAL_TEXTS:
            if t in to_id:
                attr[to_id[t]] |= ATTR_CONTROL
        for i, a in enumerate(attr):                    # control tokens named "unused"
            if a & ATTR_CONTROL and "unused" in self._tokens[i]:
                attr[i] |= ATTR_UNUSED

        eog = {i for i in (fim_pad, fim_rep, fim_sep) if i is not None}
        for t in _EOG_TEXTS:
            if t in to_id:
                eog.add(to_id[t])
                attr[to_id[t]] |= ATTR_CONTROL
        for t in ("<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"):
            if t in to_id:                              # gpt-oss: always rendered
                attr[to_id[t]] = ATTR_USER_DEFINED
        eog.update(i for i in (self.eos_id, self.eot_id, self.eom_id) if i is not None)
        texts = {self._tokens[i]: i for i in eog}
        if ("<|end|>" in texts and (("<|return|>" in texts and "<|call|>" in texts)
                                    or ("<|calls|>" in texts and "<|flush|>" in texts))):
            eog.discard(texts["<|end|>"])               # harmony / solar-open: <|end|> is not EOG
            attr[texts["<|end|>"]] = ATTR_USER_DEFINED
        if "<|tool_response>" in texts and "</s>" in texts:
            eog.discard(texts["</s>"])
            attr[texts["</s>"]] = ATTR_NORMAL
        self.eog_ids: set[int] = eog

    def _phi3_strip(self) -> None:
        for i, a in enumerate(self._attr):
            if a & (ATTR_CONTROL | ATTR_USER_DEFINED | ATTR_UNKNOWN):
                self._attr[i] |= ATTR_RSTRIP
        for t, on in (("</s>", True), ("<unk>", False), ("<s>", False), ("<|endoftext|>", False)):
            if t in self._to_id:
                i = self._to_id[t]
                self._attr[i] = self._attr[i] | ATTR_RSTRIP if on else self._attr[i] & ~ATTR_RSTRIP

    # -- lookups ----------------------------------------------------------------------------
    def token_id(self, text: str) -> int | None:
        return self._to_id.get(text)

    def is_control(self, token: int) -> bool:
        return bool(self._attr[token] & ATTR_CONTROL)

    def is_eog(self, token: int) -> bool:
        return token in self.eog_ids

    # -- encode -----------------------------------------------------------------------------
    def encode(self, text: str, add_special: bool = True, parse_special: bool = False) -> list[int]:
        """llama_tokenize(text, add_special, parse_special)."""
        if _SURROGATE.search(text):     # not encodable as UTF-8: llama.cpp never sees them
            text = _SURROGATE.sub("\ufffd", text)
        frags = self._partition(text, parse_special) if text else []
        out: list[int] = []
        if add_special and self.add_bos:
            out.append(self.bos_id)
        if self.kind == "spm":
            prev_special = True         # the first fragment gets the space prefix
            for f in frags:
                if isinstance(f, int):
                    out.append(f)
                    prev_special = True
                    continue
                piece = text[f[0]:f[1]]
                if self.add_space_prefix and prev_special:
                    piece = " " + piece
                self._spm(piece.replace(" ", "\u2581"), out)
                prev_special = False
        else:
            for f in frags:
                if isinstance(f, int):
                    out.append(f)
                    continue
                for word in self._pretok.split(text[f[0]:f[1]]):
                    out.extend(self._bpe_word(word))
        if add_special and self.add_eos:
            out.append(self.eos_id)
        return out

    def _partition(self, text: str, parse_special: bool) -> list:
        """tokenizer_st_partition: split out special-token texts, longest first.

        Fragments are token ids or (start, end) spans of `text`. User-defined tokens are
        always split out; control and unknown ones only when parse_special is set.
        """
        frags: list = [(0, len(text))]
        candidates = self._special_all if parse_special else self._special_user
        tokens, attrs = self._tokens, self._attr
        if len(candidates) > 64 and len(text) > 256:
            # thousands of control tokens: scan the text only for those whose first two
            # characters occur in it at all
            pairs = set(zip(text, text[1:]))
            candidates = [t for t in candidates
                          if len(tokens[t]) == 1 or (tokens[t][0], tokens[t][1]) in pairs]
        for tid in candidates:
            tok = tokens[tid]
            if tok not in text:
                continue
            a = attrs[tid]
            out = []
            for f in frags:
                if isinstance(f, int):
                    out.append(f)
                    continue
                start, end = f
                while True:
                    m = text.find(tok, start, end)
                    if m < 0:
                        out.append((start, end))
                        break
                    left_end = m
                    if a & ATTR_LSTRIP:
                        while left_end > start and text[left_end - 1] in _C_SPACE:
                            left_end -= 1
                    if left_end > start:
                        out.append((start, left_end))
                    out.append(tid)
                    start = m + len(tok)
                    if a & ATTR_RSTRIP:
                        while start < end and text[start] in _C_SPACE:
                            start += 1
                    if start >= end:
                        break
            frags = out
        return frags

    def _spm(self, text: str, out: list[int]) -> None:
        """llm_tokenizer_spm_session: merge the best-scoring adjacent pair until none is left."""
        n = len(text)
        if not n:
            return
        to_id, scores = self._to_id, self._scores
        sym = list(text)                # one entry per code point; "" once merged away
        nxt = list(range(1, n + 1))
        nxt[-1] = -1
        prv = list(range(-1, n - 1))
        heap = []
        for i in range(1, n):
            tid = to_id.get(sym[i - 1] + sym[i])
            if tid is not None:
                heap.append((-scores[tid], i - 1, i, 2))
        heapq.heapify(heap)
        push, pop = heapq.heappush, heapq.heappop
        while heap:
            _, left, right, size = pop(heap)
            ls, rs = sym[left], sym[right]
            if not ls or not rs or len(ls) + len(rs) != size:
                continue                # one side changed since this pair was queued
            merged = ls + rs
            sym[left] = merged
            sym[right] = ""
            after = nxt[right]
            nxt[left] = after
            if after >= 0:
                prv[after] = left
            before = prv[left]
            if before >= 0:
                tid = to_id.get(sym[before] + merged)
                if tid is not None:
                    push(heap, (-scores[tid], before, left, len(sym[before]) + len(merged)))
            if after >= 0:
                tid = to_id.get(merged + sym[after])
                if tid is not None:
                    push(heap, (-scores[tid], left, after, len(merged) + len(sym[after])))
        i = 0
        while i != -1:
            s = sym[i]
            tid = to_id.get(s)
            if tid is not None:
                out.append(tid)
            else:
                # only single code points are left unmerged: emit their UTF-8 bytes
                for b in s.encode("utf-8"):
                    out.append(self._byte_token(b))
            i = nxt[i]

    def _byte_token(self, b: int) -> int:
        tid = self._to_id.get(f"<0x{b:02X}>")
        if tid is None and b < 0x80:
            tid = self._to_id.get(chr(b))
        if tid is None:
            raise ValueError(f"vocabulary has no byte token for 0x{b:02X}")
        return tid

    def _bpe_word(self, word: str) -> list[int]:
        """llm_tokenizer_bpe_session for one pre-tokenized word (cached)."""
        cached = self._word_cache.get(word)
        if cached is not None:
            return cached
        encoded = "".join([BYTE_TO_UNICODE[b] for b in word.encode("utf-8")])
        to_id = self._to_id
        if self._ignore_merges and encoded in to_id:
            ids = [to_id[encoded]]
        else:
            ids = []
            for s in self._bpe_merge(encoded):
                tid = to_id.get(s)
                if tid is not None:
                    ids.append(tid)
                    continue
                # llama.cpp looks each UTF-8 byte up as a one-byte text: only ASCII can hit
                for b in s.encode("utf-8"):
                    if b < 0x80 and chr(b) in to_id:
                        ids.append(to_id[chr(b)])
        if len(self._word_cache) >= _WORD_CACHE_MAX:
            self._word_cache.clear()
        self._word_cache[word] = ids
        return ids

    def _bpe_merge(self, word: str) -> list[str]:
        ranks = self._ranks
        n = len(word)
        if n < 2:
            return [word] if n else []
        sym = list(word)
        nxt = list(range(1, n + 1))
        nxt[-1] = -1
        prv = list(range(-1, n - 1))
        heap = []
        for i in range(1, n):
            r = ranks.get((sym[i - 1], sym[i]))
            if r is not None:
                heap.append((r, i - 1, i, sym[i - 1] + sym[i]))
        heapq.heapify(heap)
        push, pop = heapq.heappush, heapq.heappop
        while heap:
            _, left, right, text = pop(heap)
            ls, rs = sym[left], sym[right]
            if not ls or not rs or ls + rs != text:
                continue                # outdated pair
            sym[left] = text
            sym[right] = ""
            after = nxt[right]
            nxt[left] = after
            if after >= 0:
                prv[after] = left
            before = prv[left]
            if before >= 0:
                r = ranks.get((sym[before], text))
                if r is not None:
                    push(heap, (r, before, left, sym[before] + text))
            if after >= 0:
                r = ranks.get((text, sym[after]))
                if r is not None:
                    push(heap, (r, left, after, text + sym[after]))
        return [s for s in sym if s]

    # -- decode -----------------------------------------------------------------------------
    def piece(self, token: int, special: bool = True) -> bytes:
        """llama_token_to_piece(token, lstrip=0, special): the exact bytes of one token."""
        if not special and self._attr[token] & (ATTR_CONTROL | ATTR_UNKNOWN):
            return b""
        p = self._pieces[token]
        if p is None:
            p = self._pieces[token] = self._make_piece(token)
        return p

    def _make_piece(self, token: int) -> bytes:
        text, a = self._tokens[token], self._attr[token]
        if a & (ATTR_CONTROL | ATTR_UNKNOWN | ATTR_USER_DEFINED):
            return text.encode("utf-8")
        if a & ATTR_NORMAL:
            if self.kind == "spm":
                return text.replace("\u2581", " ").encode("utf-8")
            out = bytearray()
            for c in text:
                b = UNICODE_TO_BYTE.get(c)
                if b is not None:
                    out.append(b)
                else:                   # llama_decode_text's marker for unmappable text
                    out += f"[UNK_BYTE_0x{c.encode().hex()}{text}]".encode()
            return bytes(out)
        if a & ATTR_BYTE:
            return bytes([int(text[3:5], 16)])
        return b""

    def decode_bytes(self, ids: list[int], special: bool = False) -> bytes:
        """llama_detokenize(ids, remove_special=False, unparse_special=special)."""
        parts = [self.piece(t, special) for t in ids]
        if self.add_space_prefix and parts and parts[0][:1] == b" ":
            parts[0] = parts[0][1:]     # SentencePiece's leading space
        data = b"".join(parts)
        return _clean_spaces(data) if self._clean_spaces else data

    def decode(self, ids: list[int], special: bool = False) -> str:
        """Text of the ids; invalid or partial UTF-8 becomes U+FFFD."""
        return self.decode_bytes(ids, special).decode("utf-8", "replace")


def _clean_spaces(text: bytes) -> bytes:
    """llama_detokenize's three clean_up_tokenization_spaces passes, byte for byte."""
    if not text:
        return text
    t = text
    out = bytearray(t[:1])              # " ?", " !", " .", " ,": drop the space
    for i in range(1, len(t)):
        if t[i - 1] == 0x20 and t[i] in b"?!.,":
            out.pop()
        out.append(t[i])
    t = bytearray(out)
    out = bytearray(t[:1])              # " ' " -> "'"; llama.cpp blanks the next byte to NUL
    i = 1
    while i < len(t):
        x = t[i]
        if x == 0x27 and i + 1 < len(t) and t[i - 1] == 0x20 and t[i + 1] == 0x20:
            out.pop()
            t[i + 1] = 0
            i += 1
        out.append(x)
        i += 1
    t = bytes(out)
    out = bytearray(t[:1])              # " 's", " 'm", " 're", " 've": drop the space
    for i in range(1, len(t)):
        x = t[i]
        if t[i - 1] == 0x20 and x == 0x27 and i + 1 < len(t):
            x1 = t[i + 1]
            if x1 in b"sm" or (x1 not in b"td" and i + 2 < len(t)
                               and t[i + 1:i + 3] in (b"re", b"ve")):
                out.pop()
        out.append(x)
    return bytes(out)


class StreamDecoder:
    """Turns ids arriving one by one into text without splitting a UTF-8 character.

    Each call returns the text completed so far; bytes of an unfinished character wait for
    the next token, invalid ones become U+FFFD. Pieces are joined as they are (no
    clean-up pass), as llama-server streams them.
    """

    def __init__(self, tokenizer: Tokenizer, special: bool | frozenset[int] = False):
        # special: every control token's text kept, or only those of the given ids
        self.tokenizer = tokenizer
        self.special = special
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self._first = True

    def push(self, token: int) -> str:
        special = self.special if isinstance(self.special, bool) else token in self.special
        data = self.tokenizer.piece(token, special)
        if self._first:                 # as decode(): SentencePiece's leading space goes
            self._first = False
            if self.tokenizer.add_space_prefix and data[:1] == b" ":
                data = data[1:]
        return self._decoder.decode(data)

    def flush(self) -> str:
        """Whatever is still held back (an unfinished character becomes U+FFFD)."""
        return self._decoder.decode(b"", final=True)
