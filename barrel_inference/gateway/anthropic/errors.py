"""The Anthropic error envelope: `{"type": "error", "error": {"type", "message"}, "request_id"}`.

Statuses and types as the real API documents them: 400 invalid_request_error, 401
authentication_error, 403 permission_error, 404 not_found_error, 413 request_too_large, 500
api_error, 504 timeout_error, 529 overloaded_error (with retry-after). Bad input is never a 500.
"""

from __future__ import annotations

from ...protocol import ErrorInfo

# protocol ErrorCode value (and the gateway's own codes) -> (status, Anthropic error type)
_BY_CODE: dict[str, tuple[int, str]] = {
    "invalid_request": (400, "invalid_request_error"),
    "context_length_exceeded": (400, "invalid_request_error"),
    "grammar_error": (400, "invalid_request_error"),
    "template_error": (400, "invalid_request_error"),
    "unsupported": (400, "invalid_request_error"),
    "authentication": (401, "authentication_error"),
    "permission": (403, "permission_error"),
    "forbidden": (403, "permission_error"),
    "model_not_found": (404, "not_found_error"),
    "not_found": (404, "not_found_error"),
    "request_too_large": (413, "request_too_large"),
    "overloaded": (529, "overloaded_error"),
    "worker_unavailable": (529, "overloaded_error"),
    "queue_timeout": (504, "timeout_error"),
    "decode_failed": (500, "api_error"),
    "internal": (500, "api_error"),
}
_BY_STATUS = {
    400: "invalid_request_error", 401: "authentication_error", 403: "permission_error", 404: "not_found_error",
    405: "invalid_request_error", 413: "request_too_large", 429: "rate_limit_error", 500: "api_error",
    503: "overloaded_error", 504: "timeout_error", 529: "overloaded_error",
}  # fmt: skip
RETRY_AFTER_S = 1


def _code(info: ErrorInfo) -> str:
    return getattr(info.code, "value", info.code)


def error_status(info: ErrorInfo) -> int:
    return _BY_CODE.get(_code(info), (500, "api_error"))[0]


def error_type(info: ErrorInfo) -> str:
    return _BY_CODE.get(_code(info), (500, "api_error"))[1]


def type_of_status(status: int) -> str:
    return _BY_STATUS.get(status, "invalid_request_error" if status < 500 else "api_error")


def error_body(info: ErrorInfo, request_id: str | None = None) -> dict:
    """The envelope of a typed error (request_id included when there is one)."""
    return envelope(error_type(info), info.message, request_id)


def envelope(kind: str, message: str, request_id: str | None = None) -> dict:
    body: dict = {"type": "error", "error": {"type": kind, "message": message}}
    if request_id is not None:
        body["request_id"] = request_id
    return body


def error_headers(status: int, request_id: str | None) -> dict[str, str]:
    headers = {"retry-after": str(RETRY_AFTER_S)} if status in (503, 529) else {}
    if request_id is not None:
        headers["request-id"] = request_id
    return headers
