"""The jobs the bridge's lanes run on the engine: loads, reloads, model operations, the
chat box's requests. A mixin of EngineBridge (core.py), whose signals they emit."""
from __future__ import annotations

import os
import threading
import time

from engine.facade import Request

from ..activity import Op
from ..errors import describe, summary_of
from .messages import NoEngine, WontRun, load_message, rate_text, sizes_text


class ModelJobs:
    """Run on a lane; each ends by emitting what happened."""

    def _load(self, path: str, name: str | None, pin: bool, n_ctx: int | None,
              cpu_moe: float, mmproj: str | None = None) -> None:
        try:
            self._load_one(path, name, pin, n_ctx, cpu_moe, mmproj=mmproj)
        except Exception as exc:
            if not self._closing:
                self.load_failed.emit(path, summary_of(exc), load_message(path, exc))

    def _load_one(self, path: str, name: str | None, pin: bool, n_ctx: int | None,
                  cpu_moe: float, verb: str = "Loaded", mmproj: str | None = None) -> str:
        """Check the file (with its vision projector), then load it (and pin it); raises
        WontRun for a file the check refuses (the load is not attempted), else what the
        engine raises."""
        eng = self._need_engine()
        self.load_started.emit(path)
        report = eng.check(path, n_ctx, **({"mmproj": mmproj} if mmproj else {}))
        if not report["runs"]:
            raise WontRun(path, report["problems"])
        label = name or os.path.splitext(os.path.basename(path))[0]
        op: list[Op] = []
        last = [-1]

        def progress(done: int, total: int) -> None:
            if not op:                    # the upload runs: the load is on the device now
                op.append(self.activity.begin(label, "load"))
                self.activity.start(op[0])
            pct = done * 100 // total if total else 100
            if pct != last[0] and not self._closing:
                last[0] = pct
                self.load_progress.emit(path, int(done), int(total))

        t0 = time.monotonic()
        kw = {"cpu_moe": cpu_moe} if cpu_moe else {}
        if mmproj:
            kw["mmproj"] = mmproj
        try:
            name = eng.load(path, name=name, n_ctx=n_ctx, progress=progress, **kw)
        finally:
            if op:
                self.activity.end(op[0])
        if pin:
            try:
                eng.pin(name)
            except Exception as exc:
                self.error.emit(*describe(exc))
        if self._endpoint is not None:
            n = next((s["n_ctx"] for s in eng.status() if s["name"] == name), None)
            if n is not None:
                self._endpoint.add_model(name, n)
        self.log(f"{verb} {name} in {time.monotonic() - t0:.1f} s{sizes_text(report)}")
        self.load_finished.emit(path, name)
        self._emit_status()
        return name

    def _reload(self, name: str, n_ctx: int | None, cpu_moe: float) -> None:
        eng = self._need_engine()
        old = next((s for s in eng.status() if s["name"] == name), None)
        if old is None:
            self.error.emit(f"no model named {name!r} is loaded", "")
            return
        eng.unload(name)
        if self._endpoint is not None:
            self._endpoint.remove_model(name)
        self._emit_status()
        pinned = bool(old["pinned"])
        try:
            self._load_one(old["path"], name, pinned, n_ctx, cpu_moe, verb="Reloaded",
                           mmproj=old.get("mmproj"))
        except Exception as exc:
            if self._closing:
                return
            # these options do not work for this model: back to the ones it had
            self.error.emit(f"Could not reload {name} with those settings: "
                            f"{summary_of(exc)}", load_message(old["path"], exc))
            self._load(old["path"], name, pinned, old.get("n_ctx"),
                       float(old.get("cpu_moe") or 0.0), old.get("mmproj"))

    def _call(self, method: str, name: str, op: Op) -> None:
        try:
            eng = self._need_engine()
            self.activity.start(op)
            getattr(eng, method)(name)
        except Exception as exc:
            if not isinstance(exc, (KeyError, ValueError, NoEngine, RuntimeError)):
                raise
            self.error.emit(*describe(exc))
        else:
            if method == "unload" and self._endpoint is not None:
                self._endpoint.remove_model(name)
        finally:
            self.activity.end(op)
        self._emit_status()

    def _generate(self, name: str, prompt: str, max_tokens: int) -> None:
        from engine.text.sampling import SamplingParams

        try:
            out = self._need_engine().generate(Request(name, prompt=prompt, max_tokens=max_tokens,
                                                       sampling=SamplingParams(temperature=0.0)))
        except (KeyError, ValueError, NoEngine) as exc:
            self.error.emit(*describe(exc))
            return
        self.generated.emit(name, out.text)
        self._emit_status()

    def _chat(self, rid: int, name: str, messages: list[dict], max_tokens: int,
              temperature: float, cancel: threading.Event, op: Op) -> None:
        from engine.text.sampling import SamplingParams

        info = {"text": "", "tokens": 0, "finish_reason": "", "tokens_per_s": None,
                "error": ""}

        def on_text(piece: str) -> None:       # on the engine thread
            self.activity.tick(op)
            if not self._closing:
                self.chat_delta.emit(rid, piece)
        # a message's images (bytes) leave it: the request holds them, in order, one for
        # each media marker of the text
        images = [b for m in messages for b in m.get("images", ())]
        messages = [{k: v for k, v in m.items() if k != "images"} for m in messages]
        try:
            eng = self._need_engine()
            self.activity.start(op)
            out = eng.generate(Request(name, messages=messages, max_tokens=max_tokens,
                                       sampling=SamplingParams(temperature=temperature),
                                       images=images),
                               on_text=on_text, cancel=cancel)
        except Exception as exc:
            info["error"] = summary_of(exc)
        else:
            rate = (out.timings or {}).get("decode_tokens_per_s") or op.rate()
            info.update(text=out.text, tokens=len(out.tokens), finish_reason=out.finish_reason,
                        tokens_per_s=rate)
            self.log(f"Chat: {len(out.tokens)} tokens from {name}{rate_text(out.timings)}")
        finally:
            self.activity.end(op)
            self._cancels.pop(rid, None)
        if not self._closing:
            self.chat_done.emit(rid, info)
        self._emit_status()
