"""Admission: per model, at most n_seq_max requests on the worker, and a bounded FIFO of the rest.

A request waits for a free sequence in its model's queue. When the queue already holds `max_queue`
waiters it is refused at once (OVERLOADED, retryable: 503, or 529 for Anthropic, with retry-after);
one that waited `queue_timeout_ms` gets QUEUE_TIMEOUT (504); one whose client left (its task was
cancelled) is removed from the queue. A freed slot goes to the oldest waiter. Generations and
embeddings share a model's slots.

Figures: `barrel_inference_requests_waiting` (queue depth), `barrel_inference_queue_wait_seconds`
(time spent waiting, admitted or not), `barrel_inference_queue_rejections_total{reason}` (full,
timeout, disconnected).
"""

from __future__ import annotations

import asyncio
import collections
import time
from typing import Any

from ..protocol import ErrorCode
from .errors import GatewayError

DEFAULT_QUEUE_TIMEOUT_MS = 60_000


class Slot:
    """A held place on the worker; `release()` is idempotent and never awaits."""

    __slots__ = ("_queue", "_released")

    def __init__(self, queue: "ModelQueue") -> None:
        self._queue = queue
        self._released = False

    def release(self, *_: Any) -> None:
        if not self._released:
            self._released = True
            self._queue._release()


class ModelQueue:
    def __init__(self, name: str, metrics: Any = None) -> None:
        self.name = name
        self.capacity = 1
        self.running = 0
        self._waiters: collections.deque[asyncio.Future[Slot]] = collections.deque()
        self._metrics = metrics

    @property
    def depth(self) -> int:
        return len(self._waiters)

    async def acquire(self, capacity: int, max_queue: int, timeout_s: float) -> Slot:
        self.capacity = max(1, capacity)
        if self.running < self.capacity and not self._waiters:
            self.running += 1
            self._observe_wait(0.0)
            return Slot(self)
        if len(self._waiters) >= max(0, max_queue):
            self._reject("full")
            raise GatewayError(
                ErrorCode.OVERLOADED,
                f"model {self.name} is at capacity ({self.running} running, {len(self._waiters)} waiting, "
                f"max_queue {max_queue}); retry later",
                retryable=True,
            )
        fut: asyncio.Future[Slot] = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        self._set_depth()
        t0 = time.monotonic()
        try:
            return await asyncio.wait_for(asyncio.shield(fut), timeout_s)
        except asyncio.TimeoutError:
            if fut.done() and not fut.cancelled():  # admitted in the same instant: give the slot back
                fut.result().release()
            self._reject("timeout")
            raise GatewayError(
                ErrorCode.QUEUE_TIMEOUT,
                f"waited {timeout_s * 1000:.0f} ms (queue_timeout_ms) for a free sequence of model {self.name}; retry later",
                retryable=True,
            ) from None
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():
                fut.result().release()
            self._reject("disconnected")
            raise
        finally:
            self._observe_wait(time.monotonic() - t0)
            if not fut.done():
                fut.cancel()
            try:
                self._waiters.remove(fut)
            except ValueError:
                pass
            self._set_depth()

    def _release(self) -> None:
        self.running -= 1
        while self._waiters and self.running < self.capacity:
            fut = self._waiters.popleft()
            if fut.done():
                continue
            self.running += 1
            fut.set_result(Slot(self))
        self._set_depth()

    # ---- figures ----------------------------------------------------------------------
    def _set_depth(self) -> None:
        if self._metrics is not None:
            self._metrics.waiting.labels(self.name).set(len(self._waiters))

    def _observe_wait(self, seconds: float) -> None:
        if self._metrics is not None:
            self._metrics.queue_wait.labels(self.name).observe(seconds)

    def _reject(self, reason: str) -> None:
        if self._metrics is not None:
            self._metrics.rejections.labels(self.name, reason).inc()


class Admission:
    """The queues of every model, by registry name, with their settings."""

    def __init__(self, settings: Any, metrics: Any = None) -> None:
        self.settings = settings
        self.metrics = metrics
        self._queues: dict[str, ModelQueue] = {}

    def queue(self, name: str) -> ModelQueue:
        q = self._queues.get(name)
        if q is None:
            q = self._queues[name] = ModelQueue(name, self.metrics)
        return q

    def limits(self, name: str) -> tuple[int, float]:
        """(max_queue, timeout seconds) of a model: [models."name"], then [defaults], then the top-level max_queue."""
        ms = self.settings.model_settings(name) if hasattr(self.settings, "model_settings") else None
        max_queue = getattr(ms, "max_queue", None)
        if max_queue is None:
            max_queue = getattr(self.settings, "max_queue", 256)
        timeout_ms = getattr(ms, "queue_timeout_ms", None) or DEFAULT_QUEUE_TIMEOUT_MS
        return int(max_queue), timeout_ms / 1000.0

    async def acquire(self, name: str, capacity: int) -> Slot:
        max_queue, timeout_s = self.limits(name)
        return await self.queue(name).acquire(capacity, max_queue, timeout_s)

    def forget(self, name: str) -> None:
        """Drop the queue of a deleted model when nothing waits in it (its gauges go with it)."""
        q = self._queues.get(name)
        if q is not None and q.depth == 0:
            del self._queues[name]

    def depths(self) -> dict[str, int]:
        return {name: q.depth for name, q in self._queues.items()}
