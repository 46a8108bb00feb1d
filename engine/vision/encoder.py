"""A vision encoder on the device: its weights (from the mmproj file, a few of them reshaped
on the way), the activations of one image, and one recorded graph that turns an image's
patches into its soft tokens. Warm or cold with its text model: `release` frees every
device byte (the weights' host copy stays: the file's own pages, and the reshaped tensors
in RAM), `restore` uploads them again and records the graph anew."""
from __future__ import annotations

import dataclasses

import numpy as np

from ..formats.gguf_file import GGUFFile, ModelFileError
from ..gpu import vk
from ..gpu.builder import Builder
from ..gpu.graph import Graph
from ..gpu.kernels import KernelCache
from ..gpu.paths import Tuning
from ..gpu.tensors import BIND_ALIGN, Tensor
from . import image as images
from . import siglip
from .config import VisionConfig


class VisionState:
    """The activations of one image's pass, as the Builder's ops name them (the step buffer,
    x rounded in xq), with the patches in and the soft tokens out host-visible."""

    def __init__(self, dev: vk.Device, c: VisionConfig, label: str):
        alloc = dev.allocator.alloc
        n, d, t = c.n_patches, c.n_embd, c.n_tokens
        patch_len = c.patch_len

        def act(name: str, floats: int) -> vk.Buffer:
            return alloc(4 * floats, f"{label}/{name}", "compute")

        self.n_ctx = n
        self.patches = alloc(4 * n * patch_len, f"{label}/patches", "compute", host=True)
        self.x, self.xn = act("x", n * d), act("xn", n * d)
        self.q, self.k, self.v, self.att = (act(s, n * d) for s in ("q", "k", "v", "att"))
        self.k_cache = alloc(2 * n * d, f"{label}/k_cache", "compute")      # f16
        self.v_cache = alloc(2 * n * d, f"{label}/v_cache", "compute")
        self.ff = act("ff", n * c.ff_len)
        self.xq = act("xq", n * max(patch_len, d, c.ff_len))
        self.pooled = act("pooled", t * d)
        self.out = alloc(4 * t * c.n_embd_text, f"{label}/out", "compute", host=True)
        self.step = alloc(16, f"{label}/step", "compute", host=True)
        # one pass over every patch, each seeing all of them (pos0 0, n_past n, bidir)
        self.step.write(np.array([0, n, 1, 0], np.uint32))
        self.masks: dict = {}
        self.flash_block = None

    def buffers(self) -> list[vk.Buffer]:
        return [b for b in vars(self).values() if isinstance(b, vk.Buffer)]


def _padded(a: np.ndarray, cols: int = 0, rows: int = 0) -> np.ndarray:
    """a (numpy order, rows x row length) with zero columns and rows added up to the sizes."""
    out = np.zeros((max(rows, a.shape[0]), max(cols, a.shape[-1])), a.dtype)
    out[:a.shape[0], :a.shape[-1]] = a.reshape(a.shape[0], -1)
    return out


def host_weights(g: GGUFFile, c: VisionConfig) -> dict[str, tuple[str, tuple, np.ndarray]]:
    """Each tensor as the graph reads it: (type, ggml shape, bytes). The patch kernel as an
    F16 [patch_len, n_embd] matrix (ggml's convolution takes f16 from im2col), the position
    embedding F32, the projection transposed to rows of the encoder's width, the feed-
    forward's products padded to ff_len; the rest as in the file (memmap views)."""
    out = {}
    d, ff = c.n_embd, c.ff_len
    pad_ff = ff != c.n_ff
    for name, shape in c.tensor_shapes().items():
        t = g.tensor(name)
        if name == "v.patch_embd.weight":
            a = _padded(g.dequantize(name).reshape(d, -1).astype(np.float16), c.patch_len)
            out[name] = ("F16", (c.patch_len, d), a)
        elif name == "v.position_embd.weight":
            out[name] = ("F32", shape, g.dequantize(name))
        elif name == "mm.input_projection.weight":
            a = g.dequantize(name)                     # [n_embd, n_embd_text] numpy order
            dtype = np.float16 if t.type_name == "F16" else np.float32
            out[name] = (t.type_name, (d, c.n_embd_text), np.ascontiguousarray(a.T, dtype))
        elif pad_ff and name.endswith(("ffn_up.weight", "ffn_up.bias", "ffn_down.weight")):
            if t.type_name not in ("F32", "F16"):
                raise ModelFileError(g.path, f"tensor {name} is {t.type_name} with a feed-"
                                     f"forward of {c.n_ff}, no multiple of 32", "unsupported")
            dtype = np.float16 if t.type_name == "F16" else np.float32
            a = g.dequantize(name).astype(dtype)
            a = _padded(a.reshape(1, -1), ff) if name.endswith("bias") else \
                _padded(a, rows=ff) if "ffn_up" in name else _padded(a, ff)
            new = (ff,) if name.endswith("bias") else (d, ff) if "ffn_up" in name else (ff, d)
            out[name] = (t.type_name, new, a)
        else:
            out[name] = (t.type_name, tuple(t.shape), t.data)
    return {k: (wt, sh, np.ascontiguousarray(a).reshape(-1).view(np.uint8))
            for k, (wt, sh, a) in out.items()}


