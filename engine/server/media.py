"""Images in requests, as every route takes them: OpenAI's `image_url` content parts and
`/v1/responses`' `input_image` (data URLs), Ollama's `images` (base64). A route keeps the
image's bytes and puts the media marker (engine/vision/prompt.py) in the message's text at
its place; the bytes are decoded on a worker thread (`decode`), where a file that is not an
image, or one past the limits, is a 400 naming the parameter.

A URL that is not a data URL is refused: the server fetches nothing unless asked to."""
from __future__ import annotations

import base64
import binascii
import re

from ..vision.image import MAX_BYTES, Image, ImageError
from ..vision.prompt import MARKER
from .errors import bad

_DATA_URL = re.compile(r"data:(?P<mime>[\w.+-]+/[\w.+-]+)?(?P<params>(;[^,;]*)*?)"
                       r"(?P<b64>;base64)?,(?P<data>.*)", re.S)


def from_base64(text, param: str) -> bytes:
    """The bytes of a base64 string (400 where it is not one)."""
    if not isinstance(text, str):
        raise bad(f"{param} must be a base64 string", param, "invalid_type")
    if len(text) > 4 * (MAX_BYTES // 3 + 4):
        raise bad(f"{param}: the image is larger than {MAX_BYTES} bytes", param,
                  "invalid_image")
    try:
        return base64.b64decode(re.sub(r"\s+", "", text), validate=True)
    except (binascii.Error, ValueError):
        raise bad(f"{param} is not valid base64", param, "invalid_image") from None


def from_url(url, param: str) -> bytes:
    """The bytes of an image URL: a data URL (base64), else a 400."""
    if not isinstance(url, str) or not url:
        raise bad(f"{param} must be a URL string", param, "invalid_type")
    m = _DATA_URL.fullmatch(url)
    if m is None:
        scheme = url.split(":", 1)[0] if ":" in url else "a URL without a scheme"
        raise bad(f"{param}: only data URLs (data:image/...;base64,...) are taken; images are "
                  f"not fetched from {scheme} URLs", param, "unsupported_image_url")
    if m["mime"] and not m["mime"].startswith("image/"):
        raise bad(f"{param}: a data URL of {m['mime']}, not an image", param, "invalid_image")
    if not m["b64"]:
        raise bad(f"{param}: the data URL is not base64", param, "invalid_image")
    return from_base64(m["data"], param)


def decode(images: list[tuple[bytes, str]]) -> list[Image]:
    """(bytes, parameter) pairs to Images, on a worker thread; a 400 for the first bad one."""
    out = []
    for data, param in images:
        try:
            out.append(Image.from_bytes(data))
        except ImageError as exc:
            raise bad(f"{param}: {exc}", param, "invalid_image") from None
    return out


def marked(text: str, param: str) -> str:
    """A message's own text, which must not hold the media marker itself."""
    if MARKER in text:
        raise bad(f"{param} contains {MARKER}, which marks an image's place", param,
                  "invalid_value")
    return text
