"""Grammar masks over a vocabulary (engine/text/constrain.py), against a brute-force reference:
for a finite language, token t is allowed after text p exactly when p + bytes(t) begins some
sentence, and end-of-generation exactly when p is a sentence."""
from __future__ import annotations

import json

import numpy as np
import pytest

from engine.residency import loop
from engine.text.constrain import Constraint, ConstraintError, Grammar, token_bytes
from engine.text.sampling import Sampler, SamplingParams, apply_mask
from engine.text.tokenizer import Tokenizer

WORDS = ["red", "re", "grün", "日本語", "d car", "ü"]


def spm_vocab() -> Tokenizer:
    """SentencePiece with byte fallback: <unk>, <s>, </s>, the 256 byte tokens, words
    (multi-byte ones among them) and a control token that is not end-of-generation."""
    words = ["r", "e", "d", "re", "red", "gr", "ün", "ü", "日本", "語", "▁car", "<ctl>"]
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + words
    types = [2, 3, 3] + [6] * 256 + [1] * (len(words) - 1) + [3]
    return Tokenizer(model="llama", pre="default", tokens=tokens, token_types=types,
                     scores=[-float(i) for i in range(len(tokens))], merges=None, bos_id=1,
                     eos_id=2, add_space_prefix=False)


def lark_of(words: list[str]) -> Grammar:
    return Grammar.lark("start: " + " | ".join(json.dumps(w) for w in words))


def reference(tok: Tokenizer, sentences: list[bytes], prefix: bytes) -> np.ndarray:
    """bool[n_vocab]: the tokens that keep `prefix` on the way to a sentence."""
    pieces = token_bytes(tok, tok.n_vocab)
    out = np.zeros(tok.n_vocab, dtype=bool)
    for i, b in enumerate(pieces):
        if b and not b.startswith(b"\xff"):
            out[i] = any(s.startswith(prefix + b) for s in sentences)
    for e in tok.eog_ids:
        out[e] = prefix in sentences
    return out


def forced(sentences: list[bytes], prefix: bytes) -> bool:
    """Whether the grammar leaves one next byte only (llguidance then allows the first
    token of that text's own tokenization, not every token that fits)."""
    nxt = {s[len(prefix)] for s in sentences if s.startswith(prefix) and len(s) > len(prefix)}
    return len(nxt) == 1 and prefix not in sentences


def test_masks_match_the_language_on_every_path():
    tok = spm_vocab()
    sentences = [w.encode() for w in WORDS]
    rng = np.random.default_rng(0)
    for walk in range(40):
        c = Constraint(lark_of(WORDS), tok)
        text = b""
        for _ in range(20):
            allowed = c.allowed()
            want = reference(tok, sentences, text)
            assert allowed.any() and not (allowed & ~want).any(), (walk, text)
            if not forced(sentences, text):
                assert np.array_equal(allowed, want), (walk, text,
                                                       np.flatnonzero(allowed ^ want))
            t = int(rng.choice(np.flatnonzero(allowed)))
            if t in tok.eog_ids:
                assert c.complete and text in sentences
                break
            c.advance(t)
            text += tok.piece(t)
        else:
            pytest.fail("the walk never ended")
        c.close()


def test_multibyte_text_through_byte_tokens():
    """Up to six characters other than "a", walked as 日本語 one byte token at a time:
    inside a character only continuation bytes may follow and the end may not come; the
    two-character token 日本 is allowed at the start and after 語's last byte."""
    tok = spm_vocab()
    pieces = token_bytes(tok, tok.n_vocab)
    c = Constraint(Grammar.lark("start: /[^a]{1,6}/"), tok)
    assert c.allowed()[tok.token_id("日本")] and not c.allowed()[tok.token_id("▁car")]
    for i, b in enumerate("日本語".encode()):
        allowed = c.allowed()
        assert allowed[3 + b]
        assert allowed[tok.eos_id] == (i > 0 and i % 3 == 0)
        if i % 3:
            assert all(0x80 <= pieces[t][0] <= 0xBF for t in np.flatnonzero(allowed))
        c.advance(3 + b)
    allowed = c.allowed()
    assert c.complete and allowed[tok.eos_id] and allowed[tok.token_id("日本")]


