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
"""

from __future__ import annotations

import asyncio
import inspect
import math
import time
from typing import Any, Sequence

import msgspec
import zmq.asyncio

from ..config import Settings
from ..protocol import ErrorCode, HelperCall, Hello, Submit
from .collector import RequestStream
from .errors import GatewayError, WorkerCrashed, worker_unavailable
from .fallbacks import FallbackStore
from .link import WorkerLink
from .logging import make_logger
from .process import WorkerProcess, default_command, engine_options, ipc_endpoint, slug, template_argv, tool_argv, worker_argv
from .residency import Residency
from .variants import is_variant, variant_options, with_overrides

UNLOAD_DRAIN_S = 2.0


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
        )  # fmt: skip

    def _expires_at(self) -> float | None:
        if self.process is None or self.keep_alive == math.inf:
            return None
        if self.in_flight > 0 or self.expires_at is None:  # busy: the deadline once it goes idle now
            return time.time() + self.keep_alive
        return self.expires_at


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
        self._handles: dict[str, WorkerHandle] = {}
        self._starting: dict[str, asyncio.Task[WorkerHandle]] = {}
        self._watchers: set[asyncio.Task] = set()
        self._closed = False
        self.residency = Residency(self, settings, self.log)
        self.metrics: Any = None  # the app's GatewayMetrics: worker starts and exits are counted there
        self.fallbacks = fallbacks if fallbacks is not None else FallbackStore.in_cache_dir(settings.cache_dir())
        self._failures: dict[str, tuple[int, float, str]] = {}
        self._retiring: dict[str, asyncio.Task] = {}  # model -> the stop of a worker retired by a reload  # name -> (failures in a row, retry at, why)

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

    async def get(self, name: str, overrides: dict | None = None) -> WorkerHandle:
        """The model's worker; with engine `overrides` (n_ctx, ...) that differ from its own, a second worker
        of that model with them (gateway/variants.py), which `get(handle.name)` then finds by its name."""
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

    def current(self, name: str) -> WorkerHandle | None:
        return self._handles.get(name)

    def running(self) -> list[RunningModel]:
        return [h.info() for h in self._handles.values() if h.alive]

    def handles(self) -> list[WorkerHandle]:
        return [h for h in self._handles.values() if h.alive]

    # ---- start ------------------------------------------------------------------------
    async def _start(self, record: Any) -> WorkerHandle:
        opts = variant_options(self.settings, record)
        timeout = self.settings.worker_start_timeout
        if opts.endpoint:
            link = WorkerLink(
                opts.endpoint, name=record.name, ctx=self._ctx, heartbeat_interval=self.heartbeat[0],
                heartbeat_timeout=self.heartbeat[1], on_lost=self._on_link_lost, watch_connection=True, logger=self.log,
                curve=self._curve_keys(record.name, opts),
            )  # fmt: skip
            # a remote worker is either up or not: fail fast (503, retryable) rather than hang the client
            hello = await link.connect(min(timeout, self.settings.remote_connect_timeout))
            handle = WorkerHandle(record, link, hello, None, self.settings.max_queue)
            self.log.info("worker_connected", model=record.name, endpoint=opts.endpoint, n_seq_max=hello.n_seq_max)
        else:
            await self.residency.make_room(record)
            handle = await self._spawn(record, opts, timeout)
        old = self._handles.get(record.name)
        self._handles[record.name] = handle
        handle.on_release = self.residency.released
        self.residency.loaded(handle)
        if old is not None and old is not handle:
            self._spawn_task(old.link.close("the worker was replaced"))
        return handle

    async def _spawn(self, record: Any, opts: Any, timeout: float) -> WorkerHandle:
        """Start the model's worker: the remembered profile, else default then safe after a crash."""
        retiring = self._retiring.get(record.name)
        if retiring is not None:
            await asyncio.shield(retiring)
        self._check_backoff(record.name)
        remembered = self.fallbacks.get(record)
        profile = "safe" if remembered else "default"
        if remembered:
            self.log.info("engine_fallback_remembered", model=record.name, profile="safe", reason=remembered.get("reason"))
        try:
            try:
                handle = await self._spawn_once(record, opts, timeout, profile)
            except WorkerCrashed as exc:
                if profile != "default" or exc.extra_buffers is False:
                    raise
                reason = (
                    f"worker for {record.name} was killed by {exc.signal} while loading with llama.cpp's extra "
                    "buffer types on; restarting it in the safe engine profile (extra buffer types off)"
                )
                self.log.error("engine_fallback", model=record.name, signal=exc.signal, profile="safe", reason=reason)
                self.fallbacks.remember(record, profile="safe", reason=reason, signal=exc.signal)
                handle = await self._spawn_once(record, opts, timeout, "safe")
        except GatewayError as exc:
            self._note_failure(record.name, exc.info.message)
            raise
        self._failures.pop(record.name, None)
        return handle

    def _curve_keys(self, name: str, opts: Any) -> tuple[str, str] | None:
        """(gateway secret key, worker public key) for a remote worker; plain tcp only when asked for."""
        if opts.server_key:
            if not self.settings.curve_secret_key:
                raise worker_unavailable(
                    f"model {name} has a server_key but the gateway has no curve_secret_key to authenticate with"
                )
            return (self.settings.curve_secret_key, opts.server_key)
        if opts.endpoint.startswith("tcp://") and not opts.insecure:
            raise worker_unavailable(
                f"refusing the unauthenticated worker endpoint {opts.endpoint} for {name}: set server_key (the worker's "
                "public key from `bictl worker keygen`) and curve_secret_key, or insecure = true"
            )
        if opts.endpoint.startswith("tcp://"):
            self.log.warning("insecure_worker_link", model=name, endpoint=opts.endpoint)
        return None

    def reconfigure(self) -> list[str]:
        """After a config reload: a running model whose engine settings changed is stopped once it is
        idle (at once if it is), so that its next request starts it with the new settings. Streams
        that run keep their worker until they end. Returns the models that will restart."""
        stale = []
        for handle in list(self._handles.values()):
            if handle.opts is None or handle.stale:
                continue
            if engine_options(self.settings, handle.record) != handle.opts:
                handle.stale = True
                handle.on_idle = self._retire
                stale.append(handle.name)
                if handle.in_flight == 0:
                    self._retire(handle)
        return stale

    def _retire(self, handle: WorkerHandle) -> None:
        if self._handles.get(handle.name) is handle:
            del self._handles[handle.name]
            self.log.info("worker_retired", model=handle.name, reason="engine settings changed")
            task = asyncio.create_task(self._stop(handle, "engine settings changed"))
            self._retiring[handle.name] = task  # its successor starts once it is gone (same socket path)
            task.add_done_callback(lambda t, name=handle.name: self._retiring.pop(name, None))

    def _check_backoff(self, name: str) -> None:
        failed = self._failures.get(name)
        if failed is None:
            return
        count, retry_at, why = failed
        wait = retry_at - time.monotonic()
        if wait > 0:
            raise worker_unavailable(
                f"{why}; the worker is not started again for {wait:.0f} s ({count} failed start{'s' * (count > 1)} in a row)",
                retry_after=wait,
            )

    def _note_failure(self, name: str, why: str) -> None:
        count = self._failures.get(name, (0, 0.0, ""))[0] + 1
        delay = min(self.settings.worker_restart_backoff_max, self.settings.worker_restart_backoff * 2 ** (count - 1))
        self._failures[name] = (count, time.monotonic() + delay, why)
        self.log.error("worker_start_backoff", model=name, failures=count, backoff_s=round(delay, 3), reason=why)

    async def _spawn_once(self, record: Any, opts: Any, timeout: float, profile: str) -> WorkerHandle:
        run_dir = self.settings.run_dir()
        run_dir.mkdir(parents=True, exist_ok=True)
        endpoint = ipc_endpoint(run_dir, record.name)
        argv = worker_argv(self.command, endpoint, record, opts, profile) + tool_argv(self.settings, record)
        argv += template_argv(self.settings, record)
        argv += ["--kv-dir", str(self.settings.kv_dir() / slug(record.name))]
        proc = WorkerProcess(record.name, argv, self.log)
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
            n_seq_max=hello.n_seq_max, chat_template=hello.chat_template,
        )  # fmt: skip
        if self.metrics is not None:
            self.metrics.worker_started(record.name)
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
            self.metrics.worker_exited(handle.name, proc.returncode if proc else None)
        self.log.error("worker_died", model=handle.name, in_flight=handle.in_flight, reason=reason,
                       worker_output=proc.last_output() if proc else [])  # fmt: skip
        info = handle.hello.engine_info
        if proc is not None and proc.crash_signal and info is not None and info.profile == "default" and info.extra_buffers:
            why = (f"worker for {handle.name} was killed by {proc.crash_signal} while serving with llama.cpp's extra "
                   "buffer types on; its next start uses the safe engine profile")  # fmt: skip
            self.log.error("engine_fallback", model=handle.name, signal=proc.crash_signal, profile="safe", reason=why)
            self.fallbacks.remember(handle.record, profile="safe", reason=why, signal=proc.crash_signal)
        handle.link.lose(reason)
        self._forget(handle)
        await handle.link.close(reason)

    def _on_link_lost(self, link: WorkerLink, reason: str) -> None:
        for handle in list(self._handles.values()):
            if handle.link is link:
                self.log.error("worker_lost", model=handle.name, reason=reason)
                self._forget(handle)
                if handle.process is not None and handle.process.returncode is None and not self._closed:
                    self._spawn_task(self._restart_hung(handle))
        self._spawn_task(link.close(reason))

    async def _restart_hung(self, handle: WorkerHandle) -> None:
        """A worker process that stopped answering is killed and a fresh one started in its place."""
        handle.unloading = True  # its exit is this restart, not a crash
        await handle.process.stop(timeout=1.0)
        self.log.warning("worker_restart", model=handle.name, pid=handle.process.pid, reason="stopped answering")
        try:
            await self.get(handle.name)
        except Exception as exc:  # noqa: BLE001 - the next request tries again
            self.log.error("worker_restart_failed", model=handle.name, error=str(exc))

    def _forget(self, handle: WorkerHandle) -> None:
        if self._handles.get(handle.name) is handle:
            del self._handles[handle.name]

    def spawn_task(self, coro: Any) -> None:
        self._spawn_task(coro)

    def _spawn_task(self, coro: Any) -> None:
        task = asyncio.create_task(coro)
        self._watchers.add(task)
        task.add_done_callback(self._watchers.discard)

    # ---- stop -------------------------------------------------------------------------
    async def unload(self, name: str, *, only_if_idle: bool = False) -> bool:
        """Abort the model's requests and stop its worker. False when it was not running (or, with
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

    async def _stop(self, handle: WorkerHandle, reason: str) -> None:
        handle.unloading = True
        self.residency.stopped(handle.name)
        ids = handle.link.in_flight()
        if ids:
            handle.link.abort(ids)
            deadline = time.monotonic() + UNLOAD_DRAIN_S
            while handle.link.in_flight() and time.monotonic() < deadline:
                await asyncio.sleep(0.02)
        await handle.link.close(reason)
        if handle.process is not None:
            rc = await handle.process.stop(self.stop_timeout)
            self.log.info("worker_stopped", model=handle.name, returncode=rc, reason=reason)
        else:
            self.log.info("worker_disconnected", model=handle.name, reason=reason)

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
