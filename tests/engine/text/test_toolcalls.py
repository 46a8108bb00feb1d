"""Tool-call parsing per family, fed with model outputs written the way each family writes
them (single and parallel calls, nested arguments, text before a call, malformed calls that
must stay content), whole and streamed piece by piece; and the call grammars, checked with
llguidance on a byte tokenizer: they accept the family's calls, which the parser reads back,
and refuse what is not a call."""
from __future__ import annotations

import json

import pytest

from engine.text.chat import ChatTemplate
from engine.text.toolcalls import (
    Gemma4,
    Generic,
    GptOss,
    Hermes,
    Llama3,
    Mistral,
    closed,
    family_of,
    json_end,
    prepare_messages,
    template_caps,
)

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object",
                   "properties": {"city": {"type": "string"},
                                  "unit": {"type": "string", "enum": ["c", "f"]}},
                   "required": ["city"]}}}
SEARCH = {"type": "function", "function": {
    "name": "search", "description": "Search documents",
    "parameters": {"type": "object",
                   "properties": {"query": {"type": "string"},
                                  "filters": {"type": "object",
                                              "properties": {"tags": {"type": "array",
                                                                      "items": {"type": "string"}},
                                                             "year": {"type": "integer"}}}},
                   "required": ["query"]}}}
NESTED = {"query": "kv cache", "filters": {"tags": ["gpu", "vulkan"], "year": 2025}}


def calls_of(parsed) -> list[tuple[str, dict]]:
    return [(c.name, json.loads(c.arguments)) for c in parsed.calls]


def streamed(family, text: str, step: int = 3):
    """Feed text in pieces as a stream would: content only grows, a call's arguments only
    grow, and the end agrees with the whole parse."""
    sent_content, sent_args = "", []
    for k in range(1, len(text) + step, step):
        p = family.parse(text[:k], partial=True)
        assert p.content.startswith(sent_content), (text[:k], p.content, sent_content)
        sent_content = p.content
        for i, c in enumerate(p.calls):
            if i < len(sent_args):
                assert c.arguments.startswith(sent_args[i]), (c.arguments, sent_args[i])
                sent_args[i] = c.arguments
            else:
                sent_args.append(c.arguments)
    return sent_content, sent_args


# -- Hermes / Qwen ----------------------------------------------------------------------------

HERMES_ONE = ('I will look that up.\n<tool_call>\n{"name": "get_weather", "arguments": '
              '{"city": "Paris", "unit": "c"}}\n</tool_call>')
HERMES_TWO = ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
              '</tool_call>\n<tool_call>\n{"name": "search", "arguments": '
              + json.dumps(NESTED) + '}\n</tool_call>')


def test_hermes_content_then_call():
    p = Hermes().parse(HERMES_ONE)
    assert p.content == "I will look that up."
    assert calls_of(p) == [("get_weather", {"city": "Paris", "unit": "c"})]


def test_hermes_parallel_nested():
    p = Hermes().parse(HERMES_TWO)
    assert p.content == ""
    assert calls_of(p) == [("get_weather", {"city": "Paris"}), ("search", NESTED)]


@pytest.mark.parametrize("text", [
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"</tool_call>',
    '<tool_call>\nget_weather(city="Paris")\n</tool_call>',
    '<tool_call>\n{"arguments": {"city": "Paris"}}\n</tool_call>',
    "Just text with no call.",
])
def test_hermes_malformed_stays_content(text):
    p = Hermes().parse(text)
    assert p.calls == [] and p.content == text.strip()


def test_hermes_stream():
    content, args = streamed(Hermes(), HERMES_ONE)
    assert content.strip() == "I will look that up."
    assert [json.loads(a) for a in args] == [{"city": "Paris", "unit": "c"}]
    content, args = streamed(Hermes(), HERMES_TWO, step=1)
    assert content.strip() == ""
    assert [json.loads(a) for a in args] == [{"city": "Paris"}, NESTED]


