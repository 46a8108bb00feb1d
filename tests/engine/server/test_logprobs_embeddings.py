"""logprobs and /v1/embeddings over HTTP on the real engine (SmolLM2), through the official
openai client: the chosen token's logprob against numpy's log-softmax of the engine's own
logits, the alternatives sorted, streamed entries equal to the whole answer's, the legacy
completions shape; embeddings of strings, lists and token ids, unit norm, identical texts
giving identical vectors, base64, and the 400s. Few tokens per generation (lavapipe)."""
from __future__ import annotations

import base64
import json
import math

import numpy as np
import openai
import pytest

from engine.api import Engine
from engine.server.app import make_app
from tests.engine.server.test_serve import KEY, ServerThread, assert_error, request

pytestmark = pytest.mark.gpu

N_CTX = 256
MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]
PROMPT = "The capital of France is"
N_EMBD = 576                    # SmolLM2-135M's hidden size


@pytest.fixture(scope="module")
def engine(smollm2_path):
    eng = Engine(n_ctx=N_CTX)
    eng.load(smollm2_path)
    yield eng
    eng.close()


@pytest.fixture(scope="module")
def name(engine) -> str:
    return engine.status()[0]["name"]


@pytest.fixture(scope="module")
def base(engine, name):
    srv = ServerThread([make_app(engine, [name], api_key=KEY)])
    yield f"http://127.0.0.1:{srv.ports[0]}"
    srv.close()


@pytest.fixture(scope="module")
def client(base) -> openai.OpenAI:
    return openai.OpenAI(base_url=base + "/v1", api_key=KEY, max_retries=0, timeout=300)


def log_softmax_after(engine, name, ids: list[int]) -> np.ndarray:
    """numpy's log-softmax of the engine's own logits after ids (from an empty cache)."""
    def job(model):
        model.cache_tokens = []
        return model.eval(ids, 0, greedy=False)
    x = engine.device_job(job, name).astype(np.float64)
    m = x.max()
    return x - (m + np.log(np.exp(x - m).sum()))


@pytest.fixture(scope="module")
def chat_lp(client, name):
    return client.chat.completions.create(model=name, messages=MESSAGES, temperature=0,
                                          max_tokens=4, logprobs=True, top_logprobs=5)


def test_chat_logprobs(chat_lp, engine, name):
    tok = engine.tokenizer(name)
    content = chat_lp.choices[0].logprobs.content
    assert len(content) == chat_lp.usage.completion_tokens == 4
    assert "".join(c.token for c in content) == chat_lp.choices[0].message.content
    for c in content:
        assert len(c.top_logprobs) == 5
        lps = [t.logprob for t in c.top_logprobs]
        assert lps == sorted(lps, reverse=True) and lps[0] <= 0
        assert sum(math.exp(v) for v in lps) <= 1 + 1e-5
        # greedy: the chosen token is the best one
        assert c.token == c.top_logprobs[0].token and c.logprob == lps[0]
        assert bytes(c.bytes).decode("utf-8", "replace") == c.token
    # the first token's logprobs against numpy's log-softmax of the engine's logits
    prompt = engine.prompt_tokens(name, messages=MESSAGES)
    ref = log_softmax_after(engine, name, prompt)
    best = np.lexsort((np.arange(ref.shape[0]), -ref))[:5]
    first = content[0]
    assert [t.token for t in first.top_logprobs] == \
        [tok.piece(int(i)).decode("utf-8", "replace") for i in best]
    assert np.allclose([t.logprob for t in first.top_logprobs], ref[best], atol=1e-4)


