"""Who may use the server: the Host names it answers to, the browser origins it lets in, the
media type of request bodies, and the API key on /v1 and /api.

A web page the user visits can send requests to 127.0.0.1 too. Without a preflight a browser
sends GET, and POST with a `text/plain` or form body, and it always says where the page came
from in `Origin`; a DNS-rebinding page reaches the server under its own name, which the
browser sends as `Host`. So every request is refused that names a Host the server was not
told about, carries an Origin not named with --cors-origin, or has a body that is not JSON
(a JSON body from a page needs a preflight, which only allowed origins pass). Requests
without an Origin (curl, the openai client, every non-browser client) are not affected.
"""
from __future__ import annotations

import hmac
import ipaddress
from typing import TYPE_CHECKING, Iterable

from .errors import ApiError

if TYPE_CHECKING:
    from aiohttp import web

LOOPBACK_NAMES = ("127.0.0.1", "localhost", "[::1]")
WILDCARD_BINDS = ("0.0.0.0", "::", "")


def host_name(value: str) -> str:
    """The name part of a Host header or --host value: lower case, without the port;
    an IPv6 address in brackets ("[::1]:8080" and "::1" both give "[::1]")."""
    value = value.strip().lower()
    if value.startswith("["):
        end = value.find("]")
        return value[:end + 1] if end > 0 else value
    if value.count(":") > 1:                 # a bare IPv6 address, as --host takes it
        return f"[{value}]"
    return value.partition(":")[0].rstrip(".")       # "localhost." is localhost


def _is_ip_literal(name: str) -> bool:
    try:
        ipaddress.ip_address(name[1:-1] if name.startswith("[") else name)
    except ValueError:
        return False
    return True


def allowed_host_names(bind: str, extra: Iterable[str] = ()) -> frozenset[str]:
    """The Host names a server bound to `bind` answers to: the loopback names, the bound
    name itself and the `extra` names (--allow-host)."""
    names = {*LOOPBACK_NAMES, *(host_name(n) for n in extra)}
    if bind not in WILDCARD_BINDS:
        names.add(host_name(bind))
    return frozenset(n for n in names if n)


class Access:
    """The Server's checks of a request's Host, Origin, body type and credentials (a mixin:
    it reads `api_key`, `cors_origins`, `allowed_hosts` and `any_ip_host`)."""

    api_key: str | None
    cors_origins: set[str]
    allowed_hosts: frozenset[str]
    any_ip_host: bool                 # bound to every interface: any IP address is a Host

    def _check_access(self, request: web.Request) -> None:
        """Host, Origin and body type; raises the 403 or 415 that refuses the request."""
        self._check_host(request)
        self._check_origin(request)
        self._check_body_type(request)

    def _check_host(self, request: web.Request) -> None:
        raw = request.headers.get("Host")
        if raw is None:                       # HTTP/1.0 without Host: no browser sends that
            return
        name = host_name(raw)
        if name in self.allowed_hosts or (self.any_ip_host and _is_ip_literal(name)):
            return
        # an IP address cannot be rebound, a name can: only the names the server was given
        raise ApiError(403, f"the Host {name!r} is not one this server answers to; start it "
                            "with --allow-host NAME to allow it", None, "host_not_allowed")

    def _origin_allowed(self, origin: str) -> bool:
        return "*" in self.cors_origins or origin in self.cors_origins

    def _check_origin(self, request: web.Request) -> None:
        origin = request.headers.get("Origin")
        if origin is None or self._origin_allowed(origin):
            return
        raise ApiError(403, f"requests from web pages at {origin} are not allowed; start the "
                            "server with --cors-origin ORIGIN to allow them", None,
                       "origin_not_allowed")

    def _check_body_type(self, request: web.Request) -> None:
        if request.method in ("GET", "HEAD", "OPTIONS") or not request.body_exists:
            return
        if request.content_type != "application/json":
            given = request.headers.get("Content-Type") or "none"
            raise ApiError(415, f"request bodies must be application/json (Content-Type: "
                                f"{given})", None, "unsupported_media_type")

    def _check_auth(self, request: web.Request) -> None:
        if self.api_key is None or not request.path.startswith(("/v1/", "/api/")):
            return
        given = request.headers.get("Authorization", "")
        scheme, _, token = given.partition(" ")
        if scheme.lower() != "bearer":          # Anthropic's clients send x-api-key
            token = request.headers.get("x-api-key", "")
        if not token or not hmac.compare_digest(token.strip().encode(), self.api_key.encode()):
            raise ApiError(401, "missing or wrong API key (Authorization: Bearer KEY, or "
                                "x-api-key: KEY)", None, "invalid_api_key")

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
