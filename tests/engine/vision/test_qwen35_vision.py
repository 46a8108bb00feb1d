"""Qwen3.5 with images on the GPU engine, against llama.cpp (libmtmd, CPU) on the synthetic
qwen35 text model and a synthetic qwen3vl_merger mmproj (tests/data/synth, made by
tests/tools/make_synth_vision.py --family qwen35, images of at most 256 soft tokens): the
image's geometry and soft tokens, mtmd's prompt ids, the M-RoPE positions of every prompt
token, and the logits after a prompt with an image and at each teacher-forced greedy step;
then the same after a release and restore, and with the image's soft tokens in several
causal passes."""
from __future__ import annotations

import numpy as np
import pytest

from engine.residency.model import Media, Model
from engine.text.tokenizer import Tokenizer
from engine.vision import prompt as media_prompt
from engine.vision.image import Image
from engine.vision.positions import Positions
from tests.helpers import vision_cases

pytestmark = pytest.mark.gpu

IMAGES = ("square", "wide")
CASE = vision_cases.load("qwen35-vision")
if CASE is None:
    pytest.skip("no qwen35-vision case in tests/data/synth", allow_module_level=True)
REF = CASE.ref
image = CASE.image
check_logits = CASE.check_logits


def prompt_ids(name: str, img: Image) -> list[int]:
    return CASE.prompt_ids(name, media_prompt.media_id(img),
                           CASE.entry["images"][name]["n_image_tokens"])


def open_model(dev, kc, **kw) -> Model:
    CASE.check_files()
    m = Model(dev, kc, CASE.model_path, n_ctx=1024, **kw)
    m.attach_vision(CASE.mmproj_path, max_tokens=CASE.entry["image_max_tokens"])
    return m


@pytest.fixture(scope="module")
def model(dev, kc):
    m = open_model(dev, kc)
    yield m
    m.close()


@pytest.fixture(scope="module")
def soft_tokens(model) -> dict[str, Media]:
    return CASE.encode(model)


@pytest.mark.parametrize("name", IMAGES)
def test_geometry_and_soft_tokens_are_llamacpps(soft_tokens, name):
    media = soft_tokens[name]
    assert [media.geometry.nx, media.geometry.ny] == list(REF[f"{name}_grid"])
    CASE.check_soft_tokens(name, media.rows)


def test_a_warm_models_rope_tables_become_host_visible_with_its_projector(dev, kc):
    """M-RoPE's table rows are written for each pass: a model warm before its projector
    came makes its tables again host-visible (a discrete GPU's device-local one has no
    host view to write), as does the run state a restore makes; a pass writes them."""
    m = open_model(dev, kc)
    try:
        for _ in range(2):
            m.eval([1, 2, 3], 0, greedy=True)
            assert m.rs.rope_tables and all(b.host for b in m.rs.rope_tables.values())
            m.release(full=True)
            m.restore()
    finally:
        m.close()


def test_prompt_ids_are_mtmds(model):
    tok = Tokenizer.from_gguf(model.gguf)
    for name in IMAGES:
        img = image(name)
        ids = media_prompt.tokenize(tok, CASE.entry["prompt_text"], [img], model.vision.config)
        assert ids == prompt_ids(name, img)


@pytest.mark.parametrize("name", IMAGES)
def test_positions_are_mtmds(soft_tokens, name):
    """Every prompt token's (t, h, w, e), as llama.cpp decoded them."""
    n0 = len(REF[f"{name}_ids_before"])
    geometry = soft_tokens[name].geometry
    p = Positions(1024, (0,))
    got = np.concatenate([p.advance(0, n0, None),
                          p.advance(n0, geometry.n_tokens, geometry),
                          p.advance(n0 + geometry.n_tokens, len(REF[f"{name}_ids_after"]),
                                    None)])
    assert np.array_equal(got, REF[f"{name}_positions"])


@pytest.mark.parametrize("name", IMAGES)
def test_logits_after_an_image_are_llamacpps(model, soft_tokens, name):
    check_logits(name, CASE.teacher_forced(model, name, image(name), soft_tokens[name]))


def test_release_and_restore_between_two_images(model):
    first = image("square")
    check_logits("square", CASE.teacher_forced(model, "square", first,
                                          Media(*model.vision.encode(first))))
    model.release(full=True)
    assert not model.vision.warm and "vision" not in model.device_bytes()
    model.restore()
    second = image("wide")
    check_logits("wide", CASE.teacher_forced(model, "wide", second,
                                        Media(*model.vision.encode(second))))


def test_an_image_in_several_passes(dev, kc, soft_tokens, monkeypatch):
    """A causal image may go in passes smaller than itself: the same logits."""
    m = open_model(dev, kc)
    try:
        monkeypatch.setattr(Model, "chunk", property(lambda self: 64))
        check_logits("wide", CASE.teacher_forced(m, "wide", image("wide"), soft_tokens["wide"]))
    finally:
        m.close()


def test_the_engine_answers_an_image_and_again_from_its_cache():
    """Through Engine.generate as the server calls it: llama.cpp's greedy tokens; the same
    request again resumes from the recurrent model's checkpoint past the image and answers
    the same; the image is encoded once. (The square image: the wide one's first step is a
    near tie in llama.cpp, 0.007 apart.)"""
    from engine.api import Engine
    from engine.facade import Request
    from engine.text.sampling import SamplingParams

    greedy = SamplingParams(temperature=0.0)
    data = CASE.image_bytes("square")
    with Engine(n_ctx=1024) as eng:
        name = eng.load(CASE.model_path, mmproj=CASE.mmproj_path,
                        image_max_tokens=CASE.entry["image_max_tokens"])
        req = Request(name, prompt=CASE.entry["prompt_text"], images=[data], max_tokens=8,
                      sampling=greedy)
        first = eng.generate(req)
        assert first.tokens == [int(t) for t in REF["square_continuation_ids"]]
        assert len(first.prompt_tokens) == CASE.entry["n_prompt"]["square"]
        again = eng.generate(req)
        assert again.tokens == first.tokens
        assert again.timings["cached_tokens"] > len(REF["square_ids_before"]) + 256
        assert eng.models[name].model.vision.encoded == 1


def test_text_after_an_image_prompt_is_at_its_own_positions(dev, kc, model, soft_tokens):
    """Once an image has moved the rope rows of its slots, a hidden-state pass (embeddings)
    and a text prompt from position 0 get the plain rows back: the same as a model that
    never saw an image."""
    plain = Model(dev, kc, CASE.model_path, n_ctx=1024)
    try:
        # with ggml's rounding both models read a rope table: bit-close. A GPU's plain model
        # turns its angles in the shader, whose cos and sin round apart from the table's
        # (hidden states 4.3e-4 apart at most on the H100): a relative error that rows left
        # at an image's positions pass by far
        def close(a, b) -> bool:
            if model.paths.numerics == "ggml":
                return np.abs(a - b).max() < 1e-4
            return np.sum((a - b) ** 2) / np.sum(b ** 2) < 1e-6
        text = [int(t) for t in REF["square_ids_after"]] * 3
        want_hidden, want_logits = plain.hidden(text), plain.eval(text, 0, greedy=False)
        CASE.teacher_forced(model, "square", image("square"), soft_tokens["square"])
        assert close(model.hidden(text), want_hidden)
        CASE.teacher_forced(model, "square", image("square"), soft_tokens["square"])
        model.cache_tokens = []
        model.rs.reset_recurrent()
        assert close(model.eval(text, 0, greedy=False), want_logits)
    finally:
        plain.close()
