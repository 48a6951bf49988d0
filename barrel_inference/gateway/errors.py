"""The gateway's typed error: an ErrorInfo raised as an exception.

Every API family maps `GatewayError.info.code` (a protocol ErrorCode) to its own status and body.
"""

from __future__ import annotations

from ..protocol import ErrorCode, ErrorInfo


class GatewayError(Exception):
    """A failure with a typed code, raised anywhere in the gateway and answered by the family."""

    def __init__(
        self, code: ErrorCode, message: str, *, param: str | None = None, retryable: bool = False
    ) -> None:
        super().__init__(message)
        self.info = ErrorInfo(code=code, message=message, retryable=retryable, param=param)

    @classmethod
    def from_info(cls, info: ErrorInfo) -> "GatewayError":
        return cls(info.code, info.message, param=info.param, retryable=info.retryable)

    @property
    def code(self) -> ErrorCode:
        return self.info.code

    @property
    def param(self) -> str | None:
        return self.info.param


def invalid(message: str, param: str | None = None) -> GatewayError:
    return GatewayError(ErrorCode.INVALID_REQUEST, message, param=param)


def unsupported(message: str, param: str | None = None) -> GatewayError:
    return GatewayError(ErrorCode.UNSUPPORTED, message, param=param)


def worker_unavailable(message: str) -> GatewayError:
    return GatewayError(ErrorCode.WORKER_UNAVAILABLE, message, retryable=True)