def test_hermes_holds_back_a_marker_start():
    assert Hermes().parse("Sure <tool_", partial=True).content == "Sure "
    assert Hermes().parse("a < b", partial=True).content == "a < b"


# -- Llama 3.x -------------------------------------------------------------------------------

def test_llama3_json_call():
    p = Llama3().parse('{"name": "get_weather", "parameters": {"city": "Paris"}}')
    assert p.content == "" and calls_of(p) == [("get_weather", {"city": "Paris"})]


def test_llama3_python_tag_and_parallel():
    text = ('<|python_tag|>{"type": "function", "name": "get_weather", "parameters": '
            '{"city": "Oslo"}}; {"name": "search", "parameters": ' + json.dumps(NESTED) + '}')
    p = Llama3().parse(text)
    assert calls_of(p) == [("get_weather", {"city": "Oslo"}), ("search", NESTED)]


def test_llama3_content_before_and_malformed():
    p = Llama3().parse('Let me check. {"name": "get_weather", "parameters": {"city": "Rome"}}')
    assert p.content == "Let me check." and calls_of(p) == [("get_weather", {"city": "Rome"})]
    text = 'Use {"name": "get_weather", "parameters": {"city": }} like this.'
    p = Llama3().parse(text)
    assert p.calls == [] and p.content == text
    assert Llama3().parse("a set {1, 2}").content == "a set {1, 2}"


def test_llama3_stream():
    text = 'Checking. {"name": "search", "parameters": ' + json.dumps(NESTED) + '}'
    content, args = streamed(Llama3(), text)
    assert content.strip() == "Checking."
    assert [json.loads(a) for a in args] == [NESTED]


# -- gpt-oss ---------------------------------------------------------------------------------

GPT_OSS_CALL = ('<|channel|>analysis<|message|>The user wants the weather in Paris. I should '
                'call get_weather.<|end|><|start|>assistant<|channel|>commentary '
                'to=functions.get_weather <|constrain|>json<|message|>{"city":"Paris"}')
GPT_OSS_FINAL = ('<|channel|>analysis<|message|>Simple greeting.<|end|><|start|>assistant'
                 '<|channel|>final<|message|>Hello! How can I help?')


def test_gpt_oss_call_and_reasoning():
    p = GptOss().parse(GPT_OSS_CALL)
    assert calls_of(p) == [("get_weather", {"city": "Paris"})]
    assert p.content == "" and p.reasoning.startswith("The user wants")


def test_gpt_oss_final_and_role_recipient():
    p = GptOss().parse(GPT_OSS_FINAL)
    assert p.calls == [] and p.content == "Hello! How can I help?"
    p = GptOss().parse(' to=functions.search<|channel|>commentary json<|message|>'
                       + json.dumps(NESTED))
    assert calls_of(p) == [("search", NESTED)]


def test_gpt_oss_malformed_and_stream():
    p = GptOss().parse('<|channel|>commentary to=functions.get_weather <|constrain|>json'
                       '<|message|>{"city": Paris}')
    assert p.calls == [] and p.content == '{"city": Paris}'
    content, args = streamed(GptOss(), GPT_OSS_CALL)
    assert content == "" and [json.loads(a) for a in args] == [{"city": "Paris"}]
    content, args = streamed(GptOss(), GPT_OSS_FINAL, step=2)
    assert content == "Hello! How can I help?" and args == []


# -- Mistral ---------------------------------------------------------------------------------

def test_mistral_list():
    text = ('[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Lyon"}, "id": '
            '"a1b2c3d4e"}, {"name": "search", "arguments": ' + json.dumps(NESTED)
            + ', "id": "z9y8x7w6v"}]')
    p = Mistral().parse(text)
    assert calls_of(p) == [("get_weather", {"city": "Lyon"}), ("search", NESTED)]
    assert [c.id for c in p.calls] == ["a1b2c3d4e", "z9y8x7w6v"]
    _, args = streamed(Mistral(), text)
    assert [json.loads(a) for a in args] == [{"city": "Lyon"}, NESTED]


