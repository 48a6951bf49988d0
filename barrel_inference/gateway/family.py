"""API families as the core sees them: path prefixes, routes, an error envelope; one status table.

A family registers a `Family`: the path prefixes it owns (`/v1`, `/anthropic`...), its routes, and
`render_error(info) -> body` (its error envelope). Every error the gateway answers, from a bad
field to an unknown path, a wrong method, a too-large body or a crash, is rendered by the family
whose prefix the path has (the longest match), with the status from `STATUS` (a family may
override a code's status: Anthropic answers overload with 529). Paths no family owns get
`{"error": "..."}`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Iterable

from starlette.responses import Response

from ..protocol import ErrorCode, ErrorInfo
from .http import JSONBody

# the one table: typed error code -> HTTP status
STATUS: dict[ErrorCode, int] = {
    ErrorCode.INVALID_REQUEST: 400,
    ErrorCode.CONTEXT_LENGTH: 400,
    ErrorCode.GRAMMAR: 400,
    ErrorCode.TEMPLATE: 400,
    ErrorCode.UNSUPPORTED: 400,
    ErrorCode.MODEL_NOT_FOUND: 404,
    ErrorCode.NOT_FOUND: 404,
    ErrorCode.METHOD_NOT_ALLOWED: 405,
    ErrorCode.REQUEST_TOO_LARGE: 413,
    ErrorCode.FORBIDDEN: 403,
    ErrorCode.UNAUTHENTICATED: 401,
    ErrorCode.UNSUPPORTED_MEDIA_TYPE: 415,
    ErrorCode.OVERLOADED: 503,
    ErrorCode.WORKER_UNAVAILABLE: 503,
    ErrorCode.QUEUE_TIMEOUT: 504,
    ErrorCode.DECODE_FAILED: 500,
    ErrorCode.TOOL_CALL_INVALID: 500,  # the model wrote a call that does not parse or validate
    ErrorCode.OUTPUT_INVALID: 500,  # finished structured output that fails its schema
    ErrorCode.INTERNAL: 500,
}
RETRY_AFTER_S = 1  # sent with every overload / unavailable / queue-timeout answer


def plain_error(info: ErrorInfo, status: int) -> dict:
    """`{"error": "..."}`: Ollama's envelope, and the one for paths no family owns."""
    return {"error": info.message}


@dataclass
class Family:
    name: str  # "openai", "anthropic", "ollama"
    prefixes: tuple[str, ...]  # the paths it owns: "/v1" owns "/v1" and "/v1/..."
    render_error: Callable[[ErrorInfo, int], Any] = plain_error  # (info, status) -> JSON body
    routes: Callable[[], list] = lambda: []
    status_overrides: dict[ErrorCode, int] = field(default_factory=dict)
    aclose: Callable[[Any], Awaitable[None]] | None = None  # aclose(app) at shutdown

    def status(self, code: ErrorCode) -> int:
        return self.status_overrides.get(code, STATUS.get(code, 500))

    def owns(self, path: str) -> int:
        """The length of the longest prefix of `path` this family owns (0: none)."""
        best = 0
        for p in self.prefixes:
            if (path == p or path.startswith(p.rstrip("/") + "/")) and len(p) > best:
                best = len(p)
        return best

    def error_response(
        self, info: ErrorInfo, *, status: int | None = None, headers: dict | None = None, retry_after: float | None = None
    ) -> Response:
        status = status or self.status(info.code)
        headers = dict(headers or {})
        if status in (503, 504, 529) or info.code in (ErrorCode.OVERLOADED, ErrorCode.QUEUE_TIMEOUT):
            headers.setdefault("retry-after", str(max(RETRY_AFTER_S, math.ceil(retry_after or 0))))
        return JSONBody(self.render_error(info, status), status_code=status, headers=headers)

    def error(self, exc: Any, *, headers: dict | None = None) -> Response:
        """A GatewayError in this family's envelope (its retry_after, where known, in the header)."""
        return self.error_response(exc.info, headers=headers, retry_after=getattr(exc, "retry_after", None))


DEFAULT_FAMILY = Family("default", ())


class Families:
    """The registered families; `for_path` picks the one whose prefix a path has."""

    def __init__(self, families: Iterable[Family] = ()) -> None:
        self.all: list[Family] = list(families)

    def for_path(self, path: str) -> Family:
        best, found = 0, DEFAULT_FAMILY
        for fam in self.all:
            n = fam.owns(path)
            if n > best:
                best, found = n, fam
        return found

    def error_response(self, path: str, info: ErrorInfo, *, status: int | None = None, headers: dict | None = None) -> Response:
        return self.for_path(path).error_response(info, status=status, headers=headers)