def test_chat_logprobs_streamed(client, name, chat_lp):
    stream = client.chat.completions.create(model=name, messages=MESSAGES, temperature=0,
                                            max_tokens=4, logprobs=True, top_logprobs=5,
                                            stream=True)
    entries, text = [], ""
    for c in stream:
        if not c.choices:
            continue
        ch = c.choices[0]
        text += ch.delta.content or ""
        if ch.logprobs is not None:
            entries += ch.logprobs.content
    whole = chat_lp.choices[0].logprobs.content
    assert text == chat_lp.choices[0].message.content
    assert [e.token for e in entries] == [e.token for e in whole]
    assert np.allclose([e.logprob for e in entries], [e.logprob for e in whole], atol=1e-5)
    assert [[t.token for t in e.top_logprobs] for e in entries] == \
        [[t.token for t in e.top_logprobs] for e in whole]


def test_sampled_tokens_have_their_own_logprob(client, name):
    """Sampling at temperature 1.5 (the logprobs stay the model's own): a token outside the
    top 2 still gets its own logprob, below the best alternative's."""
    resp = client.chat.completions.create(model=name, messages=MESSAGES, temperature=1.5,
                                          seed=7, max_tokens=4, logprobs=True, top_logprobs=2)
    for c in resp.choices[0].logprobs.content:
        top = {t.token: t.logprob for t in c.top_logprobs}
        assert c.logprob <= c.top_logprobs[0].logprob + 1e-6
        if c.token in top:
            assert abs(top[c.token] - c.logprob) < 1e-6


def test_completions_logprobs_legacy_shape(client, name, base):
    resp = client.completions.create(model=name, prompt=PROMPT, temperature=0, max_tokens=4,
                                     logprobs=3)
    lp = resp.choices[0].logprobs
    text = resp.choices[0].text
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 4
    assert "".join(lp.tokens) == text
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(4)]
    for t, v, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
        assert len(top) == 3 and max(top.values()) == v and top[t] == v
    # streamed: the same entries, offsets running on across chunks
    status, _, body = request(base, "POST", "/v1/completions",
                              {"model": name, "prompt": PROMPT, "temperature": 0,
                               "max_tokens": 4, "logprobs": 3, "stream": True})
    assert status == 200
    tokens, offsets = [], []
    for line in body.splitlines():
        if line.startswith("data: {"):
            ch = json.loads(line[6:])["choices"][0]
            if ch["logprobs"]:
                tokens += ch["logprobs"]["tokens"]
                offsets += ch["logprobs"]["text_offset"]
    assert tokens == lp.tokens and offsets == lp.text_offset
    # a stop string's own tokens get no entry (llama-server drops them too)
    stop = lp.tokens[2]
    assert stop and stop not in "".join(lp.tokens[:2])
    cut = client.completions.create(model=name, prompt=PROMPT, temperature=0, max_tokens=4,
                                    logprobs=3, stop=[stop])
    assert cut.choices[0].text == "".join(lp.tokens[:2])
    assert cut.choices[0].logprobs.tokens == lp.tokens[:2]
    assert cut.choices[0].logprobs.token_logprobs == lp.token_logprobs[:2]


@pytest.mark.parametrize("body,param", [
    ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ({"top_logprobs": 2}, "top_logprobs"),
    ({"logprobs": "yes"}, "logprobs"),
])
def test_bad_chat_logprobs(base, name, body, param):
    status, _, out = request(base, "POST", "/v1/chat/completions",
                             {"model": name, "messages": MESSAGES, "max_tokens": 1, **body})
    assert_error(400, status, out, param)


@pytest.mark.parametrize("body,param", [({"logprobs": 21}, "logprobs"),
                                        ({"logprobs": -1}, "logprobs"),
                                        ({"logprobs": 2, "top_logprobs": 2}, "top_logprobs")])
def test_bad_completions_logprobs(base, name, body, param):
    status, _, out = request(base, "POST", "/v1/completions",
                             {"model": name, "prompt": PROMPT, "max_tokens": 1, **body})
    assert_error(400, status, out, param)


# -- embeddings ------------------------------------------------------------------------------

TEXTS = ["The cat sat on the mat.", "Stock markets fell sharply today.",
         "The cat sat on the mat."]


