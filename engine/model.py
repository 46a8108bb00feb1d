"""A loaded model: weights on the device, its recorded graphs, and the token loop.

Decode is one recorded command buffer replayed per token: the host writes the token id and
position into small host-visible buffers, submits once, and reads back either the argmax
(greedy) or the logits (sampling). Prefill runs the prompt in chunks of up to
`max_tokens`; its graphs are recorded per chunk length and kept for reuse.
"""
from __future__ import annotations

import os
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Callable, Iterator

import numpy as np

from . import gemma3, llama, vk
from .gguf_file import GGUFFile, ModelFileError
from .graph import Graph
from .kernels import WEIGHT_TYPES, KernelCache
from .ops import Builder, RunState, Tensor, Tuning, flash_attn_mode, run_state_args

ARCHITECTURES = {"llama": llama, "gemma3": gemma3}
PREFILL_CHUNK = 256
PREFILL_GRAPHS_KEPT = 4


def default_flash_attn() -> str:
    """$HOTSEAT_FLASH_ATTN (auto, on or off) or "auto": what a model takes when not told."""
    mode = os.environ.get("HOTSEAT_FLASH_ATTN") or "auto"
    try:
        return flash_attn_mode(mode)
    except ValueError as exc:
        raise ValueError(f"HOTSEAT_FLASH_ATTN: {exc}") from None


def _check_tensors(g: GGUFFile, cfg) -> None:
    for name, shape in cfg.tensor_shapes().items():
        t = g.tensor(name)                      # raises "missing tensor"
        if t.shape != shape:
            raise ModelFileError(g.path, f"tensor {name} has shape {list(t.shape)}, "
                                         f"expected {list(shape)}")
        if t.type_name not in WEIGHT_TYPES:
            raise ModelFileError(g.path, f"tensor {name} has type {t.type_name}, which this "
                                         f"engine does not run (supported: "
                                         f"{', '.join(WEIGHT_TYPES)})")


@dataclass
class Timings:
    prompt_tokens: int = 0
    prefill_s: float = 0.0
    generated: int = 0
    decode_s: float = 0.0
    cached_tokens: int = 0

    def as_dict(self) -> dict:
        return {
            "prompt_tokens": self.prompt_tokens,
            "cached_tokens": self.cached_tokens,
            "prefill_s": self.prefill_s,
            "decode_s": self.decode_s,
            "prefill_tokens_per_s": (self.prompt_tokens - self.cached_tokens) / self.prefill_s
            if self.prefill_s > 0 else 0.0,
            # the first generated token comes out of prefill; the rest are decode steps
            "decode_tokens_per_s": (self.generated - 1) / self.decode_s
            if self.decode_s > 0 and self.generated > 1 else 0.0,
        }