def test_control_tokens_are_never_text():
    tok = spm_vocab()
    ctl = tok.token_id("<ctl>")
    assert token_bytes(tok, tok.n_vocab)[ctl] == b"\xff<ctl>"
    c = Constraint(Grammar.lark('start: /[^x]*/'), tok)     # any text at all
    assert not c.allowed()[ctl] and not c.allowed()[tok.bos_id]
    assert c.allowed()[tok.eos_id]                           # the empty text is a sentence


def test_a_lazy_grammar_holds_from_its_trigger_on():
    """A call under tool_choice auto: the text is free (the logits pass as they are) until
    the trigger token is chosen; from it on, only the grammar's text, and the end only when
    it is whole."""
    tok = spm_vocab()
    ctl, red = tok.token_id("<ctl>"), tok.token_id("red")
    c = Constraint(Grammar.lark(f'start: <[{ctl}]> "red"', triggers=frozenset({ctl})), tok)
    logits = np.linspace(-1, 1, tok.n_vocab, dtype=np.float32)
    for t in (tok.token_id("gr"), red, 3 + 0x61):          # free text, whatever it is
        assert c.apply(logits) is logits and c.allowed().all() and c.complete
        c.advance(t)
    c.advance(ctl)                                          # the call begins
    allowed = c.allowed()
    assert allowed[red] and not allowed[ctl] and not allowed[tok.eos_id]
    assert not c.complete and np.isneginf(c.apply(logits)[tok.token_id("gr")])
    c.advance(red)
    assert c.complete and c.allowed()[tok.eos_id]
    c.close()


@pytest.fixture(scope="module")
def smollm2(smollm2_path) -> Tokenizer:
    from engine.formats.gguf_file import GGUFFile
    with GGUFFile(smollm2_path) as g:
        return Tokenizer.from_gguf(g)


SCHEMA = {"type": "object",
          "properties": {"name": {"type": "string", "maxLength": 8},
                         "n": {"type": "integer", "minimum": 0, "maximum": 99},
                         "tags": {"type": "array", "items": {"enum": ["a", "bé"]},
                                  "maxItems": 2},
                         "inner": {"type": "object", "properties": {"x": {"type": "number"}},
                                   "required": ["x"], "additionalProperties": False}},
          "required": ["name", "n", "tags", "inner"], "additionalProperties": False}


def test_json_schema_eos_only_when_the_object_is_complete(smollm2):
    text = '{"name": "Ada", "n": 42, "tags": ["bé", "a"], "inner": {"x": -1.5}}'
    ids = smollm2.encode(text, add_special=False)
    c = Constraint(Grammar.json_schema(SCHEMA), smollm2)
    eog = sorted(smollm2.eog_ids)
    for i, t in enumerate(ids):
        allowed = c.allowed()
        assert allowed[t], (i, smollm2.piece(t))
        assert not allowed[eog].any(), f"EOS allowed after {smollm2.decode(ids[:i])!r}"
        c.advance(t)
    assert c.complete
    assert sorted(np.flatnonzero(c.allowed()).tolist()) == eog


@pytest.mark.parametrize("prefix,bad", [
    ('{"name": "Ada", "n": ', '"'),          # an integer, not a string
    ('{"name": "Ada", "n": 4', '.'),         # no fraction in an integer
    ('{"name": "Ada", "n": 10', '0'),         # 100: past the maximum
    ('{"name": "Ada", "n": 1, "tags": ["', 'c'),   # not an enum member
    ('{"name": "', 'Ad'),                    # allowed: text inside the string
])
def test_json_schema_refuses_what_breaks_it(smollm2, prefix, bad):
    c = Constraint(Grammar.json_schema(SCHEMA), smollm2)
    for t in smollm2.encode(prefix, add_special=False):
        c.advance(t)
    allowed = c.allowed()
    t = smollm2.token_id(bad)
    assert t is not None
    inside_string = prefix.endswith('"name": "')
    assert bool(allowed[t]) == inside_string


def test_json_object_any_object(smollm2):
    c = Constraint(Grammar.json_object(), smollm2)
    allowed = c.allowed()
    assert allowed[smollm2.token_id("{")]
    assert not allowed[smollm2.token_id("[")]


