"""A loaded model and its warm/cold states: weights on the device or in host shadows, its
KV cache and recurrent states, its recorded graphs, and one forward pass (`eval`).

Decode is one recorded command buffer replayed per token: the host writes the token id and
position into small host-visible buffers, submits once, and reads back either the argmax
(greedy) or the logits (sampling). Prefill runs the prompt in chunks of up to
`max_tokens`; its graphs are recorded per chunk length and kept for reuse. The token loop
over it is engine/residency/loop.py; where its weights sit, placement.py.

Why this module is long: every method reads or changes the one device state a Model owns
(its buffers, graphs, shadows and checkpoint), and release/restore must see all of it; the
passes (eval, run, and hidden for embeddings) are kept beside the state they record graphs
over, so that dropping the graphs on a release is visibly complete.
"""
from __future__ import annotations

import os
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable

import numpy as np

from shaders.registry import WEIGHT_TYPES

from .. import arch as architectures
from ..formats.gguf_file import GGUFFile, ModelFileError
from ..gpu import vk
from ..gpu.builder import Builder
from ..gpu.graph import Graph
from ..gpu.kernels import KernelCache
from ..gpu.paths import Paths, Tuning, flash_attn_mode
from ..gpu.rope import rope_table
from ..gpu.runstate import LOGPROB_WORDS, TOP_LOGPROBS, RunState, run_state_args
from ..gpu.tensors import Tensor
from ..vision.config import Geometry
from ..vision.encoder import VisionEncoder
from ..vision.positions import Positions
from . import placement, promptcache
from .placement import PlacementError  # noqa: F401  (raised by Model())

PREFILL_CHUNK = 256           # most prompt tokens a prefill pass takes (where no matrix units)
CHUNK_TARGET_S = 0.5          # a prefill pass (one submit) takes about this long at most
PROBE_CHUNK = 4               # the first pass of a model whose speed is not known yet
PREFILL_GRAPHS_KEPT = 8
# a recurrent model's prompt cache keeps a checkpoint of its states this many tokens before
# the end of each prompt (llama.cpp's server does: a new request whose prompt only shares the
# start of the last one, or repeats it, resumes from there; see loop.generate)
CHECKPOINT_BACK = 4


def default_flash_attn() -> str:
    """$HOTSEAT_FLASH_ATTN (auto, on or off) or "auto": what a model takes when not told."""
    mode = os.environ.get("HOTSEAT_FLASH_ATTN") or "auto"
    try:
        return flash_attn_mode(mode)
    except ValueError as exc:
        raise ValueError(f"HOTSEAT_FLASH_ATTN: {exc}") from None


def weight_layout(g: GGUFFile, cfg, on_host: frozenset[str], storage_align: int,
                  max_storage_range: int) -> placement.Layout:
    """How a model's weights are packed into arenas on a device with these limits (Model
    uploads this layout; `hotseat check` sums it before any load)."""
    return placement.plan_layout(g, cfg.tensor_shapes(), on_host, max(storage_align, 256),
                                 max_storage_range)


def run_state_sizes(cfg, n_ctx: int, tuning: Tuning) -> dict:
    """RunState's sizes for a model of config `cfg` at n_ctx on a device of this tuning:
    what a warm Model allocates and warm_bytes() counts (`hotseat check` reads them too)."""
    chunk = tuning.prefill_tokens or PREFILL_CHUNK
    block = tuning.flash_block(cfg.head_dim) \
        if tuning.use_flash_attn(cfg.head_dim, chunk) else None
    return run_state_args(cfg, n_ctx, chunk, cfg.rope_tables(), cfg.attn_windows(),
                          block)


def _check_tensors(g: GGUFFile, cfg) -> None:
    only = cfg.tensor_types()
    for name, shape in cfg.tensor_shapes().items():
        t = g.tensor(name)                      # raises "missing tensor"
        if t.shape != shape:
            raise ModelFileError(g.path, f"tensor {name} has shape {list(t.shape)}, "
                                         f"expected {list(shape)}")
        if t.type_name not in WEIGHT_TYPES:
            raise ModelFileError(g.path, f"tensor {name} has type {t.type_name}, which this "
                                         f"engine does not run (supported: "
                                         f"{', '.join(WEIGHT_TYPES)})")
        if name in only and t.type_name not in only[name]:
            raise ModelFileError(g.path, f"tensor {name} has type {t.type_name}, expected "
                                         f"{' or '.join(only[name])}")


