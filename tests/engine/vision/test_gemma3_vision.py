"""Gemma 3 with images on the GPU engine, against llama.cpp (libmtmd, CPU) on the synthetic
text model and mmproj of tests/data/synth (made by tests/tools/make_synth_vision.py): the
encoder's soft tokens, the prompt's ids around an image, and the logits after a prompt with
an image and at each teacher-forced greedy step; then the same across a release and restore
between two images, with tiled attention, and through the prompt cache."""
from __future__ import annotations

import json

import numpy as np
import pytest

from engine.residency import loop
from engine.residency.model import Media, Model
from engine.text.tokenizer import Tokenizer
from engine.vision import prompt as media_prompt
from engine.vision.image import Image
from tests.helpers import vision_cases
from tests.helpers.synth_reference import DATA

pytestmark = pytest.mark.gpu

IMAGES = ("square", "wide")
CASE = vision_cases.load("gemma3-vision")
if CASE is None:
    pytest.skip("no gemma3-vision case in tests/data/synth", allow_module_level=True)
REF, N_IMAGE = CASE.ref, CASE.entry["n_image_tokens"]
image = CASE.image
check_logits = CASE.check_logits


def prompt_ids(name: str, img: Image) -> list[int]:
    return CASE.prompt_ids(name, media_prompt.media_id(img), N_IMAGE)


@pytest.fixture(scope="module")
def model(dev, kc):
    CASE.check_files()
    m = Model(dev, kc, CASE.model_path, n_ctx=1024)
    m.attach_vision(CASE.mmproj_path)
    yield m
    m.close()


@pytest.fixture(scope="module")
def soft_tokens(model) -> dict[str, Media]:
    return CASE.encode(model)


@pytest.mark.parametrize("name", IMAGES)
def test_soft_tokens_are_llamacpps(soft_tokens, name):
    assert soft_tokens[name].geometry.n_tokens == N_IMAGE
    CASE.check_soft_tokens(name, soft_tokens[name].rows)


def test_the_two_images_give_other_soft_tokens(soft_tokens):
    a, b = soft_tokens["square"].rows, soft_tokens["wide"].rows
    assert np.linalg.norm(a - b) / np.linalg.norm(a) > 0.1


def test_prompt_ids_are_mtmds(model):
    tok = Tokenizer.from_gguf(model.gguf)
    img = image("square")
    ids = media_prompt.tokenize(tok, CASE.entry["prompt_text"], [img], model.vision.config)
    assert ids == prompt_ids("square", img)
    with pytest.raises(ValueError, match="1 image markers for 2 images"):
        media_prompt.tokenize(tok, CASE.entry["prompt_text"], [img, img], model.vision.config)


@pytest.mark.parametrize("name", IMAGES)
def test_logits_after_an_image_are_llamacpps(model, soft_tokens, name):
    check_logits(name, CASE.teacher_forced(model, name, image(name), soft_tokens[name]))


def test_release_and_restore_between_two_images(model):
    """Encode and answer one image, go cold (vision included), come back, the other image:
    both still llama.cpp's; the encoder holds no device bytes while cold."""
    first = image("square")
    check_logits("square", CASE.teacher_forced(model, "square", first,
                                          Media(*model.vision.encode(first))))
    assert model.device_bytes()["vision"] == \
        model.vision.device_bytes() + model.rs.embd_in.nbytes > model.rs.embd_in.nbytes
    model.release(full=True)
    assert not model.vision.warm and "vision" not in model.device_bytes()
    model.restore()
    assert model.vision.warm
    second = image("wide")
    check_logits("wide", CASE.teacher_forced(model, "wide", second,
                                        Media(*model.vision.encode(second))))


def test_tiled_attention_gives_the_same_answer(dev, kc, soft_tokens):
    m = Model(dev, kc, CASE.model_path, n_ctx=1024, flash_attn="on")
    m.attach_vision(CASE.mmproj_path)
    try:
        assert m.paths.prefill_attention != "attention"
        check_logits("wide", CASE.teacher_forced(m, "wide", image("wide"), soft_tokens["wide"]))
    finally:
        m.close()


def test_the_prompt_cache_keeps_an_image(model, soft_tokens):
    """The same prompt again reuses its image from the KV cache; another image at the same
    place reuses only the text before it. Greedy answers are the fresh ones."""
    a, b = image("square"), image("wide")
    model.cache_tokens = []

    def answer(img, rows, name):
        model.media = {media_prompt.media_id(img): rows}
        t = loop.Timings()
        out = list(loop.generate(model, prompt_ids(name, img), 8, timings=t))
        return out, t.cached_tokens

    first, cached = answer(a, soft_tokens["square"], "square")
    assert cached == 0
    again, cached = answer(a, soft_tokens["square"], "square")
    assert again == first and cached == len(prompt_ids("square", a)) - 1
    other, cached = answer(b, soft_tokens["wide"], "wide")
    assert cached == len(REF["wide_ids_before"])
    assert other == [int(t) for t in REF["wide_continuation_ids"]]