def test_embeddings_of_strings_lists_and_ids(client, engine, name):
    one = client.embeddings.create(model=name, input=TEXTS[0])
    assert len(one.data) == 1 and one.data[0].index == 0
    v = np.array(one.data[0].embedding)
    assert v.shape == (N_EMBD,)
    assert abs(np.linalg.norm(v) - 1) < 1e-5
    ids = engine.tokenizer(name).encode(TEXTS[0])
    assert one.usage.prompt_tokens == len(ids)

    # packed or alone, a token's sums are the same but for rounding: bit-close with ggml's
    # numerics, within the f16 inputs' rounding on the matrix units (as test_embed.py)
    atol = 1e-6 if engine.models[name].model.paths.numerics == "ggml" else 1e-4
    many = client.embeddings.create(model=name, input=TEXTS)
    vs = np.array([d.embedding for d in many.data])
    assert [d.index for d in many.data] == [0, 1, 2]
    assert np.allclose(np.linalg.norm(vs, axis=1), 1, atol=1e-5)
    assert np.array_equal(vs[0], vs[2])                  # identical texts, identical vectors
    assert np.allclose(vs[0], v, atol=atol)               # batched as alone
    assert float(vs[0] @ vs[1]) < 0.99
    assert many.usage.prompt_tokens == sum(len(engine.tokenizer(name).encode(t))
                                           for t in TEXTS)

    by_ids = client.embeddings.create(model=name, input=ids)
    assert np.allclose(by_ids.data[0].embedding, v, atol=atol)
    lists = client.embeddings.create(model=name, input=[ids, ids[:3]])
    assert np.allclose(lists.data[0].embedding, v, atol=atol) and len(lists.data) == 2
    # what the engine gives directly
    direct = engine.embed(name, [TEXTS[0]])
    assert np.allclose(direct.vectors[0], v, atol=atol) and direct.pooling == "mean"


def test_embeddings_base64_and_pooling(base, name, client):
    floats = client.embeddings.create(model=name, input=TEXTS[1], encoding_format="float")
    status, _, out = request(base, "POST", "/v1/embeddings",
                             {"model": name, "input": TEXTS[1], "encoding_format": "base64"})
    assert status == 200
    raw = np.frombuffer(base64.b64decode(out["data"][0]["embedding"]), "<f4")
    assert np.allclose(raw, floats.data[0].embedding, atol=1e-7)
    status, _, last = request(base, "POST", "/v1/embeddings",
                              {"model": name, "input": TEXTS[1], "pooling": "last"})
    assert status == 200
    lv = np.array(last["data"][0]["embedding"])
    assert abs(np.linalg.norm(lv) - 1) < 1e-5 and float(lv @ raw) < 0.999


def test_embeddings_keep_chat_answers_right(client, name):
    """An embedding overwrites the KV where a chat's prompt cache was: the next chat must
    still give the answer it gives from scratch."""
    kw = dict(model=name, messages=MESSAGES, temperature=0, max_tokens=3)
    before = client.chat.completions.create(**kw).choices[0].message.content
    client.embeddings.create(model=name, input=TEXTS[1])
    after = client.chat.completions.create(**kw)
    assert after.choices[0].message.content == before


@pytest.mark.parametrize("body,param,words", [
    ({"input": ""}, "input", "empty"),
    ({"input": []}, "input", ""),
    ({"input": [1.5]}, "input", ""),
    ({"input": "x", "dimensions": 64}, "dimensions", str(N_EMBD)),
    ({"input": "x", "encoding_format": "int8"}, "encoding_format", ""),
    ({"input": "x", "pooling": "max"}, "pooling", ""),
    ({"input": [[1] * (N_CTX + 1)]}, "input", f"holds {N_CTX}"),
    ({"input": [[10 ** 7]]}, "input", "token ids"),
])
def test_bad_embeddings(base, name, body, param, words):
    status, _, out = request(base, "POST", "/v1/embeddings", {"model": name, **body})
    err = assert_error(400, status, out, param)
    assert words in err["message"]
