"""An mmproj file's vision encoder, as llama.cpp's clip reader takes it (tools/mtmd): the
keys and tensor names of `clip.*` GGUF files. Gemma 3's projector ("gemma3") for now: a
SigLIP ViT over a fixed square image, average-pooled to a square grid of soft tokens, RMS-
normed and projected into the text model's width."""
from __future__ import annotations

from dataclasses import dataclass

from ..formats.gguf_file import GGUFFile, ModelFileError

PROJECTORS = ("gemma3",)
DEFAULT_MERGE = 4            # clip.cpp's pooling kernel for gemma3 when the file names none


@dataclass(frozen=True)
class VisionConfig:
    projector: str
    image_size: int            # pixels a side of the encoder's square input
    patch: int                 # pixels a side of a patch
    n_embd: int                # the encoder's width
    n_ff: int
    n_layer: int
    n_head: int
    eps: float                 # every LayerNorm's, and the projector's RMS norm's
    mean: tuple[float, float, float]
    std: tuple[float, float, float]
    merge: int                 # patches a side of one soft token (average-pooled)
    n_embd_text: int           # the width the projector gives: the text model's

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    @property
    def side(self) -> int:
        """Patches a side of the image."""
        return self.image_size // self.patch

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
    def n_patches(self) -> int:
        return self.side ** 2

    @property
    def n_tokens(self) -> int:
        """Soft tokens an image takes in the text model's prompt."""
        return (self.side // self.merge) ** 2

    @classmethod
    def from_gguf(cls, g: GGUFFile) -> "VisionConfig":
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
        proj_w = g.tensor("mm.input_projection.weight")
        c = cls(projector=proj, image_size=int(g.require(v + "image_size")),
                patch=int(g.require(v + "patch_size")),
                n_embd=int(g.require(v + "embedding_length")),
                n_ff=int(g.require(v + "feed_forward_length")),
                n_layer=int(g.require(v + "block_count")),
                n_head=int(g.require(v + "attention.head_count")),
                eps=float(g.require(v + "attention.layer_norm_epsilon")),
                mean=tuple(float(x) for x in mean[:3]), std=tuple(float(x) for x in std[:3]),
                merge=int(g.get(v + "projector.scale_factor", DEFAULT_MERGE)),
                n_embd_text=int(proj_w.shape[0]))
        c.validate(g)
        return c

    def validate(self, g: GGUFFile) -> None:
        """One ModelFileError naming what this encoder cannot run."""
        bad = None
        if self.image_size % self.patch or self.side % self.merge:
            bad = (f"image size {self.image_size} is not whole patches of {self.patch} "
                   f"pooled by {self.merge}")
        elif self.n_embd % self.n_head or self.head_dim % 4:
            bad = f"width {self.n_embd} over {self.n_head} heads"
        if bad is None:
            for name, shape in self.tensor_shapes().items():
                t = g.tensor(name)
                if tuple(t.shape) != shape:
                    bad = f"tensor {name} has shape {list(t.shape)}, not {list(shape)}"
                    break
                if len(shape) == 1 and t.type_name != "F32":
                    bad = f"tensor {name} is {t.type_name}, not F32"
                    break
                if name.startswith(("mm.", "v.patch_embd", "v.position")) and \
                        t.type_name not in ("F32", "F16"):
                    bad = f"tensor {name} is {t.type_name}, not F32 or F16"
                    break
        if bad:
            raise ModelFileError(g.path, bad, "unsupported")

    def tensor_shapes(self) -> dict[str, tuple[int, ...]]:
        """Every tensor the encoder reads, with its ggml shape (row length first)."""
        d, ff, p = self.n_embd, self.n_ff, self.patch
        shapes = {"v.patch_embd.weight": (p, p, 3, d), "v.patch_embd.bias": (d,),
                  "v.position_embd.weight": (d, self.n_patches),
                  "v.post_ln.weight": (d,), "v.post_ln.bias": (d,),
                  "mm.soft_emb_norm.weight": (d,),
                  "mm.input_projection.weight": (self.n_embd_text, d)}
        for i in range(self.n_layer):
            b = f"v.blk.{i}."
            for name in ("attn_q", "attn_k", "attn_v", "attn_out"):
                shapes[b + name + ".weight"] = (d, d)
                shapes[b + name + ".bias"] = (d,)
            for name in ("ln1", "ln2"):
                shapes[b + name + ".weight"] = (d,)
                shapes[b + name + ".bias"] = (d,)
            shapes[b + "ffn_up.weight"], shapes[b + "ffn_up.bias"] = (d, ff), (ff,)
            shapes[b + "ffn_down.weight"], shapes[b + "ffn_down.bias"] = (ff, d), (d,)
        return shapes