def sizes(g: GGUFFile, c: VisionConfig) -> dict[str, int]:
    """What an encoder of this file holds, without reading its tensors: "weights" and
    "activations" (the device bytes warm), "host" (RAM kept cold beyond the file's pages)."""
    def aligned(n: int) -> int:
        return -(-n // BIND_ALIGN) * BIND_ALIGN

    weights = host = 0
    for name in c.tensor_shapes():
        t = g.tensor(name)
        n = t.nbytes
        if name == "v.patch_embd.weight":
            n = 2 * c.patch_len * c.n_embd
        elif name == "v.position_embd.weight":
            n = 4 * c.n_embd * c.n_patches
            if t.type_name == "F32":                   # read in place
                weights += aligned(n)
                continue
        elif name.endswith(("ffn_up.weight", "ffn_up.bias", "ffn_down.weight")) \
                and c.ff_len != c.n_ff:
            n = n // c.n_ff * c.ff_len
        elif name != "mm.input_projection.weight":
            weights += aligned(n)
            continue
        weights += aligned(n)
        host += n
    n, d = c.n_patches, c.n_embd
    floats = n * (c.patch_len + 6 * d + d + c.ff_len + max(c.patch_len, d, c.ff_len)) + \
        c.n_tokens * (d + c.n_embd_text)
    return {"weights": weights, "activations": 4 * floats + 16, "host": host}


class VisionEncoder:
    """An mmproj file's encoder on `dev`: encode(image) -> soft tokens [n_tokens,
    n_embd_text] float32."""

    def __init__(self, dev: vk.Device, kernels: KernelCache, path: str, tuning: Tuning,
                 label: str = "vision", warm: bool = True):
        self.dev, self.kernels, self.tuning, self.label = dev, kernels, tuning, label
        self.gguf = GGUFFile(path)
        self.path = path
        self.config = VisionConfig.from_gguf(self.gguf)
        self.host = host_weights(self.gguf, self.config)
        self.arena: vk.Buffer | None = None
        self.state: VisionState | None = None
        self.graph: Graph | None = None
        self.encoded = 0                       # images encoded so far
        if warm:
            self.restore()

    @property
    def warm(self) -> bool:
        return self.graph is not None

    def weight_bytes(self) -> int:
        return sum(-(-len(b) // BIND_ALIGN) * BIND_ALIGN for _, _, b in self.host.values())

    def warm_bytes(self) -> int:
        """Device bytes when warm: the weights and one image's activations."""
        return self.weight_bytes() + sizes(self.gguf, self.config)["activations"]

    def device_bytes(self) -> int:
        """Device bytes held now: weights, activations (0 when released)."""
        if not self.warm:
            return 0
        return self.arena.nbytes + sum(b.nbytes for b in self.state.buffers())

    def host_bytes(self) -> int:
        """RAM the cold copy takes beyond the file's pages (the reshaped tensors)."""
        return sum(b.nbytes for b in self._copies())

    def _copies(self) -> list[np.ndarray]:
        """The host tensors that are not views of the file."""
        mapped = self.gguf.mapped
        return [b for _, _, b in self.host.values() if not np.shares_memory(b, mapped)]

    def restore(self) -> None:
        """Weights onto the device, the activations allocated, the graph recorded."""
        if self.warm:
            return
        c = self.config
        try:
            self.arena = self.dev.allocator.alloc(self.weight_bytes(), f"{self.label}/weights",
                                                  "weights")
            weights, at = {}, 0
            with vk.Uploader(self.dev) as up:
                for name, (wtype, shape, data) in self.host.items():
                    up.write(self.arena, data, at)
                    rows = 1
                    for s in shape[1:]:
                        rows *= s
                    weights[name] = Tensor(wtype, shape, [(0, rows, 0, at, len(data))],
                                           [self.arena])
                    at += -(-len(data) // BIND_ALIGN) * BIND_ALIGN
            self.state = VisionState(self.dev, c, self.label)
            self.graph = self._record(weights)
        except BaseException:
            self.release()
            raise

    def _record(self, weights: dict[str, Tensor]) -> Graph:
        paths = self.tuning.paths(self.config.head_dim)
        if paths.prefill_attention == "flash_attn":      # no mask here: every patch sees all
            paths = dataclasses.replace(paths, prefill_attention="attention")
        g = Graph(self.dev, self.kernels, f"{self.label}/encode")
        siglip.forward(Builder(g, weights, self.state, self.tuning, paths), self.config,
                       self.state)
        return g.finish()

    def release(self) -> None:
        """Every device byte freed (the host copies stay)."""
        if self.graph is not None:
            self.graph.close()
            self.graph = None
        if self.state is not None:
            for b in self.state.buffers():
                self.dev.allocator.free(b)
            self.state = None
        if self.arena is not None:
            self.dev.allocator.free(self.arena)
            self.arena = None

    def encode(self, image: images.Image) -> np.ndarray:
        """The image's soft tokens [n_tokens, n_embd_text] float32."""
        if not self.warm:
            raise RuntimeError(f"{self.label} is cold: restore it before encoding")
        c = self.config
        self.state.patches.write(images.patches(image, c))
        self.graph.replay()
        return self.state.out.read(np.float32, c.n_tokens * c.n_embd_text).reshape(
            c.n_tokens, c.n_embd_text)

    def close(self) -> None:
        self.release()
        self.host = {}
        self.gguf.close()
