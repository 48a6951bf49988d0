"""The Anthropic family as the core sees it (the package's `family()` returns FAMILY): the paths it owns, its envelope, its statuses.

It owns /v1/messages (and below): every error there, from a bad field to a wrong method, a too-large
body or a crash, comes back as `{"type": "error", "error": {"type", "message"}, "request_id"}` with a
`request-id` header, as the real API sends them.
"""

from __future__ import annotations

from starlette.responses import Response

from ...protocol import ErrorCode, ErrorInfo
from ..family import Family
from ..http import JSONBody, new_id
from .errors import STATUS_OVERRIDES, error_body

PREFIXES = ("/v1/messages",)


def render_error(info: ErrorInfo, status: int) -> dict:
    return error_body(info, status)


class AnthropicFamily(Family):
    def error_response(
        self, info: ErrorInfo, *, status: int | None = None, headers: dict | None = None, retry_after: float | None = None
    ) -> Response:
        """The core's answer (status, retry-after), with the request id in the body and a `request-id` header."""
        headers = dict(headers or {})
        request_id = headers.get("request-id") or headers.get("x-request-id") or new_id("req_")
        headers["request-id"] = request_id
        base = super().error_response(info, status=status, headers=headers, retry_after=retry_after)
        kept = {k: v for k, v in base.headers.items() if k not in ("content-length", "content-type")}
        return JSONBody(error_body(info, base.status_code, request_id), status_code=base.status_code, headers=kept)


def _routes() -> list:
    from .routes import routes

    return routes()


FAMILY = AnthropicFamily("anthropic", PREFIXES, render_error=render_error, routes=_routes, status_overrides=STATUS_OVERRIDES)

