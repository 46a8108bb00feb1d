"""The engine's public surface, as a Protocol: what the CLI, the HTTP server and the tray
call, and all they may call. `engine.api.Engine` is the one real implementation; the tray's
wrapper (app/) and the test fake (tests/helpers/fake_engine.py) follow it too, and
tests/engine/test_facade.py checks that their signatures match this one's.

Names are model names as `load` returned them; a `name` of None means "the only model
loaded". Errors a caller can act on carry a `code` (see `error_code`), which the server and
the tray map to their own words instead of reading message text.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol, Sequence, runtime_checkable


class ModelExists(ValueError):
    """A load under a name the engine already holds."""
    code = "model_exists"


class EngineFault(RuntimeError):
    """The GPU failed during a job (a Vulkan error: a lost device, an allocation refused
    mid-way). The engine has already reset what the failed work touched: the models are
    cold and restore from their host shadows at their next use, so a retry gives the
    answer a fresh start gives. `lost`: the device is gone and nothing will run until
    Hotseat restarts."""
    code = "device_fault"

    def __init__(self, message: str, lost: bool = False):
        super().__init__(message)
        self.lost = lost
        if lost:
            self.code = "device_lost"


@dataclass
class Request:
    """One generation, as generate() takes it: the model, the prompt (text, chat messages or
    token ids: one of the three) and how to answer, in one typed place."""
    name: str | None = None                 # None: the only model loaded
    prompt: str | None = None
    messages: list[dict] | None = None
    tokens: list[int] | None = None
    max_tokens: int = 128                   # at most; the context's room bounds it too
    sampling: Any = None                    # text.sampling.SamplingParams; None: its defaults
    stop: Sequence[str] = ()                # stop strings, cut from the answer
    logprobs: int | None = None             # 0..20 alternatives with each token; None: none
    preserved_tokens: Sequence[int] = ()    # control tokens whose text is kept (call markers)
    constraint: Any = None                  # a text.constrain.Grammar the answer follows
    images: Sequence[Any] = ()              # image files' bytes (or vision.image.Image), one
                                            # per media marker of the prompt or messages
    wait: float | None = None               # the most seconds to wait for the GPU (another
                                            # process's turn, a yield) before ArenaBusy;
                                            # None waits as long as it takes


@dataclass
class TokenLogprob:
    """A generated token's log-probability: the log-softmax of the model's own logits (before
    penalties, bias and temperature, as llama-server reports them), with the best
    alternatives, best first."""
    id: int
    logprob: float
    top: list[tuple[int, float]]         # (id, logprob), as many as asked for


@dataclass
class Completion:
    prompt_tokens: list[int]
    tokens: list[int]
    text: str
    finish_reason: str                   # "stop" (end of generation or stop string) | "length"
    timings: dict = field(default_factory=dict)  # | "cancelled"
    # with generate(logprobs=k): one entry per token of `tokens` up to a stop string
    logprobs: list[TokenLogprob] | None = None

    def as_dict(self) -> dict:
        out = {"prompt_tokens": self.prompt_tokens, "tokens": self.tokens, "text": self.text,
               "finish_reason": self.finish_reason, "timings": self.timings}
        if self.logprobs is not None:
            out["logprobs"] = [{"id": e.id, "logprob": e.logprob, "top": e.top}
                               for e in self.logprobs]
        return out


@dataclass
class Embeddings:
    """embed()'s answer: one L2-normalized vector per input, in order."""
    vectors: list[list[float]]
    prompt_tokens: int                   # the inputs' tokens, all together
    pooling: str                         # "mean", "cls" or "last"
    dim: int


def error_code(exc: BaseException) -> str:
    """The code of an engine error: its class's `code` where it has one ("model_file",
    "budget", "pinned", "model_exists", "context_full", "arena_busy", "gpu_given_up",
    "not_loaded", "device_fault", ...), "not_loaded" for a KeyError naming a model, else
    "internal"."""
    code = getattr(exc, "code", None)
    if isinstance(code, str):
        return code
    if isinstance(exc, KeyError):
        return "not_loaded"
    if isinstance(exc, ValueError):
        return "invalid_value"
    return "internal"


