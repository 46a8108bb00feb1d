"""Images in requests, as every route takes them: OpenAI's `image_url` content parts and
`/v1/responses`' `input_image` (data URLs), Ollama's `images` (base64). A route keeps the
image's bytes and puts the media marker (engine/vision/prompt.py) in the message's text at
its place; the bytes are decoded on a worker thread (`decode`), where a file that is not an
image, or one past the limits, is a 400 naming the parameter.

An http(s) URL is kept as it is and fetched (`fetch`) only where the server was started with
--fetch-images; otherwise it is refused: by default the server fetches nothing."""
from __future__ import annotations

import asyncio
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


FETCH_TIMEOUT_S = 20.0


def from_url(url, param: str) -> bytes | str:
    """The bytes of a data URL (base64); an http(s) URL as it is (fetched later, if the
    server fetches images); else a 400."""
    if not isinstance(url, str) or not url:
        raise bad(f"{param} must be a URL string", param, "invalid_type")
    if re.match(r"https?://", url, re.I):
        return url
    m = _DATA_URL.fullmatch(url)
    if m is None:
        scheme = url.split(":", 1)[0] if ":" in url else "a URL without a scheme"
        raise bad(f"{param}: only data URLs (data:image/...;base64,...) and http(s) URLs are "
                  f"taken, not {scheme}", param, "unsupported_image_url")
    if m["mime"] and not m["mime"].startswith("image/"):
        raise bad(f"{param}: a data URL of {m['mime']}, not an image", param, "invalid_image")
    if not m["b64"]:
        raise bad(f"{param}: the data URL is not base64", param, "invalid_image")
    return from_base64(m["data"], param)


async def fetch(images: list[tuple[bytes | str, str]], allowed: bool) -> list[tuple[bytes, str]]:
    """The images with their http(s) URLs fetched (at most MAX_BYTES each, FETCH_TIMEOUT_S):
    where `allowed`, else a 400 saying how to allow it."""
    out = []
    for data, param in images:
        if isinstance(data, str):
            if not allowed:
                raise bad(f"{param}: this server does not fetch images from URLs (start it "
                          "with --fetch-images to allow it); send a data URL "
                          "(data:image/...;base64,...)", param, "unsupported_image_url")
            data = await _get(data, param)
        out.append((data, param))
    return out


async def _get(url: str, param: str) -> bytes:
    import aiohttp

    try:
        timeout = aiohttp.ClientTimeout(total=FETCH_TIMEOUT_S)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            async with session.get(url) as r:
                if r.status != 200:
                    raise bad(f"{param}: fetching {url} gave HTTP {r.status}", param,
                              "invalid_image")
                data = bytearray()
                async for chunk in r.content.iter_chunked(1 << 16):
                    data += chunk
                    if len(data) > MAX_BYTES:
                        raise bad(f"{param}: the image at {url} is larger than {MAX_BYTES} "
                                  "bytes", param, "invalid_image")
    except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as exc:
        raise bad(f"{param}: cannot fetch {url}: {exc or type(exc).__name__}", param,
                  "invalid_image") from None
    return bytes(data)


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
