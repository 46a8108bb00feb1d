"""The management API under /api: list, load, unload, pin, unpin, evict, warm, vram.

It reads the engine's residency; the operations on one model queue behind that model's
generations, so they answer in the order they were asked.
"""
from __future__ import annotations

import math
import os
from typing import TYPE_CHECKING, Any, Callable

from .errors import ApiError, bad, boolean, json_response
from .slots import queued

if TYPE_CHECKING:
    from aiohttp import web


class ManagementRoutes:
    """The /api handlers (a mixin of Server: it uses the engine, the model slots, the device's
    turn and the worker pool)."""

    async def _model_entries(self) -> list[dict]:
        status = await self._run(self.engine.status)    # waits for the engine's lock
        return [_entry(s) for s in status if s["name"] in self.models]

    async def api_models(self, request: web.Request) -> web.Response:
        from .turns import _arena_status

        models = await self._model_entries()
        return json_response({"models": models,
                              "arena": await self._run(_arena_status, self.engine)})

    async def api_load(self, request: web.Request) -> web.Response:
        from ..facade import ModelExists
        from ..formats.bundled import resolve
        from ..formats.gguf_file import ModelFileError
        from ..residency.model import PlacementError

        body = await self._body(request)
        if not isinstance(body, dict):
            raise bad("the request body must be a JSON object", None, "invalid_type")
        path, name = body.get("path"), body.get("name")
        if not isinstance(path, str) or not path:
            raise bad("path must be a GGUF file path or a bundled model name", "path",
                       "invalid_type" if path is not None else "missing_required_parameter")
        if "\0" in path:                     # no file system takes one
            raise bad("path must not contain a NUL character", "path", "invalid_value")
        if name is not None and (not isinstance(name, str) or not name or "/" in name
                                 or name != name.strip() or not name.isprintable()):
            raise bad("name must be a non-empty string of printable characters, without '/' "
                      "or surrounding spaces", "name", "invalid_value")
        cpu_moe = body.get("cpu_moe", 0)
        if isinstance(cpu_moe, bool) or not isinstance(cpu_moe, (int, float)) \
                or not math.isfinite(cpu_moe) or cpu_moe < 0:
            raise bad("cpu_moe must be a number >= 0 (layers of experts kept in host memory)",
                       "cpu_moe", "invalid_value")
        mmproj = body.get("mmproj")
        if mmproj is not None and (not isinstance(mmproj, str) or not mmproj or "\0" in mmproj):
            raise bad("mmproj must be the path of a vision projector GGUF file", "mmproj",
                      "invalid_type")
        try:
            resolved = resolve(path)
            name = name or os.path.splitext(os.path.basename(resolved))[0]
            if name in self.models:
                raise ApiError(409, f"a model named {name!r} is already loaded", "name",
                               "model_exists")
            name = await self._run(self.engine.load, resolved, name, cpu_moe=cpu_moe,
                                   mmproj=mmproj)
        except PlacementError as exc:
            raise bad(str(exc), "cpu_moe", "invalid_value") from None
        except ModelFileError as exc:
            param = "mmproj" if mmproj is not None and exc.path == mmproj else "path"
            raise bad(str(exc), param, "invalid_model_file") from None
        except OSError as exc:
            raise bad(f"{path}: {exc.strerror or exc}", "path", "invalid_model_file") from None
        except ModelExists as exc:          # the engine already holds that name
            raise ApiError(409, str(exc), "name", "model_exists") from None
        except ValueError as exc:           # any other refusal of the request's values
            raise bad(str(exc), "path", "invalid_value") from None
        status = next(s for s in await self._run(self.engine.status) if s["name"] == name)
        self.add_model(name, status["n_ctx"])
        return json_response(_entry(status), 201)

    async def api_unload(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        slot = self.models.get(name)
        if slot is None:
            raise ApiError(404, f"the model {name!r} does not exist", "name", "model_not_found")
        del self.models[name]                 # new requests get a 404 from here on
        async with slot.lock:                 # requests already queued finish first
            slot.closed = True
            await self._run(self.engine.unload, name)
        return json_response({"name": name, "unloaded": True})

    async def _queued(self, name: str, fn: Callable[[], Any]) -> tuple[Any, dict]:
        """Run fn() on a worker thread in the model's queue, behind its generations and at
        the device's turn; returns fn's result and the model's entry after it."""
        slot = self._named(name)
        async with queued(slot, self.turn, name, param="name"):
            def work() -> tuple[Any, dict]:
                out = fn()
                return out, next(_entry(s) for s in self.engine.status()
                                 if s["name"] == name)
            try:
                return await self._run(work)
            except KeyError:                # unloaded on the engine behind our back
                raise ApiError(404, f"the model {name!r} was unloaded", "name",
                               "model_not_found") from None

    async def api_pin(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        _, entry = await self._queued(name, lambda: self.engine.pin(name))
        return json_response(entry)

    async def api_unpin(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        _, entry = await self._queued(name, lambda: self.engine.unpin(name))
        return json_response(entry)

    async def api_evict(self, request: web.Request) -> web.Response:
        name = self._named(request.match_info["name"]).name
        body = await self._body(request, empty={})
        if not isinstance(body, dict):
            raise bad("the request body must be a JSON object", None, "invalid_type")
        full = boolean(body, "full", None)    # None: the server's eviction mode
        info, entry = await self._queued(name, lambda: self.engine.evict(name, full=full))
        return json_response({**entry, "transfer": info})

    async def api_warm(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]

        def warm() -> dict:
            # Engine.warm answers its last transfer even when there was nothing to restore
            was_warm = any(s["name"] == name and s["state"] == "warm"
                           for s in self.engine.status())
            info = self.engine.warm(name)
            return {"op": None, "seconds": 0.0, "bytes": 0} if was_warm else info
        info, entry = await self._queued(name, warm)
        return json_response({**entry, "transfer": info})

    async def api_vram(self, request: web.Request) -> web.Response:
        return json_response(await self._run(self.engine.vram))



def _entry(s: dict) -> dict:
    """A model's /api/models entry, from its engine status."""
    return {"name": s["name"], "path": s["path"], "arch": s["arch"], "n_ctx": s["n_ctx"],
            "state": s["state"], "pinned": s["pinned"], "device_bytes": s["device_bytes"],
            "device_bytes_total": sum(s["device_bytes"].values()),
            "host_shadow_bytes": s["host_shadow_bytes"],
            "ram_bytes": s["ram_bytes"], "disk_bytes": s["disk_bytes"],
            "pinned_host_bytes": s.get("pinned_host_bytes", 0), "warm_bytes": s["warm_bytes"],
            "cpu_moe": s["cpu_moe"], "host_weight_bytes": s["host_weight_bytes"],
            "cached_tokens": s["cached_tokens"], "last_restore": s.get("last_restore"),
            "mmproj": s.get("mmproj")}
