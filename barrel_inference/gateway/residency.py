"""Which models stay loaded: keep_alive expiry and a budget of loaded models, as Ollama's scheduler does.

Each request may carry a keep_alive (seconds; 0 = unload once idle; inf = never unload). When a model's
last running request ends, its worker is kept for the keep_alive of the request that ended last (Ollama's
rule), then stopped if it is still idle. A model is never stopped while it has requests.

Before a new worker starts, the budget is checked: at most `max_loaded_models` workers (0 = no limit) and
at most `max_loaded_bytes` of model files loaded together (0 = no limit; the GGUF size is the estimate of
what a model holds in RAM / VRAM). The least recently used idle model is stopped to make room; when every
loaded model is busy the new one is refused with a retryable 503 rather than breaking running streams.

Workers that run elsewhere (a configured endpoint) are only connected to: they never expire.

The unit is a model's ReplicaSet (gateway/replicas.py): its replicas load and unload together, count
as one model, and hold `replicas` copies of the GGUF against max_loaded_bytes.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

from .errors import GatewayError
from .keepalive import FOREVER, format_keep_alive, parse_keep_alive
from ..protocol import ErrorCode

if TYPE_CHECKING:
    from .replicas import ReplicaSet as WorkerHandle
    from .workers import ModelManager

# a model handed out by `get` is kept at least this long for the request that asked for it to submit
CLAIM_GRACE_S = 30.0


class Residency:
    def __init__(self, manager: "ModelManager", settings: Any, logger: Any) -> None:
        self.manager = manager
        self.log = logger
        self.settings = settings
        self.default_keep_alive = parse_keep_alive(getattr(settings, "keep_alive", "5m"), 300.0)
        self.max_models = int(getattr(settings, "max_loaded_models", 0) or 0)
        self.max_bytes = int(getattr(settings, "max_loaded_bytes", 0) or 0)
        for where, ms in [("defaults", getattr(settings, "defaults", None)), *getattr(settings, "models", {}).items()]:
            if ms is not None and getattr(ms, "keep_alive", None) is not None:
                try:
                    parse_keep_alive(ms.keep_alive, 0.0)
                except ValueError as exc:
                    raise ValueError(f"invalid keep_alive for {where}: {exc}") from None
        self._pending: dict[str, float] = {}  # request id -> keep_alive, until its Done
        self._timers: dict[str, asyncio.TimerHandle] = {}
        self.admission: Any = None  # gateway/admission.py, set by the app: slots held count as use

    def busy(self, handle: "WorkerHandle") -> bool:
        """Requests on the worker, or admission slots held (a helper call such as an embedding)."""
        if handle.in_flight > 0:
            return True
        queue = self.admission.queue(handle.name) if self.admission is not None else None
        return bool(queue is not None and (queue.running > 0 or queue.depth > 0))

    def default_for(self, handle: "WorkerHandle") -> float:
        """The keep_alive of a request that did not say: the model's configured one, else the top-level one."""
        base = getattr(handle.record, "base", handle.record)
        model_settings = getattr(self.settings, "model_settings", None)
        value = model_settings(base.name).keep_alive if model_settings is not None else None
        return self.default_keep_alive if value is None else parse_keep_alive(value, self.default_keep_alive)

    # ---- per request ----------------------------------------------------------------
    def request_keep_alive(self, request_id: str, seconds: float | None) -> None:
        """Say how long the model should stay loaded after the request `request_id` (None: the default)."""
        if seconds is not None:
            self._pending[request_id] = seconds
            while len(self._pending) > 10_000:  # requests that never reached a worker leave theirs behind
                self._pending.pop(next(iter(self._pending)))

    def forget_request(self, request_id: str) -> None:
        self._pending.pop(request_id, None)

    def claimed(self, handle: "WorkerHandle") -> None:
        """`get` handed the model to a request: keep it loaded until that request can submit."""
        handle.last_used = time.time()
        if handle.in_flight == 0 and handle.expires_at is not None:
            grace = max(CLAIM_GRACE_S, handle.keep_alive if handle.keep_alive != FOREVER else 0.0)
            handle.expires_at = max(handle.expires_at, time.time() + grace)
            self._schedule(handle)

    def released(self, handle: "WorkerHandle", request_id: str) -> None:
        """A request of `handle` ended: the model's keep_alive becomes that request's."""
        handle.keep_alive = self._pending.pop(request_id, None)
        if handle.keep_alive is None:
            handle.keep_alive = self.default_for(handle)
        if getattr(handle, "unload_when_idle", False):
            handle.keep_alive = 0.0
        handle.last_used = time.time()
        if handle.in_flight > 0:
            return
        self.idle(handle)

    def idle(self, handle: "WorkerHandle") -> None:
        """Start the expiry clock of an idle model."""
        if handle.remote:  # a worker elsewhere: nothing to free here
            handle.expires_at = None
            return
        if handle.keep_alive == FOREVER:
            handle.expires_at = None
            self._cancel(handle.name)
            return
        handle.expires_at = time.time() + handle.keep_alive
        self._schedule(handle)

    def loaded(self, handle: "WorkerHandle") -> None:
        """A worker is up; until a request ends it is kept for the default keep_alive."""
        handle.keep_alive = self.default_for(handle)
        handle.last_used = time.time()
        self.idle(handle)

    def workers_of(self, name: str) -> list["WorkerHandle"]:
        """The workers of the model `name` (registry name): its own and those with other engine settings."""
        return [h for h in self.manager.handles() if h.name == name or getattr(getattr(h.record, "base", None), "name", None) == name]

    async def unload_all(self, name: str) -> bool:
        """Stop every worker of the model `name` now (its requests are aborted): delete, explicit unload."""
        stopped = False
        for handle in self.workers_of(name):
            stopped = await self.manager.unload(handle.name) or stopped
        return stopped

    async def unload_when_idle(self, name: str) -> None:
        """Ollama's keep_alive 0 with no prompt: stop the model's idle workers now, busy ones once their
        requests end (never cutting a stream off)."""
        for handle in self.workers_of(name):
            if handle.remote:  # a worker elsewhere: nothing loaded here to free
                continue
            if self.busy(handle):
                handle.unload_when_idle = True
            else:
                await self.manager.unload(handle.name, only_if_idle=True)

    # ---- expiry ---------------------------------------------------------------------
    def _schedule(self, handle: "WorkerHandle") -> None:
        self._cancel(handle.name)
        if handle.expires_at is None:
            return
        delay = max(0.0, handle.expires_at - time.time())
        loop = asyncio.get_running_loop()
        self._timers[handle.name] = loop.call_later(delay, self._expire, handle)

    def _cancel(self, name: str) -> None:
        timer = self._timers.pop(name, None)
        if timer is not None:
            timer.cancel()

    def _expire(self, handle: "WorkerHandle") -> None:
        self._timers.pop(handle.name, None)
        if handle.expires_at is None or not handle.alive:
            return
        if self.busy(handle):  # in use without a request of its own (a helper call): look again later
            handle.expires_at = time.time() + max(1.0, min(handle.keep_alive, 30.0))
            self._schedule(handle)
            return
        if time.time() < handle.expires_at - 0.001:  # pushed back meanwhile
            self._schedule(handle)
            return
        if self.manager.current(handle.name) is not handle:
            return
        self.log.info("model_expired", model=handle.name, keep_alive=format_keep_alive(handle.keep_alive))
        self.manager.spawn_task(self.manager.unload(handle.name, only_if_idle=True))

    def stopped(self, name: str) -> None:
        self._cancel(name)

    # ---- budget ---------------------------------------------------------------------
    async def make_room(self, record: Any, copies: int = 1) -> None:
        """Stop least recently used idle models until `copies` of `record` (its replicas) fit the budget;
        503 when nothing can go."""
        if not self.max_models and not self.max_bytes:
            return
        need = int(getattr(record, "size", 0) or 0) * max(1, copies)
        while True:
            loaded = [h for h in self.manager.handles() if h.name != record.name]
            count_ok = not self.max_models or len(loaded) < self.max_models
            used = sum(int(getattr(h.record, "size", 0) or 0) * max(1, len(h)) for h in loaded)
            bytes_ok = not self.max_bytes or not loaded or used + need <= self.max_bytes
            if count_ok and bytes_ok:
                return
            idle = sorted((h for h in loaded if not self.busy(h)), key=lambda h: h.last_used)
            if not idle:
                limit = f"max_loaded_models={self.max_models}" if not count_ok else f"max_loaded_bytes={self.max_bytes}"
                raise GatewayError(
                    ErrorCode.OVERLOADED,
                    f"cannot load {record.name}: every loaded model is busy and the budget ({limit}) is full; retry later",
                    retryable=True,
                )
            victim = idle[0]
            self.log.info(
                "model_evicted", model=victim.name, for_model=record.name, loaded=len(loaded),
                max_loaded_models=self.max_models, max_loaded_bytes=self.max_bytes,
            )  # fmt: skip
            await self.manager.unload(victim.name, only_if_idle=True)

    def aclose(self) -> None:
        for name in list(self._timers):
            self._cancel(name)