class Model:
    def __init__(self, dev: vk.Device, kernels: KernelCache, path: str, n_ctx: int = 2048,
                 progress: Callable[[int, int], None] | None = None, name: str | None = None,
                 warm: bool = True, flash_attn: str | None = None):
        self.dev, self.kernels = dev, kernels
        self.gguf = GGUFFile(path)
        self.path = path
        arch = self.gguf.arch
        if arch not in ARCHITECTURES:
            raise ModelFileError(path, f"unsupported architecture {arch!r} (supported: "
                                       f"{', '.join(ARCHITECTURES)})")
        self.arch = ARCHITECTURES[arch]
        self.config = self.arch.Config.from_gguf(self.gguf)
        self.config.validate(path)
        _check_tensors(self.gguf, self.config)
        if not 16 <= n_ctx <= 1 << 20:
            raise ValueError(f"context size {n_ctx} out of range")
        self.n_ctx = n_ctx
        self.name = name or path.rsplit("/", 1)[-1]
        self.tuning = Tuning.for_device(dev, flash_attn or default_flash_attn())
        self.profile = False                    # record graphs with per-op timestamps
        self._layout = self._plan_layout()      # where each tensor sits in the weight arenas
        self.arenas: list[vk.Buffer] = []       # device weights while they are resident
        self.shadow: list[vk.Buffer] = []       # their host-visible copy (discrete GPUs)
        self.weights: dict[str, Tensor] = {}
        self.rs: RunState | None = None        # activations and KV cache while resident
        self.kv_shadow: dict[str, np.ndarray] | None = None   # host copy while evicted
        self._decode: dict[bool, Graph] = {}
        self._prefill: OrderedDict[int, Graph] = OrderedDict()
        self.cache_tokens: list[int] = []       # tokens whose K/V sit at positions 0..len-1
        self.last_transfer = {"op": None, "seconds": 0.0, "bytes": 0}
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
        return sum(self._layout[1])

    def warm_bytes(self) -> int:
        """Device bytes this model holds when warm (what the arbiter must grant)."""
        return self.weight_bytes + RunState.bytes_for(**self._run_state_args())

    @property
    def uses_flash_attn(self) -> bool:
        """Whether prefill runs tiled (flash) attention on this device, for this model."""
        return self.tuning.use_flash_attn(self.config.head_dim, PREFILL_CHUNK)

    def set_flash_attn(self, mode: str) -> bool:
        """Prefill attention "auto", "on" or "off" from now on. When that changes what this
        model runs (its run state holds the masks only when it runs flash attention), the
        model goes fully cold, KV kept on the host, and restores with it: returns True."""
        before = self.uses_flash_attn
        self.tuning.flash_attn = flash_attn_mode(mode)
        if self.uses_flash_attn == before:
            return False
        self.release(full=True)
        return True

    def _run_state_args(self) -> dict:
        block = self.tuning.flash_block(self.config.head_dim) if self.uses_flash_attn else None
        return run_state_args(self.config, self.n_ctx, PREFILL_CHUNK,
                              self.arch.rope_tables(self.config),
                              self.arch.attn_windows(self.config), block)

    def restore(self, progress: Callable[[int, int], None] | None = None) -> dict:
        """Make the model warm: weights from the GGUF memmap, KV from its host shadow."""
        t0 = time.perf_counter()
        moved = 0
        if not self.arenas:
            moved += self._upload(progress)
        t1 = time.perf_counter()
        if self.rs is None:
            self.rs = RunState(self.dev, self.name, **self._run_state_args())
            if self.kv_shadow:
                kv_bytes = sum(np.asarray(c).nbytes for c in self.kv_shadow.values())
                with vk.Uploader(self.dev, staging_bytes=max(4096, min(
                        vk.STAGING_BYTES, kv_bytes))) as up:
                    for layer, buf in self._kv_buffers():
                        up.write(buf, self.kv_shadow[layer])
                    moved += up.bytes
            self.kv_shadow = None
        t2 = time.perf_counter()
        self.last_transfer = {"op": "restore", "seconds": t2 - t0, "bytes": moved,
                              "weights_s": t1 - t0, "state_s": t2 - t1}
        return self.last_transfer

    def release(self, full: bool = True) -> dict:
        """Go cold. Weights-only keeps KV and compute buffers on the device (fastest switch
        back); full eviction copies the used KV to host memory and frees everything."""
        t0 = time.perf_counter()
        moved = 0
        self._drop_graphs()
        for b in self.arenas:
            self.dev.allocator.free(b)
        self.arenas, self.weights = [], {}
        if full and self.rs is not None:
            used = len(self.cache_tokens) * self.rs.kv_row_bytes
            pairs = [(buf, used) for _, buf in self._kv_buffers()]
            copies = vk.download_many(self.dev, pairs) if used else [b""] * len(pairs)
            self.kv_shadow = {layer: c for (layer, _), c in zip(self._kv_buffers(), copies)}
            moved = used * len(pairs)
            self.rs.close()
            self.rs = None
        self.last_transfer = {"op": "release", "seconds": time.perf_counter() - t0,
                              "bytes": moved}
        return self.last_transfer

    def _kv_buffers(self) -> list[tuple[str, vk.Buffer]]:
        out = [(f"k{i}", b) for i, b in self.rs.k_cache.items()]
        return out + [(f"v{i}", b) for i, b in self.rs.v_cache.items()]

    def kv_checksum(self) -> str:
        """Digest of the used KV cache, from the device or from the host shadow."""
        import hashlib

        h = hashlib.sha256()
        if self.rs is not None:
            used = len(self.cache_tokens) * self.rs.kv_row_bytes
            pairs = [(buf, used) for _, buf in self._kv_buffers()]
            for c in (vk.download_many(self.dev, pairs) if used else []):
                h.update(c.tobytes())
        elif self.kv_shadow:
            for c in self.kv_shadow.values():
                h.update(np.asarray(c).tobytes())
        return h.hexdigest()

    def host_shadow_bytes(self) -> int:
        """Host memory that backs a restore: the weights' host-visible copy (or, on unified
        memory, the mapped GGUF file) and any KV shadow."""
        kv = sum(np.asarray(c).nbytes for c in self.kv_shadow.values()) if self.kv_shadow else 0
        return self.weight_bytes + kv

    def _drop_graphs(self) -> None:
        for g in list(self._decode.values()) + list(self._prefill.values()):
            g.close()
        self._decode, self._prefill = {}, OrderedDict()

    # -- weights ----------------------------------------------------------------------------
    ARENA_BYTES = 1 << 30          # weights are packed into buffers of at most this size
    write_in_place = True          # on unified memory; tests turn it off to take the
                                   # discrete-GPU path (host shadow + device copy)

    def _plan_layout(self):
        """Pack every tensor into arenas; split tensors past the storage-buffer range by rows.

        Returns (placements, arena sizes): placements are (name, first row, rows, arena,
        offset, bytes, file offset)."""
        align = max(self.dev.storage_align, 256)
        limit = min(self.dev.max_storage_range, self.ARENA_BYTES)
        placements, sizes = [], [0]
        for n in self.config.tensor_shapes():
            t = self.gguf.tensor(n)
            rows = t.n_elements // t.shape[0]
            row_bytes = t.nbytes // rows
            per_part = max(1, min(rows, limit // row_bytes))
            for first in range(0, rows, per_part):
                count = min(per_part, rows - first)
                nbytes = count * row_bytes
                off = -(-sizes[-1] // align) * align
                if off + nbytes > self.ARENA_BYTES and sizes[-1] > 0:
                    sizes.append(0)
                    off = 0
                placements.append((n, first, count, len(sizes) - 1, off, nbytes,
                                   first * row_bytes))
                sizes[-1] = off + nbytes
        return placements, sizes

    def _upload(self, progress) -> int:
        """Weights onto the device: from the host-visible shadow when there is one (one
        copy command per arena), else from the GGUF memmap, building the shadow on the way
        on discrete GPUs so that later restores are plain device copies."""
        placements, sizes = self._layout
        total = sum(p[5] for p in placements)
        t0 = time.perf_counter()
        self.arenas = [self.dev.allocator.alloc(n, f"{self.name}/weights.{i}", "weights")
                       for i, n in enumerate(sizes)]
        self.upload_timing = {"alloc_s": time.perf_counter() - t0}
        direct = self.arenas[0].view is not None and self.write_in_place
        if not direct and not self.shadow:
            self.shadow = [self.dev.allocator.alloc(n, f"{self.name}/shadow.{i}", "shadow",
                                                    host=True) for i, n in enumerate(sizes)]
            targets = self.shadow
        else:
            targets = self.arenas if direct else None
        if targets is not None:
            done = 0
            for n, first, count, a, off, nbytes, src in placements:
                t = self.gguf.tensor(n)
                targets[a].view[off:off + nbytes] = t.data[src:src + nbytes]
                done += nbytes
                if progress:
                    progress(done, total)
        if not direct:
            t0 = time.perf_counter()
            with self.dev.one_shot() as cmd:
                for sh, ar, n in zip(self.shadow, self.arenas, sizes):
                    vk.copy_buffer(cmd, sh, 0, ar, 0, n)
            self.upload_timing["copy_s"] = time.perf_counter() - t0
            if progress and targets is None:
                progress(total, total)
        self.weights = {}
        for n, first, count, a, off, nbytes, _ in placements:
            t = self.gguf.tensor(n)
            if n not in self.weights:
                self.weights[n] = Tensor(t.type_name, t.shape, [], self.arenas)
            self.weights[n].parts.append((first, count, a, off, nbytes))
        return total

    # -- graphs -----------------------------------------------------------------------------
    def _record(self, n: int, greedy: bool) -> Graph:
        g = Graph(self.dev, self.kernels, f"{self.name}/n{n}", profile=self.profile)
        b = Builder(g, self.weights, self.rs, self.tuning)
        self.arch.forward(b, self.config, self.rs, n)
        if greedy:
            b.argmax(self.rs.logits, self.rs.result, self.config.n_vocab)
        else:
            g.copy(self.rs.logits, 0, self.rs.result, 0, 4 * self.config.n_vocab)
        return g.finish()

    def _graph(self, n: int, greedy: bool) -> Graph:
        if n == 1:
            if greedy not in self._decode:
                self._decode[greedy] = self._record(1, greedy)
            return self._decode[greedy]
        key = (n, greedy)
        if key in self._prefill:
            self._prefill.move_to_end(key)
            return self._prefill[key]
        g = self._record(n, greedy)
        self._prefill[key] = g
        if len(self._prefill) > PREFILL_GRAPHS_KEPT:
            self._prefill.popitem(last=False)[1].close()
        return g

    def _run(self, tokens: list[int], pos0: int, greedy: bool) -> int | np.ndarray:
        if self.state != "warm":
            raise RuntimeError(f"{self.name} is cold: restore it before running it")
        if pos0 + len(tokens) > self.n_ctx:
            raise ContextFull(f"{pos0 + len(tokens)} tokens exceed the context of {self.n_ctx}")
        self.rs.set_step(tokens, pos0)
        self._graph(len(tokens), greedy).replay()
        del self.cache_tokens[pos0:]
        self.cache_tokens.extend(tokens)
        if greedy:
            return int(self.rs.result.read(np.uint32, 1)[0])
        return self.rs.result.read(np.float32, self.config.n_vocab)

    def eval(self, tokens: list[int], pos0: int, greedy: bool = True) -> int | np.ndarray:
        """Run tokens at positions pos0..; the next-token argmax (greedy) or logits."""
        out = None
        for s in range(0, len(tokens), PREFILL_CHUNK):
            chunk = tokens[s:s + PREFILL_CHUNK]
            out = self._run(chunk, pos0 + s, greedy)
        return out

    # -- generation ---------------------------------------------------------------------------
    def generate(self, prompt: list[int], max_new: int, sample: Callable | None = None,
                 stop_ids: set[int] = frozenset(), timings: Timings | None = None
                 ) -> Iterator[int]:
        """Yield up to max_new tokens. sample(logits, history) -> id; None means greedy.

        The KV of the longest cached prefix of `prompt` is reused (at least the last prompt
        token is recomputed, for its logits).
        """
        if not prompt:
            raise ValueError("empty prompt")
        t = timings if timings is not None else Timings()
        greedy = sample is None
        reuse = 0
        for a, b in zip(self.cache_tokens, prompt[:-1]):
            if a != b:
                break
            reuse += 1
        t.prompt_tokens, t.cached_tokens = len(prompt), reuse
        history = list(prompt)
        t0 = time.perf_counter()
        out = self.eval(prompt[reuse:], reuse, greedy)
        t.prefill_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        pos = len(prompt)
        for i in range(max_new):
            tok = out if greedy else sample(out, history)
            t.generated += 1
            yield tok
            history.append(tok)
            if tok in stop_ids or i == max_new - 1 or pos >= self.n_ctx:
                break
            out = self._run([tok], pos, greedy)
            pos += 1
            t.decode_s = time.perf_counter() - t0

    def device_bytes(self) -> dict[str, int]:
        out: dict[str, int] = {}
        bufs = list(self.arenas) + (self.rs.buffers() if self.rs else [])
        for b in bufs:
            if not b.released:
                out[b.kind] = out.get(b.kind, 0) + b.nbytes
        return out

    def close(self) -> None:
        self.release(full=False)
        if self.rs is not None:
            self.rs.close()
            self.rs = None
        for b in self.shadow:
            self.dev.allocator.free(b)
        self.shadow = []
        self.kv_shadow = None
        self.gguf.close()


class ContextFull(ValueError):
    pass
