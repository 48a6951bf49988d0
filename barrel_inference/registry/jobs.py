"""Pull jobs: concurrent pulls of one spec share one download; progress events about every 100 ms; await with a
timeout; a finished job answers status queries for `retention` seconds (5 minutes by default)."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import time
from collections.abc import AsyncIterator
from pathlib import Path

import structlog

from .errors import RegistryError
from .fetch import Fetcher, Plan
from .layout import spec_hash
from .records import ModelRecord, now_utc
from .specs import parse_spec

log = structlog.get_logger(logger_name="barrel_inference.registry.pull")

PROGRESS_INTERVAL = 0.1


class PullJob:
    def __init__(self, job_id: str, spec: str, canonical: str, name: str | None, sha256: str | None):
        self.id = job_id
        self.spec = spec
        self.canonical = canonical
        self.name = name
        self.sha256 = sha256
        self.status = "running"  # running | success | error
        self.phase = "queued"
        self.digest: str | None = None
        self.completed = 0
        self.total: int | None = None
        self.error: RegistryError | None = None
        self.record: ModelRecord | None = None
        self.started_at = now_utc()
        self.finished_at = None
        self.finished_mono: float | None = None
        self._events: list[dict] = []
        self._layer: dict | None = None  # the progress event of the layer being pulled
        self._progress_version = 0
        self._last_emit = 0.0
        self._changed = asyncio.Event()
        self._done = asyncio.Event()
        self.task: asyncio.Task | None = None
        self.watchers = 0  # streaming clients following the job; the last one leaving cancels it
        self.detached = False  # started in the background: runs whoever watches
        self.part: Path | None = None  # the partial download, removed when the job is cancelled
        self.cancelled_by_client = False

    # ---- state changes (called by the runner) ---------------------------------------------------------
    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    def event(self, status: str, **extra) -> None:
        self.phase = status
        self._events.append({"status": status, **extra})
        self._notify()

    def begin_layer(self, digest: str | None, total: int | None, label: str) -> None:
        self.digest = digest
        self.total = total
        self.completed = 0
        self._layer = {"status": f"pulling {label}", **({"digest": digest} if digest else {})}
        self.event(self._layer["status"], **self._progress_fields())

    def _progress_fields(self) -> dict:
        out: dict = {k: v for k, v in self._layer.items() if k != "status"} if self._layer else {}
        if self.total is not None:
            out["total"] = self.total
        out["completed"] = self.completed
        return out

    def on_progress(self, completed: int, total: int | None) -> None:
        self.completed = completed
        if total is not None:
            self.total = total
        now = time.monotonic()
        if now - self._last_emit >= PROGRESS_INTERVAL:
            self._last_emit = now
            self._progress_version += 1
            self._notify()

    def end_layer(self) -> None:
        if self._layer is not None:
            self._events.append({"status": self._layer["status"], **self._progress_fields()})
            self._layer = None
            self._notify()

    def finish(self, record: ModelRecord) -> None:
        self.record = record
        self.name = record.name
        self.status = "success"
        self.event("success")
        self._close()

    def fail(self, error: RegistryError) -> None:
        self.error = error
        self.status = "error"
        self.phase = "error"
        self._close()
        self._notify()

    def _close(self) -> None:
        self.finished_at = now_utc()
        self.finished_mono = time.monotonic()
        self._done.set()

    # ---- reading ----------------------------------------------------------------------------------------
    @property
    def done(self) -> bool:
        return self._done.is_set()

    def snapshot(self) -> dict:
        return {
            "id": self.id,
            "spec": self.spec,
            "model": self.name,
            "status": self.status,
            "phase": self.phase,
            "digest": self.digest,
            "completed": self.completed,
            "total": self.total,
            "error": self.error.to_dict() if self.error else None,
            "started_at": self.started_at.isoformat(),
            "finished_at": self.finished_at.isoformat() if self.finished_at else None,
        }

    async def wait(self, timeout: float | None = None) -> ModelRecord:
        """The pulled model's record; raises the pull's RegistryError, or RegistryError('timeout') (the pull goes on)."""
        try:
            await asyncio.wait_for(asyncio.shield(self._done.wait()), timeout)
        except asyncio.TimeoutError:
            raise RegistryError("timeout", f"the pull of {self.spec} is still running after {timeout:g}s (job {self.id})", job=self.id) from None
        if self.error:
            raise self.error
        return self.record

    async def events(self) -> AsyncIterator[dict]:
        """Progress in Ollama's pull shape, from the beginning: phase events in order, and while a layer downloads
        its {status, digest, total, completed} about every 100 ms. Ends after 'success'; raises the error on failure."""
        i = 0
        seen_version = -1
        while True:
            changed = self._changed
            while i < len(self._events):
                ev = self._events[i]
                i += 1
                seen_version = self._progress_version
                yield dict(ev)
            if self.done:
                if self.error:
                    raise self.error
                return
            if self._layer is not None and self._progress_version != seen_version:
                seen_version = self._progress_version
                yield {"status": self._layer["status"], **self._progress_fields()}
            await changed.wait()


class PullManager:
    """Starts and tracks pulls for one registry. Use `async with` or call `close()` at shutdown."""

    def __init__(self, registry, *, fetcher: Fetcher | None = None, retention: float | None = None):
        self.registry = registry
        self.log = getattr(registry, "log", log).bind(logger_name="barrel_inference.registry.pull")
        self.fetcher = fetcher or Fetcher(registry.settings)
        self.retention = retention if retention is not None else getattr(registry.settings, "pull_retention", 300.0)
        self._jobs: dict[str, PullJob] = {}
        self._active: dict[tuple, PullJob] = {}
        self._key_locks: dict[str, asyncio.Lock] = {}
        self._ids = itertools.count(1)

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        await self.close()

    async def close(self) -> None:
        for job in list(self._active.values()):
            if job.task and not job.task.done():
                job.task.cancel()
        for job in list(self._active.values()):
            if job.task:
                with contextlib.suppress(BaseException):
                    await job.task
        await self.fetcher.close()

    def _purge(self) -> None:
        now = time.monotonic()
        for jid, job in list(self._jobs.items()):
            if job.finished_mono is not None and now - job.finished_mono > self.retention:
                del self._jobs[jid]

    def start(self, spec: str, *, name: str | None = None, sha256: str | None = None) -> PullJob:
        """Start pulling `spec` (or join the pull of the same spec already running). Bad specs raise at once."""
        self._purge()
        parsed = parse_spec(spec)
        key = (parsed.canonical, name, sha256)
        job = self._active.get(key)
        if job is not None:
            return job
        job = PullJob(f"pull-{next(self._ids)}-{spec_hash(parsed.canonical)[:8]}", spec, parsed.canonical, name, sha256)
        self._jobs[job.id] = job
        self._active[key] = job
        job.task = asyncio.get_running_loop().create_task(self._run(job, parsed, key), name=f"pull {spec}")
        return job

    def cancel(self, job: PullJob) -> bool:
        """Cancel a running job (its client went away): no partial download, blob or manifest stays behind.
        A job already writing its manifest finishes (the model is complete then). Returns whether it was cancelled."""
        if job.done or job.task is None or job.task.done() or job.phase in ("writing manifest", "removing unused layers", "success"):
            return False
        job.cancelled_by_client = True
        job.task.cancel()
        self.log.info("pull_cancelled", spec=job.spec, job=job.id, phase=job.phase)
        return True

    async def follow(self, job: PullJob) -> AsyncIterator[dict]:
        """`job.events()` for one streaming client; when the last such client leaves early, the job is cancelled
        (unless it was started in the background)."""
        job.watchers += 1
        finished = False
        try:
            async for ev in job.events():
                yield ev
            finished = True
        finally:
            job.watchers -= 1
            if not finished and not job.done and job.watchers == 0 and not job.detached:
                self.cancel(job)

    async def wait_watched(self, job: PullJob) -> ModelRecord:
        """`job.wait()` for one client; if that client goes away (this is cancelled) while nobody else follows the
        job, the job is cancelled too."""
        job.watchers += 1
        left = False
        try:
            return await job.wait()
        except asyncio.CancelledError:
            left = True
            raise
        finally:
            job.watchers -= 1
            if left and not job.done and job.watchers == 0 and not job.detached:
                self.cancel(job)

    def get(self, job_id: str) -> PullJob:
        self._purge()
        job = self._jobs.get(job_id)
        if job is None:
            raise RegistryError("job_not_found", f"no pull job '{job_id}' (finished jobs are kept for {self.retention:g}s)", job=job_id)
        return job

    def jobs(self) -> list[PullJob]:
        self._purge()
        return list(self._jobs.values())

    async def pull(self, spec: str, *, name: str | None = None, sha256: str | None = None, timeout: float | None = None) -> ModelRecord:
        return await self.start(spec, name=name, sha256=sha256).wait(timeout)

    async def _run(self, job: PullJob, parsed, key) -> None:
        try:
            job.event("pulling manifest")
            plan: Plan = await self.fetcher.plan(parsed, name=job.name, sha256=job.sha256)
            job.name = plan.name
            self.registry.canonical(plan.name)  # validate the name before downloading anything
            if plan.path is not None:
                record = await self._register_file(job, plan)
            else:
                record = await self._pull_blob(job, plan)
            job.finish(record)
            self.log.info("pull_done", spec=job.spec, model=record.name, size=record.size)
        except RegistryError as exc:
            self.log.warning("pull_failed", spec=job.spec, code=exc.code, error=exc.message)
            job.fail(exc)
        except asyncio.CancelledError:
            if job.cancelled_by_client:
                self._discard(job)
                job.fail(RegistryError("cancelled", f"the pull of {job.spec} was cancelled"))
            else:
                job.fail(RegistryError("cancelled", f"the pull of {job.spec} was cancelled; pulling again resumes it"))
            raise
        except Exception as exc:  # a bug, reported as such rather than hanging the waiters
            self.log.exception("pull_crashed", spec=job.spec)
            job.fail(RegistryError("internal", f"the pull of {job.spec} failed unexpectedly: {exc!r}"))
        finally:
            if self._active.get(key) is job:
                del self._active[key]

    def _discard(self, job: PullJob) -> None:
        """What a cancelled pull leaves: its partial download and any blob no manifest refers to."""
        if job.part is not None and not any(j is not job and j.part == job.part for j in self._active.values()):
            job.part.unlink(missing_ok=True)
        try:
            self.registry.prune()
        except OSError as exc:
            self.log.warning("prune_failed", error=str(exc))

    async def _register_file(self, job: PullJob, plan: Plan) -> ModelRecord:
        if plan.sha256:
            from .layout import sha256_file

            job.event("verifying sha256 digest")
            got = await asyncio.to_thread(sha256_file, plan.path)
            if got != plan.sha256:
                raise RegistryError("sha256_mismatch", f"{plan.path}: sha256 is {got} but {plan.sha256} was expected", got=got, want=plan.sha256)
        job.event("writing manifest")
        record = await asyncio.to_thread(
            self.registry.write_manifest, plan.name, source=plan.source, path=plan.path, parameters=plan.parameters
        )
        self.fetcher.write_ref(self.registry.layout, plan, None)
        return record

    async def _pull_blob(self, job: PullJob, plan: Plan) -> ModelRecord:
        layout = self.registry.layout
        lock = self._key_locks.setdefault(plan.key, asyncio.Lock())
        label = (plan.sha256 or spec_hash(plan.key))[:12]
        with contextlib.ExitStack() as protected:
            if plan.sha256:
                protected.enter_context(self.registry.protect(plan.sha256))
            async with lock:
                job.begin_layer(plan.layer_digest, plan.size, label)
                job.part = layout.part_path(plan.key)
                digest, size, part = await self.fetcher.fetch_part(plan, layout, job.on_progress)
                job.on_progress(size, size)
                job.digest = f"sha256:{digest}"
                job.end_layer()
                job.event("verifying sha256 digest")
                protected.enter_context(self.registry.protect(digest))
                if part is not None:
                    await asyncio.to_thread(os.replace, part, layout.blob_path(digest))
            job.event("writing manifest")
            record = await asyncio.to_thread(
                self.registry.write_manifest, plan.name, source=plan.source, blob_digest=digest, parameters=plan.parameters, template=plan.template
            )
            self.fetcher.write_ref(layout, plan, digest)
        job.event("removing unused layers")
        await asyncio.to_thread(self.registry.prune)
        return record
