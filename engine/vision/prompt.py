"""Images in a prompt's token ids, as llama.cpp's mtmd puts them there: the text holds a
marker at each image's place; the text is tokenized piece by piece around the markers (the
first piece with the vocabulary's BOS), and each marker becomes the projector's opening
text, the image's soft tokens, and its closing text (Gemma 3: `<start_of_image>`, 256 soft
tokens, `<end_of_image>`; Qwen3.5: `<|vision_start|>`, as many soft tokens as its geometry
gives, `<|vision_end|>`).

A soft token has no id: in the ids it is the image's media id, a negative number made from
the digest of its pixels, repeated once per soft token. The KV cache knows the image by it
(a prompt cache hit for the same image at the same place), and Model.eval sends the span
through in one pass of the image's rows."""
from __future__ import annotations

from ..text.tokenizer import Tokenizer
from .config import VisionConfig
from .image import Image

MARKER = "<__media__>"
WRAP = {"gemma3": ("<start_of_image>", "<end_of_image>"),
        "qwen3vl_merger": ("<|vision_start|>", "<|vision_end|>")}


def media_id(image: Image) -> int:
    """A negative id from the image's digest, within int32 (31 bits of it)."""
    return -1 - (int.from_bytes(image.digest[:4], "little") >> 1)


def tokenize(tokenizer: Tokenizer, text: str, images: list[Image], c: VisionConfig) -> list[int]:
    """The ids of `text` with one image at each MARKER (ValueError where the counts differ)."""
    pieces = text.split(MARKER)
    if len(pieces) - 1 != len(images):
        raise ValueError(f"the prompt has {len(pieces) - 1} image markers for {len(images)} "
                         f"images")
    opening, closing = WRAP[c.projector]
    ids: list[int] = []
    for i, piece in enumerate(pieces):
        if i:
            image = images[i - 1]
            n = c.geometry(image.rgb.shape[1], image.rgb.shape[0]).n_tokens
            ids += [media_id(image)] * n
            piece = closing + piece
        if i < len(images):
            piece += opening
        ids += tokenizer.encode(piece, add_special=i == 0, parse_special=True)
    return ids