def test_mistral_args_and_call_id_styles():
    text = ('Sure.[TOOL_CALLS]get_weather[ARGS]{"city": "Nice"}[TOOL_CALLS]search[ARGS]'
            + json.dumps(NESTED))
    p = Mistral("args").parse(text)
    assert p.content == "Sure." and calls_of(p) == [("get_weather", {"city": "Nice"}),
                                                    ("search", NESTED)]
    content, args = streamed(Mistral("args"), text)
    assert content == "Sure." and [json.loads(a) for a in args] == [{"city": "Nice"}, NESTED]
    p = Mistral("call_id").parse('[TOOL_CALLS]get_weather[CALL_ID]Ab3dE5gH9[ARGS]{"city": "X"}')
    assert calls_of(p) == [("get_weather", {"city": "X"})] and p.calls[0].id == "Ab3dE5gH9"


@pytest.mark.parametrize("text", ['[TOOL_CALLS][{"name": "get_weather", "arguments": 5}]',
                                  '[TOOL_CALLS]get_weather[ARGS]{"city": }',
                                  '[TOOL_CALLS] I cannot call tools.'])
def test_mistral_malformed_stays_content(text):
    p = Mistral().parse(text)
    assert p.calls == [] and p.content == text


# -- Gemma 4 ---------------------------------------------------------------------------------

def test_gemma4_calls():
    text = ('<|channel>thought\nThe user asks for weather.<channel|>Let me see.'
            '<|tool_call>call:get_weather{city:<|"|>Paris, France<|"|>,unit:<|"|>c<|"|>}'
            '<tool_call|><|tool_call>call:search{query:<|"|>kv cache<|"|>,filters:{tags:'
            '[<|"|>gpu<|"|>,<|"|>vulkan<|"|>],year:2025}}<tool_call|>')
    p = Gemma4().parse(text)
    assert p.content == "Let me see." and p.reasoning == "The user asks for weather."
    assert calls_of(p) == [("get_weather", {"city": "Paris, France", "unit": "c"}),
                           ("search", NESTED)]
    content, args = streamed(Gemma4(), text)
    assert content == "Let me see."


def test_gemma4_malformed_stays_content():
    text = '<|tool_call>call:get_weather{city:Paris}<tool_call|>'
    p = Gemma4().parse(text)
    assert p.calls == [] and p.content == text


# -- generic ---------------------------------------------------------------------------------

def test_generic_forms():
    g = Generic()
    p = g.parse('{"tool_call": {"name": "get_weather", "arguments": {"city": "Paris"}}}')
    assert calls_of(p) == [("get_weather", {"city": "Paris"})]
    p = g.parse('```json\n{"tool_calls": [{"name": "get_weather", "arguments": {"city": "A"},'
                ' "id": "c001"}, {"name": "search", "arguments": ' + json.dumps(NESTED)
                + ', "id": "c002"}]}\n```')
    assert calls_of(p) == [("get_weather", {"city": "A"}), ("search", NESTED)]
    assert g.parse('{"response": "Hello there"}').content == "Hello there"
    assert g.parse("Hello there").content == "Hello there"
    bad = '{"tool_call": {"name": "get_weather", "arguments": "Paris"}}'
    assert g.parse(bad).calls == [] and g.parse(bad).content == bad
    assert g.parse('{"tool_call": {"name": "x"', partial=True).content == ""


def test_json_end():
    s = '{"a": "}{", "b": [1, {"c": "\\"}"}]} tail'
    assert s[:json_end(s, 0)] == '{"a": "}{", "b": [1, {"c": "\\"}"}]}'
    assert json_end('{"a": [1, 2', 0) is None


# -- choosing the family and rendering ---------------------------------------------------------

