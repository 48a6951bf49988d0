"""The request lifecycle every API family shares: decode, resolve, admit, submit, stream or collect, close.

How a family plugs in
---------------------
1. Describe the family once (family.Family): its name, the path prefixes it owns, its error envelope
   `render_error(info, status) -> body`, its routes, and any status it answers differently (Anthropic:
   OVERLOADED -> 529). Expose it as `family() -> Family` in the family package's `__init__` and add the
   package to `app.FAMILIES`. Everything the gateway answers under those prefixes (bad fields, 404, 405,
   413, overload, crashes) then comes back in that envelope.
2. For each generation endpoint write an `Adapter` (subclass the one below) and route to it with
   `Route(path, endpoint(adapter), methods=["POST"])`. An adapter is pure translation:
     decode(body) -> request       msgspec decoding; raise GatewayError naming the field (`invalid(msg, param)`)
     model(req), streaming(req)    the model name the client asked for, whether it wants a stream
     to_submit(req, rid) -> Submit engine terms (protocol.Submit); `rid` is the link id (`id_prefix` + hex)
     encoder(req, ctx)             a StreamEncoder: start() after the worker accepted the request (ctx.accepted
                                   has prompt / cached tokens), event(delta) per merged Delta (ordered typed
                                   parts), finish(done), error(info) for an error after the headers went out
     response(req, ctx, result)    the non-streamed body from a Result (parts in order, text, done, usage)
     media_type                    "text/event-stream" (SSE, with or without `event:` names) or
                                   "application/x-ndjson"; the encoder writes the framing
   `api` labels metrics and log lines ("anthropic.messages").
3. The core does the rest, in this order and nowhere else: read the body (at most max_request_body_bytes,
   413 while reading), decode, convert, resolve the model (404), start its worker (503), wait in the
   model's admission queue (503/529 when full, 504 queue_timeout, removed when the client leaves), submit,
   wait for Accepted (so errors such as context length are still an HTTP status), then stream through the
   encoder or collect into a Result, and close: abort a request the client left, release its slot,
   record metrics and write the request's log line.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any, Callable, Protocol

from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

from ..protocol import Accepted, Delta, Done, ErrorCode, ErrorInfo, FinishReason, Submit
from .auth import permit_model
from .errors import GatewayError
from .family import Family
from .generation import Generation, Result, record_rejected
from .structured import receipt_header
from .http import ClientDisconnected, EventStreamResponse, JSONBody, client_request_id, new_id, until_disconnect
from .sessions import CACHE_MISS_HEADER, prepare

DEFAULT_MAX_BODY = 256 * 1024 * 1024


class StreamEncoder(Protocol):
    """Optional: `keepalive_s` (seconds) and `keepalive() -> bytes`, written whenever nothing else was
    sent for that long (a long prefill, a slow model), so clients and proxies keep the stream open."""

    def start(self) -> bytes: ...
    def event(self, delta: Delta) -> bytes: ...
    def finish(self, done: Done) -> bytes: ...
    def error(self, info: ErrorInfo) -> bytes: ...


@dataclass
class Context:
    """What a response needs besides the request: the link id, names, time, the worker's acceptance."""

    id: str  # the link id (chatcmpl-..., msg_...)
    model: str  # the model name as the client gave it
    created: int  # unix seconds
    accepted: Accepted
    resolved_model: str = ""  # the registry name
    hello: Any = None  # the serving worker's Hello (model, engine build and profile)


class Adapter:
    """One generation endpoint of one family. Subclass and fill in; see the module doc."""

    family: Family
    api: str = ""
    id_prefix: str = "req-"
    media_type: str = "text/event-stream"
    model_access_checked: bool = False  # True: the route already checked the key's model permissions

    def decode(self, body: bytes) -> Any:
        raise NotImplementedError

    def model(self, req: Any) -> str:
        return req.model

    def streaming(self, req: Any) -> bool:
        return bool(getattr(req, "stream", False))

    def to_submit(self, req: Any, rid: str) -> Submit:
        raise NotImplementedError

    def encoder(self, req: Any, ctx: Context) -> StreamEncoder:
        raise NotImplementedError

    def response(self, req: Any, ctx: Context, result: Result) -> Any:
        raise NotImplementedError


def done_error(done: Done) -> ErrorInfo | None:
    """The error a Done stands for: its own, or, for an abort the client did not ask for, an unavailable one."""
    if done.error is not None:
        return done.error
    if done.finish_reason == FinishReason.ABORT:
        return ErrorInfo(ErrorCode.WORKER_UNAVAILABLE, "the request was cancelled by the server (model unloaded)", retryable=True)
    return None


def body_limit(request: Request) -> int:
    settings = getattr(request.app.state, "settings", None)
    return int(getattr(settings, "max_request_body_bytes", DEFAULT_MAX_BODY) or DEFAULT_MAX_BODY)


