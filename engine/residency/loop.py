"""The token loop: a prompt through a model's forward passes, then one token at a time.

`generate()` yields token ids (the KV of the longest cached prefix reused); `request()` is
one request's text over it: streaming, stop strings, cancellation and the arena's safe
points between prefill chunks and decoded tokens.
"""
from __future__ import annotations

import bisect
import threading
import time
from dataclasses import dataclass
from typing import Callable, Iterator

import numpy as np

from ..text.tokenizer import StreamDecoder, Tokenizer
from .model import CHECKPOINT_BACK, Model, media_start


class Cancelled(Exception):
    """A request given up mid-way: while it waited for the arena's token, or during its
    prompt."""


class NonFiniteLogits(RuntimeError):
    """The model's logits held a NaN or an infinity: no token can be chosen."""
    code = "non_finite_logits"


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


def generate(model: Model, prompt: list[int], max_new: int, sample: Callable | None = None,
             stop_ids: set[int] = frozenset(), timings: Timings | None = None,
             between_chunks: Callable[[], None] | None = None,
             logprobs: list | None = None, constraint=None) -> Iterator[int]:
    """Yield up to max_new tokens. sample(logits, history) -> id; None means greedy.
    between_chunks: eval()'s `between`, for the prompt. logprobs: a list that gets, before
    each token is yielded, (id, its log-probability, [(id, log-probability)] of the
    TOP_LOGPROBS best): the log-softmax of the model's own logits, before sampling.
    constraint: a text.constrain Constraint, whose mask the logits pass through before the
    sampler (or the argmax: the device's argmax cannot see the mask, so the logits are
    read); its next mask is computed on its worker thread while the device runs the chosen
    token.

    The KV of the longest cached prefix of `prompt` is reused (at least the last prompt
    token is recomputed, for its logits), of the part prompt passes computed where decode
    rounds otherwise (Model.reusable): the answer is a fresh model's. Recurrent states
    belong to the end of the cache, so with them the cache is reused only when all of it is
    a prefix of prompt[:-1], or up to the model's checkpoint: as llama.cpp's server does,
    the states are also kept CHECKPOINT_BACK tokens before the end of each prompt (the run
    stops there for one host copy of them), where a repeated prompt, or one whose end was
    templated differently, can resume. timings.cached_tokens is what was reused.
    """
    if not prompt:
        raise ValueError("empty prompt")
    t = timings if timings is not None else Timings()
    greedy = sample is None and constraint is None
    reuse = 0
    for a, b in zip(model.cache_tokens[:model.reusable()], prompt[:-1]):
        if a != b:
            break
        reuse += 1
    reuse = media_start(prompt, reuse)
    mark = 0
    if model.recurrent:
        if reuse < len(model.cache_tokens):
            reuse = model.checkpoint_for(prompt)
            if reuse:
                model.resume_checkpoint()
        mark = media_start(prompt, len(prompt) - CHECKPOINT_BACK)
    t.prompt_tokens, t.cached_tokens = len(prompt), reuse
    history = list(prompt)
    want = logprobs is not None
    t0 = time.perf_counter()
    if mark > reuse:
        model.eval(prompt[reuse:mark], reuse, greedy, between_chunks, prompt=True)
        model.save_checkpoint()
        if between_chunks is not None:
            between_chunks()
        reuse = mark
    out = model.eval(prompt[reuse:], reuse, greedy, between_chunks, logprobs=want,
                     prompt=True)
    t.prefill_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    pos = len(prompt)
    for i in range(max_new):
        if want:
            out, top = out
        # NaN or +inf logits (activations past f16's range, a broken file): the device's
        # argmax says so with an id past the vocabulary; a sampler's logits are looked at
        if (out >= model.config.n_vocab) if greedy else not np.isfinite(np.max(out)):
            raise NonFiniteLogits(f"the model produced non-finite logits at token {i + 1} "
                                  f"of the answer (position {pos}): its numbers overflowed "
                                  f"or the file is broken")
        if constraint is not None:
            masked = constraint.apply(out)
            tok = int(np.argmax(masked)) if sample is None else sample(masked, history)
            constraint.advance(tok)              # the next mask, while the device runs tok
        else:
            tok = out if greedy else sample(out, history)
        if want:
            logprobs.append(_token_logprob(tok, out, top))
        t.generated += 1
        yield tok
        history.append(tok)
        if tok in stop_ids or i == max_new - 1 or pos >= model.n_ctx:
            break
        out = model.run([tok], pos, greedy, logprobs=True) if want else \
            model.run([tok], pos, greedy)
        pos += 1
        t.decode_s = time.perf_counter() - t0


