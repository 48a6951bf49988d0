"""The gateway's typed error: an ErrorInfo raised as an exception.

Every API family maps `GatewayError.info.code` (a protocol ErrorCode) to its own status and body.
"""

from __future__ import annotations

from ..protocol import ErrorCode, ErrorInfo


class GatewayError(Exception):
    """A failure with a typed code, raised anywhere in the gateway and answered by the family."""

    def __init__(
        self, code: ErrorCode, message: str, *, param: str | None = None, retryable: bool = False,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message)
        self.info = ErrorInfo(code=code, message=message, retryable=retryable, param=param)
        self.retry_after = retry_after  # seconds a client should wait before retrying, where known

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


def worker_unavailable(message: str, retry_after: float | None = None) -> GatewayError:
    return GatewayError(ErrorCode.WORKER_UNAVAILABLE, message, retryable=True, retry_after=retry_after)


class WorkerCrashed(GatewayError):
    """A worker that died from a crash signal (SIGSEGV, SIGILL, SIGBUS, SIGABRT) before it was ready."""

    def __init__(self, message: str, *, signal: str, extra_buffers: bool | None) -> None:
        super().__init__(ErrorCode.WORKER_UNAVAILABLE, message, retryable=True)
        self.signal = signal
        self.extra_buffers = extra_buffers
