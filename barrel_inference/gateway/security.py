"""Browser safety: no web page may drive the daemon.

A page in the user's browser can send requests to 127.0.0.1 (CSRF), or rebind a name it controls
to 127.0.0.1 (DNS rebinding) and then read the answers. BrowserGuard, an ASGI middleware in front
of every route, refuses:
- a `Host` that is not a loopback name, an IP literal, this machine's name or one of
  `allowed_hosts` (a rebound name arrives as the attacker's host name): 403;
- an `Origin` that is not a localhost origin or one of `allowed_origins`: 403 (requests without an
  Origin come from programs, not pages);
- a request body that is not JSON (`text/plain`, forms: what a page can send without a CORS
  preflight): 415.
Allowed origins get CORS headers and their preflights an answer, so local web UIs work.
"""

from __future__ import annotations

import ipaddress
import socket
from typing import Any, Iterable


import msgspec
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..protocol import ErrorCode, ErrorInfo

LOCAL_NAMES = ("localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback")
LOCAL_ORIGIN_SCHEMES = ("http", "https")
SAFE_METHODS = ("GET", "HEAD", "OPTIONS")
JSON_TYPES = ("application/json", "application/x-ndjson")
CORS_METHODS = "GET, POST, PUT, DELETE, OPTIONS"
CORS_HEADERS = "authorization, content-type, x-request-id, x-api-key, anthropic-version, openai-organization"


def _split_host(value: str) -> str:
    """'example.com:8080' -> 'example.com'; '[::1]:80' -> '::1'."""
    value = value.strip().lower()
    if value.startswith("["):
        end = value.find("]")
        return value[1:end] if end > 0 else value
    if value.count(":") == 1:
        return value.split(":", 1)[0]
    return value


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def _is_local_name(host: str) -> bool:
    return host in LOCAL_NAMES or host.endswith(".localhost")


class BrowserGuard:
    def __init__(self, app: ASGIApp, *, allowed_hosts: Iterable[str] = (), allowed_origins: Iterable[str] = (),
                 families: Any = None) -> None:  # fmt: skip
        self.app = app
        self.families = families  # the refusal comes in the envelope of the path's API family
        hosts = {h.strip().lower() for h in allowed_hosts if h.strip()}
        self.any_host = "*" in hosts
        try:
            hosts.add(socket.gethostname().lower())
        except OSError:
            pass
        self.hosts = hosts
        origins = {o.strip().rstrip("/").lower() for o in allowed_origins if o.strip()}
        self.any_origin = "*" in origins
        self.origins = origins

    # ---- checks ---------------------------------------------------------------------------
    def host_allowed(self, host_header: str | None) -> bool:
        if self.any_host or not host_header:
            return True
        host = _split_host(host_header)
        return _is_ip(host) or _is_local_name(host) or host in self.hosts

    def origin_allowed(self, origin: str) -> bool:
        origin = origin.strip().rstrip("/").lower()
        if self.any_origin or origin in self.origins:
            return True
        scheme, sep, rest = origin.partition("://")
        if not sep or scheme not in LOCAL_ORIGIN_SCHEMES:
            return False
        host = _split_host(rest)
        if _is_local_name(host):
            return True
        try:
            return ipaddress.ip_address(host).is_loopback
        except ValueError:
            return False

    # ---- ASGI -----------------------------------------------------------------------------
    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope.get("headers", [])}
        method = scope.get("method", "GET")
        if not self.host_allowed(headers.get("host")):
            await self._refuse(scope, send, 403, "forbidden_host", "this server does not answer to that Host name "
                               "(add it to allowed_hosts in the configuration)")  # fmt: skip
            return
        origin = headers.get("origin")
        if origin is not None and origin != "null" and not self.origin_allowed(origin):
            await self._refuse(scope, send, 403, "forbidden_origin", "requests from that web origin are not allowed "
                               "(add it to allowed_origins in the configuration)")  # fmt: skip
            return
        if origin == "null":
            await self._refuse(scope, send, 403, "forbidden_origin", "requests from an opaque web origin are not allowed")
            return
        if method == "OPTIONS" and origin is not None and "access-control-request-method" in headers:
            await self._preflight(origin, send)
            return
        if method not in SAFE_METHODS and self._has_body(headers):
            ctype = headers.get("content-type", "").split(";", 1)[0].strip().lower()
            if ctype and ctype not in JSON_TYPES and not ctype.endswith("+json"):
                await self._refuse(scope, send, 415, "unsupported_media_type",
                                   f"the request body must be JSON (Content-Type: application/json), not {ctype!r}")  # fmt: skip
                return
        if origin is None:
            await self.app(scope, receive, send)
            return

        async def send_with_cors(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = dict(message)
                message["headers"] = [*message.get("headers", []), *self._cors(origin)]
            await send(message)

        await self.app(scope, receive, send_with_cors)

    @staticmethod
    def _has_body(headers: dict[str, str]) -> bool:
        length = headers.get("content-length")
        return "transfer-encoding" in headers or (length is not None and length.strip() not in ("", "0"))

    @staticmethod
    def _cors(origin: str) -> list[tuple[bytes, bytes]]:
        return [(b"access-control-allow-origin", origin.encode("latin-1")), (b"vary", b"Origin")]

    async def _preflight(self, origin: str, send: Send) -> None:
        headers = [*self._cors(origin), (b"access-control-allow-methods", CORS_METHODS.encode()),
                   (b"access-control-allow-headers", CORS_HEADERS.encode()), (b"access-control-max-age", b"600"),
                   (b"content-length", b"0")]  # fmt: skip
        await send({"type": "http.response.start", "status": 204, "headers": headers})
        await send({"type": "http.response.body", "body": b""})

    async def _refuse(self, scope: Scope, send: Send, status: int, code: str, message: str) -> None:
        path = scope.get("path", "")
        error = ErrorCode.UNSUPPORTED_MEDIA_TYPE if status == 415 else ErrorCode.FORBIDDEN
        info = ErrorInfo(error, message)

        async def no_body() -> Message:
            return {"type": "http.disconnect"}

        if self.families is not None:
            await self.families.error_response(path, info, status=status)(scope, no_body, send)
            return
        data = msgspec.json.encode({"error": message})
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]})  # fmt: skip
        await send({"type": "http.response.body", "body": data})