def test_check_counts_the_projector_as_a_load_does():
    """`hotseat check --mmproj`'s figures are what the loaded model reports: its warm bytes
    (the encoder's included) and, warm, its device bytes by kind."""
    from engine.api import Engine

    model, mmproj = CASE.model_path, CASE.mmproj_path
    with Engine(n_ctx=1024) as eng:
        report = eng.check(model, mmproj=mmproj)
        assert report["runs"] and report["vision"]["tokens_per_image"] == 256
        eng.load(model, name="v", mmproj=mmproj)
        st = eng.status()[0]
        assert st["mmproj"] == mmproj
        assert report["vram"]["total_bytes"] == st["warm_bytes"] == \
            sum(st["device_bytes"].values())
        assert report["vram"]["vision_bytes"] == st["device_bytes"]["vision"]
        alone = eng.check(model)
        assert alone["vram"]["total_bytes"] + report["vram"]["vision_bytes"] == \
            report["vram"]["total_bytes"]
        assert report["vram"]["vision_bytes"] > report["vision"]["vram_bytes"]  # + image rows
        other = eng.check(str(DATA / "qwen35-f16.gguf"), mmproj=mmproj)   # 128 wide
        assert not other["runs"]
        assert "mmproj: the projector gives rows of 256; the model takes 128" in \
            other["problems"]


def test_image_bench_times_the_first_token():
    """`hotseat bench --image` as a user runs it: a one-image prompt's first token, timed."""
    import os
    import subprocess
    import sys

    from tests.conftest import ROOT

    env = dict(os.environ, PYTHONPATH=str(ROOT))
    cmd = [sys.executable, "-m", "engine.cli", "bench", "-m", CASE.model_path,
           "--image", str(CASE.image_dir / "wide.png"), "-r", "1", "--json"]
    r = subprocess.run(cmd + ["--mmproj", CASE.mmproj_path],
                       capture_output=True, text=True, timeout=600, cwd=ROOT, env=env)
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert report["prompt_tokens"] > N_IMAGE
    assert report["rows"][0]["engine"] == "hotseat" and report["rows"][0]["ttft_s"] > 0
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=ROOT, env=env)
    assert r.returncode != 0 and "--image needs the model's --mmproj" in r.stderr


def _ask(eng, name, img):
    from engine.facade import Request
    from engine.text.sampling import SamplingParams

    return eng.generate(Request(name, prompt=CASE.entry["prompt_text"],
                                images=[CASE.image_bytes(img)], max_tokens=6,
                                sampling=SamplingParams(temperature=0.0))).tokens


def test_a_fault_while_encoding_is_recovered_and_the_answer_is_the_same():
    """A device fault in the image's encoding (its pass's wait times out): the engine resets
    every model from its host copies, the request that showed nothing runs once more, and
    answers as without the fault."""
    from engine.api import Engine
    from engine.gpu import vk

    with Engine(n_ctx=1024) as eng:
        name = eng.load(CASE.model_path, mmproj=CASE.mmproj_path)
        want = _ask(eng, name, "wide")
        eng.models[name].media.clear()             # the next request encodes again
        vk.inject("wait", "timeout")
        try:
            assert _ask(eng, name, "wide") == want
        finally:
            vk.clear_faults()
        assert eng.health()["faults"] == 1 and eng.models[name].model.vision.encoded == 2


def test_no_memory_for_the_encoder_fails_the_request_and_the_next_one_answers(monkeypatch):
    """Out of memory while the encoder's buffers are made (the model coming back warm): the
    request fails with that error, the model stays whole and cold, and the next request
    answers as before."""
    from engine.api import Engine
    from engine.gpu import vk
    from engine.vision.encoder import VisionEncoder

    real = VisionEncoder.restore

    def short_of_memory(self):
        vk.inject("alloc", "out_of_memory")
        try:
            return real(self)
        finally:
            vk.clear_faults()
    with Engine(n_ctx=1024) as eng:
        name = eng.load(CASE.model_path, mmproj=CASE.mmproj_path)
        want = _ask(eng, name, "wide")
        eng.evict(name, full=True)
        monkeypatch.setattr(VisionEncoder, "restore", short_of_memory)
        with pytest.raises(vk.OutOfMemory):
            _ask(eng, name, "wide")
        monkeypatch.setattr(VisionEncoder, "restore", real)
        st = eng.status()[0]
        assert st["state"] == "cold" and "vision" not in st["device_bytes"]
        assert _ask(eng, name, "wide") == want
