"""RequestStream: the gateway's collector for one in-flight request.

The link feeds it the Accepted event, deltas and the final Done as they arrive from the worker;
the HTTP side awaits `opened()` (Accepted or an early Done), then reads events at its own pace. Deltas that pile up while the reader is slow are merged
into one (their parts keep their order; adjacent parts of one kind are joined), so the link's
receive loop never waits for a client (the worker is never blocked by a slow reader).
"""

from __future__ import annotations

import asyncio
import time
from typing import Callable

from ..protocol import Accepted, Delta, Done, merge_parts

Event = Delta | Done


class RequestStream:
    """An async iterator of Delta (merged) events that ends after exactly one Done."""

    def __init__(self, request_id: str, on_abort: Callable[[list[str]], None]) -> None:
        self.id = request_id
        self._on_abort = on_abort
        self._pending: Delta | None = None
        self.accepted: Accepted | None = None  # once it arrived
        self._opened = asyncio.Event()
        self._done: Done | None = None
        self._delivered_done = False
        self._aborted = False
        self._wake = asyncio.Event()
        self._callbacks: list[Callable[[Done], None]] = []
        # timing, monotonic seconds, taken when events arrive (not when they are read)
        self.t_submit = time.monotonic()
        self.t_first_token: float | None = None
        self.t_last_token: float | None = None
        self.token_gaps: list[tuple[float, int]] = []  # (seconds since the previous delta, tokens in it)
        self.n_tokens = 0  # tokens generated so far (as the deltas counted them)

    # ---- fed by the link --------------------------------------------------------------
    def feed_accepted(self, accepted: Accepted) -> None:
        if self._done is not None or self.accepted is not None:
            return
        self.accepted = accepted
        self._opened.set()

    def feed_delta(self, delta: Delta) -> None:
        if self._done is not None:
            return
        now = time.monotonic()
        n = delta.n_tokens or (1 if delta.parts or delta.tokens else 0)
        if n:
            self.n_tokens += n
            if self.t_first_token is None:
                self.t_first_token = now
            elif self.t_last_token is not None:
                self.token_gaps.append((now - self.t_last_token, n))
            self.t_last_token = now
        self._opened.set()  # output implies acceptance (a worker that sent none)
        if self._pending is None:
            self._pending = Delta(id=delta.id, parts=[], tokens=list(delta.tokens), n_tokens=delta.n_tokens, logprobs=list(delta.logprobs))
            merge_parts(self._pending.parts, delta.parts)
        else:
            merge_parts(self._pending.parts, delta.parts)
            self._pending.tokens.extend(delta.tokens)
            self._pending.logprobs.extend(delta.logprobs)
            self._pending.n_tokens += delta.n_tokens
        self._wake.set()

    def feed_done(self, done: Done) -> None:
        if self._done is not None:
            return
        self._done = done
        self._wake.set()
        self._opened.set()
        callbacks, self._callbacks = self._callbacks, []
        for cb in callbacks:
            cb(done)

    def add_done_callback(self, cb: Callable[[Done], None]) -> None:
        """Call cb(done) when the worker's Done arrives (at once if it already has)."""
        if self._done is not None:
            cb(self._done)
        else:
            self._callbacks.append(cb)

    # ---- read by the HTTP side --------------------------------------------------------
    async def opened(self) -> Accepted | Done:
        """Wait until the worker accepted the request (-> Accepted) or ended it first (-> Done)."""
        await self._opened.wait()
        if self.accepted is not None:
            return self.accepted
        if self._done is not None and self._pending is None:
            return self._done
        return Accepted(self.id, prompt_tokens=0)
    @property
    def finished(self) -> bool:
        """True once the worker's Done arrived (whether or not it was read)."""
        return self._done is not None

    @property
    def done(self) -> Done | None:
        return self._done

    def __aiter__(self) -> "RequestStream":
        return self

    async def __anext__(self) -> Event:
        while True:
            if self._pending is not None:
                delta, self._pending = self._pending, None
                return delta
            if self._done is not None:
                if self._delivered_done:
                    raise StopAsyncIteration
                self._delivered_done = True
                return self._done
            self._wake.clear()
            await self._wake.wait()

    def abort(self) -> None:
        """Ask the worker to cancel this request (idempotent, never blocks).

        The worker answers with Done(abort), which still arrives here and ends the stream.
        """
        if self._done is None and not self._aborted:
            self._aborted = True
            self._on_abort([self.id])

    @property
    def aborted(self) -> bool:
        return self._aborted
