"""The local OpenAI-compatible endpoint, run from the tray: the server `hotseat serve` runs,
started the same way (`engine.server.listen.listen`), in an asyncio loop of its own on a
background thread.

    ep = Endpoint(engine, [("smollm2", 2048)], port=8080)   # host="0.0.0.0", api_key="..."
    url = ep.start()               # raises OSError when the port is taken
    ep.add_model("other", 2048)    # models loaded from the tray while it runs
    ep.stop()

The engine is shared with the tray's lanes; the engine runs all device work on its own
thread, which makes that safe.
"""
from __future__ import annotations

import asyncio
import threading

HOST = "127.0.0.1"
START_TIMEOUT_S = 10.0
STOP_TIMEOUT_S = 10.0


class Endpoint:
    def __init__(self, engine, models: list[tuple[str, int]], port: int, host: str = HOST,
                 api_key: str = ""):
        self.engine = engine
        self.api_key = api_key or None
        self.host, self.port = host, int(port)
        self._models = list(models)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._listening = None            # engine.server.listen.Listening
        self._server = None               # the engine.server.app.Server behind it
        self.url = ""

    def start(self) -> str:
        """Listen; returns the URL. Blocks the calling (worker) thread until bound."""
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever,
                                        name="hotseat-endpoint", daemon=True)
        self._thread.start()
        fut = asyncio.run_coroutine_threadsafe(self._start(), self._loop)
        try:
            self._listening = fut.result(START_TIMEOUT_S)
        except BaseException:
            self._shutdown_loop()
            raise
        self._server = self._listening.server
        self.port = self._listening.port
        shown = "127.0.0.1" if self.host in ("0.0.0.0", "") else self.host
        self.url = f"http://{shown}:{self.port}"
        return self.url

    async def _start(self):
        from engine.server.listen import listen

        listening = await listen(self.engine, [], host=self.host, port=self.port,
                                 api_key=self.api_key, shutdown_timeout=2)
        for name, n_ctx in self._models:
            listening.server.add_model(name, n_ctx)
        return listening

    @property
    def running(self) -> bool:
        return self._listening is not None

    def add_model(self, name: str, n_ctx: int) -> None:
        if self._loop is not None and self._server is not None:
            self._loop.call_soon_threadsafe(self._add, name, n_ctx)

    def _add(self, name: str, n_ctx: int) -> None:
        if name not in self._server.models:
            self._server.add_model(name, n_ctx)

    def remove_model(self, name: str) -> None:
        if self._loop is not None and self._server is not None:
            self._loop.call_soon_threadsafe(self._server.models.pop, name, None)

    def stop(self) -> None:
        if self._loop is None:
            return
        if self._listening is not None:
            fut = asyncio.run_coroutine_threadsafe(self._stop(), self._loop)
            try:
                fut.result(STOP_TIMEOUT_S)
            except Exception:             # a stuck request: drop the loop all the same
                pass
        self._shutdown_loop()

    async def _stop(self) -> None:
        listening, self._listening = self._listening, None
        await listening.stop()

    def _shutdown_loop(self) -> None:
        loop, self._loop = self._loop, None
        loop.call_soon_threadsafe(loop.stop)
        if self._thread is not None:
            self._thread.join(STOP_TIMEOUT_S)
            self._thread = None
        if not loop.is_running():
            loop.close()
        self._listening = None
