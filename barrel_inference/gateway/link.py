"""WorkerLink: the gateway's ZeroMQ DEALER to one worker's ROUTER.

One receive loop decodes FromWorker messages and routes them: Hello to `connect`, Tick acceptances,
deltas and dones to per-request collectors (RequestStream), helper replies to waiting futures,
anything at all counts as a sign of life for the heartbeat. A message that cannot be decoded fails
the requests and calls it names (read from it loosely), with a typed INTERNAL error. Sends go through a queue drained by one writer task,
so `submit` and `abort` never await (an abort can be sent from a cancelled task's cleanup).

When the worker is lost (its process died, the heartbeat stopped, the link was closed) every
in-flight request ends with Done(error=WORKER_UNAVAILABLE, retryable) and every call gets its
reply with that error.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from typing import Any, Callable

import msgspec
import zmq
import zmq.asyncio
import zmq.utils.monitor

from ..protocol import (
    PROTOCOL_VERSION,
    Abort,
    REPLY_OF,
    Connect,
    Done,
    ErrorCode,
    ErrorInfo,
    FinishReason,
    GatewayCodec,
    HelperCall,
    Hello,
    Ping,
    Pong,
    Reply,
    Submit,
    Tick,
    ToWorker,
)
from ..protocol.curve import CurveError, secure_client
from .collector import RequestStream
from .errors import GatewayError, worker_unavailable

CONNECT_RETRY_S = 1.0


class WorkerLink:
    def __init__(
        self,
        endpoint: str,
        *,
        name: str = "",
        ctx: zmq.asyncio.Context | None = None,
        heartbeat_interval: float | None = None,
        heartbeat_timeout: float | None = None,
        on_lost: Callable[["WorkerLink", str], None] | None = None,
        watch_connection: bool = False,
        logger: Any = None,
        curve: tuple[str, str] | None = None,
    ) -> None:
        self.endpoint = endpoint
        self._curve = curve  # (the gateway's secret key file, the worker's public key file)
        self.name = name or endpoint
        self.hello: Hello | None = None
        self._ctx = ctx or zmq.asyncio.Context.instance()
        self._codec = GatewayCodec()
        self._sock: zmq.asyncio.Socket | None = None
        self._monitor: zmq.asyncio.Socket | None = None  # the connection monitor's PAIR (watch_connection)
        self._outbox: asyncio.Queue[bytes] = asyncio.Queue()
        self._streams: dict[str, RequestStream] = {}
        self._calls: dict[str, tuple[type, asyncio.Future[Reply]]] = {}
        self._call_ids = itertools.count(1)
        self._hello_waiter: asyncio.Future[Hello] | None = None
        self._tasks: list[asyncio.Task] = []
        self._hb_interval = heartbeat_interval
        self._hb_timeout = heartbeat_timeout
        self._on_lost = on_lost
        self._watch_connection = watch_connection
        self._log = logger
        self._last_seen = time.monotonic()
        self._closed = False
        self.lost_reason: str | None = None
        self.last_pong: Pong | None = None

    # ---- lifecycle --------------------------------------------------------------------
    @property
    def alive(self) -> bool:
        return self.hello is not None and self.lost_reason is None and not self._closed

    async def connect(self, timeout: float) -> Hello:
        """Connect and send Connect until the worker says Hello (it may still be loading)."""
        if self._sock is not None:
            raise RuntimeError("connect() called twice")
        sock = self._ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.IMMEDIATE, 1)  # queue only to a completed connection
        sock.setsockopt(zmq.SNDHWM, 0)
        sock.setsockopt(zmq.RCVHWM, 0)
        if self._curve is not None:
            try:
                secure_client(sock, *self._curve)
            except CurveError as exc:
                sock.close(0)
                raise worker_unavailable(f"worker for {self.name}: {exc}") from None
        sock.connect(self.endpoint)
        self._sock = sock
        loop = asyncio.get_running_loop()
        self._hello_waiter = loop.create_future()
        self._tasks = [
            asyncio.create_task(self._recv_loop(), name=f"link-recv-{self.name}"),
            asyncio.create_task(self._send_loop(), name=f"link-send-{self.name}"),
        ]
        deadline = loop.time() + timeout
        try:
            while True:
                if self._outbox.empty():
                    self._send(Connect(client="barrel-inference-gateway"))
                remaining = deadline - loop.time()
                if remaining <= 0:
                    why = " (or refused this gateway's key / did not prove its own)" if self._curve else ""
                    raise worker_unavailable(f"worker for {self.name} did not answer at {self.endpoint} within {timeout:g}s{why}")
                try:
                    hello = await asyncio.wait_for(asyncio.shield(self._hello_waiter), min(CONNECT_RETRY_S, remaining))
                    break
                except asyncio.TimeoutError:
                    continue
            if hello.protocol_version != PROTOCOL_VERSION:
                raise worker_unavailable(
                    f"the worker for {self.name} at {self.endpoint} speaks protocol version {hello.protocol_version}, "
                    f"this gateway speaks {PROTOCOL_VERSION}; run the same barrel-inference version on both"
                )
        except BaseException:
            await self.close()
            raise
        self._last_seen = time.monotonic()
        if self._hb_interval and self._hb_timeout:
            self._tasks.append(asyncio.create_task(self._heartbeat_loop(), name=f"link-hb-{self.name}"))
        if self._watch_connection:
            self._monitor = self._sock.get_monitor_socket(zmq.EVENT_DISCONNECTED)
            self._tasks.append(asyncio.create_task(self._monitor_loop(self._monitor), name=f"link-monitor-{self.name}"))
        return hello

    async def close(self, reason: str = "the link to the worker was closed") -> None:
        if self._closed:
            return
        self._closed = True
        self.fail_all(reason)
        current = asyncio.current_task()
        for t in self._tasks:
            if t is not current:
                t.cancel()
        for t in self._tasks:
            if t is not current:
                try:
                    await t
                except (asyncio.CancelledError, Exception):
                    pass
        if self._sock is not None:
            if self._monitor is not None:
                # the context's I/O thread writes monitor events with a blocking send: stop the monitor
                # before its socket goes, or its next event would freeze that thread for every link
                self._sock.disable_monitor()
                self._monitor.close(linger=0)
            self._sock.close(linger=0)

    def lose(self, reason: str) -> None:
        """The worker is gone: fail everything in flight and tell the owner."""
        if self.lost_reason is not None or self._closed:
            return
        self.lost_reason = reason
        self.fail_all(reason)
        if self._on_lost is not None:
            self._on_lost(self, reason)

    def fail_all(self, reason: str) -> None:
        info = ErrorInfo(code=ErrorCode.WORKER_UNAVAILABLE, message=reason, retryable=True)
        streams, self._streams = self._streams, {}
        for rid, stream in streams.items():
            stream.feed_done(Done(id=rid, finish_reason=FinishReason.ERROR, error=info))
        calls, self._calls = self._calls, {}
        for cid, (kind, fut) in calls.items():
            if not fut.done():
                fut.set_result(kind(id=cid, error=info))

    # ---- requests ---------------------------------------------------------------------
    def in_flight(self) -> list[str]:
        return list(self._streams)

    def submit(self, submit: Submit) -> RequestStream:
        self._check_alive()
        if submit.id in self._streams:
            raise GatewayError(ErrorCode.INVALID_REQUEST, f"request id {submit.id!r} is already in flight")
        body = self._encode(submit)
        stream = RequestStream(submit.id, self.abort)
        self._streams[submit.id] = stream
        self._outbox.put_nowait(body)
        return stream

    def abort(self, ids: list[str]) -> None:
        """Cancel requests; never awaits. Each one still ends with the worker's Done(abort)."""
        ids = [i for i in ids if i in self._streams]
        if ids and self.alive:
            self._send(Abort(ids=ids))

    async def call(self, call: HelperCall, timeout: float = 30.0) -> Any:
        """Send a helper call (Tokenize, Render, Embed...) and await its reply (TokenizeResult...).

        A call still waiting when its task is cancelled (the client left) is aborted on the worker."""
        self._check_alive()
        if not call.id or call.id in self._calls:
            call = msgspec.structs.replace(call, id=f"call-{next(self._call_ids)}")
        body = self._encode(call)
        fut: asyncio.Future[Reply] = asyncio.get_running_loop().create_future()
        self._calls[call.id] = (REPLY_OF[type(call)], fut)
        self._outbox.put_nowait(body)
        try:
            return await asyncio.wait_for(fut, timeout)
        except asyncio.TimeoutError:
            self._abort_call(call.id)
            raise worker_unavailable(f"worker for {self.name} did not answer {type(call).__name__} within {timeout:g}s") from None
        except asyncio.CancelledError:
            self._abort_call(call.id)
            raise
        finally:
            self._calls.pop(call.id, None)

    def _abort_call(self, cid: str) -> None:
        if cid in self._calls and self.alive:
            self._send(Abort(ids=[cid]))

    def _check_alive(self) -> None:
        if not self.alive:
            raise worker_unavailable(self.lost_reason or f"worker for {self.name} is not connected")

    def _send(self, msg: ToWorker) -> None:
        self._outbox.put_nowait(self._codec.encode(msg))

    def _encode(self, msg: ToWorker) -> bytes:
        """A client's request as link bytes; what msgpack cannot carry (an integer beyond 64 bits
        anywhere in a schema or tool) is the client's error, not the server's."""
        try:
            return self._codec.encode(msg)
        except (OverflowError, TypeError, ValueError) as exc:
            raise GatewayError(ErrorCode.INVALID_REQUEST, f"the request holds a value this server cannot carry: {exc}") from None

    # ---- loops ------------------------------------------------------------------------
    async def _send_loop(self) -> None:
        assert self._sock is not None
        try:
            while True:
                body = await self._outbox.get()
                await self._sock.send(body)
        except zmq.ZMQError as exc:
            self.lose(f"the link to the worker for {self.name} failed: {exc}")

    async def _recv_loop(self) -> None:
        assert self._sock is not None
        while True:
            try:
                frames = await self._sock.recv_multipart(copy=True)
            except zmq.ZMQError as exc:
                self.lose(f"the link to the worker for {self.name} failed: {exc}")
                return
            self._last_seen = time.monotonic()
            body = next((f for f in frames if f), None)
            if body is None:
                continue
            try:
                msg = self._codec.decode(body)
            except msgspec.DecodeError as exc:
                self._undecodable(body, exc)
                continue
            try:
                self._dispatch(msg)
            except Exception as exc:  # noqa: BLE001 - one bad message must not stop the link
                self._warn("failed to handle a message from the worker", error=repr(exc))

    async def _monitor_loop(self, monitor: zmq.asyncio.Socket) -> None:
        """A remote worker whose connection drops (it exited, or restarted) loses what was in flight.

        It reads every event until the link closes (close() stops the monitor, then closes its socket):
        the socket reconnects by itself and may report again, and an event nobody reads blocks the
        context's I/O thread."""
        while True:
            event = zmq.utils.monitor.parse_monitor_message(await monitor.recv_multipart())
            if event["event"] == zmq.EVENT_DISCONNECTED:
                self.lose(f"the connection to the worker for {self.name} at {self.endpoint} was lost")

    def _dispatch(self, msg: Any) -> None:
        if isinstance(msg, Tick):
            for accepted in msg.accepted:
                stream = self._streams.get(accepted.id)
                if stream is not None:
                    stream.feed_accepted(accepted)
            for delta in msg.deltas:
                stream = self._streams.get(delta.id)
                if stream is not None:
                    stream.feed_delta(delta)
            for done in msg.done:
                stream = self._streams.pop(done.id, None)
                if stream is not None:
                    stream.feed_done(done)
        elif isinstance(msg, Reply):
            entry = self._calls.pop(msg.id, None)
            if entry is not None and not entry[1].done():
                entry[1].set_result(msg)
        elif isinstance(msg, Hello):
            if self.hello is None:
                self.hello = msg
            if self._hello_waiter is not None and not self._hello_waiter.done():
                self._hello_waiter.set_result(msg)
        elif isinstance(msg, Pong):
            self.last_pong = msg

    def _undecodable(self, body: bytes, exc: Exception) -> None:
        """Fail what a message we cannot decode names: its requests (ids in its accepted / deltas /
        done) and its call (`id`), so none of them waits forever. Everything else goes on."""
        ids: set[str] = set()
        try:
            raw = msgspec.msgpack.decode(body)
        except msgspec.DecodeError:
            raw = None
        if isinstance(raw, dict):
            if isinstance(raw.get("id"), str):
                ids.add(raw["id"])
            for key in ("accepted", "deltas", "done"):
                items = raw.get(key)
                if isinstance(items, list):
                    ids.update(i["id"] for i in items if isinstance(i, dict) and isinstance(i.get("id"), str))
        self._warn("undecodable message from worker", error=str(exc), ids=sorted(ids))
        info = ErrorInfo(ErrorCode.INTERNAL, f"the worker sent a message this gateway cannot decode: {exc}")
        for rid in ids:
            stream = self._streams.pop(rid, None)
            if stream is not None:
                stream.feed_done(Done(id=rid, finish_reason=FinishReason.ERROR, error=info))
                if self.alive:
                    self._send(Abort(ids=[rid]))
            entry = self._calls.pop(rid, None)
            if entry is not None and not entry[1].done():
                entry[1].set_result(entry[0](id=rid, error=info))

    async def _heartbeat_loop(self) -> None:
        assert self._hb_interval and self._hb_timeout
        nonce = 0
        while self.lost_reason is None:
            await asyncio.sleep(self._hb_interval)
            silent = time.monotonic() - self._last_seen
            if silent > self._hb_timeout:
                self.lose(f"worker for {self.name} at {self.endpoint} stopped answering ({silent:.1f}s without a message)")
                return
            nonce += 1
            self._send(Ping(nonce=nonce))

    def _warn(self, event: str, **kw: Any) -> None:
        if self._log is not None:
            self._log.warning(event, model=self.name, **kw)
