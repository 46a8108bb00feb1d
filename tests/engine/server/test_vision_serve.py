"""Images over HTTP with the official `openai` and `ollama` clients, against a real `hotseat
serve` of the synthetic Gemma 3 text model with its mmproj (tests/data/synth): the same image
twice gives the same answer (the second from the prompt cache), another image other logits,
both clients the same answer for the same conversation; a bad image or a remote URL is a 400
and the next request answers; /api/models shows the projector and its `vision` bytes."""
from __future__ import annotations

import base64
import json
import urllib.error
import urllib.request

import pytest

from tests.helpers.served import served
from tests.helpers.synth_reference import DATA

pytestmark = pytest.mark.gpu

IMAGES = DATA.parent / "images"
TEXT = "What is in this picture?"
# greedy, without Ollama's default repeat penalty (1.1), as the OpenAI requests are
GREEDY = {"temperature": 0, "num_predict": 6, "repeat_penalty": 1.0}


def data_url(name: str) -> str:
    return "data:image/png;base64," + base64.b64encode((IMAGES / name).read_bytes()).decode()


@pytest.fixture(scope="module")
def base():
    model, mmproj = DATA / "gemma3-f16.gguf", DATA / "gemma3-mmproj-f16.gguf"
    if not model.exists() or not mmproj.exists():
        pytest.skip("no synthetic Gemma 3 vision model in tests/data/synth")
    with served("--ctx", "1024", "-m", str(model), "--mmproj", str(mmproj)) as url:
        yield url


@pytest.fixture(scope="module")
def client(base):
    import openai

    return openai.OpenAI(base_url=base + "/v1", api_key="none", max_retries=0)


@pytest.fixture(scope="module")
def model(client) -> str:
    return client.models.list().data[0].id


def ask(client, model, *urls: str):
    content = [{"type": "image_url", "image_url": {"url": u}} for u in urls] + \
              [{"type": "text", "text": TEXT}]
    return client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": content}], max_tokens=6,
        temperature=0, logprobs=True, top_logprobs=5)


def first_top(r) -> list[tuple[str, float]]:
    return [(t.token, t.logprob) for t in r.choices[0].logprobs.content[0].top_logprobs]


def test_the_same_image_twice_and_another(client, model):
    a = ask(client, model, data_url("square.png"))
    again = ask(client, model, data_url("square.png"))
    assert a.choices[0].message.content == again.choices[0].message.content
    assert first_top(a) == first_top(again)
    assert a.usage.prompt_tokens > 256
    assert again.usage.prompt_tokens_details.cached_tokens >= a.usage.prompt_tokens - 1
    other = ask(client, model, data_url("wide.png"))
    assert other.usage.prompt_tokens == a.usage.prompt_tokens
    assert first_top(other) != first_top(a)


def test_ollama_client_gives_the_same_answer(base, client, model):
    import ollama

    want = ask(client, model, data_url("wide.png")).choices[0].message.content
    c = ollama.Client(host=base)
    got = c.chat(model=model, messages=[{"role": "user", "content": TEXT,
                                         "images": [str(IMAGES / "wide.png")]}],
                 options=GREEDY)
    assert got.message.content == want
    streamed = "".join(p.message.content for p in c.chat(
        model=model, messages=[{"role": "user", "content": TEXT,
                                "images": [(IMAGES / "wide.png").read_bytes()]}],
        options=GREEDY, stream=True))
    assert streamed == want
    gen = c.generate(model=model, prompt=TEXT, images=[str(IMAGES / "wide.png")],
                     options=GREEDY)
    assert gen.response == want


@pytest.mark.parametrize("url,code", [
    ("data:image/png;base64," + base64.b64encode(b"not an image at all").decode(),
     "invalid_image"),
    ("data:image/png;base64,%%%", "invalid_image"),
    ("https://example.com/cat.png", "unsupported_image_url"),    # not fetched: not asked to
    ("file:///etc/passwd", "unsupported_image_url"),
])
def test_a_bad_image_is_a_400_and_the_next_request_answers(client, model, url, code):
    import openai

    with pytest.raises(openai.BadRequestError) as exc:
        ask(client, model, url)
    assert exc.value.code == code
    assert "messages[0].content[0].image_url" in str(exc.value)
    assert ask(client, model, data_url("square.png")).choices[0].message.content is not None


def test_an_ollama_image_that_is_not_one_is_a_400(base, model):
    import ollama

    with pytest.raises(ollama.ResponseError) as exc:
        ollama.Client(host=base).chat(model=model, messages=[
            {"role": "user", "content": TEXT, "images": [b"GIF89a but not really"]}])
    assert exc.value.status_code == 400 and "messages[0].images[0]" in str(exc.value)


def test_api_models_shows_the_projector(base, client, model):
    ask(client, model, data_url("square.png"))         # warm, the encoder with it
    entry = next(m for m in json.load(urllib.request.urlopen(base + "/api/models"))["models"]
                 if m["name"] == model)
    assert entry["mmproj"].endswith("gemma3-mmproj-f16.gguf")
    assert entry["device_bytes"]["vision"] > 0