def test_gbnf_and_lark_with_embedded_json(smollm2):
    g = Grammar.gbnf('root ::= "yes" | "no" ws\nws ::= " "?')
    c = Constraint(g, smollm2)
    starts = {smollm2.piece(int(t)) for t in np.flatnonzero(c.allowed())}
    assert b"yes" in starts and b"no" in starts and b"maybe" not in starts
    # a tool call: marker + JSON + marker
    g = Grammar.lark('start: "<tool_call>" %json {"type": "object", "properties": '
                     '{"n": {"type": "integer"}}, "required": ["n"], '
                     '"additionalProperties": false} "</tool_call>"')
    c = Constraint(g, smollm2)
    for t in smollm2.encode('<tool_call>{"n": 7}</tool_call>', add_special=False):
        assert c.allowed()[t]
        c.advance(t)
    assert c.complete


@pytest.mark.parametrize("make,param,match", [
    (lambda: Grammar.json_schema({"type": "nope"}), "json_schema", "json_schema"),
    (lambda: Grammar.json_schema("{not json", "response_format.json_schema.schema"),
     "response_format.json_schema.schema", "not valid JSON"),
    (lambda: Grammar.json_schema([1, 2]), "json_schema", "must be a JSON object"),
    (lambda: Grammar.gbnf('root ::= "a', "grammar"), "grammar", "grammar"),
    (lambda: Grammar.gbnf("root ::= undefined_rule"), "grammar", "grammar"),
    (lambda: Grammar.gbnf("   "), "grammar", "non-empty"),
    (lambda: Grammar.lark("start: (", "grammar"), "grammar", "grammar"),
])
def test_bad_grammars_name_their_parameter(make, param, match):
    with pytest.raises(ConstraintError, match=match) as e:
        make()
    assert e.value.param == param


# -- the mask in the sampler chain and the token loop --------------------------------------

def test_masked_tokens_are_never_sampled():
    rng = np.random.default_rng(1)
    logits = rng.normal(size=50).astype(np.float32) * 5
    allowed = np.zeros(50, dtype=bool)
    allowed[[3, 17, 40]] = True
    masked = apply_mask(logits, allowed)
    assert np.all(np.isneginf(masked[~allowed])) and np.array_equal(masked[allowed],
                                                                    logits[allowed])
    s = Sampler(SamplingParams(temperature=1.5, top_k=0, top_p=1.0, min_p=0.0, seed=3,
                               logit_bias={3: 50.0}, repeat_penalty=1.3))
    picks = {s.sample(masked, [3, 3, 17]) for _ in range(200)}
    assert picks <= {3, 17, 40} and 3 in picks
    # ids past the mask (the model's padding beyond the tokenizer) are never allowed
    assert np.isneginf(apply_mask(logits, allowed[:40])[40:]).all()


class ScriptedModel:
    """The loop's view of a model: eval/run give logits that favour one fixed token, so
    that only the mask can make the output follow the grammar."""

    def __init__(self, n_vocab: int, favourite: int):
        self.cache_tokens: list[int] = []
        self.recurrent = False
        self.n_ctx = 256
        self.n_vocab, self.favourite = n_vocab, favourite
        self.greedy_calls: list[bool] = []

    def _logits(self, greedy: bool) -> np.ndarray:
        self.greedy_calls.append(greedy)
        x = np.zeros(self.n_vocab, dtype=np.float32)
        x[self.favourite] = 10.0
        return x

    def reusable(self) -> int:
        return len(self.cache_tokens)

    def eval(self, tokens, pos0, greedy=True, between=None, logprobs=False, prompt=False):
        assert not logprobs
        return self._logits(greedy)

    def run(self, tokens, pos0, greedy):
        return self._logits(greedy)


def test_the_loop_masks_greedy_and_sampled_decoding():
    tok = spm_vocab()
    model = ScriptedModel(tok.n_vocab + 8, favourite=tok.token_id("<ctl>"))
    for sample in (None, Sampler(SamplingParams(temperature=1.0, seed=5)).sample):
        c = Constraint(lark_of(["grün", "日本語"]), tok, n_vocab=model.n_vocab)
        out = list(loop.generate(model, [1, 5], 20, sample, tok.eog_ids, constraint=c))
        c.close()
        assert out[-1] == tok.eos_id
        assert tok.decode(out[:-1]) in ("grün", "日本語")
        assert not any(model.greedy_calls)          # logits read, never the device argmax


def test_a_tokenizers_vocabulary_goes_with_it():
    import gc
    import weakref

    from engine.text import constrain
    tok = spm_vocab()
    Constraint(Grammar.json_object(), tok).close()
    assert tok in constrain._vocabs
    gone = weakref.ref(tok)
    del tok
    gc.collect()
    assert gone() is None
