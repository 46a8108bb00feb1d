"""An image, from a file's bytes to the encoder's input, as llama.cpp's mtmd prepares it for
a fixed-size encoder (mtmd-image.cpp): decoded to RGB, letterboxed into the encoder's square
(scaled by Pillow's bilinear filter to fit, centred on black), each value v / 255 then
(v - mean) / std per channel, and cut into patches: row-major over the image, each patch's
values in (channel, row, column) order, a convolution's im2col."""
from __future__ import annotations

import hashlib
import io
from dataclasses import dataclass

import numpy as np

from .config import VisionConfig

MAX_BYTES = 20 * 1024 * 1024          # an image file larger than this is refused
MAX_PIXELS = 50_000_000               # as is one whose width x height is larger
SCALE_PIXELS = 16_000_000             # larger ones are scaled down to this before anything


class ImageError(ValueError):
    """Bytes that are not an image this engine reads, or one past the limits."""


@dataclass(frozen=True)
class Image:
    """A decoded image: RGB pixels [height, width, 3] uint8, and the digest of those pixels
    (what the prompt cache knows the image by)."""
    rgb: np.ndarray
    digest: bytes

    @classmethod
    def from_bytes(cls, data: bytes) -> "Image":
        """PNG, JPEG, WebP (whatever Pillow opens), to RGB; ImageError otherwise."""
        from PIL import Image as PILImage, UnidentifiedImageError

        if len(data) > MAX_BYTES:
            raise ImageError(f"the image is {len(data)} bytes; the limit is {MAX_BYTES}")
        if not data:
            raise ImageError("the image is empty")
        try:
            with PILImage.open(io.BytesIO(data)) as im:
                w, h = im.size
                if w * h > MAX_PIXELS:
                    raise ImageError(f"the image is {w}x{h} pixels; the limit is "
                                     f"{MAX_PIXELS} pixels")
                if w * h > SCALE_PIXELS:
                    im.draft("RGB", (w // 2, h // 2))     # JPEG: decode at a smaller scale
                im = im.convert("RGB")
                if im.width * im.height > SCALE_PIXELS:
                    f = (SCALE_PIXELS / (im.width * im.height)) ** 0.5
                    im = im.resize((max(1, int(im.width * f)), max(1, int(im.height * f))),
                                   PILImage.Resampling.BILINEAR)
                rgb = np.asarray(im, np.uint8)
        except ImageError:
            raise
        except (UnidentifiedImageError, PILImage.DecompressionBombError, OSError, ValueError,
                SyntaxError) as exc:
            raise ImageError(f"not an image that can be read: {exc}") from None
        return cls.from_rgb(rgb)

    @classmethod
    def from_rgb(cls, rgb: np.ndarray) -> "Image":
        rgb = np.ascontiguousarray(rgb, np.uint8)
        if rgb.ndim != 3 or rgb.shape[2] != 3 or min(rgb.shape[:2]) < 1:
            raise ImageError(f"pixels of shape {rgb.shape}, not [height, width, 3]")
        h = hashlib.sha256(np.array(rgb.shape, np.int64).tobytes())
        h.update(rgb.data)
        return cls(rgb, h.digest())


def letterbox(rgb: np.ndarray, size: int) -> np.ndarray:
    """rgb scaled to fit a size x size square, keeping its aspect, centred on black
    (mtmd's resize with PAD_CEIL; Pillow's bilinear filter is the one it follows)."""
    from PIL import Image as PILImage

    h, w = rgb.shape[:2]
    if (h, w) == (size, size):
        return rgb
    scale = min(np.float32(size) / np.float32(w), np.float32(size) / np.float32(h))
    nw = min(int(np.ceil(np.float32(w) * scale)), size)
    nh = min(int(np.ceil(np.float32(h) * scale)), size)
    im = PILImage.fromarray(rgb).resize((nw, nh), PILImage.Resampling.BILINEAR,
                                        reducing_gap=None)
    out = np.zeros((size, size, 3), np.uint8)
    ox, oy = (size - nw) // 2, (size - nh) // 2
    out[oy:oy + nh, ox:ox + nw] = np.asarray(im, np.uint8)
    return out


def patches(image: Image, c: VisionConfig) -> np.ndarray:
    """The encoder's input: [n_patches, patch_len] float32, patch py * side + px, values in
    (channel, row, column) order, then zeros to patch_len."""
    x = letterbox(image.rgb, c.image_size).astype(np.float32) / np.float32(255.0)
    x = (x - np.asarray(c.mean, np.float32)) / np.asarray(c.std, np.float32)
    s, p = c.side, c.patch
    x = x.transpose(2, 0, 1).reshape(3, s, p, s, p).transpose(1, 3, 0, 2, 4)
    out = np.zeros((s * s, c.patch_len), np.float32)
    out[:, :3 * p * p] = x.reshape(s * s, 3 * p * p)
    return out
