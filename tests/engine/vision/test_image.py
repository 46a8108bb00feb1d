"""An image from a file's bytes to the encoder's patches (no GPU): the formats read, the
errors for what is not an image or is too large, mtmd's letterbox, the patch order, and the
media id a prompt knows an image by."""
from __future__ import annotations

import io

import numpy as np
import pytest

from engine.vision import image as images
from engine.vision.config import VisionConfig
from engine.vision.image import Image, ImageError, letterbox, patches
from engine.vision.prompt import media_id

PIL = pytest.importorskip("PIL.Image")


def encoded(rgb: np.ndarray, fmt: str, **kw) -> bytes:
    out = io.BytesIO()
    PIL.fromarray(rgb).save(out, format=fmt, **kw)
    return out.getvalue()


def gradient(h: int, w: int) -> np.ndarray:
    y, x = np.mgrid[0:h, 0:w]
    return np.stack([x * 255 // max(w - 1, 1), y * 255 // max(h - 1, 1),
                     (x + y) % 256], -1).astype(np.uint8)


def config(image_size=28, patch=14, merge=1) -> VisionConfig:
    return VisionConfig("gemma3", image_size, patch, 32, 64, 1, 2, 1e-6, (0.5,) * 3,
                        (0.5,) * 3, merge, 64, (image_size // patch) ** 2)


@pytest.mark.parametrize("fmt,kw,exact", [("PNG", {}, True), ("WEBP", {"lossless": True}, True),
                                          ("JPEG", {"quality": 95}, False)])
def test_formats_read_as_rgb(fmt, kw, exact):
    rgb = gradient(30, 50)
    got = Image.from_bytes(encoded(rgb, fmt, **kw)).rgb
    assert got.shape == (30, 50, 3) and got.dtype == np.uint8
    if exact:
        assert np.array_equal(got, rgb)
    else:
        assert np.abs(got.astype(int) - rgb).mean() < 4


def test_grey_and_alpha_become_rgb():
    grey = Image.from_bytes(encoded(gradient(8, 8)[..., 0], "PNG")).rgb
    assert grey.shape == (8, 8, 3) and np.array_equal(grey[..., 0], grey[..., 2])
    rgba = np.dstack([gradient(8, 8), np.full((8, 8), 128, np.uint8)])
    assert Image.from_bytes(encoded(rgba, "PNG")).rgb.shape == (8, 8, 3)


@pytest.mark.parametrize("data,match", [
    (b"", "empty"),
    (b"this is not an image at all", "not an image"),
    (b"\x89PNG\r\n\x1a\n" + b"\x00" * 40, "not an image"),
])
def test_what_is_not_an_image_is_refused(data, match):
    with pytest.raises(ImageError, match=match):
        Image.from_bytes(data)


def test_a_truncated_file_is_refused():
    data = encoded(gradient(64, 64), "PNG")
    with pytest.raises(ImageError, match="not an image"):
        Image.from_bytes(data[:len(data) // 2])


def test_limits(monkeypatch):
    with pytest.raises(ImageError, match="bytes; the limit is"):
        Image.from_bytes(b"\0" * (images.MAX_BYTES + 1))
    big = io.BytesIO()
    PIL.new("1", (10000, 6000)).save(big, format="PNG")      # 6e7 pixels, a small file
    with pytest.raises(ImageError, match="pixels; the limit is"):
        Image.from_bytes(big.getvalue())
    monkeypatch.setenv(images.SCALE_SETTING, "100")
    small = Image.from_bytes(encoded(gradient(40, 20), "PNG")).rgb   # scaled to fit
    assert small.shape[0] * small.shape[1] <= 100 and small.shape[0] > small.shape[1]


def test_letterbox_keeps_the_aspect_on_black():
    rgb = np.full((100, 200, 3), 200, np.uint8)
    out = letterbox(rgb, 64, 64)
    assert out.shape == (64, 64, 3)
    assert (out[:16] == 0).all() and (out[48:] == 0).all()      # 64 x 32, centred
    assert (out[16:48] == 200).all()
    square = gradient(64, 64)
    assert letterbox(square, 64, 64) is square


def test_patches_are_rows_of_channel_row_column():
    c = config()
    rgb = gradient(28, 28)
    got = patches(Image.from_rgb(rgb), c)
    assert got.shape == (4, c.patch_len) and c.patch_len == 608
    norm = (rgb.astype(np.float32) / 255 - 0.5) / 0.5
    for py in range(2):
        for px in range(2):
            block = norm[14 * py:14 * py + 14, 14 * px:14 * px + 14]     # [row, col, ch]
            want = block.transpose(2, 0, 1).reshape(-1)
            assert np.allclose(got[2 * py + px, :588], want, atol=1e-6)
    assert not got[:, 588:].any()


def test_media_ids():
    a, b = Image.from_rgb(gradient(8, 8)), Image.from_rgb(gradient(8, 9))
    assert media_id(a) == media_id(Image.from_rgb(gradient(8, 8)))
    assert media_id(a) != media_id(b)
    assert -2 ** 31 <= media_id(a) < 0 and -2 ** 31 <= media_id(b) < 0
    with pytest.raises(ImageError, match="not \\[height, width, 3\\]"):
        Image.from_rgb(np.zeros((4, 4), np.uint8))


def test_the_scale_bound_setting_is_checked(monkeypatch):
    monkeypatch.setenv(images.SCALE_SETTING, "lots")
    with pytest.raises(ValueError, match="^HOTSEAT_IMAGE_SCALE_PIXELS: 'lots' is not a whole"):
        Image.from_bytes(encoded(gradient(4, 4), "PNG"))
