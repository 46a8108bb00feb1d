"""A vision encoder on the device: its weights (from the mmproj file, a few of them reshaped
on the way), the activations of one image (sized for the largest), and a recorded graph per
image geometry that turns an image's patches into its soft tokens. Warm or cold with its
text model: `release` frees every device byte (the weights' host copy stays: the file's own
pages, and the reshaped tensors in RAM), `restore` uploads them again."""
from __future__ import annotations

import dataclasses
from collections import OrderedDict

import numpy as np

from ..formats.gguf_file import GGUFFile, ModelFileError
from ..gpu import vk
from ..gpu.builder import Builder
from ..gpu.graph import Graph
from ..gpu.kernels import KernelCache
from ..gpu.paths import Tuning
from ..gpu.rope import Rope
from ..gpu.tensors import BIND_ALIGN, Tensor
from . import image as images
from . import qwen3vl, siglip
from .config import Geometry, VisionConfig

GRAPHS_KEPT = 4               # image geometries whose graphs are kept
VISION_ROPE_BASE = 10000.0
FORWARD = {"gemma3": siglip.forward, "qwen3vl_merger": qwen3vl.forward}


class VisionState:
    """The activations of one image's pass, as the Builder's ops name them (the step buffer,
    x rounded in xq), sized for the largest image, with the patches in and the soft tokens
    out host-visible; for qwen3vl_merger also the image's position embeddings and its rope
    table, written for each image."""

    positioned = True           # rope_qkv reads the table of this image's patches

    def __init__(self, dev: vk.Device, c: VisionConfig, label: str):
        alloc = dev.allocator.alloc
        n, d, t = c.max_patches, c.n_embd, c.max_image_tokens
        patch_len = c.patch_len

        def act(name: str, floats: int, host: bool = False) -> vk.Buffer:
            return alloc(4 * floats, f"{label}/{name}", "compute", host=host)

        self.n_ctx = n
        self.patches = act("patches", n * patch_len, host=True)
        self.x, self.xn = act("x", n * d), act("xn", n * d)
        self.q, self.k, self.v, self.att = (act(s, n * d) for s in ("q", "k", "v", "att"))
        self.k_cache = alloc(2 * n * d, f"{label}/k_cache", "compute")      # f16
        self.v_cache = alloc(2 * n * d, f"{label}/v_cache", "compute")
        self.ff = act("ff", n * c.ff_len)
        self.xq = act("xq", n * max(patch_len, d, c.ff_len))
        self.out = act("out", t * c.n_embd_text, host=True)
        self.step = alloc(16, f"{label}/step", "compute", host=True)
        if c.projector == "gemma3":
            self.pooled = act("pooled", t * d)
        else:
            self.pos = act("pos", n * d, host=True)                     # [n, d]
            self.rope = act("rope", n * c.head_dim, host=True)          # [n, d_head / 2, 2]
            self.merged = act("merged", n * d)                          # [t, 4 d]
            self.vision_rope = Rope(VISION_ROPE_BASE, c.head_dim)
        self.masks: dict = {}
        self.flash_block = None

    @staticmethod
    def floats(c: VisionConfig) -> int:
        """What the constructor allocates, in floats (f16 pairs counted as one)."""
        n, d, t = c.max_patches, c.n_embd, c.max_image_tokens
        out = n * (c.patch_len + 7 * d + c.ff_len + max(c.patch_len, d, c.ff_len)) + \
            t * c.n_embd_text + 4
        return out + (t * d if c.projector == "gemma3" else n * (2 * d + c.head_dim))

    def rope_table(self, rope: Rope) -> vk.Buffer:
        return self.rope

    def set_image(self, c: VisionConfig, g: Geometry, positions: np.ndarray | None) -> None:
        """This image's step (every patch seeing all of them), and for qwen3vl_merger its
        position embeddings and rope table."""
        self.step.write(np.array([0, g.n_patches, 1, 0], np.uint32))
        if c.projector != "gemma3":
            order = images.block_order(g.gw, g.gh)
            self.pos.write(resampled_positions(positions, g)[order])
            self.rope.write(rope_2d(order // g.gw, order % g.gw, c.head_dim))

    def buffers(self) -> list[vk.Buffer]:
        return [b for b in vars(self).values() if isinstance(b, vk.Buffer)]


def resampled_positions(table: np.ndarray, g: Geometry) -> np.ndarray:
    """The [n*n, d] position table (row r at x = r % n, y = r // n) resampled to the image's
    gh x gw patches, bilinear with aligned corners (ggml_interpolate, as clip's
    resize_position_embeddings), [gh * gw, d] row-major; as it is for an n x n grid."""
    n = int(round(np.sqrt(table.shape[0])))
    if (g.gw, g.gh) == (n, n):
        return np.ascontiguousarray(table, np.float32)
    grid = table.reshape(n, n, -1).astype(np.float64)

    def axis(n_out: int):
        f32 = np.float32
        if n_out > 1 and n > 1:
            sf = f32(n_out - 1) / f32(n - 1)
            src = np.arange(n_out, dtype=f32) / sf
        else:
            src = np.zeros(n_out, f32)
        i0 = np.clip(np.floor(src).astype(np.int64), 0, n - 1)
        i1 = np.clip(i0 + 1, 0, n - 1)
        return i0, i1, np.clip(src.astype(np.float64) - i0, 0.0, 1.0)

    y0, y1, dy = axis(g.gh)
    x0, x1, dx = axis(g.gw)
    dy, dx = dy[:, None, None], dx[None, :, None]
    out = (grid[y0][:, x0] * (1 - dx) * (1 - dy) + grid[y0][:, x1] * dx * (1 - dy)
           + grid[y1][:, x0] * (1 - dx) * dy + grid[y1][:, x1] * dx * dy)
    return np.ascontiguousarray(out.reshape(g.gh * g.gw, -1), np.float32)


def rope_2d(rows: np.ndarray, cols: np.ndarray, head_dim: int) -> np.ndarray:
    """[n, head_dim / 2, (cos, sin)] of the vision rope: pair k < head_dim / 4 turns by the
    patch's row times 10000^(-4k / head_dim), the next head_dim / 4 pairs by its column (the
    pairs are (k, k + head_dim / 2)), as ggml's vision rope with sections of head_dim / 4."""
    f32 = np.float32
    freq = f32(VISION_ROPE_BASE) ** (f32(-4.0 / head_dim) * np.arange(head_dim // 4, dtype=f32))
    ang = np.concatenate([rows[:, None] * freq, cols[:, None] * freq], axis=1)
    ang = ang.astype(np.float64)
    return np.ascontiguousarray(np.stack([np.cos(ang), np.sin(ang)], -1), np.float32)


def _padded(a: np.ndarray, cols: int = 0, rows: int = 0) -> np.ndarray:
    """a (numpy order, rows x row length) with zero columns and rows added up to the sizes."""
    out = np.zeros((max(rows, a.shape[0]), max(cols, a.shape[-1])), a.dtype)
    out[:a.shape[0], :a.shape[-1]] = a.reshape(a.shape[0], -1)
    return out


class HostTensor:
    """A tensor as the graph reads it, on the host: its type, ggml shape and bytes, either
    held (a view of the file, or a small reshaped copy) or made at each upload from the
    file (`make`: the feed-forward's padded products, which would double the RAM kept)."""

    def __init__(self, wtype: str, shape: tuple, data: np.ndarray | None = None,
                 make=None, nbytes: int = 0):
        self.wtype, self.shape, self._data, self._make = wtype, tuple(shape), data, make
        self.nbytes = data.nbytes if data is not None else nbytes

    def data(self) -> np.ndarray:
        if self._data is not None:
            return self._data
        return np.ascontiguousarray(self._make()).reshape(-1).view(np.uint8)

    def held_bytes(self, mapped: np.ndarray) -> int:
        """RAM this holds beyond the file's pages."""
        if self._data is None or np.shares_memory(self._data, mapped):
            return 0
        return self._data.nbytes


def _u8(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a).reshape(-1).view(np.uint8)


def host_weights(g: GGUFFile, c: VisionConfig) -> dict[str, HostTensor]:
    """Each tensor as the graph reads it. The patch kernels as F16 [patch_len, n_embd]
    matrices (ggml's convolution takes f16 from im2col), gemma3's position embedding F32 and
    projection transposed to rows of the encoder's width, qwen3vl_merger's fused q | k | v
    cut in three (views), the feed-forward's products padded to ff_len (made at upload);
    the rest as in the file (memmap views). qwen3vl_merger's position table is not here:
    the host resamples it for each image."""
    out: dict[str, HostTensor] = {}
    d, ff = c.n_embd, c.ff_len
    pad_ff = ff != c.n_ff
    for name, shape in c.tensor_shapes().items():
        t = g.tensor(name)
        if name.startswith("v.patch_embd.weight"):
            a = _padded(g.dequantize(name).reshape(d, -1).astype(np.float16), c.patch_len)
            out[name] = HostTensor("F16", (c.patch_len, d), _u8(a))
        elif name == "v.position_embd.weight":
            if c.projector == "gemma3":
                out[name] = HostTensor("F32", shape, _u8(g.dequantize(name)))
        elif name == "mm.input_projection.weight":
            a = g.dequantize(name)                     # [n_embd, n_embd_text] numpy order
            dtype = np.float16 if t.type_name == "F16" else np.float32
            out[name] = HostTensor(t.type_name, (d, c.n_embd_text),
                                   _u8(np.ascontiguousarray(a.T, dtype)))
        elif name.endswith(("attn_qkv.weight", "attn_qkv.bias")):
            part = t.nbytes // 3                       # q, k and v: a third of the rows each
            for k, which in enumerate(("attn_q", "attn_k", "attn_v")):
                out[name.replace("attn_qkv", which)] = HostTensor(
                    t.type_name, (d,) if len(shape) == 1 else (d, d),
                    t.data[k * part:(k + 1) * part])
        elif pad_ff and name.endswith(("ffn_up.weight", "ffn_up.bias", "ffn_down.weight")):
            if t.type_name not in ("F32", "F16"):
                raise ModelFileError(g.path, f"tensor {name} is {t.type_name} with a feed-"
                                     f"forward of {c.n_ff}, no multiple of 32", "unsupported")
            dtype = np.float16 if t.type_name == "F16" else np.float32

            def make(name=name, dtype=dtype):
                a = g.dequantize(name).astype(dtype)
                return _padded(a.reshape(1, -1), ff) if name.endswith("bias") else \
                    _padded(a, rows=ff) if "ffn_up" in name else _padded(a, ff)
            new = (ff,) if name.endswith("bias") else (d, ff) if "ffn_up" in name else (ff, d)
            count = 1
            for n in new:
                count *= n
            out[name] = HostTensor(t.type_name, new, make=make,
                                   nbytes=count * np.dtype(dtype).itemsize)
        else:
            out[name] = HostTensor(t.type_name, tuple(t.shape), t.data)
    return out


def sizes(g: GGUFFile, c: VisionConfig) -> dict[str, int]:
    """What an encoder of this file holds: "weights" and "activations" (the device bytes
    warm), "host" (RAM kept cold beyond the file's pages). Reads the tensors the host
    reshapes (small beside the layers)."""
    mapped = g.mapped
    host = host_weights(g, c).values()
    weights = sum(-(-t.nbytes // BIND_ALIGN) * BIND_ALIGN for t in host)
    held = sum(t.held_bytes(mapped) for t in host)
    if c.projector != "gemma3":                         # the position table, as f32
        held += 4 * c.n_embd * c.n_pos_embd
    return {"weights": weights, "activations": 4 * VisionState.floats(c), "host": held}


class VisionEncoder:
    """An mmproj file's encoder on `dev`: encode(image) -> (soft tokens [n_tokens,
    n_embd_text] float32, the image's geometry). max_tokens: qwen3vl_merger's budget of
    soft tokens an image (llama.cpp's --image-max-tokens)."""

    def __init__(self, dev: vk.Device, kernels: KernelCache, path: str, tuning: Tuning,
                 label: str = "vision", warm: bool = True, max_tokens: int | None = None):
        self.dev, self.kernels, self.tuning, self.label = dev, kernels, tuning, label
        self.gguf = GGUFFile(path)
        self.path = path
        self.config = VisionConfig.from_gguf(self.gguf, max_tokens)
        self.host = host_weights(self.gguf, self.config)
        # qwen3vl_merger: the position table, resampled to each image's grid
        self.positions = None if self.config.projector == "gemma3" else \
            np.ascontiguousarray(self.gguf.dequantize("v.position_embd.weight"), np.float32)
        self.arena: vk.Buffer | None = None
        self.state: VisionState | None = None
        self.weights: dict[str, Tensor] = {}
        self.graphs: OrderedDict[Geometry, Graph] = OrderedDict()
        self.encoded = 0                       # images encoded so far
        if warm:
            self.restore()

    @property
    def warm(self) -> bool:
        return self.state is not None

    def weight_bytes(self) -> int:
        return sum(-(-t.nbytes // BIND_ALIGN) * BIND_ALIGN for t in self.host.values())

    def warm_bytes(self) -> int:
        """Device bytes when warm: the weights and the largest image's activations."""
        return self.weight_bytes() + 4 * VisionState.floats(self.config)

    def device_bytes(self) -> int:
        """Device bytes held now: weights, activations (0 when released)."""
        if not self.warm:
            return 0
        return self.arena.nbytes + sum(b.nbytes for b in self.state.buffers())

    def host_bytes(self) -> int:
        """RAM the cold copy takes beyond the file's pages (the reshaped tensors)."""
        mapped = self.gguf.mapped
        extra = self.positions.nbytes if self.positions is not None else 0
        return extra + sum(t.held_bytes(mapped) for t in self.host.values())

    def restore(self) -> None:
        """Weights onto the device, the activations allocated (graphs: on first use)."""
        if self.warm:
            return
        try:
            self.arena = self.dev.allocator.alloc(self.weight_bytes(), f"{self.label}/weights",
                                                  "weights")
            at = 0
            with vk.Uploader(self.dev) as up:
                for name, t in self.host.items():
                    up.write(self.arena, t.data(), at)
                    rows = 1
                    for s in t.shape[1:]:
                        rows *= s
                    self.weights[name] = Tensor(t.wtype, t.shape, [(0, rows, 0, at, t.nbytes)],
                                                [self.arena])
                    at += -(-t.nbytes // BIND_ALIGN) * BIND_ALIGN
            self.state = VisionState(self.dev, self.config, self.label)
        except BaseException:
            self.release()
            raise

    def _graph(self, g: Geometry) -> Graph:
        if g in self.graphs:
            self.graphs.move_to_end(g)
            return self.graphs[g]
        paths = self.tuning.paths(self.config.head_dim)
        if paths.prefill_attention == "flash_attn":      # no mask here: every patch sees all
            paths = dataclasses.replace(paths, prefill_attention="attention")
        graph = Graph(self.dev, self.kernels, f"{self.label}/encode{g.gw}x{g.gh}")
        FORWARD[self.config.projector](Builder(graph, self.weights, self.state, self.tuning,
                                               paths), self.config, self.state, g)
        self.graphs[g] = graph.finish()
        if len(self.graphs) > GRAPHS_KEPT:
            self.graphs.popitem(last=False)[1].close()
        return self.graphs[g]

    def release(self) -> None:
        """Every device byte freed (the host copies stay)."""
        for graph in self.graphs.values():
            graph.close()
        self.graphs.clear()
        if self.state is not None:
            for b in self.state.buffers():
                self.dev.allocator.free(b)
            self.state = None
        if self.arena is not None:
            self.dev.allocator.free(self.arena)
            self.arena = None
        self.weights = {}

    def geometry(self, image: images.Image) -> Geometry:
        return self.config.geometry(image.rgb.shape[1], image.rgb.shape[0])

    def encode(self, image: images.Image) -> tuple[np.ndarray, Geometry]:
        """The image's soft tokens [n_tokens, n_embd_text] float32 and its geometry."""
        if not self.warm:
            raise RuntimeError(f"{self.label} is cold: restore it before encoding")
        c, g = self.config, self.geometry(image)
        graph = self._graph(g)
        self.state.patches.write(images.patches(image, c, g))
        self.state.set_image(c, g, self.positions)
        graph.replay()
        self.encoded += 1
        rows = self.state.out.read(np.float32, g.n_tokens * c.n_embd_text)
        return rows.reshape(g.n_tokens, c.n_embd_text), g

    def close(self) -> None:
        self.release()
        self.host = {}
        self.gguf.close()
