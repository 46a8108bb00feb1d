"""The local endpoint's control: start, stop, move it. A mixin of EngineBridge (core.py)."""
from __future__ import annotations

from .endpoint import Endpoint
from .messages import NoEngine
from .observed import ObservedEngine


class EndpointControl:
    """Run on the control lane."""

    def _set_endpoint(self, enabled: bool) -> None:
        if enabled and self._endpoint is None:
            try:
                eng = self._need_engine()
            except NoEngine as exc:
                self.endpoint_changed.emit(False, str(exc))
                return
            models = [(s["name"], s["n_ctx"]) for s in eng.status()]
            ep = Endpoint(ObservedEngine(eng, self), models, self._port, host=self._host,
                          api_key=self._api_key)
            try:
                url = ep.start()
            except OSError as exc:
                why = f"cannot listen on {ep.host}:{self._port}: {exc.strerror or exc}"
                self.endpoint_changed.emit(False, why)
                self.error.emit(f"Local endpoint: {why}", "")
                return
            self._endpoint = ep
            # a load that finished while the endpoint started saw no endpoint to tell
            for s in eng.status():
                ep.add_model(s["name"], s["n_ctx"])
            self.log(f"Endpoint listening on {url}")
            self.endpoint_changed.emit(True, url)
        elif not enabled and self._endpoint is not None:
            self._endpoint.stop()
            self._endpoint = None
            self.log("Endpoint stopped")
            self.endpoint_changed.emit(False, "")
        else:
            running = self._endpoint is not None
            self.endpoint_changed.emit(running, self._endpoint.url if running else "")

    def _move_endpoint(self, port: int | None = None, host: str | None = None,
                       api_key: str | None = None) -> None:
        new = (self._port if port is None else port, self._host if host is None else host,
               self._api_key if api_key is None else api_key)
        changed = new != (self._port, self._host, self._api_key)
        self._port, self._host, self._api_key = new
        if changed and self._endpoint is not None:
            self._set_endpoint(False)
            self._set_endpoint(True)
