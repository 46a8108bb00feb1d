"""Build the HTTP server and start listening: the one way `hotseat serve` and the tray's
endpoint both start it, so that the address it binds and the Host names it answers to
(make_app's host) always agree.

    listening = await listen(engine, names, host="0.0.0.0", port=8080, api_key="...")
    listening.port                       # the bound port (port 0 picks a free one)
    listening.server.add_model(...)      # the app's Server
    await listening.stop()               # cancels running requests, closes the port

Call it on the event loop that serves; it raises OSError when the address cannot be bound.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from .app import SERVER_KEY, make_app

if TYPE_CHECKING:
    from aiohttp import web

    from ..facade import EngineAPI
    from .app import Server


@dataclass
class Listening:
    app: web.Application
    runner: web.AppRunner
    host: str
    port: int

    @property
    def server(self) -> Server:
        return self.app[SERVER_KEY]

    async def stop(self) -> None:
        self.server.cancel_all()
        await self.runner.cleanup()


async def listen(engine: EngineAPI, model_names: list[str], *, host: str, port: int,
                 api_key: str | None = None, cors_origins: list[str] | tuple[str, ...] = (),
                 allow_hosts: list[str] | tuple[str, ...] = (),
                 shutdown_timeout: float = 5.0, fetch_images: bool = False) -> Listening:
    """Serve model_names (already loaded on engine) on host:port. host is both the address
    bound and the Host name the server answers to (with the loopback names, allow_hosts,
    and any IP address when it is 0.0.0.0 or ::)."""
    from aiohttp import web

    app = make_app(engine, model_names, api_key=api_key, cors_origins=cors_origins,
                   host=host, allow_hosts=allow_hosts, fetch_images=fetch_images)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=shutdown_timeout)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    try:
        await site.start()
    except OSError:
        await runner.cleanup()
        raise
    bound = runner.addresses[0][1] if runner.addresses else port
    return Listening(app, runner, host, int(bound))
