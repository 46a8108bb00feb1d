"""The vision cases of tests/data/synth (index.json's "vision_cases", made by
tests/tools/make_synth_vision.py): llama.cpp's soft tokens, prompt ids and teacher-forced
logits for an image in a prompt, and the rules the engine's logits are held to (those of
the text cases: the argmax, unless llama.cpp's top two are a near tie, and cosine; and an
absolute bound, since a wrong image position moves logits by a few tenths)."""
from __future__ import annotations

import hashlib
import json

import numpy as np

from engine.vision.image import Image
from tests.helpers.synth_reference import DATA, MIN_COS, TIE, cosine

MAX_EMBD_ERR = 2e-3            # relative (Frobenius) to llama.cpp's soft tokens
MAX_LOGIT_DIFF = 0.05


class VisionCase:
    def __init__(self, entry: dict):
        self.entry = entry
        self.ref = np.load(DATA / entry["data"])
        self.image_dir = DATA.parents[2] / entry["image_dir"]
        self.model_path = str(DATA / entry["model_file"])
        self.mmproj_path = str(DATA / entry["mmproj_file"])

    def check_files(self) -> None:
        """The stored GGUFs are byte for byte the ones llama.cpp's outputs come from."""
        for key in ("model", "mmproj"):
            path = DATA / self.entry[f"{key}_file"]
            assert hashlib.sha256(path.read_bytes()).hexdigest() == \
                self.entry[f"{key}_sha256"], path.name

    def image_bytes(self, name: str) -> bytes:
        data = (self.image_dir / self.entry["images"][name]["file"]).read_bytes()
        assert hashlib.sha256(data).hexdigest() == self.entry["images"][name]["sha256"]
        return data

    def image(self, name: str) -> Image:
        return Image.from_bytes(self.image_bytes(name))

    def prompt_ids(self, name: str, media_id: int, n_tokens: int) -> list[int]:
        """llama.cpp's text ids around the image, its soft tokens as media_id."""
        return [int(t) for t in self.ref[f"{name}_ids_before"]] + [media_id] * n_tokens + \
            [int(t) for t in self.ref[f"{name}_ids_after"]]

    def encode(self, model) -> dict:
        """Each of the case's images through the model's encoder: name -> residency.Media."""
        from engine.residency.model import Media

        return {name: Media(*model.vision.encode(self.image(name)))
                for name in self.entry["images"]}

    def teacher_forced(self, model, name: str, img: Image, media) -> np.ndarray:
        """A Model's logits after the prompt with the image (`media`, a residency.Media, as
        img's media id) and after each of llama.cpp's continuation tokens, from an empty
        cache."""
        from engine.vision.prompt import media_id as media_id_of

        media_id = media_id_of(img)
        ids = self.prompt_ids(name, media_id, len(media.rows))
        model.media = {media_id: media}
        model.cache_tokens = []
        model.rs.reset_recurrent()
        out = [model.eval(ids, 0, greedy=False)]
        for i, tok in enumerate(self.ref[f"{name}_continuation_ids"]):
            out.append(model.run([int(tok)], len(ids) + i, greedy=False))
        return np.stack(out)

    def check_soft_tokens(self, name: str, rows: np.ndarray) -> None:
        want = self.ref[f"{name}_embd"]
        assert rows.shape == want.shape
        assert np.linalg.norm(rows - want) / np.linalg.norm(want) < MAX_EMBD_ERR

    def check_logits(self, name: str, got: np.ndarray) -> None:
        want = self.ref[f"{name}_logits_steps"]
        assert got.shape == want.shape
        for step, (g, w) in enumerate(zip(got, want)):
            top2 = np.sort(w)[-2:]
            if int(np.argmax(g)) != int(np.argmax(w)):
                assert top2[1] - top2[0] < TIE, f"{name} step {step}: argmax differs"
            assert cosine(g, w) >= MIN_COS, f"{name} step {step}"
            assert np.abs(g - w).max() < MAX_LOGIT_DIFF, f"{name} step {step}"


def load(name: str) -> VisionCase | None:
    index = DATA / "index.json"
    if not index.exists():
        return None
    entry = next((c for c in json.loads(index.read_text()).get("vision_cases", ())
                  if c["name"] == name), None)
    return None if entry is None else VisionCase(entry)
