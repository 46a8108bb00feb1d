"""engine.text.chat: rendering like HF/llama.cpp, token ids like llama-server."""
from __future__ import annotations

import datetime

import pytest

from engine.text.chat import ChatTemplate
from tests.conftest import load_reference
from tests.engine.text.test_tokenizer import gguf_file, tokenizer_for

SMOL_SYSTEM = ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, "
               "trained by Hugging Face<|im_end|>\n")


@pytest.fixture(scope="module")
def smol(smollm2_path) -> ChatTemplate:
    return ChatTemplate.from_gguf(gguf_file("smollm2"))


@pytest.fixture(scope="module")
def gemma(gemma3_path) -> ChatTemplate:
    return ChatTemplate.from_gguf(gguf_file("gemma3"))


def test_smollm2_user_message_gets_default_system_prompt(smol):
    text = smol.render([{"role": "user", "content": "Hello!"}])
    assert text == SMOL_SYSTEM + "<|im_start|>user\nHello!<|im_end|>\n<|im_start|>assistant\n"
    assert smol.builtin is None and smol.bos_token == "<|im_start|>"


def test_smollm2_multi_turn(smol):
    messages = [{"role": "system", "content": "Be brief."},
                {"role": "user", "content": "Hi"},
                {"role": "assistant", "content": "Hello."},
                {"role": "user", "content": "Bye"}]
    assert smol.render(messages) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\nHello.<|im_end|>\n<|im_start|>user\nBye<|im_end|>\n"
        "<|im_start|>assistant\n")
    without = smol.render(messages, add_generation_prompt=False)
    assert without.endswith("<|im_start|>user\nBye<|im_end|>\n")


def test_smollm2_ids_are_control_tokens(smol):
    tok = tokenizer_for("smollm2")
    ids = smol.tokenize(tok, [{"role": "user", "content": "Hello!"}])
    assert ids[0] == 1                  # <|im_start|>, parsed as a control token, no BOS added
    assert ids.count(1) == 3 and ids.count(2) == 2
    assert tok.decode(ids, special=True) == smol.render([{"role": "user", "content": "Hello!"}])


def test_gemma_falls_back_to_builtin(gemma):
    assert gemma.builtin == "gemma" and gemma.bos_token == "<bos>"
    messages = [{"role": "system", "content": "  Be brief.  "},
                {"role": "user", "content": " Hi "},
                {"role": "assistant", "content": "Hello."},
                {"role": "user", "content": "Bye"}]
    assert gemma.render(messages) == (
        "<start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n"
        "<start_of_turn>model\nHello.<end_of_turn>\n"
        "<start_of_turn>user\nBye<end_of_turn>\n<start_of_turn>model\n")
    tok = tokenizer_for("gemma3")
    ids = gemma.tokenize(tok, messages[1:2])
    assert ids[:2] == [tok.bos_id, 105] and ids[-3:] == [105, tok.token_id("model"), 107]


@pytest.mark.parametrize("model", ["smollm2", "gemma3"])
def test_matches_llama_cpp(model, smollm2_path, gemma3_path):
    """Text from llama.cpp's renderers and the ids llama-server would feed the model."""
    g = gguf_file(model)
    tok = tokenizer_for(model)
    from_file = ChatTemplate.from_gguf(g)
    cases = load_reference(f"tokenizer_extra_{model}.json")["chat_cases"]
    assert cases
    for c in cases:
        if c["template"] == "gguf":
            tmpl = from_file
            # create_chat_completion's ids agree for this vocabulary (no BOS added)
            assert c["ids_llama_cpp_python"] == c["ids"]
        else:
            tmpl = ChatTemplate(builtin=c["template"], bos_token=from_file.bos_token,
                                eos_token=from_file.eos_token)
        where = f"{c['template']} {c['messages']}"
        assert tmpl.render(c["messages"], c["add_generation_prompt"]) == c["text"], where
        assert tmpl.tokenize(tok, c["messages"], c["add_generation_prompt"]) == c["ids"], where


def test_template_bos_is_not_doubled(gemma3_path, smollm2_path):
    src = "{{ bos_token }}{% for m in messages %}{{ m['content'] }}{% endfor %}"
    gemma_tok = tokenizer_for("gemma3")
    ids = ChatTemplate(src, bos_token="<bos>").tokenize(gemma_tok, [{"role": "user",
                                                                     "content": "hi"}])
    assert ids == [gemma_tok.bos_id] + gemma_tok.encode("hi", add_special=False)
    # SmolLM2 adds no BOS itself: the template's one is kept and parsed
    smol_tok = tokenizer_for("smollm2")
    ids = ChatTemplate(src, bos_token="<|im_start|>").tokenize(smol_tok, [{"role": "user",
                                                                           "content": "hi"}])
    assert ids == [1] + smol_tok.encode("hi", add_special=False)


def test_broken_template_is_a_value_error():
    with pytest.raises(ValueError, match=r"bad chat template: line 1"):
        ChatTemplate("{% for m in messages %}{{ m['content'] }}")
    with pytest.raises(ValueError, match="bad chat template"):
        ChatTemplate("{{ messages[0]['content'] }")


def test_raise_exception_in_template():
    tmpl = ChatTemplate("{% for m in messages %}{% if m['role'] != 'user' %}"
                        "{{ raise_exception('Only user messages are supported') }}"
                        "{% endif %}{{ m['content'] }}{% endfor %}")
    assert tmpl.render([{"role": "user", "content": "ok"}]) == "ok"
    with pytest.raises(ValueError, match="Only user messages are supported"):
        tmpl.render([{"role": "system", "content": "no"}])


def test_runtime_errors_and_bad_messages():
    with pytest.raises(ValueError, match="chat template failed"):
        ChatTemplate("{{ messages[0].content.nope() }}").render([{"role": "user",
                                                                  "content": "x"}])
    with pytest.raises(ValueError, match="role"):
        ChatTemplate(builtin="chatml").render(["just a string"])
    with pytest.raises(ValueError, match="unknown built-in"):
        ChatTemplate(builtin="vicuna")


def test_jinja_environment_like_hf():
    # trim_blocks / lstrip_blocks: block tags leave no blank lines or indentation behind
    tmpl = ChatTemplate("{% for m in messages %}\n    {% if true %}\n{{ m['content'] }}\n"
                        "    {% endif %}\n{% endfor %}")
    assert tmpl.render([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]) \
        == "a\nb\n"
    year = ChatTemplate("{{ strftime_now('%Y') }}").render([])
    assert year == str(datetime.date.today().year)
    as_json = ChatTemplate("{{ messages | tojson }}").render([{"role": "user", "content": "é<"}])
    assert as_json == '[{"role": "user", "content": "é<"}]'
    gen = ChatTemplate("{% generation %}x{% endgeneration %}{% for m in messages %}"
                       "{% if loop.index > 1 %}{% break %}{% endif %}{{ m['content'] }}"
                       "{% endfor %}")
    assert gen.render([{"role": "user", "content": "1"}, {"role": "user", "content": "2"}]) \
        == "x1"
