"""The Anthropic error envelope: `{"type": "error", "error": {"type", "message"}, "request_id"}`.

Statuses come from the gateway's one table (family.STATUS) with Anthropic's overrides: overload, and a
worker that is down, are 529 overloaded_error (the status the SDKs and Claude Code retry). The error
type follows the status as the real API documents it: 400 invalid_request_error, 401
authentication_error, 403 permission_error, 404 not_found_error, 413 request_too_large, 429
rate_limit_error, 500 api_error, 504 timeout_error, 529 overloaded_error.
"""

from __future__ import annotations

from ...protocol import ErrorCode, ErrorInfo
from ..family import STATUS

STATUS_OVERRIDES = {ErrorCode.OVERLOADED: 529, ErrorCode.WORKER_UNAVAILABLE: 529}
ALIAS_HINT = (
    "; to serve a client's model id with a local model, map it in the config's [aliases] table "
    '(e.g. "claude-sonnet-4-5" = "gemma3:270m") and reload the daemon (SIGHUP), or call the local model by its registry name'
)
_BY_STATUS = {
    400: "invalid_request_error", 401: "authentication_error", 403: "permission_error", 404: "not_found_error",
    405: "invalid_request_error", 413: "request_too_large", 429: "rate_limit_error", 500: "api_error",
    503: "overloaded_error", 504: "timeout_error", 529: "overloaded_error",
}  # fmt: skip


def error_status(info: ErrorInfo) -> int:
    return STATUS_OVERRIDES.get(info.code, STATUS.get(info.code, 500))


def type_of_status(status: int) -> str:
    return _BY_STATUS.get(status, "invalid_request_error" if status < 500 else "api_error")


def envelope(kind: str, message: str, request_id: str | None = None) -> dict:
    body: dict = {"type": "error", "error": {"type": kind, "message": message}}
    if request_id is not None:
        body["request_id"] = request_id
    return body


def error_body(info: ErrorInfo, status: int | None = None, request_id: str | None = None) -> dict:
    """The envelope of a typed error; an unknown model's message says how to alias it."""
    message = info.message
    if info.code == ErrorCode.MODEL_NOT_FOUND and "[aliases]" not in message:
        message += ALIAS_HINT
    return envelope(type_of_status(status or error_status(info)), message, request_id)