QWEN_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\n# Tools\n<tools>\n{%- for tool in tools %}\n"
    "{{ tool | tojson }}\n{%- endfor %}\n</tools>\nFor each function call, return a json "
    "object within <tool_call></tool_call> XML tags<|im_end|>\n{%- endif %}\n"
    "{%- for message in messages %}\n"
    "{%- if message.role == 'assistant' and message.tool_calls %}<|im_start|>assistant\n"
    "{%- for tool_call in message.tool_calls %}\n<tool_call>\n{\"name\": \""
    "{{ tool_call.function.name }}\", \"arguments\": {{ tool_call.function.arguments | tojson }}"
    "}\n</tool_call>{%- endfor %}<|im_end|>\n"
    "{%- elif message.role == 'tool' %}<|im_start|>user\n<tool_response>\n"
    "{{ message.content }}\n</tool_response><|im_end|>\n"
    "{%- else %}<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n{%- endif %}"
    "{%- endfor %}{%- if add_generation_prompt %}<|im_start|>assistant\n{%- endif %}")
CALL_MSGS = [{"role": "user", "content": "Weather in Paris?"},
             {"role": "assistant", "content": None, "tool_calls": [
                 {"id": "call_1", "type": "function",
                  "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
             {"role": "tool", "tool_call_id": "call_1", "content": "18 C, sunny"}]


def test_family_of_templates():
    assert isinstance(family_of(QWEN_TEMPLATE), Hermes)
    assert isinstance(family_of("{{ '<|channel|>' }}"), GptOss)
    assert isinstance(family_of("[TOOL_CALLS]{{ x }}[ARGS]"), Mistral)
    assert family_of("[TOOL_CALLS][CALL_ID][ARGS]").style == "call_id"
    assert isinstance(family_of("{{ '<|tool_call>call:' }}"), Gemma4)
    assert isinstance(family_of("<|start_header_id|>ipython<|python_tag|>"), Llama3)
    assert isinstance(family_of("<|im_start|>", supports_tools=False), Generic)


def test_native_template_renders_tools_and_calls():
    t = ChatTemplate(QWEN_TEMPLATE)
    caps = template_caps(t)
    assert caps == {"tools": True, "tool_calls": True, "object_arguments": True}
    msgs = prepare_messages(CALL_MSGS, [WEATHER], caps, generic=False)
    text = t.render(msgs, tools=[WEATHER])
    assert '"name": "get_weather"' in text and "<tools>" in text
    # the arguments went in as an object: tojson writes them once, not as a quoted string
    assert '"arguments": {"city": "Paris"}' in text
    assert "<tool_response>\n18 C, sunny\n</tool_response>" in text


def test_generic_polyfill_for_a_plain_template():
    t = ChatTemplate(builtin="chatml")
    caps = template_caps(t)
    assert caps == {"tools": False, "tool_calls": False, "object_arguments": False}
    msgs = prepare_messages(CALL_MSGS, [WEATHER], caps, generic=True)
    text = t.render(msgs)
    assert text.startswith("<|im_start|>system\n" + Generic.SYSTEM)
    assert "You can call any of the following tools" in text and '"get_weather"' in text
    assert '"tool_calls": [' in text and '"tool_response": {' in text
    assert "18 C, sunny" in text


# -- grammars, with llguidance on a byte tokenizer --------------------------------------------

llg = pytest.importorskip("llguidance")
BYTE = llg.LLTokenizer("byte")
SPECIAL: dict[str, int] = {}    # control-token markers: the byte tokenizer's special ids


def token_of(marker: str):
    if marker.startswith("<|") or marker.startswith("[") or marker.endswith("|>"):
        if marker not in SPECIAL and 256 + len(SPECIAL) < BYTE.eos_token:
            SPECIAL[marker] = 256 + len(SPECIAL)
        return SPECIAL.get(marker)
    return None


def tokens(text: str, markers) -> list[int]:
    """The text as the byte tokenizer writes it, markers as their special ids."""
    markers = [m for m in markers if token_of(m) is not None]
    out, i = [], 0
    while i < len(text):
        m = next((m for m in markers if text.startswith(m, i)), None)
        if m is not None:
            out.append(token_of(m))
            i += len(m)
        else:
            j = min([text.find(m, i) for m in markers if text.find(m, i) >= 0] + [len(text)])
            out += BYTE.tokenize_str(text[i:j])
            i = j
    return out


def accepts(grammar: str, text: str, markers) -> bool:
    g = llg.LLMatcher.grammar_from_lark(grammar)
    assert llg.LLMatcher.validate_grammar(g, BYTE) == ""
    m = llg.LLMatcher(BYTE, g)
    toks = tokens(text, markers)
    return m.try_consume_tokens(toks) == len(toks) and m.is_accepting()


CASES = [  # family, a call in its syntax, parallel calls, an output that is not a call
    (Hermes(), HERMES_ONE.split("\n", 1)[1],
     '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
     '<tool_call>\n{"name": "search", "arguments": ' + json.dumps(NESTED) + '}\n</tool_call>',
     '<tool_call>\n{"name": "get_weather", "arguments": {"unit": "c"}}\n</tool_call>'),
    (Llama3(), '{"name": "get_weather", "parameters": {"city": "Paris"}}',
     '{"name": "get_weather", "parameters": {"city": "Paris"}}; {"name": "search", '
     '"parameters": ' + json.dumps(NESTED) + '}',
     'Let me think. {"name": "get_weather", "parameters": {"city": "Paris"}}'),
    (GptOss(), GPT_OSS_CALL,
     None,
     '<|channel|>final<|message|>Hello'),
    (Mistral(), '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}]',
     '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}, {"name": '
     '"search", "arguments": ' + json.dumps(NESTED) + '}]',
     '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": 5}}]'),
    (Mistral("args"), '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}',
     '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}[TOOL_CALLS]search[ARGS]'
     + json.dumps(NESTED),
     '[TOOL_CALLS]get_time[ARGS]{}'),
    (Gemma4(), '<|tool_call>call:get_weather{city:<|"|>Paris<|"|>}<tool_call|>',
     '<|tool_call>call:get_weather{city:<|"|>Paris<|"|>}<tool_call|><|tool_call>call:search'
     '{query:<|"|>kv cache<|"|>,filters:{tags:[<|"|>gpu<|"|>,<|"|>vulkan<|"|>],year:2025}}'
     '<tool_call|>',
     '<|tool_call>call:get_time{}<tool_call|>'),
    (Generic(), '{"tool_call": {"name": "get_weather", "arguments": {"city": "Paris"}}}',
     '{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}}, '
     '{"name": "search", "arguments": ' + json.dumps(NESTED) + '}]}',
     '{"response": "Hello"}'),
]


@pytest.mark.parametrize("family,one,many,wrong", CASES, ids=lambda c: getattr(c, "name", ""))
def test_grammar_accepts_calls_the_parser_reads(family, one, many, wrong):
    markers = family.markers
    SPECIAL.clear()
    single = family.grammar([WEATHER, SEARCH], False, token_of)
    assert accepts(single, one, markers)
    assert family.parse(one).calls[-1].name == "get_weather"
    assert not accepts(single, wrong, markers)
    if many is not None:
        assert not accepts(single, many, markers)
        parallel = family.grammar([WEATHER, SEARCH], True, token_of)
        assert accepts(parallel, many, markers)
        assert calls_of(family.parse(many)) == [("get_weather", {"city": "Paris"}),
                                                ("search", NESTED)]
    named = family.grammar([SEARCH], False, token_of)        # tool_choice names one
    assert not accepts(named, one, markers)


@pytest.mark.parametrize("family,one,many,wrong", CASES, ids=lambda c: getattr(c, "name", ""))
def test_call_grammars_close(family, one, many, wrong):
    """Arguments keep to the function's schema as strict mode reads it: no key it does not
    list, and no whitespace beyond the family's own separators, so a sampled call cannot
    pad itself or grow keys until max_tokens runs out."""
    SPECIAL.clear()
    g = family.grammar([WEATHER, SEARCH], False, token_of)
    if isinstance(family, Gemma4):              # not JSON: its shape only is constrained
        return
    sep = ":" if isinstance(family, GptOss) else ": "
    city = '"city"' + sep + '"Paris"'
    assert city in one
    assert not accepts(g, one.replace(city, city + ("," if sep == ":" else ", ")
                                      + '"type"' + sep + '"function"'), family.markers)
    assert not accepts(g, one.replace(city, city.replace(sep, sep + "   ")), family.markers)
    assert not accepts(g, one.replace(city, city.replace(sep, "\n" + sep)), family.markers)


def test_generic_calls_take_no_model_written_id():
    g = Generic().grammar([WEATHER], True, token_of)
    call = '{"name": "get_weather", "arguments": {"city": "Paris"}'
    assert accepts(g, '{"tool_calls": [' + call + '}]}', ())
    assert not accepts(g, '{"tool_calls": [' + call + ', "id": "1234"}]}', ())
    assert not accepts(g, '{"tool_calls": [' + call + '}], "response": "x"}', ())


def test_closed_schema_shuts_listed_objects_only():
    open_obj = {"type": "object"}
    assert closed(open_obj) == open_obj                 # no properties listed: any object
    s = {"type": "object", "properties": {
        "a": {"type": "object", "properties": {"b": {"type": "string"}}},
        "c": {"type": "array", "items": {"type": "object", "properties": {}}},
        "d": {"type": "object", "properties": {}, "additionalProperties": {"type": "number"}},
        "e": {"allOf": [{"type": "object", "properties": {"x": {}}}]}},
        "$defs": {"p": {"type": "object", "properties": {"q": {}}}}}
    c = closed(s)
    assert c["additionalProperties"] is False
    assert c["properties"]["a"]["additionalProperties"] is False
    assert c["properties"]["c"]["items"]["additionalProperties"] is False
    assert c["properties"]["d"]["additionalProperties"] == {"type": "number"}
    assert "additionalProperties" not in c["properties"]["e"]["allOf"][0]
    assert c["$defs"]["p"]["additionalProperties"] is False
    assert "additionalProperties" not in s           # the tool's own schema is not changed


def test_generic_streams_the_response_string():
    text = '{"response": "Caf\\u00e9 \\"Le Nord\\" is open."}'
    content, args = streamed(Generic(), text, step=1)
    assert content == 'Café "Le Nord" is open.' and args == []
    assert Generic().parse(text).content == content
    assert Generic().parse(text[:20]).content == "Caf"        # cut by max_tokens


def test_generic_grammar_without_a_required_call_allows_a_reply():
    g = Generic().grammar([WEATHER], False, token_of, required=False)
    assert accepts(g, '{"response": "Hello"}', ())
    assert accepts(g, '{"tool_call": {"name": "get_weather", "arguments": {"city": "X"}}}', ())
    assert not accepts(g, "Hello", ())


def test_qwen3_thinking_is_reasoning():
    text = ('<think>\nThe user wants the weather; call the tool.\n</think>\n\n<tool_call>\n'
            '{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>')
    p = Hermes().parse(text)
    assert p.reasoning == "The user wants the weather; call the tool."
    assert p.content == "" and calls_of(p) == [("get_weather", {"city": "Paris"})]
    content, args = streamed(Hermes(), text)
    assert content == "" and [json.loads(a) for a in args] == [{"city": "Paris"}]
    assert Hermes().parse("I think <think> is a tag.").content == "I think <think> is a tag."
