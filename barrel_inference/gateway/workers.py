"""ModelManager: one worker per model in use, started on first use, watched, restarted after a crash.

`await get(name)` resolves the name in the registry, starts (or connects to) the model's worker and
returns its WorkerHandle; concurrent calls for one model share one start. A worker runs as a child
process bound at `ipc://{run_dir}/{slug}.sock`, or, when the model's settings name an `endpoint`,
is a worker elsewhere that the gateway only connects to (watched by heartbeat). When a worker dies
its in-flight requests end with a typed WORKER_UNAVAILABLE error and the next `get` starts a fresh
one: the gateway itself never goes down.

Engine crashes: a worker that dies from a crash signal while loading or warming up in the default
engine profile (with llama.cpp's extra buffer types on) is started once more in the safe profile,
and the fallback is remembered (gateway/fallbacks.py) so that the next start goes straight to it.
A model whose worker still fails to start is not started again before a backoff that doubles
with each failure (settings.worker_restart_backoff .. worker_restart_backoff_max); requests in the
meantime get a 503 naming the model and why.

Admission: a model accepts at most n_seq_max + settings.max_queue requests in flight; the next one
gets a typed OVERLOADED error.

Replicas: a model with `replicas = N` runs N workers (each its own process, socket `{slug}-r{n}.sock`,
device, restart backoff and crash fallback), or connects to the N workers of `endpoints`; `get`
returns them as one ReplicaSet (gateway/replicas.py) once every replica has started or failed, with
at least one up. A replica that dies or fails to start is started again in the background (after
its backoff) while the others serve; the set goes when its last replica does.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from typing import Any, Sequence

import zmq.asyncio

from ..config import Settings
from ..devices import Device, device_argv, device_env, parse_device
from ..protocol import ErrorCode
from .errors import GatewayError, WorkerCrashed, worker_unavailable
from .fallbacks import FallbackStore
from .handle import RunningModel, WorkerHandle
from .link import WorkerLink
from .logging import make_logger
from .process import (
    WorkerProcess, default_command, engine_options, ipc_endpoint, replica_slug, template_argv, tool_argv, worker_argv,
)  # fmt: skip
from .replicas import ReplicaSet
from .residency import Residency
from .variants import is_variant, variant_options, with_overrides

UNLOAD_DRAIN_S = 2.0
__all__ = ["ModelManager", "RunningModel", "WorkerHandle", "replica_key"]


class ModelManager:
    def __init__(
        self,
        settings: Settings,
        registry: Any,
        *,
        logger: Any = None,
        worker_command: Sequence[str] | None = None,
        extra_args: Sequence[str] = (),
        heartbeat: tuple[float, float] | None = None,
        stop_timeout: float = 10.0,
        ctx: zmq.asyncio.Context | None = None,
        fallbacks: FallbackStore | None = None,
    ) -> None:
        self.settings = settings
        self.registry = registry
        self.log = logger if logger is not None else make_logger(settings)
        self.command = list(worker_command or default_command()) + list(extra_args)
        # (interval, timeout) of pings to every worker: one silent past the timeout is lost (and restarted)
        self.heartbeat = heartbeat or (settings.heartbeat_interval, settings.heartbeat_timeout)
        self.stop_timeout = stop_timeout  # SIGTERM, then SIGKILL after this many seconds
        self._ctx = ctx
        self._handles: dict[str, ReplicaSet] = {}
        self._starting: dict[str, asyncio.Task[ReplicaSet]] = {}
        self._watchers: set[asyncio.Task] = set()
        self._closed = False
        self.residency = Residency(self, settings, self.log)
        self.metrics: Any = None  # the app's GatewayMetrics: worker starts and exits are counted there
        self.fallbacks = fallbacks if fallbacks is not None else FallbackStore.in_cache_dir(settings.cache_dir())
        self._failures: dict[str, tuple[int, float, str]] = {}  # name (#replica) -> (failures in a row, retry at, why)
        self._retiring: dict[str, asyncio.Task] = {}  # model -> the stop of a worker retired by a reload

    # ---- lookup -----------------------------------------------------------------------
    async def resolve(self, name: str) -> Any:
        """The registry record of `name`; unknown names raise GatewayError(MODEL_NOT_FOUND, param='model')."""
        try:
            record = self.registry.resolve(name)
            if inspect.isawaitable(record):
                record = await record
        except GatewayError:
            raise
        except Exception as exc:
            code = getattr(exc, "code", None)
            if code is None:
                raise
            message = getattr(exc, "message", None) or str(exc)
            if code == "model_not_found":
                raise GatewayError(ErrorCode.MODEL_NOT_FOUND, message, param="model") from exc
            raise GatewayError(ErrorCode.INVALID_REQUEST, message, param="model") from exc
        return record

    async def get(self, name: str, overrides: dict | None = None) -> ReplicaSet:
        """The model's workers (a ReplicaSet); with engine `overrides` (n_ctx, ...) that differ from its own, a
        second worker of that model with them (gateway/variants.py), which `get(handle.name)` then finds by its name."""
        if self._closed:
            raise worker_unavailable("the gateway is shutting down")
        handle = self._handles.get(name)
        if handle is not None and handle.alive and is_variant(handle.record):
            self.residency.claimed(handle)
            return handle
        record = with_overrides(self.settings, await self.resolve(name), overrides)
        handle = self._handles.get(record.name)
        if handle is not None and handle.alive:
            self.residency.claimed(handle)
            return handle
        task = self._starting.get(record.name)
        if task is None:
            task = asyncio.create_task(self._start(record), name=f"start-{record.name}")
            self._starting[record.name] = task
            task.add_done_callback(lambda t, key=record.name: self._starting.pop(key, None))
        handle = await asyncio.shield(task)
        self.residency.claimed(handle)
        return handle

    def current(self, name: str) -> ReplicaSet | None:
        return self._handles.get(name)

    def running(self) -> list[RunningModel]:
        return [h.info() for h in self._handles.values() if h.alive]

    def handles(self) -> list[ReplicaSet]:
        return [h for h in self._handles.values() if h.alive]

    # ---- start ------------------------------------------------------------------------
    def _plan(self, record: Any, opts: Any) -> tuple[list[str | None], list[Device | None]]:
        """(endpoint or None, device or None) per replica. A variant (other engine settings for one client)
        runs as a single worker."""
        if opts.endpoints:
            return list(opts.endpoints), [None] * len(opts.endpoints)
        if opts.endpoint:
            return [opts.endpoint], [None]
        devices = [parse_device(d) for d in opts.devices or []]
        if is_variant(record):
            return [None], devices[:1] or [None]
        n = max(1, opts.replicas or 1)
        return [None] * n, devices if len(devices) == n else [None] * n

    async def _start(self, record: Any) -> ReplicaSet:
        opts = variant_options(self.settings, record)
        endpoints, devices = self._plan(record, opts)
        remote = endpoints[0] is not None
        if not remote:
            await self.residency.make_room(record, copies=len(devices))
        rset = ReplicaSet(record, opts, devices, remote=remote, routing=opts.routing or "affinity", metrics=self.metrics)
        starts = [self._start_replica(rset, i, endpoints[i]) for i in range(len(devices))]
        try:
            results = await asyncio.gather(*starts, return_exceptions=True)
        except BaseException:  # cancelled: what did start must not outlive this
            await asyncio.gather(*(self._stop_replica(h, "the start was cancelled") for h in rset.replicas if h), return_exceptions=True)
            raise
        failed = [r for r in results if isinstance(r, BaseException)]
        if not rset.live():
            await asyncio.gather(*(self._stop_replica(h, "the model failed to start") for h in rset.replicas if h), return_exceptions=True)
            raise failed[0] if failed else worker_unavailable(f"no worker of {record.name} started")
        old = self._handles.get(record.name)
        self._handles[record.name] = rset
        rset.on_release = self.residency.released
        self.residency.loaded(rset)
        for i, result in enumerate(results):
            if isinstance(result, BaseException):
                self.log.error("replica_start_failed", model=record.name, replica=i, error=str(result))
                self._revive_later(rset, i, endpoints[i])
        if old is not None and old is not rset:
            for h in old.replicas:
                if h is not None:
                    self._spawn_task(h.link.close("the worker was replaced"))
        return rset

    async def _start_replica(self, rset: ReplicaSet, index: int, endpoint: str | None) -> WorkerHandle:
        """Start (or connect to) replica `index` of `rset` and put it in its slot."""
        record, opts = rset.record, rset.opts
        timeout = self.settings.worker_start_timeout
        many = len(rset) > 1
        if endpoint:
            link = WorkerLink(
                endpoint, name=record.name, ctx=self._ctx, heartbeat_interval=self.heartbeat[0],
                heartbeat_timeout=self.heartbeat[1], on_lost=self._on_link_lost, watch_connection=True, logger=self.log,
                curve=self._curve_keys(record.name, endpoint, opts),
            )  # fmt: skip
            # a remote worker is either up or not: fail fast (503, retryable) rather than hang the client
            try:
                hello = await link.connect(min(timeout, self.settings.remote_connect_timeout))
            except BaseException:
                await link.close()
                raise
            handle = WorkerHandle(record, link, hello, None, self.settings.max_queue)
            self.log.info("worker_connected", model=record.name, endpoint=endpoint, n_seq_max=hello.n_seq_max,
                          **({"replica": index} if many else {}))  # fmt: skip
        else:
            handle = await self._spawn(record, opts, timeout, index if many else None, rset.devices[index])
        if rset.unloading or self._closed:
            await self._stop_replica(handle, "the model was unloaded while it started")
            raise worker_unavailable(f"model {record.name} was unloaded")
        rset.attach(index, handle)
        return handle

    async def _spawn(self, record: Any, opts: Any, timeout: float, replica: int | None = None,
                     device: Device | None = None) -> WorkerHandle:  # fmt: skip
        """Start one worker of the model: the remembered profile, else default then safe after a crash."""
        key = replica_key(record.name, replica or 0)
        retiring = self._retiring.get(record.name)
        if retiring is not None:
            await asyncio.shield(retiring)
        self._check_backoff(key)
        remembered = self.fallbacks.get(record)
        profile = "safe" if remembered else "default"
        if remembered:
            self.log.info("engine_fallback_remembered", model=record.name, profile="safe", reason=remembered.get("reason"))
        try:
            try:
                handle = await self._spawn_once(record, opts, timeout, profile, replica, device)
            except WorkerCrashed as exc:
                if profile != "default" or exc.extra_buffers is False:
                    raise
                reason = (
                    f"worker for {record.name} was killed by {exc.signal} while loading with llama.cpp's extra "
                    "buffer types on; restarting it in the safe engine profile (extra buffer types off)"
                )
                self.log.error("engine_fallback", model=record.name, signal=exc.signal, profile="safe", reason=reason)
                self.fallbacks.remember(record, profile="safe", reason=reason, signal=exc.signal)
                handle = await self._spawn_once(record, opts, timeout, "safe", replica, device)
        except GatewayError as exc:
            self._note_failure(key, exc.info.message)
            raise
        self._failures.pop(key, None)
        return handle

    def _curve_keys(self, name: str, endpoint: str, opts: Any) -> tuple[str, str] | None:
        """(gateway secret key, worker public key) for a remote worker; plain tcp only when asked for."""
        if opts.server_key:
            if not self.settings.curve_secret_key:
                raise worker_unavailable(
                    f"model {name} has a server_key but the gateway has no curve_secret_key to authenticate with"
                )
            return (self.settings.curve_secret_key, opts.server_key)
        if endpoint.startswith("tcp://") and not opts.insecure:
            raise worker_unavailable(
                f"refusing the unauthenticated worker endpoint {endpoint} for {name}: set server_key (the worker's "
                "public key from `bictl worker keygen`) and curve_secret_key, or insecure = true"
            )
        if endpoint.startswith("tcp://"):
            self.log.warning("insecure_worker_link", model=name, endpoint=endpoint)
        return None

    def reconfigure(self) -> list[str]:
        """After a config reload: a running model whose engine settings changed is stopped once it is
        idle (at once if it is), so that its next request starts it with the new settings. Streams
        that run keep their worker until they end. A new `routing` applies at once. Returns the models
        that will restart."""
        stale = []
        for handle in list(self._handles.values()):
            if handle.remote or handle.stale:
                continue
            fresh = engine_options(self.settings, handle.record)
            if fresh.routing and fresh.routing != handle.router.policy:
                handle.router.policy = handle.opts.routing = fresh.routing
            if fresh != handle.opts:
                handle.stale = True
                handle.on_idle = self._retire
                stale.append(handle.name)
                if handle.in_flight == 0:
                    self._retire(handle)
        return stale

    def _retire(self, handle: ReplicaSet) -> None:
        if self._handles.get(handle.name) is handle:
            del self._handles[handle.name]
            self.log.info("worker_retired", model=handle.name, reason="engine settings changed")
            task = asyncio.create_task(self._stop(handle, "engine settings changed"))
            self._retiring[handle.name] = task  # its successor starts once it is gone (same socket path)
            task.add_done_callback(lambda t, name=handle.name: self._retiring.pop(name, None))

    def _backoff_left(self, key: str) -> float:
        failed = self._failures.get(key)
        return 0.0 if failed is None else max(0.0, failed[1] - time.monotonic())

    def _check_backoff(self, key: str) -> None:
        wait = self._backoff_left(key)
        if wait > 0:
            count, _, why = self._failures[key]
            raise worker_unavailable(
                f"{why}; the worker is not started again for {wait:.0f} s ({count} failed start{'s' * (count > 1)} in a row)",
                retry_after=wait,
            )

    def _note_failure(self, key: str, why: str) -> None:
        count = self._failures.get(key, (0, 0.0, ""))[0] + 1
        delay = min(self.settings.worker_restart_backoff_max, self.settings.worker_restart_backoff * 2 ** (count - 1))
        self._failures[key] = (count, time.monotonic() + delay, why)
        self.log.error("worker_start_backoff", model=key, failures=count, backoff_s=round(delay, 3), reason=why)

    async def _spawn_once(self, record: Any, opts: Any, timeout: float, profile: str, replica: int | None = None,
                          device: Device | None = None) -> WorkerHandle:  # fmt: skip
        run_dir = self.settings.run_dir()
        run_dir.mkdir(parents=True, exist_ok=True)
        endpoint = ipc_endpoint(run_dir, record.name, replica or 0)
        argv = worker_argv(self.command, endpoint, record, opts, profile) + tool_argv(self.settings, record)
        argv += template_argv(self.settings, record)
        argv += ["--kv-dir", str(self.settings.kv_dir() / replica_slug(record.name, replica or 0))] + device_argv(device)
        proc = WorkerProcess(record.name, argv, self.log, env=device_env(device), replica=replica)
        spawned = time.monotonic()
        await proc.start()
        link = WorkerLink(
            endpoint, name=record.name, ctx=self._ctx, heartbeat_interval=self.heartbeat[0],
            heartbeat_timeout=self.heartbeat[1], on_lost=self._on_link_lost, logger=self.log,
        )  # fmt: skip
        connecting = asyncio.create_task(link.connect(timeout))
        exited = asyncio.create_task(proc.wait())
        try:
            await asyncio.wait({connecting, exited}, return_when=asyncio.FIRST_COMPLETED)
        except BaseException:
            connecting.cancel()
            exited.cancel()
            await proc.stop(timeout=2.0)
            raise
        if not connecting.done():  # the process exited before it said hello
            connecting.cancel()
            await asyncio.gather(connecting, return_exceptions=True)
            await link.close()
            reason = proc.describe_exit(" before it was ready")
            self.log.error("worker_start_failed", model=record.name, reason=reason, profile=profile,
                           worker_output=proc.last_output())  # fmt: skip
            if proc.crash_signal is not None:
                extra = proc.engine_profile.get("extra_buffers")
                raise WorkerCrashed(reason, signal=proc.crash_signal, extra_buffers=extra if isinstance(extra, bool) else None)
            raise worker_unavailable(reason)
        try:
            hello = connecting.result()
        except BaseException as exc:
            exited.cancel()
            await proc.stop(timeout=2.0)
            self.log.error("worker_start_failed", model=record.name, reason=str(exc))
            raise
        if hello.pid != proc.pid:  # the socket answered, but not from the process started here
            exited.cancel()
            await link.close()
            await proc.stop(timeout=2.0)
            self.log.error("worker_start_failed", model=record.name, reason="foreign_worker", endpoint=endpoint, pid=hello.pid)
            raise worker_unavailable(f"the worker socket for {record.name} is served by another process, not the worker this gateway started")
        handle = WorkerHandle(record, link, hello, proc, self.settings.max_queue)
        handle.load_seconds = round(time.monotonic() - spawned, 3)
        handle.opts = opts
        self.log.info(
            "worker_ready", model=record.name, pid=proc.pid, endpoint=endpoint, n_ctx=hello.n_ctx,
            n_seq_max=hello.n_seq_max, chat_template=hello.chat_template, **({"replica": replica} if replica is not None else {}),
        )  # fmt: skip
        if self.metrics is not None:
            self.metrics.worker_started(record.name, str(replica or 0))
        watcher = asyncio.create_task(self._watch(handle, exited), name=f"watch-{record.name}")
        self._watchers.add(watcher)
        watcher.add_done_callback(self._watchers.discard)
        return handle

    async def _watch(self, handle: WorkerHandle, exited: asyncio.Task) -> None:
        await exited
        if handle.unloading:
            return
        proc = handle.process
        reason = proc.describe_exit() if proc else "worker exited"
        if self.metrics is not None:
            self.metrics.worker_exited(handle.name, proc.returncode if proc else None, str(handle.replica))
        self.log.error("worker_died", model=handle.name, in_flight=handle.in_flight, reason=reason,
                       worker_output=proc.last_output() if proc else [], **self._replica_field(handle))  # fmt: skip
        info = handle.hello.engine_info
        if proc is not None and proc.crash_signal and info is not None and info.profile == "default" and info.extra_buffers:
            why = (f"worker for {handle.name} was killed by {proc.crash_signal} while serving with llama.cpp's extra "
                   "buffer types on; its next start uses the safe engine profile")  # fmt: skip
            self.log.error("engine_fallback", model=handle.name, signal=proc.crash_signal, profile="safe", reason=why)
            self.fallbacks.remember(handle.record, profile="safe", reason=why, signal=proc.crash_signal)
        handle.link.lose(reason)
        self._replica_lost(handle)
        await handle.link.close(reason)

    @staticmethod
    def _replica_field(handle: WorkerHandle) -> dict:
        return {"replica": handle.replica} if handle.set is not None and len(handle.set) > 1 else {}

    def _replica_lost(self, handle: WorkerHandle, *, revive: bool = True) -> None:
        """A replica died or stopped answering: its set forgets what it cached and starts it again while
        the other replicas serve; a set with no replica left is dropped (the next `get` starts it)."""
        rset = handle.set
        if rset is None or self._handles.get(rset.name) is not rset or not rset.detach(handle):
            return
        if rset.live() and not self._closed:
            if revive:
                self._revive_later(rset, handle.replica, None if handle.process else handle.link.endpoint)
        else:
            self._forget(rset)

    def _revive_later(self, rset: ReplicaSet, index: int, endpoint: str | None) -> None:
        task = rset.revivers.get(index)
        if task is not None and not task.done():
            return
        task = asyncio.create_task(self._revive(rset, index, endpoint), name=f"revive-{rset.name}-{index}")
        rset.revivers[index] = task
        self._watchers.add(task)
        task.add_done_callback(self._watchers.discard)

    async def _revive(self, rset: ReplicaSet, index: int, endpoint: str | None) -> None:
        """Start replica `index` again, after its backoff, until it runs or its set goes."""
        key = replica_key(rset.name, index)
        while not self._closed and not rset.unloading and self._handles.get(rset.name) is rset:
            wait = self._backoff_left(key)
            if wait > 0:
                await asyncio.sleep(wait)
                continue
            try:
                handle = await self._start_replica(rset, index, endpoint)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - tried again after the backoff
                if endpoint or not isinstance(exc, GatewayError):
                    self._note_failure(key, str(exc))
                continue
            self.log.info("replica_restarted", model=rset.name, replica=index, pid=handle.process.pid if handle.process else None)
            return

    def _on_link_lost(self, link: WorkerLink, reason: str) -> None:
        for rset in list(self._handles.values()):
            for handle in rset.replicas:
                if handle is None or handle.link is not link:
                    continue
                self.log.error("worker_lost", model=handle.name, reason=reason, **self._replica_field(handle))
                hung = handle.process is not None and handle.process.returncode is None and not self._closed
                self._replica_lost(handle, revive=not hung)
                if hung:
                    self._spawn_task(self._restart_hung(handle))
        self._spawn_task(link.close(reason))

    async def _restart_hung(self, handle: WorkerHandle) -> None:
        """A worker process that stopped answering is killed and a fresh one started in its place."""
        handle.unloading = True  # its exit is this restart, not a crash
        await handle.process.stop(timeout=1.0)
        self.log.warning("worker_restart", model=handle.name, pid=handle.process.pid, reason="stopped answering")
        rset = handle.set
        if rset is not None and self._handles.get(rset.name) is rset:
            self._revive_later(rset, handle.replica, None)
            return
        try:
            await self.get(handle.name)
        except Exception as exc:  # noqa: BLE001 - the next request tries again
            self.log.error("worker_restart_failed", model=handle.name, error=str(exc))

    def _forget(self, rset: ReplicaSet) -> None:
        if self._handles.get(rset.name) is rset:
            del self._handles[rset.name]
        for task in rset.revivers.values():
            task.cancel()

    def spawn_task(self, coro: Any) -> None:
        self._spawn_task(coro)

    def _spawn_task(self, coro: Any) -> None:
        task = asyncio.create_task(coro)
        self._watchers.add(task)
        task.add_done_callback(self._watchers.discard)

    # ---- stop -------------------------------------------------------------------------
    async def unload(self, name: str, *, only_if_idle: bool = False) -> bool:
        """Abort the model's requests and stop its workers. False when it was not running (or, with
        only_if_idle, when it has requests)."""
        key = name if name in self._handles or name in self._starting else None
        if key is None:
            try:
                key = (await self.resolve(name)).name
            except GatewayError:
                return False
        starting = self._starting.get(key)
        if starting is not None:
            try:
                await asyncio.shield(starting)
            except Exception:
                return False
        handle = self._handles.get(key)
        if handle is None or (only_if_idle and handle.in_flight > 0):
            return False
        del self._handles[key]
        await self._stop(handle, "keep_alive expired" if only_if_idle else "model unloaded")
        return True

    async def _stop(self, rset: ReplicaSet, reason: str) -> None:
        rset.unloading = True
        for task in rset.revivers.values():
            task.cancel()
        self.residency.stopped(rset.name)
        await asyncio.gather(*(self._stop_replica(h, reason) for h in rset.replicas if h is not None), return_exceptions=True)

    async def _stop_replica(self, handle: WorkerHandle, reason: str) -> None:
        handle.unloading = True
        ids = handle.link.in_flight()
        if ids:
            handle.link.abort(ids)
            deadline = time.monotonic() + UNLOAD_DRAIN_S
            while handle.link.in_flight() and time.monotonic() < deadline:
                await asyncio.sleep(0.02)
        await handle.link.close(reason)
        if handle.process is not None:
            rc = await handle.process.stop(self.stop_timeout)
            self.log.info("worker_stopped", model=handle.name, returncode=rc, reason=reason, **self._replica_field(handle))
        else:
            self.log.info("worker_disconnected", model=handle.name, reason=reason, **self._replica_field(handle))

    async def aclose(self) -> None:
        self._closed = True
        self.residency.aclose()
        for task in list(self._starting.values()):
            task.cancel()
        await asyncio.gather(*self._starting.values(), return_exceptions=True)
        handles, self._handles = list(self._handles.values()), {}
        await asyncio.gather(*(self._stop(h, "the gateway is shutting down") for h in handles), return_exceptions=True)
        for task in list(self._watchers):
            task.cancel()
        await asyncio.gather(*self._watchers, return_exceptions=True)


def replica_key(name: str, replica: int) -> str:
    """The restart-backoff key of one replica (the model's own name for the first)."""
    return name if not replica else f"{name}#{replica}"