def test_responses_takes_an_input_image(client, model):
    want = ask(client, model, data_url("wide.png")).choices[0].message.content
    r = client.responses.create(model=model, max_output_tokens=6, temperature=0, input=[
        {"role": "user", "content": [{"type": "input_image", "image_url": data_url("wide.png")},
                                     {"type": "input_text", "text": TEXT}]}])
    assert r.output_text == want
    assert r.usage.input_tokens > 256


def test_a_model_loaded_over_http_with_its_projector(base, client):
    import openai

    body = {"path": str(DATA / "gemma3-f16.gguf"), "name": "second",
            "mmproj": str(DATA / "gemma3-mmproj-f16.gguf")}
    req = urllib.request.Request(base + "/api/models", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    entry = json.load(urllib.request.urlopen(req))
    assert entry["name"] == "second" and entry["mmproj"] == body["mmproj"]
    assert ask(client, "second", data_url("square.png")).choices[0].message.content
    bad = dict(body, name="third", mmproj=str(DATA / "gemma3-f16.gguf"))
    req = urllib.request.Request(base + "/api/models", json.dumps(bad).encode(),
                                 {"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as exc:
        urllib.request.urlopen(req)
    err = json.loads(exc.value.read())["error"]
    assert exc.value.code == 400 and err["param"] == "mmproj"
    assert "not a vision projector" in err["message"]
    # a model without a projector says so
    plain = dict(path=str(DATA / "gemma3-f16.gguf"), name="plain")
    urllib.request.urlopen(urllib.request.Request(
        base + "/api/models", json.dumps(plain).encode(), {"Content-Type": "application/json"}))
    with pytest.raises(openai.BadRequestError, match="loaded without a vision projector"):
        ask(client, "plain", data_url("square.png"))
    # hotseat ps: the projector's VRAM in its own column, "-" for a model without one
    from engine.tools.client import format_ps

    models = json.load(urllib.request.urlopen(base + "/api/models"))["models"]
    table = format_ps(models, json.load(urllib.request.urlopen(base + "/api/vram")))
    head, *rows = table.splitlines()
    col = head.index("VISION")
    by_name = {r.split()[0]: r for r in rows[:len(models)]}
    assert by_name["second"][col:].split()[0] != "-"
    assert by_name["plain"][col:].split()[0] == "-"


def test_a_server_asked_to_fetches_image_urls(tmp_path):
    """--fetch-images: an http URL's image answers as its data URL does; a URL that is not
    there is a 400."""
    import http.server
    import threading
    from functools import partial

    import openai

    handler = partial(http.server.SimpleHTTPRequestHandler, directory=str(IMAGES))
    handler.log_message = lambda *a: None
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    site = f"http://127.0.0.1:{httpd.server_address[1]}"
    try:
        with served("--ctx", "1024", "-m", str(DATA / "gemma3-f16.gguf"), "--mmproj",
                    str(DATA / "gemma3-mmproj-f16.gguf"), "--fetch-images") as url:
            c = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0)
            name = c.models.list().data[0].id
            want = ask(c, name, data_url("square.png"))
            got = ask(c, name, site + "/square.png")
            assert got.choices[0].message.content == want.choices[0].message.content
            assert first_top(got) == first_top(want)
            with pytest.raises(openai.BadRequestError, match="HTTP 404") as exc:
                ask(c, name, site + "/missing.png")
            assert exc.value.code == "invalid_image"
    finally:
        httpd.shutdown()


@pytest.mark.parametrize("args,words", [
    (["--mmproj", "a.gguf", "--mmproj", "b.gguf"], "2 --mmproj for 1 models"),
    (["--mmproj", "x.gguf", "--image-max-tokens", "0"], "--image-max-tokens must be at least 1"),
])
def test_serve_refuses_projector_options_it_cannot_use(args, words):
    import os
    import subprocess
    import sys

    from tests.conftest import ROOT

    env = dict(os.environ, PYTHONPATH=str(ROOT))
    r = subprocess.run([sys.executable, "-m", "engine.cli", "serve", "--port", "0", "-m",
                        str(DATA / "gemma3-f16.gguf"), *args], capture_output=True, text=True,
                       timeout=120, cwd=ROOT, env=env)
    assert r.returncode != 0 and words in r.stderr, r.stderr


def test_a_projector_file_that_is_missing_is_one_line(tmp_path):
    import os
    import subprocess
    import sys

    from tests.conftest import ROOT

    env = dict(os.environ, PYTHONPATH=str(ROOT))
    r = subprocess.run([sys.executable, "-m", "engine.cli", "serve", "--port", "0", "-m",
                        str(DATA / "gemma3-f16.gguf"), "--mmproj", str(tmp_path / "no.gguf")],
                       capture_output=True, text=True, timeout=120, cwd=ROOT, env=env)
    assert r.returncode != 0
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "no.gguf" in lines[0], r.stderr
