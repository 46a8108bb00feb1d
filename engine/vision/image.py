"""An image, from a file's bytes to the encoder's input, as llama.cpp's mtmd prepares it
(mtmd-image.cpp): decoded to RGB, letterboxed onto the canvas of its geometry (config.py:
scaled to fit keeping its aspect, centred on black; Pillow's bilinear filter for gemma3,
bicubic for qwen3vl_merger, which mtmd's resampler follows), each value v / 255 then
(v - mean) / std per channel, and cut into patches, each patch's values in (channel, row,
column) order, a convolution's im2col: row-major over the image (gemma3), or in 2 x 2 blocks
of patches, the blocks row-major and the patches of a block too (qwen3vl_merger)."""
from __future__ import annotations

import hashlib
import io
from dataclasses import dataclass

import numpy as np

from .config import Geometry, VisionConfig

MAX_BYTES = 20 * 1024 * 1024          # an image file larger than this is refused
MAX_PIXELS = 50_000_000               # as is one whose width x height is larger
SCALE_PIXELS = 16_000_000             # larger ones are scaled down to this before anything
SCALE_SETTING = "HOTSEAT_IMAGE_SCALE_PIXELS"    # that bound, where set (serve's option)


def scale_pixels() -> int:
    """The pixels an image is scaled down to before anything else: $HOTSEAT_IMAGE_SCALE_PIXELS
    (hotseat serve --image-scale-pixels), else SCALE_PIXELS."""
    from ..gpu.paths import count_setting

    return count_setting(SCALE_SETTING, SCALE_PIXELS)


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
        bound = scale_pixels()
        try:
            with PILImage.open(io.BytesIO(data)) as im:
                w, h = im.size
                if w * h > MAX_PIXELS:
                    raise ImageError(f"the image is {w}x{h} pixels; the limit is "
                                     f"{MAX_PIXELS} pixels")
                if w * h > bound:
                    im.draft("RGB", (w // 2, h // 2))     # JPEG: decode at a smaller scale
                im = im.convert("RGB")
                if im.width * im.height > bound:
                    f = (bound / (im.width * im.height)) ** 0.5
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


def letterbox(rgb: np.ndarray, width: int, height: int, bicubic: bool = False) -> np.ndarray:
    """rgb scaled to fit a width x height canvas, keeping its aspect, centred on black
    (mtmd's resize with PAD_CEIL); unchanged where it is that size already."""
    from PIL import Image as PILImage

    h, w = rgb.shape[:2]
    if (h, w) == (height, width):
        return rgb
    f32 = np.float32
    scale = min(f32(width) / f32(w), f32(height) / f32(h))
    nw = min(int(np.ceil(f32(f32(w) * scale))), width)
    nh = min(int(np.ceil(f32(f32(h) * scale))), height)
    mode = PILImage.Resampling.BICUBIC if bicubic else PILImage.Resampling.BILINEAR
    im = PILImage.fromarray(rgb).resize((nw, nh), mode, reducing_gap=None)
    out = np.zeros((height, width, 3), np.uint8)
    ox, oy = (width - nw) // 2, (height - nh) // 2
    out[oy:oy + nh, ox:ox + nw] = np.asarray(im, np.uint8)
    return out


def block_order(gw: int, gh: int) -> np.ndarray:
    """qwen3vl_merger's patch order: 2 x 2 blocks row-major, each block's four patches
    row-major; the raster index y * gw + x of each."""
    yb, xb, dy, dx = np.meshgrid(np.arange(gh // 2), np.arange(gw // 2), np.arange(2),
                                 np.arange(2), indexing="ij")
    return ((2 * yb + dy) * gw + (2 * xb + dx)).reshape(-1)


def patches(image: Image, c: VisionConfig, g: Geometry | None = None) -> np.ndarray:
    """The encoder's input: [n_patches, patch_len] float32, values in (channel, row, column)
    order, then zeros to patch_len; patches in the projector's order."""
    g = g or c.geometry(image.rgb.shape[1], image.rgb.shape[0])
    x = letterbox(image.rgb, g.width, g.height, bicubic=c.projector != "gemma3")
    x = x.astype(np.float32) / np.float32(255.0)
    x = (x - np.asarray(c.mean, np.float32)) / np.asarray(c.std, np.float32)
    p = c.patch
    x = x.transpose(2, 0, 1).reshape(3, g.gh, p, g.gw, p).transpose(1, 3, 0, 2, 4)
    x = x.reshape(g.n_patches, 3 * p * p)
    if c.projector != "gemma3":
        x = x[block_order(g.gw, g.gh)]
    out = np.zeros((g.n_patches, c.patch_len), np.float32)
    out[:, :3 * p * p] = x
    return out
