"""Who may use the server: the API key on /v1 and /api, and the browser origins CORS lets in."""
from __future__ import annotations

import hmac
from typing import TYPE_CHECKING

from .errors import ApiError

if TYPE_CHECKING:
    from aiohttp import web


class Access:
    """The Server's checks of a request's credentials and origin (a mixin: it reads
    `api_key` and `cors_origins`)."""

    api_key: str | None
    cors_origins: set[str]

    def _check_auth(self, request: web.Request) -> None:
        if self.api_key is None or not request.path.startswith(("/v1/", "/api/")):
            return
        given = request.headers.get("Authorization", "")
        scheme, _, token = given.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(),
                                                                 self.api_key.encode()):
            raise ApiError(401, "missing or wrong API key (Authorization: Bearer KEY)",
                           None, "invalid_api_key")

    def _cors_origin(self, request: web.Request) -> str | None:
        origin = request.headers.get("Origin")
        if "*" in self.cors_origins:
            return "*"
        return origin if origin in self.cors_origins else None

    def _preflight(self, request: web.Request) -> web.Response:
        from aiohttp import web

        headers = {"Access-Control-Allow-Methods": "GET, POST, DELETE, OPTIONS",
                   "Access-Control-Allow-Headers":
                       request.headers.get("Access-Control-Request-Headers",
                                           "Authorization, Content-Type"),
                   "Access-Control-Max-Age": "600"}
        return web.Response(status=204, headers=headers)

    async def on_prepare(self, request: web.Request, resp: web.StreamResponse) -> None:
        if not self.cors_origins:
            return
        origin = self._cors_origin(request)
        if origin is not None:
            resp.headers["Access-Control-Allow-Origin"] = origin
            resp.headers["Vary"] = "Origin"