class Model:
    def __init__(self, dev: vk.Device, kernels: KernelCache, path: str, n_ctx: int = 2048,
                 progress: Callable[[int, int], None] | None = None, name: str | None = None,
                 warm: bool = True, cpu_moe: float = 0.0, flash_attn: str | None = None):
        self.dev, self.kernels = dev, kernels
        self.gguf = GGUFFile(path)
        self.path = path
        self.arch = architectures.for_file(self.gguf)
        self.config = self.arch.Config.from_gguf(self.gguf)
        self.config.validate(path)
        _check_tensors(self.gguf, self.config)
        self.tuning = Tuning.for_device(dev, flash_attn or default_flash_attn())
        if not 16 <= n_ctx <= self.tuning.max_ctx:
            self.gguf.close()
            raise ValueError(f"context size {n_ctx} out of range (16 to "
                             f"{self.tuning.max_ctx} on {dev.name})")
        self.n_ctx = n_ctx
        self.config = self.config.at_context(n_ctx)      # phi3's LongRoPE: by context size
        self.name = name or path.rsplit("/", 1)[-1]
        # recurrent layers (lfm2's short convolutions, gated delta nets): states that a run
        # carries forward and cannot rewind
        self.recurrent = RunState.recurrent_bytes(**self._run_state_args()) > 0
        self.profile = False                    # record graphs with per-op timestamps
        try:
            # read by the GPU from host memory
            experts = self.config.expert_tensors
            self.host_tensors = placement.host_tensors(
                cpu_moe, self.config.n_layer, experts if experts(0) else None,
                f"{self.name} ({self.gguf.arch})")
        except PlacementError:
            self.gguf.close()
            raise
        self.cpu_moe = float(cpu_moe)
        # where each tensor sits in the weight arenas
        self._layout = weight_layout(self.gguf, self.config, self.host_tensors,
                                     dev.storage_align, dev.max_storage_range)
        self.arenas: list[vk.Buffer] = []       # device weights while they are resident
        self.shadow: list[vk.Buffer] = []       # host-visible copy of what is not pinned
        self.pinned: vk.HostImport | None = None  # the file's pages, imported (discrete GPUs)
        self._sources = None                    # per arena: where a restore copies from
        self._graph_keys: tuple[list, list] = ([], [])  # graphs held before the release
        self.host_arenas: list[vk.Buffer] = []  # host-placed weights, from first restore to close
        self.weights: dict[str, Tensor] = {}   # while resident: self._tensors
        self._tensors: dict[str, Tensor] = {}
        self.rs: RunState | None = None        # activations and KV cache while resident
        # while fully evicted: (host-visible buffer or None, used bytes per layer, layer keys)
        self.kv_shadow: tuple[vk.Buffer | None, int, list[str]] | None = None
        # the KV shadow moved to a file (promptcache's) under the host budget: read back at
        # the next restore
        self.kv_on_disk: str | None = None
        # the recurrent states and their checkpoint moved to a file (an .npz) the same way
        self.recurrent_on_disk: str | None = None
        # the recurrent states (RunState.recurrent_states: conv and delta-rule states by key),
        # captured at every release (they are read-write, so the device copy is not a cache
        # of anything) and written back on restore
        self.recurrent_shadow: dict[str, np.ndarray] | None = None
        self._decode: dict[bool, Graph] = {}
        self._prefill: OrderedDict[int, Graph] = OrderedDict()
        # hidden-state passes (embeddings), per length, the latest used last
        self._hidden: OrderedDict[int, Graph] = OrderedDict()
        self.hidden_passes = 0                 # hidden-state passes run (embeddings)
        self._hidden_out: vk.Buffer | None = None   # what they read back: [chunk, n_embd]
        self.cache_tokens: list[int] = []       # tokens whose K/V sit at positions 0..len-1;
                                                # recurrent states belong to the end of them
                                                # (an image's soft tokens as its media id)
        # how many of cache_tokens' first tokens prompt passes computed: where a decode
        # step rounds otherwise (Paths.steps_match_prompts) a later prompt reuses only
        # these (reusable)
        self.prompt_upto = 0
        self.media: dict[int, Media] = {}      # media id -> soft tokens, of the request
        # M-RoPE (a model whose rope turns pairs by position components, with images): the
        # positions of its slots, and its rope table written for each pass
        self.positions: Positions | None = None
        self.vision: VisionEncoder | None = None   # an mmproj's encoder: warm and cold with
                                                   # the model (attach_vision)
        # recurrent models: (tokens, host copy of the states after them), an earlier point
        # of cache_tokens that a prompt may resume from (save_checkpoint)
        self.checkpoint: tuple[list[int], dict[str, np.ndarray]] | None = None
        self.last_transfer = {"op": None, "seconds": 0.0, "bytes": 0}
        self.faults = 0                         # device faults this model was reset after
        self._last_pass: tuple[int, float] | None = None   # (tokens, seconds) of the last
                                                              # prefill pass
        if warm:
            try:
                self.restore(progress)
            except BaseException:
                self.close()
                raise

    # -- residency ----------------------------------------------------------------------------
    @property
    def state(self) -> str:
        """warm: everything on the device; cold: weights released (KV kept or shadowed)."""
        return "warm" if self.arenas and self.rs is not None else "cold"

    @property
    def weight_bytes(self) -> int:
        """Device bytes of the weights (the host-placed ones excluded)."""
        return sum(self._layout[1])

    @property
    def host_weight_bytes(self) -> int:
        """Bytes of the weights cpu_moe keeps in host-visible memory (no VRAM)."""
        return sum(self._layout[2])

    def warm_bytes(self) -> int:
        """Device bytes this model holds when warm (what the arbiter must grant)."""
        args = self._run_state_args()
        vision = self.vision.warm_bytes() + 4 * args["max_tokens"] * self.config.n_embd \
            if self.vision is not None else 0          # the encoder, and a pass's image rows
        return self.weight_bytes + RunState.bytes_for(**args) + vision

    def attach_vision(self, path: str, max_tokens: int | None = None) -> None:
        """An mmproj file's encoder for this model's images, whose soft tokens must have
        this model's width; made warm now if the model is. max_tokens: an image's most soft
        tokens, where the projector sizes images (qwen3vl_merger; llama.cpp's 4096)."""
        enc = VisionEncoder(self.dev, self.kernels, path, self.tuning,
                            label=f"{self.name}/vision", warm=False, max_tokens=max_tokens)
        if enc.config.n_embd_text != self.config.n_embd:
            enc.close()
            raise ModelFileError(path, f"the projector gives rows of {enc.config.n_embd_text}; "
                                 f"{self.name} takes {self.config.n_embd}", "unsupported")
        if enc.config.bidirectional and enc.config.max_image_tokens > self.chunk:
            enc.close()                        # its soft tokens go in one pass
            raise ModelFileError(path, f"an image of {enc.config.max_image_tokens} soft "
                                 f"tokens does not fit a pass of {self.chunk}", "unsupported")
        self.vision = enc
        components = getattr(self.config, "rope_components", None)
        if components is not None and enc.config.projector == "qwen3vl_merger":
            self.positions = Positions(self.n_ctx, components())
            self._drop_graphs()                # from now on they read a written table
            if self.rs is not None:
                self.rs.set_positioned()
        if self.state == "warm":
            enc.restore()

    @property
    def uses_flash_attn(self) -> bool:
        """Whether prefill runs tiled (flash) attention on this device, for this model."""
        return self.tuning.use_flash_attn(self.config.head_dim, self.chunk)

    def set_flash_attn(self, mode: str) -> bool:
        """Prefill attention "auto", "on" or "off" from now on. True when that changes what
        this model runs (its run state holds the masks only when it runs flash attention):
        the caller must then release it fully (KV kept on the host) before its next use, so
        that it restores with them; its graphs are dropped now."""
        before = self.uses_flash_attn
        self.tuning.flash_attn = flash_attn_mode(mode)
        if self.uses_flash_attn == before:
            return False
        self._drop_graphs()
        return True

    @property
    def paths(self) -> Paths:
        """The kernels this model's graphs take on its device."""
        return self.tuning.paths(self.config.head_dim)

    @property
    def chunk(self) -> int:
        """Prompt tokens per prefill pass: more where matrix units want wide tiles."""
        return self.tuning.prefill_tokens or PREFILL_CHUNK

    def _run_state_args(self) -> dict:
        return run_state_sizes(self.config, self.n_ctx, self.tuning)

    def restore(self, progress: Callable[[int, int], None] | None = None) -> dict:
        """Make the model warm: weights from the GGUF memmap, KV from its host shadow.

        On a device that copies, the weight copies run while the host goes on: each arena
        is copied as soon as it is allocated (so the next one is allocated meanwhile), and
        while the last copies run the KV cache and compute buffers are made and the graphs
        the model had before its release are recorded again, so that the first token after
        a swap finds them ready. Timing: alloc_s (arenas allocated and their copies sent),
        state_s (KV and compute buffers), record_s (graphs), wait_s (the copies' tail)."""
        t0 = time.perf_counter()
        moved = 0
        stream = None
        uploaded = not self.arenas
        made_rs = False
        try:
            if uploaded:
                n, stream = self._upload(progress)
                moved += n
            t1 = time.perf_counter()
            made_rs = self.rs is None
            if made_rs and self.kv_on_disk is not None:
                self._read_spilled()
            if self.recurrent_on_disk is not None:
                self._read_spilled_states()
            if made_rs:
                self.rs = RunState(self.dev, self.name, **self._run_state_args(),
                                   positioned=self.positions is not None)
                if self.kv_shadow is not None:
                    # its own submit (it waits for the weights' copies before it): in their
                    # stream, graph recording started earlier and overran the copy (H200:
                    # 8B restore between processes 94 -> 113 ms)
                    moved += self._restore_kv()
            if self.recurrent_shadow is not None:
                moved += self.rs.restore_recurrent(self.recurrent_shadow)
                self.recurrent_shadow = None
            t2 = time.perf_counter()
            if stream is not None:
                self._record_again(stream)
            t3 = time.perf_counter()
            if stream is not None:
                stream.wait()
            if self.vision is not None:
                self.vision.restore()
                self.rs.embd_input()           # counted with the encoder: made with it
        except BaseException:
            if stream is not None:
                stream.close()
            if made_rs and self.rs is not None and self.kv_shadow is not None:
                self.rs.close()                # its KV never arrived: the shadow still holds it
                self.rs = None
            if uploaded:                       # half made: nothing of it is usable
                self._drop_graphs()
                self._free_arenas()
            raise
        t4 = time.perf_counter()
        self.last_transfer = {"op": "restore", "seconds": t4 - t0, "bytes": moved,
                              "weights_s": (t1 - t0) + (t4 - t3), "state_s": t2 - t1,
                              "record_s": t3 - t2, "wait_s": t4 - t3}
        if uploaded:
            self.last_transfer.update(self.upload_timing)      # alloc_s, copy_s
        return self.last_transfer

    def _record_again(self, stream: vk.CopyStream) -> None:
        """While the weight copies run: record the graphs the model had before its release
        (decode first, then prefill, most recent first) until the copies are done; the
        rest are recorded when first used, as always, so the restore never waits on them."""
        decode, prefill = self._graph_keys
        self._graph_keys = ([], [])
        keys = [(1, g, lp, False, False) for g, lp in decode] + \
            [(*key, True) for key in reversed(prefill)]
        for n, greedy, logprobs, embd, prompt in keys:
            if stream.done():
                break
            self._graph(n, greedy, logprobs, embd, prompt)

    def release(self, full: bool = True, discard: bool = False) -> dict:
        """Go cold. Weights-only keeps KV and compute buffers on the device (fastest switch
        back); full eviction copies the used KV to host memory and frees everything on the
        device. Both copy the recurrent states to host memory. Host-placed weights stay where
        they are either way: they hold no VRAM, and keeping them spares the restore their
        copy (close() frees them).

        discard: the device's contents cannot be trusted (a Vulkan error hit work on it):
        free everything on the device and copy nothing back. What only the device held (the
        KV cache and recurrent states of a warm model) is lost, so the prompt cache is
        emptied; host shadows stay as they were, and the next restore starts from them."""
        if discard:
            return self._discard()
        t0 = time.perf_counter()
        moved = 0
        self._graph_keys = (list(self._decode), list(self._prefill))
        self._drop_graphs()
        if self.vision is not None:            # its weights and activations: all of it
            self.vision.release()
        copies = self.rs.capture_recurrent() if self.rs is not None else {}
        if copies:
            self.recurrent_shadow = copies
            moved += sum(c.nbytes for c in copies.values())
        self._free_arenas()
        if full and self.rs is not None:
            moved += self._shadow_kv()
            self.rs.close()
            self.rs = None
        self.last_transfer = {"op": "release", "seconds": time.perf_counter() - t0,
                              "bytes": moved}
        return self.last_transfer

    def _free_arenas(self) -> None:
        for b in self.arenas:
            self.dev.allocator.free(b)
        self.arenas.clear()                     # the same list: the Tensors refer to it
        self.weights = {}

    def _discard(self) -> dict:
        self._drop_graphs()
        if self.vision is not None:
            self.vision.release()
        self._free_arenas()
        if self.rs is not None:
            self.rs.close()
            self.rs = None
            if self.kv_shadow is None:          # the device held the only copy
                self.cache_tokens = []
                self.recurrent_shadow = None
        self.faults += 1
        self.last_transfer = {"op": "discard", "seconds": 0.0, "bytes": 0}
        return self.last_transfer

    def _shadow_kv(self) -> int:
        """Copy the used KV rows into one host-visible buffer (one submit); bytes moved."""
        used = len(self.cache_tokens) * self.rs.kv_row_bytes
        pairs = self._kv_buffers()
        if not used:
            self.kv_shadow = (None, used, [layer for layer, _ in pairs])
            return 0
        host = self.dev.allocator.alloc(used * len(pairs), f"{self.name}/kv_shadow", "shadow",
                                        host=True)
        with self.dev.one_shot() as cmd:
            for i, (_, buf) in enumerate(pairs):
                vk.copy_buffer(cmd, buf, 0, host, i * used, used)
        self.kv_shadow = (host, used, [layer for layer, _ in pairs])
        return used * len(pairs)

    # -- the disk tier (the arbiter's host budget) --------------------------------------------
    def ram_bytes(self) -> int:
        """Anonymous host memory this model's shadows hold: the KV shadow, the recurrent
        states and their checkpoint, host-visible weight copies. The GGUF file's own pages
        (the weights read in place, or imported) are the page cache's, not counted; the
        vision encoder's reshaped tensors are."""
        vision = self.vision.host_bytes() if self.vision is not None else 0
        return self._state_shadow_bytes() + sum(b.nbytes for b in self.shadow) + vision

    def _state_shadow_bytes(self) -> int:
        """The KV shadow, the recurrent states and their checkpoint, in host memory."""
        kv = self.kv_shadow[0].nbytes if self.kv_shadow and self.kv_shadow[0] else 0
        rec = sum(c.nbytes for c in self.recurrent_shadow.values()) \
            if self.recurrent_shadow else 0
        if self.checkpoint is not None:
            rec += sum(c.nbytes for c in self.checkpoint[1].values())
        return kv + rec

    def disk_bytes(self) -> int:
        """Bytes of its KV shadow and recurrent states in files (the disk tier)."""
        total = 0
        for path in (self.kv_on_disk, self.recurrent_on_disk):
            try:
                total += os.path.getsize(path) if path else 0
            except OSError:
                pass
        return total

    def spill(self) -> int:
        """Free the host shadows a file can hold instead; the RAM freed. Weight copies hold
        the GGUF file's own bytes: they go, and the next restore reads the file again
        (through the page cache; the file's imported pages are let go with them and
        imported again). The KV host shadow, and a recurrent model's states and checkpoint,
        move to files of the cache folder (where a file cannot be written, they stay)."""
        freed = 0
        if self.shadow:
            freed += sum(b.nbytes for b in self.shadow)
            for b in self.shadow:
                self.dev.allocator.free(b)
            self.shadow = []
            if self.pinned is not None:
                self.pinned.close()
                self.pinned = None
            self._sources = None                # the next upload makes them again
        freed += self._spill_states()
        if self.rs is not None or not self.kv_shadow or self.kv_shadow[0] is None:
            return freed
        path = promptcache.save(self, spill=True)
        if path is None:
            return freed
        freed += self.kv_shadow[0].nbytes
        self._kv_restored()                     # the host copy goes: the file holds it
        self.kv_on_disk = str(path)
        return freed

    def _spill_states(self) -> int:
        """The recurrent states and the checkpoint into one .npz beside the KV's; RAM freed."""
        if self.state == "warm" or self.recurrent_on_disk is not None or (
                self.recurrent_shadow is None and self.checkpoint is None):
            return 0                            # a warm model's checkpoint is in use
        arrays = {f"state/{k}": v for k, v in (self.recurrent_shadow or {}).items()}
        if self.checkpoint is not None:
            arrays["checkpoint_tokens"] = np.asarray(self.checkpoint[0], np.int64)
            arrays.update((f"checkpoint/{k}", v) for k, v in self.checkpoint[1].items())
        path = promptcache.save_states(self, arrays)
        if path is None:
            return 0
        freed = sum(a.nbytes for k, a in arrays.items() if k != "checkpoint_tokens")
        self.recurrent_on_disk = str(path)
        self.recurrent_shadow, self.checkpoint = None, None
        return freed

    def _read_spilled_states(self) -> None:
        """The recurrent states and checkpoint back from their file; where it is gone or
        damaged the prompt cache goes (the states belong to its end)."""
        path, self.recurrent_on_disk = self.recurrent_on_disk, None
        arrays = promptcache.load_states(path)
        promptcache.remove(path)
        if arrays is None:
            self.cache_tokens, self.checkpoint = [], None
            if self.kv_shadow is not None:
                self._kv_restored()
            return
        states = {k.split("/", 1)[1]: v for k, v in arrays.items() if k.startswith("state/")}
        self.recurrent_shadow = states or None
        if "checkpoint_tokens" in arrays:
            self.checkpoint = ([int(t) for t in arrays["checkpoint_tokens"]],
                               {k.split("/", 1)[1]: v for k, v in arrays.items()
                                if k.startswith("checkpoint/")})

    def _read_spilled(self) -> None:
        """The spilled KV back into a host shadow for the restore; where its file is gone or
        damaged the prompt cache is emptied (the prompt is computed again)."""
        path, self.kv_on_disk = self.kv_on_disk, None
        tokens = list(self.cache_tokens)
        if not promptcache.load(self, path) or self.cache_tokens != tokens:
            if self.kv_shadow is not None:
                self._kv_restored()
            self.cache_tokens = []
        promptcache.remove(path)                # the warm model holds it now

    def _restore_kv(self) -> int:
        """The KV host shadow back into the fresh cache (one submit); bytes moved."""
        host, used, layers = self.kv_shadow
        pairs = self._kv_buffers()
        if [layer for layer, _ in pairs] != layers:
            raise RuntimeError(f"{self.name}: KV layout changed while cold")
        if host is not None:
            with self.dev.one_shot() as cmd:
                for i, (_, buf) in enumerate(pairs):
                    vk.copy_buffer(cmd, host, i * used, buf, 0, used)
        self._kv_restored()
        return used * len(pairs) if host is not None else 0

    def _kv_restored(self) -> None:
        if self.kv_shadow is not None and self.kv_shadow[0] is not None:
            self.dev.allocator.free(self.kv_shadow[0])
        self.kv_shadow = None

    def _kv_buffers(self) -> list[tuple[str, vk.Buffer]]:
        out = [(f"k{i}", b) for i, b in self.rs.k_cache.items()]
        return out + [(f"v{i}", b) for i, b in self.rs.v_cache.items()]

    # -- recurrent checkpoints (the prompt cache of recurrent models) -------------------------
    def save_checkpoint(self) -> None:
        """Keep a host copy of the recurrent states, which belong to the end of cache_tokens
        (one download), replacing the last one."""
        self.checkpoint = (list(self.cache_tokens), self.rs.capture_recurrent())

    def checkpoint_for(self, prompt: list[int]) -> int:
        """Tokens of `prompt` the checkpoint lets a run skip: its length where the prompt and
        the KV cache both still start with its tokens and a token of the prompt is left to
        run (for the logits); else 0."""
        if self.checkpoint is None:
            return 0
        tokens = self.checkpoint[0]
        n = len(tokens)
        if not 0 < n < len(prompt) or prompt[:n] != tokens or self.cache_tokens[:n] != tokens:
            return 0
        return n

    def resume_checkpoint(self) -> int:
        """Put the checkpoint's states back and cut the cache to its tokens (the KV past them
        is simply overwritten); the position the run continues from."""
        tokens, states = self.checkpoint
        self.rs.restore_recurrent(states)
        del self.cache_tokens[len(tokens):]
        return len(tokens)

    def kv_checksum(self) -> str:
        """Digest of the used KV cache, from the device or from the host shadow."""
        import hashlib

        h = hashlib.sha256()
        if self.rs is not None:
            used = len(self.cache_tokens) * self.rs.kv_row_bytes
            pairs = [(buf, used) for _, buf in self._kv_buffers()]
            for c in (vk.download_many(self.dev, pairs) if used else []):
                h.update(c.tobytes())
        elif self.kv_shadow is not None and self.kv_shadow[0] is not None:
            host, used, layers = self.kv_shadow
            for i in range(len(layers)):
                h.update(host.view[i * used:(i + 1) * used].tobytes())
        return h.hexdigest()

    def recurrent_checksum(self) -> str:
        """Digest of the recurrent states: the host shadow while there is one (it is what a
        restore writes back), else the device copy."""
        import hashlib

        h = hashlib.sha256()
        if self.recurrent_shadow is not None:
            for key in sorted(self.recurrent_shadow):
                h.update(self.recurrent_shadow[key].tobytes())
        elif self.rs is not None and self.rs.recurrent_states():
            states = self.rs.recurrent_states()
            bufs = [(states[key], states[key].nbytes) for key in sorted(states)]
            for c in vk.download_many(self.dev, bufs):
                h.update(c.tobytes())
        return h.hexdigest()

    def host_shadow_bytes(self) -> int:
        """Host memory that backs a restore: the device weights' host-visible copy (or the
        mapped GGUF file), any KV shadow and the recurrent states. Host-placed weights are
        counted apart, in host_weight_bytes."""
        return self.weight_bytes + self._state_shadow_bytes()

    def _drop_graphs(self) -> None:
        for g in list(self._decode.values()) + list(self._prefill.values()) + \
                list(self._hidden.values()):
            g.close()
        self._decode, self._prefill, self._hidden = {}, OrderedDict(), OrderedDict()
        if self._hidden_out is not None:       # the hidden graphs' read-back buffer
            self.dev.allocator.free(self._hidden_out)
            self._hidden_out = None

    # -- weights ----------------------------------------------------------------------------
    write_in_place = True          # on unified memory; tests turn it off to take the
                                   # discrete-GPU path (host shadow + device copy)

    def _upload(self, progress) -> tuple[int, vk.CopyStream | None]:
        """Weights onto the device: (bytes, the copies in flight or None). On unified memory
        they are written in place from the GGUF memmap. Otherwise every restore is copy
        commands from host memory the GPU reads: the file's own pages, imported (pinned)
        where the driver allows, and for the rest a host-visible shadow filled once, on the
        first upload. Each arena's copies are sent as soon as it is allocated, and the
        caller waits for them (CopyStream.wait). Host-placed weights (cpu_moe) are written
        from the memmap on the first upload and kept."""
        placements, sizes, host_sizes = self._layout
        fill_host = bool(host_sizes) and not self.host_arenas
        total = sum(p[5] for p in placements if fill_host or not p[7])
        alloc = self.dev.allocator.alloc
        direct = self.dev.unified and self.write_in_place
        done = 0
        if not direct and self._sources is None:          # the first upload: host sources
            self._sources, self.pinned, shadows = placement.copy_sources(
                self.dev, self.gguf, self._layout, self.name,
                self.pin_host and bool(self.dev.host_import_align)
                and self.dev.imports_file_pages, progress, done, total)
            self.shadow.extend(shadows)
        t0 = time.perf_counter()
        stream = None if direct else vk.CopyStream(self.dev)
        try:
            for i, n in enumerate(sizes):
                self.arenas.append(alloc(n, f"{self.name}/weights.{i}", "weights"))
                if stream is not None:
                    for src_buf, regions in self._sources[i]:
                        stream.copy(src_buf, self.arenas[i], regions)
                    stream.submit()
            if fill_host:
                self.host_arenas = [alloc(n, f"{self.name}/host_weights.{i}", "host_weights",
                                          host=True) for i, n in enumerate(host_sizes)]
        except BaseException:
            if stream is not None:
                stream.close()
            self._free_arenas()
            raise
        self.upload_timing = {"alloc_s": time.perf_counter() - t0}
        for n, first, count, a, off, nbytes, src, host in placements:
            dst = (self.host_arenas if fill_host else None) if host else \
                (self.arenas if direct else None)
            if dst is None:
                continue
            t = self.gguf.tensor(n)
            dst[a].view[off:off + nbytes] = t.data[src:src + nbytes]
            done += nbytes
            if progress:
                progress(done, total)
        if stream is not None and progress:
            progress(total, total)
        if not self._tensors:                  # the layout never changes: built once
            for n, first, count, a, off, nbytes, _, host in placements:
                t = self.gguf.tensor(n)
                if n not in self._tensors:
                    self._tensors[n] = Tensor(t.type_name, t.shape, [],
                                              self.host_arenas if host else self.arenas)
                self._tensors[n].parts.append((first, count, a, off, nbytes))
        self.weights = self._tensors
        return total, stream

    pin_host = True                # import the file's pages where the driver allows

    def pinned_bytes(self) -> int:
        """Host bytes imported for the device to copy from (the GGUF file's own pages)."""
        return self.pinned.nbytes if self.pinned is not None else 0

    # -- graphs -----------------------------------------------------------------------------
    def _record(self, n: int, greedy: bool, logprobs: bool = False, embd: bool = False,
                prompt: bool = False) -> Graph:
        g = Graph(self.dev, self.kernels,
                  f"{self.name}/n{n}{'e' if embd else ''}{'p' if n == 1 and prompt else ''}",
                  profile=self.profile)
        b = Builder(g, self.weights, self.rs, self.tuning, self.paths, embd=embd,
                    prompt=prompt)
        self.arch.forward(b, self.config, self.rs, n)
        n_vocab = self.config.n_vocab
        if greedy:
            b.argmax(self.rs.logits, self.rs.result, n_vocab)
        else:
            g.copy(self.rs.logits, 0, self.rs.result, 0, 4 * n_vocab)
        if logprobs:               # after the argmax's word, or after the logits
            b.logprobs(self.rs.logits, self.rs.result, n_vocab, TOP_LOGPROBS,
                       1 if greedy else n_vocab)
        return g.finish()

    def _graph(self, n: int, greedy: bool, logprobs: bool = False, embd: bool = False,
               prompt: bool = False) -> Graph:
        """The graph of a pass of n tokens: decode's for one token, else a prompt's (prompt:
        one token of a prompt, which takes the kernels of a wider pass, Builder.prompt)."""
        if n == 1 and not embd and not prompt:
            key1 = (greedy, logprobs)
            if key1 not in self._decode:
                self._decode[key1] = self._record(1, greedy, logprobs)
            return self._decode[key1]
        key = (n, greedy, logprobs, embd)
        if key in self._prefill:
            self._prefill.move_to_end(key)
            return self._prefill[key]
        g = self._record(n, greedy, logprobs, embd, prompt=True)
        self._prefill[key] = g
        if len(self._prefill) > PREFILL_GRAPHS_KEPT:
            self._prefill.popitem(last=False)[1].close()
        return g

    def run(self, tokens: list[int], pos0: int, greedy: bool, logprobs: bool = False,
            embd: Media | None = None, prompt: bool = False):
        """The next-token argmax (greedy) or logits after tokens at positions pos0..; with
        logprobs, (that, (lse, top log-probabilities, their ids)): the log-softmax of the
        logits, computed on the device (the TOP_LOGPROBS best, best first). embd: an
        image whose soft tokens [len(tokens), n_embd] go in instead of the tokens' (seeing
        each other both ways where its projector says so); `tokens` are then what the cache
        knows them by. prompt: the tokens are (part of) a prompt, whose one-token pass takes
        the kernels of a wider one, so its bits do not depend on how the prompt was cut."""
        if self.state != "warm":
            raise RuntimeError(f"{self.name} is cold: restore it before running it")
        if pos0 + len(tokens) > self.n_ctx:
            raise ContextFull(f"{pos0 + len(tokens)} tokens exceed the context of {self.n_ctx}")
        if self.recurrent:
            # a recurrent state cannot rewind: a run starts a sequence or continues the last
            if pos0 == 0:
                self.rs.reset_recurrent()
            elif pos0 != len(self.cache_tokens):
                raise ValueError(f"{self.name}: the recurrent state is at position "
                                 f"{len(self.cache_tokens)}, not {pos0}")
        if embd is not None:
            if embd.rows.shape != (len(tokens), self.config.n_embd):
                raise ValueError(f"embeddings of shape {embd.rows.shape} for {len(tokens)} "
                                 f"positions of width {self.config.n_embd}")
            self.rs.embd_input().write(np.ascontiguousarray(embd.rows, np.float32))
            self.rs.set_step(np.zeros(len(tokens), np.uint32), pos0,
                             bidir=self.vision.config.bidirectional)
        else:
            self.rs.set_step(tokens, pos0)
        if self.positions is not None:
            rope = self.config.rope
            rows = self.positions.rows(rope_table(self.n_ctx, rope), pos0, len(tokens),
                                       None if embd is None else embd.geometry,
                                       0 if embd is None else embd.first)
            self.rs.rope_table(rope).write(rows, pos0 * rows[0].nbytes)
        graph = self._graph(len(tokens), greedy, logprobs, embd is not None, prompt)
        t0 = time.perf_counter()
        graph.replay()
        if len(tokens) > 1:                     # what a prefill pass of this size costs
            self._last_pass = (len(tokens), time.perf_counter() - t0)
        self._cached(pos0, tokens, prompt or len(tokens) > 1 or embd is not None)
        n_vocab = self.config.n_vocab
        if greedy:
            words = self.rs.result.read(np.uint32, 1 + (LOGPROB_WORDS if logprobs else 0))
            out = int(words[0])
            words = words[1:]
        else:
            words = self.rs.result.read(np.uint32, n_vocab + (LOGPROB_WORDS if logprobs else 0))
            out = words[:n_vocab].view(np.float32).copy()
            words = words[n_vocab:]
        if not logprobs:
            return out
        k = TOP_LOGPROBS
        return out, (float(words[:1].view(np.float32)[0]), words[1:1 + k].view(np.float32),
                     words[1 + k:1 + 2 * k].copy())

    def _cached(self, pos0: int, tokens: list[int], prompt: bool) -> None:
        """tokens sit in the KV cache from pos0 on now (what followed is gone); a decode
        step's (not prompt) ends the part a later prompt may reuse where decode rounds
        otherwise (reusable)."""
        del self.cache_tokens[pos0:]
        self.cache_tokens.extend(tokens)
        if not prompt:
            self.prompt_upto = min(self.prompt_upto, pos0)
        elif pos0 <= self.prompt_upto:
            self.prompt_upto = pos0 + len(tokens)

    def reusable(self) -> int:
        """How many of cache_tokens a later prompt may take as computed: all where a decode
        step gives a token the bits a prompt's pass gives it (Paths.steps_match_prompts),
        else those that prompt passes computed. On a GPU a conversation's next turn then
        computes the last answer's tokens again (a prefill of them), so its answer is the
        one a fresh model gives the whole conversation."""
        n = len(self.cache_tokens)
        return n if self.paths.steps_match_prompts else min(n, self.prompt_upto)

    def eval(self, tokens: list[int], pos0: int, greedy: bool = True,
             between: Callable[[], None] | None = None, logprobs: bool = False,
             prompt: bool = False):
        """Run tokens at positions pos0..; the next-token argmax (greedy) or logits (with
        logprobs, as run() gives them). between() runs between two chunks: a safe point,
        where the model may be released and restored (the cache then holds every chunk so
        far). prompt: the tokens are a prompt's rest, whose one-token pass (a cached prefix's
        last token) takes a wider pass's kernels (run's prompt); else one token is a decode
        step."""
        out = None
        s = 0
        while s < len(tokens):
            if s and between is not None:
                between()
            embd = None
            if tokens[s] < 0:       # an image's span: whole where it sees itself both ways
                first = media_start(tokens, s)
                image = self.media_rows(tokens[s], media_span(tokens, first))
                a = s - first
                n = len(image.rows) - a
                if not self.vision.config.bidirectional:
                    n = min(n, self.chunk)
                embd = Media(image.rows[a:a + n], image.geometry, a)
            else:
                n = self.next_chunk(media_free(tokens, s))
            out = self.run(tokens[s:s + n], pos0 + s, greedy,     # the last pass's logits
                           logprobs=logprobs and s + n == len(tokens),  # only
                           embd=embd, prompt=prompt)
            s += n
        return out

    def media_rows(self, key: int, n: int) -> Media:
        """The soft tokens of the image a prompt knows by `key` (a negative id, see
        engine/vision/prompt.py), from `media`, the request's images."""
        media = self.media.get(key)
        if media is None:
            raise ValueError(f"{self.name}: no image for the prompt's media id {key}")
        if len(media.rows) != n:
            raise ValueError(f"{self.name}: an image of {len(media.rows)} soft tokens in a "
                             f"span of {n}")
        if n > self.chunk and self.vision.config.bidirectional:
            raise ValueError(f"{self.name}: an image of {n} soft tokens does not fit a pass "
                             f"of {self.chunk}")
        return media

    def hidden(self, tokens: list[int], between: Callable[[], None] | None = None) -> np.ndarray:
        """The final-normed hidden states [len(tokens), n_embd] of tokens run as a sequence
        of their own, from position 0 (embeddings are pooled from them). They go through the
        KV cache like a prompt, so the prompt cache then holds these tokens; chunks as in
        eval(), between() between them."""
        self._hidden_ready(len(tokens))
        out = np.empty((len(tokens), self.config.n_embd), np.float32)
        s = 0
        while s < len(tokens):
            if s and between is not None:
                between()          # may release and restore the model: graphs recorded anew
            n = self.next_chunk(len(tokens) - s)
            if s == 0:
                self.rs.reset_recurrent()
            out[s:s + n] = self._hidden_pass(tokens[s:s + n], s, None)
            self._cached(s, tokens[s:s + n], True)
            s += n
        return out

    def hidden_packed(self, seqs: list[list[int]]) -> list[np.ndarray]:
        """The hidden states of several token lists, as hidden() gives each, from one pass:
        packed one after the other into the cache from slot 0, each token at its own
        sequence's position and seeing only the earlier tokens of its own sequence
        (step.seq_first, Builder.seqs). Their total must fit a pass (`chunk`) and the
        context; a recurrent model (one state per pass) takes one sequence at a time. The
        prompt cache then holds the first sequence, the only one at its true positions."""
        lens = [len(x) for x in seqs]
        n = sum(lens)
        if not seqs or min(lens) < 1:
            raise ValueError("packed sequences must be non-empty")
        if n > min(self.chunk, self.n_ctx):
            raise ValueError(f"{n} packed tokens exceed a pass of {min(self.chunk, self.n_ctx)}")
        if self.recurrent and len(seqs) > 1:
            raise ValueError(f"{self.name}: a recurrent state holds one sequence per pass")
        self._hidden_ready(n)
        self.rs.reset_recurrent()
        tokens = [t for x in seqs for t in x]
        starts = np.cumsum([0] + lens[:-1])
        hidden = self._hidden_pass(tokens, 0, np.repeat(starts, lens) if n > 1 else None)
        self._cached(0, seqs[0], True)
        return [hidden[a:a + k] for a, k in zip(starts, lens)]

    def _hidden_ready(self, n: int) -> None:
        if self.state != "warm":
            raise RuntimeError(f"{self.name} is cold: restore it before running it")
        if n > self.n_ctx:
            raise ContextFull(f"{n} tokens exceed the context of {self.n_ctx}")

    def _hidden_pass(self, tokens: list[int], pos0: int, seq_first) -> np.ndarray:
        """One hidden-state pass of tokens from cache slot pos0; seq_first, per token, the
        slot where its sequence starts (None: all one sequence)."""
        e, n = self.config.n_embd, len(tokens)
        if self._hidden_out is None:
            self._hidden_out = self.dev.allocator.alloc(4 * self.rs.max_tokens * e,
                                                        f"{self.name}/hidden", "compute",
                                                        host=True)
        if seq_first is None and n > 1:     # the graph reads the bounds: one sequence
            seq_first = np.zeros(n, np.uint32)
        self.rs.set_step(tokens, pos0, seq_first)
        if self.positions is not None:      # text from position 0: the plain rows
            plain = rope_table(self.n_ctx, self.config.rope)[:pos0 + n]
            self.rs.rope_table(self.config.rope).write(plain)
            self.positions.next[:pos0 + n] = np.arange(1, pos0 + n + 1)
        graph = self._hidden.get(n)
        if graph is None:
            graph = self._hidden[n] = self._record_hidden(n)
            if len(self._hidden) > PREFILL_GRAPHS_KEPT:
                self._hidden.popitem(last=False)[1].close()
        else:
            self._hidden.move_to_end(n)
        t0 = time.perf_counter()
        graph.replay()
        self.hidden_passes += 1
        if n > 1:
            self._last_pass = (n, time.perf_counter() - t0)
        return self._hidden_out.read(np.float32, n * e).reshape(n, e)

    def _record_hidden(self, n: int) -> Graph:
        g = Graph(self.dev, self.kernels, f"{self.name}/hidden{n}", profile=self.profile)
        # every pass takes the prompt's kernels, so an input's vectors do not depend on what
        # it was packed with
        b = Builder(g, self.weights, self.rs, self.tuning, self.paths, hidden=True,
                    prompt=True)
        # a pass may pack several sequences (the host writes step.seq_first); one of a single
        # token is one sequence
        b.seqs = int(n > 1)
        self.arch.forward(b, self.config, self.rs, n)
        if not b.ended:
            g.close()
            raise RuntimeError(f"{self.gguf.arch}: the forward pass did not end in the head "
                               f"block, which gives the hidden states")
        g.copy(self.rs.xn, 0, self._hidden_out, 0, 4 * n * self.config.n_embd)
        return g.finish()

    def pass_tokens(self) -> int:
        """Tokens one pass takes within CHUNK_TARGET_S at this model's measured speed
        (PROBE_CHUNK before it is measured), up to `chunk`: the width of a packed embedding
        pass, which, unlike a prompt's chunks, need not be a power of two (its graphs are
        per length anyway); the fixed cost in the measure makes it grow pass by pass."""
        if self._last_pass is None:
            return min(PROBE_CHUNK, self.chunk)
        tokens, seconds = self._last_pass
        return max(2, min(int(CHUNK_TARGET_S * tokens / max(seconds, 1e-9)), self.chunk))

    def next_chunk(self, remaining: int) -> int:
        """Tokens for the next prefill pass: as many as fit CHUNK_TARGET_S at this model's
        measured speed, so that a cancellation or another process's turn (taken between
        passes) waits at most about that long on any device; a power of two, so that few
        graphs are recorded, up to `chunk`. The rest of a prompt that fits goes whole."""
        cap = self.chunk
        if self._last_pass is None:
            n = PROBE_CHUNK
        else:
            # the last pass's cost per token (its fixed cost included: an overestimate for
            # a wider pass, so the next one stays under the target, and grows from there)
            tokens, seconds = self._last_pass
            fit = CHUNK_TARGET_S * tokens / max(seconds, 1e-9)
            n = 1 << (int(fit).bit_length() - 1) if fit >= 2 else 2
        n = min(n, cap)
        if remaining <= n:
            return remaining
        if remaining - n == 1:         # no pass of one token: that is decode's graph
            n = n + 1 if n < cap else n - 1
        return n

    def device_bytes(self) -> dict[str, int]:
        """Device bytes held now, by kind; an encoder's all under "vision", with the rows
        that take an image's soft tokens into a pass."""
        out: dict[str, int] = {}
        bufs = list(self.arenas) + (self.rs.buffers() if self.rs else [])
        embd = self.rs.embd_in if self.rs is not None else None
        for b in bufs:
            if not b.released:
                kind = "vision" if b is embd else b.kind
                out[kind] = out.get(kind, 0) + b.nbytes
        if self.vision is not None and self.vision.warm:
            out["vision"] = out.get("vision", 0) + self.vision.device_bytes()
        return out

    def close(self) -> None:
        self.release(full=False)
        if self.vision is not None:
            self.vision.close()
            self.vision = None
        if self.rs is not None:
            self.rs.close()
            self.rs = None
        for b in self.shadow + self.host_arenas:
            self.dev.allocator.free(b)
        self.shadow, self.host_arenas = [], []
        if self.pinned is not None:
            self.pinned.close()
            self.pinned = None
        self._sources = None
        if self.kv_shadow is not None and self.kv_shadow[0] is not None:
            self.dev.allocator.free(self.kv_shadow[0])
        self.kv_shadow = None
        if self.kv_on_disk is not None and self.kv_on_disk.endswith(promptcache.SPILL):
            promptcache.remove(self.kv_on_disk)  # kept as the prompt cache, it was renamed
        if self.recurrent_on_disk is not None:
            promptcache.remove(self.recurrent_on_disk)
        self.kv_on_disk = self.recurrent_on_disk = None
        self.recurrent_shadow = None
        self.checkpoint = None
        self.gguf.close()


@dataclass(frozen=True)
class Media:
    """An image in a prompt: its soft tokens [n_tokens, n_embd] and its geometry; in a pass
    of part of it, the soft tokens from `first` on."""
    rows: np.ndarray
    geometry: Geometry
    first: int = 0


def media_span(tokens: list[int], s: int) -> int:
    """Positions of the image span that starts at tokens[s] (all its media id)."""
    n = s + 1
    while n < len(tokens) and tokens[n] == tokens[s]:
        n += 1
    return n - s


def media_start(tokens: list[int], i: int) -> int:
    """i, or where the image span that holds position i starts: a pass never starts inside
    one (its soft tokens see each other both ways, so they go in together)."""
    while 0 < i < len(tokens) and tokens[i] < 0 and tokens[i - 1] == tokens[i]:
        i -= 1
    return i


def media_free(tokens: list[int], s: int) -> int:
    """Tokens from s up to the next image span (or the end)."""
    n = s
    while n < len(tokens) and tokens[n] >= 0:
        n += 1
    return n - s


class ContextFull(ValueError):
    code = "context_full"
