"""engine.text.tokenizer against llama.cpp's own output for both bundled vocabularies.

Sources: ../shared/reference (written with llama-cpp-python beside the model files) and
tests/data/tokenizer_extra_<model>.json (tests/tools/make_tokenizer_reference.py).
"""
from __future__ import annotations

import functools
import hashlib
import time

import pytest

from engine.formats.gguf_file import GGUFFile
from engine.text.tokenizer import StreamDecoder, Tokenizer
from tests.conftest import load_reference

MODELS = {
    "smollm2": ("tokenizer_smollm2-135m-instruct-q4_1.json", "smollm2-135m-instruct-q4_1.json"),
    "gemma3": ("tokenizer_gemma3-270m-q4_k_m.json", "gemma3-270m-q4_k_m.json"),
}


@functools.lru_cache(maxsize=None)
def gguf_file(model: str) -> GGUFFile:
    """Each bundled GGUF read once per session (reading the metadata is the slow part)."""
    from engine.formats.bundled import BUNDLED
    return GGUFFile(BUNDLED[model]())


@functools.lru_cache(maxsize=None)
def tokenizer_for(model: str) -> Tokenizer:
    return Tokenizer.from_gguf(gguf_file(model))


@pytest.fixture(scope="session", params=list(MODELS))
def model(request, smollm2_path, gemma3_path) -> str:
    return request.param


@pytest.fixture(scope="session")
def tok(model) -> Tokenizer:
    return tokenizer_for(model)


def _report(bad: list[str]) -> None:
    assert not bad, f"{len(bad)} mismatches:\n" + "\n".join(bad[:15])


def test_shared_reference_cases(model, tok):
    ref = load_reference(MODELS[model][0])
    bad = []
    for c in ref["cases"]:
        text = c["text"]
        for key, add, parse in (("ids", False, False), ("ids_add_special", True, False),
                                ("ids_parse_special", False, True)):
            got = tok.encode(text, add_special=add, parse_special=parse)
            if got != c[key]:
                bad.append(f"{key} {text!r}: {got} != {c[key]}")
        pieces = [tok.piece(i).hex() for i in c["ids"]]
        if pieces != c["pieces_hex"]:
            bad.append(f"pieces {text!r}: {pieces} != {c['pieces_hex']}")
        if tok.decode(c["ids"]) != c["detokenized"]:
            bad.append(f"decode {text!r}: {tok.decode(c['ids'])!r}")
    _report(bad)


def test_shared_reference_prompts(model, tok):
    ref = load_reference(MODELS[model][1])
    assert tok.n_vocab == ref["n_vocab"]
    assert (tok.bos_id, tok.eos_id, tok.eot_id) == (ref["bos_id"], ref["eos_id"], ref["eot_id"])
    assert tok.add_bos == (ref["add_bos_metadata"] == "true")
    for name, p in ref["prompts"].items():
        # tokenize_args: add_bos=True (add_special), special=False
        assert tok.encode(p["text"], add_special=True) == p["prompt_ids"], name
        assert tok.decode(p["greedy_ids"]) == p["greedy_text"], name


def test_extra_cases(model, tok):
    ref = load_reference(f"tokenizer_extra_{model}.json")
    bad = []
    for c in ref["cases"]:
        text = c["text"]
        for key, add, parse in (("ids", False, False), ("ids_add_special", True, False),
                                ("ids_parse_special", False, True),
                                ("ids_add_parse_special", True, True)):
            got = tok.encode(text, add_special=add, parse_special=parse)
            if got != c[key]:
                bad.append(f"{key} {text!r}: {got[:20]} != {c[key][:20]}")
        pieces = [tok.piece(i).hex() for i in c["ids"]]
        if pieces != c["pieces_hex"]:
            bad.append(f"pieces {text!r}")
        if tok.decode_bytes(c["ids"]).hex() != c["detokenized_hex"]:
            bad.append(f"decode {text!r}: {tok.decode_bytes(c['ids'])!r}")
    assert len(ref["cases"]) > 400
    _report(bad)


def test_unicode_classes(model, tok):
    """Code points of every plane in contexts where their class decides the split."""
    ref = load_reference(f"tokenizer_extra_{model}.json")
    bad = [f"{c['text'][:40]!r}" for c in ref["unicode_cases"]
           if tok.encode(c["text"], add_special=False) != c["ids"]]
    _report(bad)


def test_special_ids(model, tok):
    ref = load_reference(f"tokenizer_extra_{model}.json")
    assert tok.n_vocab == ref["n_vocab"]
    assert (tok.bos_id, tok.eos_id, tok.eot_id) == (ref["bos_id"], ref["eos_id"], ref["eot_id"])
    assert (tok.add_bos, tok.add_eos) == (ref["add_bos"], ref["add_eos"])
    assert sorted(tok.eog_ids) == ref["eog_ids"]