async def read_body(request: Request, limit: int | None = None) -> bytes:
    """The request body, refused (413, REQUEST_TOO_LARGE) as soon as it passes `limit` bytes while it is
    read: a Content-Length over the limit is refused before reading, a chunked body when it gets there."""
    limit = body_limit(request) if limit is None else limit
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise _too_large(limit)
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise _too_large(limit)
        chunks.append(chunk)
    body = b"".join(chunks)
    request._body = body  # later readers (request.body()) see the same bytes
    return body


def _too_large(limit: int) -> GatewayError:
    return GatewayError(ErrorCode.REQUEST_TOO_LARGE, f"the request body is larger than max_request_body_bytes ({limit} bytes)")


def endpoint(adapter: Adapter) -> Callable:
    """The Starlette endpoint that runs `adapter`'s requests through the lifecycle."""

    async def run(request: Request) -> Response:
        return await serve(request, adapter)

    run.__name__ = adapter.api.replace(".", "_") or "generation"
    return run


async def serve(request: Request, adapter: Adapter) -> Response:
    state = request.app.state
    family = adapter.family
    rid = new_id(adapter.id_prefix)
    request_id = client_request_id(request) or rid
    headers = {"x-request-id": request_id}
    try:
        req = adapter.decode(await read_body(request))
        submit = prepare(adapter.to_submit(req, rid), getattr(state, "normalizer", None), request.headers)
        model = adapter.model(req)
        if not adapter.model_access_checked:
            await permit_model(request.scope, state, model)
    except GatewayError as exc:
        record_rejected(state, api=adapter.api, request_id=request_id, error=exc)
        return family.error(exc, headers=headers)
    except ClientDisconnect:
        return Response(status_code=499)
    stream = adapter.streaming(req)
    created = int(time.time())
    opening = Generation.open(state, api=adapter.api, model=model, submit=submit, stream_response=stream, request_id=request_id)
    try:
        gen = await until_disconnect(request, opening)
    except GatewayError as exc:
        return family.error(exc, headers=headers)
    except ClientDisconnected:
        return Response(status_code=499)
    headers.update(receipt_header(gen.accepted.schema_receipt))
    if gen.accepted.cache_miss:  # known before any output: streamed responses carry it too
        headers[CACHE_MISS_HEADER] = gen.accepted.cache_miss
    ctx = Context(id=rid, model=model, created=created, accepted=gen.accepted, resolved_model=gen.model, hello=gen.hello)
    if stream:
        body = _stream_body(gen, adapter.encoder(req, ctx))
        return EventStreamResponse(body, on_close=gen.close, media_type=adapter.media_type, headers=headers)
    try:
        result = await until_disconnect(request, gen.collect())
    except ClientDisconnected:
        return Response(status_code=499)
    except GatewayError as exc:
        gen.close(exc)
        return family.error(exc, headers=headers)
    finally:
        gen.close()
    if (info := done_error(result.done)) is not None:
        return family.error_response(info, headers=headers)
    return JSONBody(adapter.response(req, ctx, result), headers=headers)


async def admitted_call(request: Request, model: str, call: Any, *, timeout: float = 30.0) -> Any:
    """A helper call (Embed, Tokenize...) that holds one of the model's admission slots while it runs:
    it waits in the model's queue like a generation, and is dropped (and aborted on the worker) if the
    client leaves. Raises GatewayError, ClientDisconnected."""
    state = request.app.state

    async def run() -> Any:
        await permit_model(request.scope, state, model)
        handle = await state.models.get(model)
        admission = getattr(state, "admission", None)
        slot = await admission.acquire(handle.name, handle.hello.n_seq_max) if admission is not None else None
        try:
            if not handle.alive:
                handle = await state.models.get(model)
            return await handle.call(call, timeout)
        finally:
            if slot is not None:
                slot.release()

    return await until_disconnect(request, run())


async def _stream_body(gen: Generation, enc: StreamEncoder):
    try:
        if chunk := enc.start():
            yield chunk
        async for event in _with_keepalive(gen.events(), getattr(enc, "keepalive_s", None)):
            if event is None:
                yield enc.keepalive()
            elif isinstance(event, Delta):
                if chunk := enc.event(event):
                    yield chunk
            elif (info := done_error(event)) is not None:
                yield enc.error(info)
            else:
                yield enc.finish(event)
    finally:
        gen.close()


async def _with_keepalive(events, interval: float | None):
    """`events`, and None whenever nothing came for `interval` seconds (an encoder with `keepalive_s`
    writes a keepalive then, e.g. Anthropic's ping during a long prefill). The pending read is a task
    of its own, so a keepalive never cancels it."""
    if not interval:
        async for event in events:
            yield event
        return
    it = events.__aiter__()
    pending: asyncio.Future | None = None
    try:
        while True:
            pending = asyncio.ensure_future(it.__anext__())
            while not (await asyncio.wait({pending}, timeout=interval))[0]:
                yield None
            try:
                event = pending.result()
            except StopAsyncIteration:
                return
            pending = None
            yield event
    finally:
        if pending is not None and not pending.done():
            pending.cancel()
