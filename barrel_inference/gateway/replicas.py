"""ReplicaSet: the running workers of one model (its `replicas`), seen by callers as one worker.

`ModelManager.get(name)` hands out a ReplicaSet. It has the surface a single worker had: `submit`
routes the request to one replica (gateway/routing.py) and counts the choice; `call` (tokenize,
render, count, stats, embed...) goes to the least loaded live replica; `hello` is a live replica's
with `n_seq_max` the sum over the live ones (the admission queue's capacity); `in_flight` sums them;
`info()` is one entry for the model with a `replicas` list. Residency state (keep_alive, expiry,
last use) belongs to the set: a model is loaded or unloaded as a whole.

A replica that dies fails only its own requests (the link ends them with WORKER_UNAVAILABLE); what
it was known to cache is forgotten, and the manager starts it again while the others serve. A set
whose last replica died is dropped, as a single worker was.
"""

from __future__ import annotations

import math
import time
from typing import Any

import msgspec

from ..devices import Device
from ..protocol import Done, ErrorCode, HelperCall, Submit
from .collector import RequestStream
from .errors import worker_unavailable
from .routing import Candidate, Route, Router


class ReplicaInfo(msgspec.Struct):
    """One replica in /api/ps and /api/stats."""

    replica: int
    alive: bool
    pid: int | None = None
    endpoint: str = ""
    device: str | None = None
    in_flight: int = 0
    n_seq_max: int = 0
    started_at: float | None = None
    load_seconds: float | None = None
    restarts: int = 0
    routed: dict[str, int] = {}  # requests routed to it, by reason
    prompt_tokens: int = 0  # of the requests it finished
    cached_tokens: int = 0
    affinity_entries: int = 0  # prefix fingerprints the router knows it holds