@runtime_checkable
class EngineAPI(Protocol):
    """One small API over the device, its models and their turns on it."""

    device_name: str

    # -- models ------------------------------------------------------------------------------
    def load(self, path: str, name: str | None = None, n_ctx: int | None = None,
             progress: Callable[[int, int], None] | None = None,
             cpu_moe: float = 0.0, mmproj: str | None = None,
             image_max_tokens: int | None = None) -> str:
        """Parse and upload a GGUF file (budget acquired first); its name. mmproj: a vision
        projector file for its images (warm and cold with it); image_max_tokens: an image's
        most soft tokens where the projector sizes images (Qwen3.5; llama.cpp's 4096)."""

    def check(self, path: str, n_ctx: int | None = None, mmproj: str | None = None) -> dict:
        """Whether the file will run here, before loading it (no device work): "runs",
        "problems" (every one, one line each), its architecture, weight types, contexts and
        the VRAM warm and RAM cold it takes at n_ctx (None: the engine's default);
        engine/residency/check.py. A file that is not a readable GGUF raises the error a
        load would. mmproj: with that vision projector (its bytes counted)."""

    def unload(self, name: str) -> None:
        """Free the model's device and host memory."""

    def warm(self, name: str, wait: float | None = None) -> dict:
        """Make a model warm now; the transfer ({"op": None} when it already was)."""

    def evict(self, name: str, full: bool | None = None) -> dict:
        """Make a model cold now (weights-only or full; default: the engine's mode)."""

    def pin(self, name: str) -> None:
        """Keep a model warm: made warm now, never released for another model."""

    def unpin(self, name: str) -> None:
        ...

    # -- settings ----------------------------------------------------------------------------
    def set_flash_attn(self, mode: str) -> None:
        """Prefill attention "auto", "on" or "off", for the models loaded and later loads."""

    def set_budget(self, budget_bytes: int | None) -> int:
        """The VRAM budget in bytes (None: the device's default); the budget now in force."""

    def default_budget(self) -> int:
        """The budget the engine takes when not told: the device heap less a margin."""

    def set_host_budget(self, budget_bytes: int | None) -> int:
        """The RAM for every model's host shadows together, in bytes (None: half the memory
        available at start, or $HOTSEAT_HOST_BUDGET_MIB); past it the least recently used
        KV shadows move to disk. The budget now in force."""

    def set_full_release(self, full: bool) -> None:
        """Whether releases for other models free everything (KV shadowed on the host) or
        only the weights."""

    def set_idle_evict(self, seconds: float, name: str | None = None) -> None:
        """Evict a warm, unpinned model unused for this long (0: never). With a name, that
        model's own idle time, in place of the engine's, until it is unloaded."""

    def subscribe(self, fn: Callable[[str, dict], None]) -> None:
        """fn(event, info) for what the engine does by itself: "idle_evicted" ({"name",
        "idle_s"}), "yielded" ({"until"}), "device_fault" ({"t", "error", "during",
        "lost"})."""

    # -- text and generation -----------------------------------------------------------------
    def tokenizer(self, name: str | None = None):
        """The model's Tokenizer."""

    def prompt_tokens(self, name: str | None, prompt: str | None = None,
                      messages: list[dict] | None = None, images: Sequence = (),
                      template_args: dict | None = None) -> list[int]:
        """The token ids a prompt or a chat becomes for this model; with images (decoded,
        engine/vision/image.py's), one at each media marker of the text, as its media id.
        template_args go to the chat template (tools)."""

    def chat_template(self, name: str | None = None):
        """The model's ChatTemplate (engine/text/chat.py): tool calling reads its source
        and renders tools with it."""

    def generate(self, request: Request, on_text: Callable[[str], None] | None = None,
                 cancel: threading.Event | None = None) -> Completion:
        """One request (Request says what it holds). on_text(piece) gets the answer as it
        comes; with request.logprobs it is called as on_text(piece, [TokenLogprob]) with the
        tokens since the last piece. cancel set: the answer stops at its next token
        (finish_reason "cancelled")."""

    def embed(self, name: str | None, inputs: list, pooling: str | None = None,
              cancel: threading.Event | None = None,
              wait: float | None = None) -> Embeddings:
        """Embeddings of texts or token-id lists: the model's final-normed hidden states,
        pooled ("mean", "cls", "last"; None: the model's declared pooling, else mean) and
        L2-normalized. Runs through the model's KV cache: its prompt cache then holds the
        last input instead of what it held. cancel set: stops between passes (Cancelled);
        wait as for generate."""

    # -- status ------------------------------------------------------------------------------
    def status(self) -> list[dict]:
        """Per model: state, pin, device bytes by kind, host shadow, ..."""

    def vram(self) -> dict:
        """The budget and what is in use."""

    def arena_status(self) -> dict | None:
        """Where this process stands in the cross-process arena, with "gave_up": game mode's
        record (when, free bytes seen, budget, need, the reason in words) while another
        program keeps the engine off the GPU. None without an arena, unless game mode has
        given the GPU up: then {"enabled": False, "state": "cold", "pid", "gave_up"}."""

    def health(self) -> dict:
        """{"status": "ok" | "recovered" (device faults happened and were recovered from) |
        "device_lost", "faults": count, "last_fault": {"t", "error", "during"} or None}."""

    def yielded_until(self) -> float | None:
        """The end (time.time()) of a GPU yield in force, None when there is none."""

    def yield_gpu(self, seconds: float) -> float:
        """Give the GPU to other programs for this long: every Hotseat process goes cold;
        the yield's end."""

    def set_arena_label(self, label: str) -> None:
        """What `hotseat ps` says this process is."""

    # -- tools -------------------------------------------------------------------------------
    def device_job(self, fn: Callable[..., object], name: str | None = None,
                   why: str = "device work"):
        """fn on the engine thread as one job, holding the GPU: with a name, that model is
        made warm first and fn gets its Model; without, fn gets the Vulkan device. For
        benchmarks."""

    def trim(self) -> int:
        """Give spare device blocks back to the driver; the bytes freed."""

    def close(self) -> None:
        ...
