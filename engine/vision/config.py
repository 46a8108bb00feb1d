"""An mmproj file's vision encoder, as llama.cpp's clip reader takes it (tools/mtmd): the
keys and tensor names of `clip.*` GGUF files, and the geometry of an image.

Two projectors:
- "gemma3" (Gemma 3): a SigLIP ViT over a fixed square image, its patch grid average-pooled
  by `merge` a side into soft tokens, RMS-normed and projected into the text model's width;
  an image's soft tokens see each other both ways in the text model.
- "qwen3vl_merger" (Qwen3.5, Qwen3-VL without deepstack): a ViT with 2-D rope over an image
  of its own size (sides multiples of patch x merge, within a budget of soft tokens), each
  2 x 2 block of patches merged by an MLP into one soft token; causal in the text model,
  with M-RoPE positions (row and column) there.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..formats.gguf_file import GGUFFile, ModelFileError

PROJECTORS = ("gemma3", "qwen3vl_merger")
DEFAULT_MERGE = {"gemma3": 4, "qwen3vl_merger": 2}
# qwen3vl_merger's image budget in soft tokens, llama.cpp's defaults (clip.cpp's
# set_limit_image_tokens(8, 4096)); its mmproj files name none
MIN_TOKENS, MAX_TOKENS = 8, 4096


@dataclass(frozen=True)
class Geometry:
    """One image as the encoder takes it: the canvas it is drawn on (pixels), its grid of
    patches and of soft tokens."""
    width: int
    height: int
    gw: int                    # patches a row
    gh: int
    nx: int                    # soft tokens a row
    ny: int

    @property
    def n_patches(self) -> int:
        return self.gw * self.gh

    @property
    def n_tokens(self) -> int:
        return self.nx * self.ny


@dataclass(frozen=True)
class VisionConfig:
    projector: str
    image_size: int            # gemma3: pixels a side of its square input; else 0
    patch: int                 # pixels a side of a patch
    n_embd: int                # the encoder's width
    n_ff: int
    n_layer: int
    n_head: int
    eps: float                 # every LayerNorm's, and gemma3's RMS norm's
    mean: tuple[float, float, float]
    std: tuple[float, float, float]
    merge: int                 # patches a side of one soft token
    n_embd_text: int           # the width the projector gives: the text model's
    n_pos_embd: int            # rows of the position table
    min_tokens: int = MIN_TOKENS    # qwen3vl_merger: an image's soft tokens, at least
    max_tokens: int = MAX_TOKENS    # and at most

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    @property
    def bidirectional(self) -> bool:
        """Whether an image's soft tokens see each other both ways in the text model."""
        return self.projector == "gemma3"

    @property
    def patch_len(self) -> int:
        """Values of a patch as the encoder takes them: 3 patch^2, padded with zeros to whole
        blocks of 32 (the products' unit)."""
        return -(-3 * self.patch ** 2 // 32) * 32

    @property
    def ff_len(self) -> int:
        """The feed-forward width as the encoder holds it: n_ff padded to whole blocks of 32
        (SigLIP's 4304 is not), the padding rows and columns zero."""
        return -(-self.n_ff // 32) * 32

    @property
    def max_image_tokens(self) -> int:
        """Soft tokens of the largest image (gemma3: every image's)."""
        return self.max_patches // self.merge ** 2

    @property
    def max_patches(self) -> int:
        """Patches of the largest image: what the encoder's buffers hold."""
        if self.projector == "gemma3":
            return (self.image_size // self.patch) ** 2
        return self.max_tokens * self.merge ** 2

    def geometry(self, width: int, height: int) -> Geometry:
        """The canvas and grids of a width x height image (mtmd's fixed size for gemma3;
        for qwen3vl_merger its calc_size_preserved_ratio, in float32 as there)."""
        if self.projector == "gemma3":
            side = self.image_size // self.patch
            return Geometry(self.image_size, self.image_size, side, side,
                            side // self.merge, side // self.merge)
        align = self.patch * self.merge
        w, h = smart_size(width, height, align, self.min_tokens * align ** 2,
                          self.max_tokens * align ** 2)
        return Geometry(w, h, w // self.patch, h // self.patch, w // align, h // align)

    @classmethod
    def from_gguf(cls, g: GGUFFile, max_tokens: int | None = None) -> "VisionConfig":
        if not g.get("clip.has_vision_encoder", False):
            raise ModelFileError(g.path, "not a vision projector (no clip.has_vision_encoder)",
                                 "unsupported")
        proj = g.get("clip.projector_type", g.get("clip.vision.projector_type"))
        if proj not in PROJECTORS:
            raise ModelFileError(g.path, f"vision projector {proj!r} is not supported (only "
                                 f"{', '.join(PROJECTORS)})", "unsupported")
        if not g.get("clip.use_gelu", False):
            raise ModelFileError(g.path, "the encoder's activation is not GELU "
                                 "(clip.use_gelu)", "unsupported")
        v = "clip.vision."
        mean, std = g.require(v + "image_mean"), g.require(v + "image_std")
        if len(mean) < 3 or len(std) < 3:
            raise ModelFileError(g.path, "image_mean and image_std need 3 values", "corrupt")
        out = "mm.input_projection.weight" if proj == "gemma3" else "mm.2.bias"
        width = g.tensor(out).shape[0]
        merge_key = v + ("projector.scale_factor" if proj == "gemma3" else "spatial_merge_size")
        c = cls(projector=proj,
                image_size=int(g.require(v + "image_size")) if proj == "gemma3" else 0,
                patch=int(g.require(v + "patch_size")),
                n_embd=int(g.require(v + "embedding_length")),
                n_ff=int(g.require(v + "feed_forward_length")),
                n_layer=int(g.require(v + "block_count")),
                n_head=int(g.require(v + "attention.head_count")),
                eps=float(g.require(v + "attention.layer_norm_epsilon")),
                mean=tuple(float(x) for x in mean[:3]), std=tuple(float(x) for x in std[:3]),
                merge=int(g.get(merge_key, DEFAULT_MERGE[proj])), n_embd_text=int(width),
                n_pos_embd=int(g.tensor("v.position_embd.weight").shape[1]),
                max_tokens=int(max_tokens or MAX_TOKENS))
        c.validate(g)
        return c

    def validate(self, g: GGUFFile) -> None:
        """One ModelFileError naming what this encoder cannot run."""
        bad = None
        if self.projector == "gemma3" and (self.image_size % self.patch
                                           or (self.image_size // self.patch) % self.merge):
            bad = (f"image size {self.image_size} is not whole patches of {self.patch} "
                   f"pooled by {self.merge}")
        elif self.projector == "qwen3vl_merger" and self.merge != 2:
            bad = f"spatial merge {self.merge} (the graph merges 2 x 2)"
        elif self.projector == "qwen3vl_merger" and math.isqrt(self.n_pos_embd) ** 2 != \
                self.n_pos_embd:
            bad = f"{self.n_pos_embd} position embeddings are no square grid"
        elif self.n_embd % self.n_head or self.head_dim % 4:
            bad = f"width {self.n_embd} over {self.n_head} heads"
        elif not 0 < self.min_tokens <= self.max_tokens:
            bad = f"an image budget of {self.min_tokens} to {self.max_tokens} soft tokens"
        if bad is None:
            for name, shape in self.tensor_shapes().items():
                t = g.tensor(name)
                if tuple(t.shape) != shape:
                    bad = f"tensor {name} has shape {list(t.shape)}, not {list(shape)}"
                    break
                if len(shape) == 1 and t.type_name != "F32":
                    bad = f"tensor {name} is {t.type_name}, not F32"
                    break
                if name.startswith(("mm.input", "v.patch_embd", "v.position")) and \
                        t.type_name not in ("F32", "F16"):
                    bad = f"tensor {name} is {t.type_name}, not F32 or F16"
                    break
        if bad:
            raise ModelFileError(g.path, bad, "unsupported")

    def tensor_shapes(self) -> dict[str, tuple[int, ...]]:
        """Every tensor the encoder reads, with its ggml shape (row length first)."""
        d, ff, p = self.n_embd, self.n_ff, self.patch
        shapes = {"v.patch_embd.weight": (p, p, 3, d), "v.patch_embd.bias": (d,),
                  "v.position_embd.weight": (d, self.n_pos_embd),
                  "v.post_ln.weight": (d,), "v.post_ln.bias": (d,)}
        if self.projector == "gemma3":
            shapes.update({"mm.soft_emb_norm.weight": (d,),
                           "mm.input_projection.weight": (self.n_embd_text, d)})
        else:
            m = d * self.merge ** 2
            shapes.update({"v.patch_embd.weight.1": (p, p, 3, d),
                           "mm.0.weight": (m, m), "mm.0.bias": (m,),
                           "mm.2.weight": (m, self.n_embd_text), "mm.2.bias": (self.n_embd_text,)})
        for i in range(self.n_layer):
            b = f"v.blk.{i}."
            attn = ("attn_q", "attn_k", "attn_v") if self.projector == "gemma3" else ()
            for name in attn + ("attn_out",):
                shapes[b + name + ".weight"] = (d, d)
                shapes[b + name + ".bias"] = (d,)
            if self.projector != "gemma3":
                shapes[b + "attn_qkv.weight"], shapes[b + "attn_qkv.bias"] = (d, 3 * d), (3 * d,)
            for name in ("ln1", "ln2"):
                shapes[b + name + ".weight"] = (d,)
                shapes[b + name + ".bias"] = (d,)
            shapes[b + "ffn_up.weight"], shapes[b + "ffn_up.bias"] = (d, ff), (ff,)
            shapes[b + "ffn_down.weight"], shapes[b + "ffn_down.bias"] = (ff, d), (d,)
        return shapes


def smart_size(w: int, h: int, align: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """llama.cpp's img_tool::calc_size_preserved_ratio (Qwen's smart resize), in float32 as
    there: each side rounded to a multiple of align (half away from zero), then scaled down
    (floored) to fit max_pixels or up (ceiled) to reach min_pixels."""
    f32 = np.float32
    f = f32(align)

    def rnd(x):
        return int(np.floor(f32(x) / f + f32(0.5))) * align

    def ceil_(x):
        return int(np.ceil(f32(x) / f)) * align

    def floor_(x):
        return int(np.floor(f32(x) / f)) * align

    w_bar, h_bar = max(align, rnd(f32(w))), max(align, rnd(f32(h)))
    if h_bar * w_bar > max_pixels:
        beta = np.sqrt(f32(f32(f32(h) * f32(w)) / f32(max_pixels)), dtype=np.float32)
        h_bar, w_bar = max(align, floor_(f32(h) / beta)), max(align, floor_(f32(w) / beta))
    elif h_bar * w_bar < min_pixels:
        beta = np.sqrt(f32(f32(min_pixels) / f32(f32(h) * f32(w))), dtype=np.float32)
        h_bar, w_bar = ceil_(f32(h) * beta), ceil_(f32(w) * beta)
    return w_bar, h_bar
