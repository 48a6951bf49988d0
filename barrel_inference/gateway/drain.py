"""Draining: what the gateway does between SIGTERM and exit.

1. Stop admitting: every new request gets 503 (in its family's envelope, with retry-after), and
   /health says "draining" with 503 so a load balancer sends traffic elsewhere.
2. Let what runs finish, up to `drain_timeout` seconds.
3. Past it, stop the workers: each stream still running ends with a clean error event (the
   family's), never a cut connection; then the server stops.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from starlette.types import ASGIApp, Receive, Scope, Send

from ..protocol import ErrorCode, ErrorInfo
from .http import JSONBody

OPEN_PATHS = ("/metrics",)  # still answered while draining (figures of the drain itself)


class DrainGate:
    """Refuses new requests once the app drains (app.state.draining)."""

    def __init__(self, app: ASGIApp, state: Any) -> None:
        self.app = app
        self.state = state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not getattr(self.state, "draining", False):
            await self.app(scope, receive, send)
            return
        path = scope.get("path", "")
        if path in OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        if path == "/health":
            await JSONBody({"status": "draining"}, status_code=503, headers={"retry-after": "1"})(scope, receive, send)
            return
        info = ErrorInfo(ErrorCode.WORKER_UNAVAILABLE, "the server is shutting down; retry on another instance", retryable=True)
        await self.state.families.error_response(path, info, headers={"retry-after": "1"})(scope, receive, send)


def in_flight(state: Any) -> int:
    """Requests the gateway still serves: running on a worker, or waiting in an admission queue."""
    running = sum(h.in_flight for h in state.models.handles())
    admission = getattr(state, "admission", None)
    waiting = sum(admission.depths().values()) if admission is not None else 0
    return running + waiting


async def drain(state: Any, timeout: float, log: Any, *, poll: float = 0.05) -> int:
    """Drain as the module doc says; returns how many requests were ended by the deadline."""
    state.draining = True
    start = time.monotonic()
    log.info("drain_started", in_flight=in_flight(state), drain_timeout_s=timeout)
    while in_flight(state) and time.monotonic() - start < timeout:
        await asyncio.sleep(poll)
    left = in_flight(state)
    if left:
        log.warning("drain_timeout", in_flight=left, after_s=round(time.monotonic() - start, 3))
        await state.models.aclose()  # aborts what runs: each stream ends with its family's error event
        end = time.monotonic() + 5.0
        while in_flight(state) and time.monotonic() < end:  # let those last events reach the clients
            await asyncio.sleep(poll)
    log.info("drain_done", ended=left, after_s=round(time.monotonic() - start, 3))
    return left
