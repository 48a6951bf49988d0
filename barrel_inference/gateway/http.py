"""HTTP helpers every API family shares: request ids, disconnect races, an event-stream response."""

from __future__ import annotations

import asyncio
import re
import secrets
from typing import Any, Awaitable, Callable, TypeVar

import msgspec
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.types import Receive, Scope, Send

T = TypeVar("T")
_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:\-]{1,128}$")


def new_id(prefix: str) -> str:
    """A fresh id (`chatcmpl-…`, `cmpl-…`): unique, so it can name the request on the worker link."""
    return prefix + secrets.token_hex(12)


def client_request_id(request: Request) -> str | None:
    """The client's X-Request-Id when it is a sane token (logged and echoed, never used as a link id)."""
    given = request.headers.get("x-request-id")
    return given if given and _REQUEST_ID.match(given) else None


class ClientDisconnected(Exception):
    """The HTTP client went away before the answer was ready."""


async def until_disconnect(request: Request, work: Awaitable[T]) -> T:
    """Await `work`, but cancel it and raise ClientDisconnected if the client disconnects first.

    Call after the body was read: the next ASGI message is then `http.disconnect`.
    """
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_wait_disconnect(request.receive))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        if not task.done():
            task.cancel()
        watcher.cancel()
    if task.done() and not task.cancelled():
        return task.result()
    await asyncio.gather(task, return_exceptions=True)
    raise ClientDisconnected()


async def _wait_disconnect(receive: Receive) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return


class EventStreamResponse(StreamingResponse):
    """A streaming response whose `on_close` (synchronous) runs however the stream ends.

    A client disconnect cancels the body iterator's task; cleanup that must reach the worker
    (an Abort) therefore cannot await, and `on_close` runs here even if the iterator never resumed.
    """

    def __init__(self, content: Any, *, on_close: Callable[[], None], media_type: str = "text/event-stream", headers: dict | None = None):
        base_headers = {"cache-control": "no-cache", "x-accel-buffering": "no"}
        super().__init__(content, media_type=media_type, headers={**base_headers, **(headers or {})})
        self._on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._on_close()


class JSONBody(Response):
    """A JSON response encoded with msgspec."""

    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        return msgspec.json.encode(content)
