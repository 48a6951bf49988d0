"""The Anthropic family as the core sees it (the package's `family()` returns FAMILY): the paths it owns, its envelope, its statuses.

It owns /v1/messages (and below): every error there, from a bad field to a wrong method, a too-large
body or a crash, comes back as `{"type": "error", "error": {"type", "message"}, "request_id"}` with a
`request-id` header, as the real API sends them.
"""

from __future__ import annotations

from starlette.responses import Response

from ...protocol import ErrorCode, ErrorInfo
from ..family import RETRY_AFTER_S, Family
from ..http import JSONBody, new_id
from .errors import STATUS_OVERRIDES, error_body

PREFIXES = ("/v1/messages",)


def render_error(info: ErrorInfo, status: int) -> dict:
    return error_body(info, status)


class AnthropicFamily(Family):
    def error_response(self, info: ErrorInfo, *, status: int | None = None, headers: dict | None = None) -> Response:
        """The envelope with the request id in the body and in a `request-id` header."""
        headers = dict(headers or {})
        request_id = headers.get("request-id") or headers.get("x-request-id") or new_id("req_")
        headers["request-id"] = request_id
        status = status or self.status(info.code)
        if status in (503, 504, 529):
            headers.setdefault("retry-after", str(RETRY_AFTER_S))
        return JSONBody(error_body(info, status, request_id), status_code=status, headers=headers)


def _routes() -> list:
    from .routes import routes

    return routes()


FAMILY = AnthropicFamily("anthropic", PREFIXES, render_error=render_error, routes=_routes, status_overrides=STATUS_OVERRIDES)


def authentication_error(request_id: str) -> Response:
    info = ErrorInfo(ErrorCode.INVALID_REQUEST, "invalid x-api-key: the key is not in this server's anthropic_api_keys")
    return FAMILY.error_response(info, status=401, headers={"request-id": request_id})