class ReplicaSet:
    def __init__(self, record: Any, opts: Any, devices: list[Device | None], *, remote: bool = False,
                 routing: str = "affinity", metrics: Any = None) -> None:  # fmt: skip
        self.record = record
        self.name: str = record.name
        self.opts = opts  # the engine options it was started with (compared on a config reload)
        self.devices = devices  # one per replica (None: no device given)
        self.remote = remote  # workers that run elsewhere (endpoint / endpoints): only connected to
        self.replicas: list[Any] = [None] * len(devices)  # WorkerHandle per slot, the last one kept once dead
        self.restarts = [0] * len(devices)
        self.routed: list[dict[str, int]] = [{} for _ in devices]
        self.usage = [[0, 0] for _ in devices]  # [prompt tokens, cached tokens] per replica
        self.router = Router(routing)
        self.metrics = metrics
        self.started_at = time.time()
        self.revivers: dict[int, Any] = {}  # replica -> the task starting it again
        # residency (gateway/residency.py): seconds kept after the last request, the unload deadline, LRU clock
        self.keep_alive: float = math.inf
        self.expires_at: float | None = None
        self.last_used = time.time()
        self.on_release: Any = None
        self.unloading = False
        self.stale = False  # its engine settings changed in a config reload: restart it once idle
        self.on_idle: Any = None  # called when a stale set's last request ends
        self._last_hello: Any = None

    # ---- replicas ---------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.replicas)

    def attach(self, index: int, handle: Any) -> None:
        """A started replica takes slot `index`."""
        if self.replicas[index] is not None:
            self.restarts[index] += 1
        handle.replica = index
        handle.set = self
        handle.on_release = self._released
        self.replicas[index] = handle
        self._last_hello = handle.hello

    def detach(self, handle: Any) -> bool:
        """`handle` died or was lost: forget what it cached. False when it no longer holds its slot."""
        index = getattr(handle, "replica", None)
        if index is None or self.replicas[index] is not handle:
            return False
        self.router.affinity.drop(index)
        return True

    def live(self) -> list[Any]:
        return [h for h in self.replicas if h is not None and h.alive]

    @property
    def alive(self) -> bool:
        return not self.unloading and any(h is not None and h.alive for h in self.replicas)

    @property
    def in_flight(self) -> int:
        return sum(h.in_flight for h in self.replicas if h is not None)

    @property
    def waiting(self) -> int:
        return sum(h.waiting for h in self.replicas if h is not None)

    @property
    def hello(self) -> Any:
        """A live replica's Hello; with several, `n_seq_max` is their sum (what the model runs at once)."""
        live = self.live()
        base = live[0].hello if live else self._last_hello
        if len(self.replicas) == 1 or not live:
            return base
        return msgspec.structs.replace(base, n_seq_max=sum(h.hello.n_seq_max for h in live))

    # single-worker conveniences (the first slot's)
    @property
    def process(self) -> Any:
        first = self.replicas[0]
        return first.process if first is not None else None

    @property
    def link(self) -> Any:
        first = self.replicas[0]
        return first.link if first is not None else None

    # ---- requests ---------------------------------------------------------------------
    def submit(self, submit: Submit) -> RequestStream:
        if self.unloading:
            raise worker_unavailable(f"model {self.name} is being unloaded")
        live = self.live()
        if not live:
            raise worker_unavailable(f"no replica of model {self.name} is running")
        if len(self.replicas) == 1:
            route = Route(live[0].replica, "only", [])
        else:
            cands = [Candidate(h.replica, h.in_flight, h.hello.n_seq_max, h.limit) for h in live]
            route = self.router.choose(submit, cands)
        handle = self.replicas[route.index]
        stream = handle.submit(submit)
        stream.replica = route.index
        stream.route = route.reason
        if len(self.replicas) > 1:
            counts = self.routed[route.index]
            counts[route.reason] = counts.get(route.reason, 0) + 1
            if self.metrics is not None:
                self.metrics.routed.labels(self.name, str(route.index), route.reason).inc()
        stream.add_done_callback(lambda done: self._learn(handle, route, stream, done))
        return stream

    def _learn(self, handle: Any, route: Route, stream: RequestStream, done: Done) -> None:
        """The replica finished a request: what its prompt left in that replica's cache."""
        if self.replicas[route.index] is not handle or stream.accepted is None:
            return
        if done.error is not None and done.error.code == ErrorCode.WORKER_UNAVAILABLE:
            return
        usage = self.usage[route.index]
        usage[0] += done.usage.prompt_tokens
        usage[1] += done.usage.cached_tokens
        if route.links and handle.alive:
            self.router.affinity.record(route.index, route.links)

    def _released(self, handle: Any, request_id: str) -> None:
        if self.on_release is not None:
            self.on_release(self, request_id)
        if self.stale and self.in_flight == 0 and self.on_idle is not None:
            self.on_idle(self)

    def least_loaded(self) -> Any:
        live = self.live()
        if not live:
            raise worker_unavailable(f"no replica of model {self.name} is running")
        return min(live, key=lambda h: (h.in_flight, h.waiting, h.replica))

    async def call(self, call: HelperCall, timeout: float = 30.0) -> Any:
        """A helper call on the least loaded live replica."""
        return await self.least_loaded().call(call, timeout)

    # ---- figures ----------------------------------------------------------------------
    def replica_info(self) -> list[ReplicaInfo]:
        out = []
        for i, h in enumerate(self.replicas):
            device = self.devices[i]
            if h is None:
                out.append(ReplicaInfo(replica=i, alive=False, device=device.spec if device else None, restarts=self.restarts[i]))
                continue
            out.append(ReplicaInfo(
                replica=i, alive=h.alive, pid=h.process.pid if h.process else (h.hello.pid or None), endpoint=h.link.endpoint,
                device=device.spec if device else None, in_flight=h.in_flight, n_seq_max=h.hello.n_seq_max,
                started_at=h.started_at, load_seconds=h.load_seconds, restarts=self.restarts[i], routed=dict(self.routed[i]),
                prompt_tokens=self.usage[i][0], cached_tokens=self.usage[i][1],
                affinity_entries=self.router.affinity.entries(i),
            ))  # fmt: skip
        return out

    def info(self) -> Any:
        """One RunningModel for the model: the first live replica's facts, the set's totals, each replica."""
        live = self.live() or [h for h in self.replicas if h is not None]
        info = live[0].info()
        return msgspec.structs.replace(
            info, in_flight=self.in_flight, n_seq_max=sum(h.hello.n_seq_max for h in live),
            size=info.size * max(1, len(live)), started_at=self.started_at, expires_at=self._expires_at(),
            replicas=self.replica_info(),
        )  # fmt: skip

    def _expires_at(self) -> float | None:
        if self.remote or self.keep_alive == math.inf:
            return None
        if self.in_flight > 0 or self.expires_at is None:  # busy: the deadline once it goes idle now
            return time.time() + self.keep_alive
        return self.expires_at
