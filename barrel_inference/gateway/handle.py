"""WorkerHandle: one started worker process (or a worker elsewhere) as the gateway holds it: submit
requests with a per-worker admission limit, make helper calls, describe it (RunningModel).

A model's workers are grouped in a ReplicaSet (gateway/replicas.py); ModelManager (gateway/workers.py)
starts, watches and stops them.
"""

from __future__ import annotations

import math
import time
from typing import Any

import msgspec

from ..protocol import ErrorCode, HelperCall, Hello, Submit
from .collector import RequestStream
from .errors import GatewayError, worker_unavailable
from .link import WorkerLink
from .process import WorkerProcess


class RunningModel(msgspec.Struct):
    """What `ModelManager.running()` says about one loaded model."""

    name: str
    endpoint: str
    remote: bool
    pid: int | None
    started_at: float  # unix time
    in_flight: int
    n_ctx: int
    n_seq_max: int
    architecture: str
    chat_template: str
    path: str = ""
    size: int = 0
    digest: str | None = None
    details: dict = {}
    chat_template_source: str = ""
    expires_at: float | None = None  # unix time the idle model will be stopped; None: never
    engine_profile: str = ""  # "default" or "safe"
    extra_buffers: bool | None = None
    engine_reason: str = ""
    weight_buffers: list[str] = []
    kv_selftest: dict | None = None  # does a saved KV state restore exactly (see EngineInfo)
    kv_unified: bool | None = None  # the KV layout and why (see EngineInfo)
    kv_layout: str = ""
    replicas: list = []  # ReplicaInfo per replica (gateway/replicas.py)


class WorkerHandle:
    """A started worker: submit requests (with admission), make calls."""

    def __init__(self, record: Any, link: WorkerLink, hello: Hello, process: WorkerProcess | None, max_queue: int):
        self.record = record
        self.name: str = record.name
        self.link = link
        self.hello = hello
        self.process = process
        self.started_at = time.time()
        self.load_seconds: float | None = None  # spawn to hello (load and warm-up), for a spawned worker
        self.limit = max(1, hello.n_seq_max) + max(0, max_queue)
        self.in_flight = 0
        self.unloading = False
        # residency (gateway/residency.py): seconds kept after the last request, the unload deadline, LRU clock
        self.keep_alive: float = math.inf
        self.expires_at: float | None = None
        self.last_used = time.time()
        self.on_release: Any = None
        self.opts: Any = None  # the engine options it was started with (None: a worker that runs elsewhere)
        self.stale = False  # its engine settings changed in a config reload: restart it once idle
        self.on_idle: Any = None  # called when a stale handle's last request ends
        self.replica = 0  # its slot in the model's ReplicaSet
        self.set: Any = None  # that ReplicaSet

    @property
    def alive(self) -> bool:
        return self.link.alive and not self.unloading

    @property
    def waiting(self) -> int:
        """Requests in flight beyond the worker's sequences (they queue in the worker)."""
        return max(0, self.in_flight - self.hello.n_seq_max)

    def submit(self, submit: Submit) -> RequestStream:
        if self.unloading:
            raise worker_unavailable(f"model {self.name} is being unloaded")
        if self.in_flight >= self.limit:
            raise GatewayError(
                ErrorCode.OVERLOADED,
                f"model {self.name} is at capacity ({self.in_flight} requests in flight, limit {self.limit}); retry later",
                retryable=True,
            )
        stream = self.link.submit(submit)
        self.in_flight += 1
        stream.add_done_callback(self._release)
        return stream

    def _release(self, done: Any) -> None:
        self.in_flight -= 1
        if self.on_release is not None:
            self.on_release(self, done.id)
        if self.stale and self.in_flight == 0 and self.on_idle is not None:
            self.on_idle(self)

    async def call(self, call: HelperCall, timeout: float = 30.0) -> Any:
        return await self.link.call(call, timeout)

    def info(self) -> RunningModel:
        r, h = self.record, self.hello
        return RunningModel(
            name=self.name, endpoint=self.link.endpoint, remote=self.process is None,
            pid=self.process.pid if self.process else (h.pid or None), started_at=self.started_at,
            in_flight=self.in_flight, n_ctx=h.n_ctx, n_seq_max=h.n_seq_max, architecture=h.architecture,
            chat_template=h.chat_template, path=str(getattr(r, "path", "") or ""), size=int(getattr(r, "size", 0) or 0),
            digest=getattr(r, "digest", None), details=dict(getattr(r, "details", None) or {}),
            chat_template_source=h.chat_template_source, expires_at=self._expires_at(),
            engine_profile=h.engine_info.profile if h.engine_info else "",
            extra_buffers=h.engine_info.extra_buffers if h.engine_info else None,
            engine_reason=h.engine_info.reason if h.engine_info else "",
            weight_buffers=list(h.engine_info.weight_buffers) if h.engine_info else [],
            kv_selftest=h.engine_info.kv_selftest if h.engine_info else None,
            kv_unified=h.engine_info.kv_unified if h.engine_info else None,
            kv_layout=h.engine_info.kv_layout if h.engine_info else "",
        )  # fmt: skip

    def _expires_at(self) -> float | None:
        if self.process is None or self.keep_alive == math.inf:
            return None
        if self.in_flight > 0 or self.expires_at is None:  # busy: the deadline once it goes idle now
            return time.time() + self.keep_alive
        return self.expires_at