@pytest.mark.parametrize("special", [True, False])
def test_every_piece(model, tok, special):
    """The bytes of all ids, against a digest of llama_token_to_piece over the vocabulary."""
    ref = load_reference(f"tokenizer_extra_{model}.json")
    h = hashlib.sha256()
    for i in range(tok.n_vocab):
        p = tok.piece(i, special)
        h.update(len(p).to_bytes(4, "little"))
        h.update(p)
    assert h.hexdigest() == ref["pieces_sha256_special" if special else "pieces_sha256_plain"]


def test_build_is_fast(gemma3_path):
    g = gguf_file("gemma3")
    t0 = time.perf_counter()
    tok = Tokenizer.from_gguf(g)
    elapsed = time.perf_counter() - t0
    assert tok.n_vocab == 262144
    assert elapsed < 2.0, f"building the 262k-token tokenizer took {elapsed:.2f} s"


def test_control_tokens_need_parse_special(smollm2_path):
    tok = tokenizer_for("smollm2")
    assert tok.encode("<|im_start|>user", add_special=False, parse_special=True)[0] == 1
    assert 1 not in tok.encode("<|im_start|>user", add_special=False)
    assert tok.is_control(1) and tok.is_eog(2) and not tok.is_eog(1)


def test_user_defined_tokens_always_split(gemma3_path):
    tok = tokenizer_for("gemma3")
    # "<table>" is user-defined: split out without parse_special; "<start_of_turn>" is control
    assert tok.encode("<table>", add_special=False) == [tok.token_id("<table>")]
    assert tok.encode("<start_of_turn>", add_special=False) != [105]
    assert tok.encode("<start_of_turn>", add_special=False, parse_special=True) == [105]
    assert tok.encode("", add_special=True) == [2]


def test_decode_replaces_invalid_utf8(gemma3_path):
    tok = tokenizer_for("gemma3")
    lead = tok.token_id("<0xE2>")       # first byte of a 3-byte character, alone
    assert tok.piece(lead) == b"\xe2"
    assert tok.decode([lead]) == "\ufffd"
    assert tok.decode([tok.bos_id], special=True) == "<bos>"
    assert tok.decode([tok.bos_id]) == ""


@pytest.mark.parametrize("text", ["Emoji: 😀😃🤖🚀 👍🏽 👨\u200d👩\u200d👧\u200d👦",
                                  "日本語のテキスト Café", "\U0001f9ff\U00031350 x", "plain ascii"])
def test_stream_decoder_keeps_characters_whole(model, tok, text):
    ids = tok.encode(text, add_special=False)
    dec = StreamDecoder(tok)
    chunks = [dec.push(i) for i in ids]
    chunks.append(dec.flush())
    assert "".join(chunks) == tok.decode(ids) == text
    assert all("\ufffd" not in c for c in chunks)


def test_stream_decoder_holds_split_characters(smollm2_path):
    tok = tokenizer_for("smollm2")
    ids = tok.encode("😀🤖 👍🏽", add_special=False)
    partial = []
    for i in ids:
        try:
            tok.piece(i).decode("utf-8")
        except UnicodeDecodeError:
            partial.append(i)
    assert partial, "byte-level BPE should split these emoji across tokens"
    dec = StreamDecoder(tok)
    chunks = [dec.push(i) for i in ids]
    assert "" in chunks and "".join(chunks) + dec.flush() == "😀🤖 👍🏽"


def test_stream_decoder_flushes_partial_character(gemma3_path):
    tok = tokenizer_for("gemma3")
    dec = StreamDecoder(tok)
    assert dec.push(tok.token_id("<0xF0>")) == ""
    assert dec.push(tok.token_id("<0x9F>")) == ""
    assert dec.flush() == "\ufffd"


# -- small synthetic vocabularies: behaviour no bundled model exercises ---------------------

def _byte_vocab(extra: list[str]) -> list[str]:
    from engine.text.tokenizer import BYTE_TO_UNICODE
    return list(BYTE_TO_UNICODE) + extra


def test_bpe_merges_by_rank_and_cleans_spaces():
    tokens = _byte_vocab(["ab", "abc", "bc", "Ġ,"])
    tok = Tokenizer(model="gpt2", pre="gpt-2", tokens=tokens, token_types=None, scores=None,
                    merges=["a b", "ab c", "b c", "Ġ ,"], bos_id=None, eos_id=None)
    ab, abc = tokens.index("ab"), tokens.index("abc")
    assert tok.encode("abc", add_special=False) == [abc]           # rank 0 first, then rank 1
    assert tok.encode("abab", add_special=False) == [ab, ab]
    # gpt-2 pre-tokenizer: clean_up_tokenization_spaces on decode
    assert tok.decode(tok.encode("a , b . c 're", add_special=False)) == "a, b. c're"


def test_unsupported_vocabularies_are_refused():
    with pytest.raises(ValueError, match="unsupported tokenizer model"):
        Tokenizer(model="bert", pre="", tokens=["a"], token_types=None, scores=None,
                  merges=None, bos_id=None, eos_id=None)
    with pytest.raises(ValueError, match="pre-tokenizer"):
        Tokenizer(model="gpt2", pre="no-such-pre", tokens=_byte_vocab([]), token_types=None,
                  scores=None, merges=[], bos_id=None, eos_id=None)