def _token_logprob(tok: int, out, top) -> tuple[int, float, list[tuple[int, float]]]:
    """A token's entry from the device's logprobs pass: its own log-probability from the
    top list (greedy: it is the first), else from the logits read back for sampling."""
    lse, lp, ids = top
    ids, lp = ids.tolist(), lp.tolist()
    if tok in ids:
        chosen = lp[ids.index(tok)]
    else:
        chosen = float(out[tok]) - lse
    return tok, chosen, list(zip(ids, lp))


def request(model: Model, tokenizer: Tokenizer, prompt_ids: list[int], max_tokens: int,
            sampler, stop, on_text, cancel: threading.Event,
            turn: Callable[[], None] | None = None, logprobs: list | None = None,
            preserved: frozenset[int] = frozenset(), constraint=None):
    """One request's text: (tokens, text, finish reason, timings). turn() is the arena's
    safe point, between prefill chunks and after every token. A client gone (cancel set)
    stops a long prompt between its chunks too (Cancelled), not after all of it.

    logprobs: a list that gets generate()'s entry of each token kept (those whose text
    starts before a stop string are kept, as llama-server drops a stop string's tokens);
    on_text is then called as on_text(piece, entries), with the entries of the tokens
    generated since the last piece."""
    timings = Timings()
    entries: list | None = [] if logprobs is not None else None
    starts: list[int] = []             # where each token's text starts (for the stop cut)
    sent = 0                           # entries given to on_text so far

    def emit(piece: str, end: int | None = None) -> None:
        """on_text(piece), with the entries of the tokens whose text starts before `end`
        (the text sent with this piece; None: all the rest)."""
        nonlocal sent
        if entries is None:
            on_text(piece)
            return
        upto = len(entries) if end is None else bisect.bisect_left(starts, end)
        on_text(piece, entries[sent:upto])
        sent = max(sent, upto)

    def prompt_point() -> None:
        if cancel.is_set():
            raise Cancelled()
        if turn is not None:
            turn()

    out: list[int] = []
    decoder = StreamDecoder(tokenizer, preserved or False)   # preserved: markers kept
    text, finish = "", "length"
    hold = max((len(s) for s in stop), default=0)    # text held back to catch stop strings
    cut = None
    emitted = 0
    if max_tokens > 0:
        gen = generate(model, prompt_ids, max_tokens,
                       None if sampler is None else sampler.sample,
                       tokenizer.eog_ids, timings, between_chunks=prompt_point,
                       logprobs=entries, constraint=constraint)
        for tok in gen:
            if tok in tokenizer.eog_ids:
                finish = "stop"
                break
            out.append(tok)
            starts.append(len(text))
            text += decoder.push(tok)
            cut = _find_stop(text, stop)
            if cut is not None:
                text, finish = text[:cut], "stop"
                break
            if on_text and len(text) - hold > emitted:
                emit(text[emitted:len(text) - hold], len(text) - hold)
                emitted = len(text) - hold
            if cancel.is_set():
                finish = "cancelled"
                break
            if turn is not None and len(out) < max_tokens:
                turn()
        gen.close()
    if finish == "length":
        text += decoder.flush()
    if entries is not None:
        # one entry per token kept: none for the end-of-generation token, nor for a stop
        # string's own tokens (whose text starts at or after the cut)
        del entries[len(out) if cut is None else bisect.bisect_left(starts, cut):]
        logprobs.extend(entries)
    if on_text and (len(text) > emitted or (entries is not None and sent < len(entries))):
        emit(text[emitted:])
    return out, text, finish, timings


def _find_stop(text: str, stop) -> int | None:
    cuts = [text.find(s) for s in stop if s and s in text]
    return min(cuts) if cuts else None
