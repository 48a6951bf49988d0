"""Operational routes: GET /health, GET /metrics (Prometheus), GET /api/stats?model=NAME."""

from __future__ import annotations

import asyncio

import msgspec

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ..protocol import GetStats
from .errors import GatewayError
from .family import STATUS
from .http import JSONBody


async def health(request: Request) -> Response:
    return JSONBody({"status": "ok"})


async def metrics(request: Request) -> Response:
    state = request.app.state
    admission = getattr(state, "admission", None)
    if admission is not None:
        state.metrics.refresh(admission.depths().items())
    await _worker_figures(state)
    return Response(state.metrics.render(), media_type=state.metrics.content_type)


async def _worker_figures(state) -> None:
    """Per replica of every running model: sequences busy / free and KV cells used (a GetStats each,
    bounded in time), requests in flight and queued in its worker, its load time."""
    replicas = [(h.name, r) for h in state.models.handles() for r in _replicas(h) if r.alive]

    async def one(name, replica):
        try:
            result = await replica.call(GetStats(id=""), 2.0)
        except (GatewayError, asyncio.TimeoutError):
            return
        if getattr(result, "error", None) is None and result.stats:
            state.metrics.worker_figures(name, result.stats, str(getattr(replica, "replica", 0)))

    await asyncio.gather(*(one(n, r) for n, r in replicas))
    for name, r in replicas:
        state.metrics.replica_load(name, str(getattr(r, "replica", 0)), r.in_flight, r.waiting, getattr(r, "load_seconds", None))


def _replicas(handle) -> list:
    """The workers of a model's ReplicaSet (a lone handle is its own)."""
    return [r for r in getattr(handle, "replicas", [handle]) if r is not None]


async def stats(request: Request) -> Response:
    """The worker's stats (scheduler figures and its per-tick profile); starts the model if needed. With
    several replicas, `stats` is the least loaded one's and `replicas` has each one's."""
    state = request.app.state
    name = request.query_params.get("model") or state.settings.default_model
    try:
        handle = await state.models.get(name)
        live = [r for r in _replicas(handle) if r.alive]
        results = await asyncio.gather(*(r.call(GetStats(id="")) for r in live), return_exceptions=True)
    except GatewayError as exc:
        return JSONBody({"error": exc.info.message}, status_code=STATUS.get(exc.code, 500))
    answers = [(r, res) for r, res in zip(live, results) if not isinstance(res, BaseException) and res.error is None]
    if not answers:
        failed = next((res for res in results if not isinstance(res, BaseException)), None)
        if failed is not None:
            return JSONBody({"error": failed.error.message}, status_code=STATUS.get(failed.error.code, 500))
        exc = next((res for res in results if isinstance(res, GatewayError)), None)
        message = exc.info.message if exc is not None else f"no replica of {handle.name} answered"
        return JSONBody({"error": message}, status_code=STATUS.get(exc.code if exc else None, 503))
    info = handle.info()
    engine = {"profile": info.engine_profile, "extra_buffers": info.extra_buffers, "reason": info.engine_reason,
              "weight_buffers": info.weight_buffers}  # fmt: skip
    first = min(answers, key=lambda a: (a[0].in_flight, getattr(a[0], "replica", 0)))[1]
    by_replica = {getattr(r, "replica", 0): res.stats or {} for r, res in answers}
    replicas = [{**msgspec.to_builtins(ri), "stats": by_replica.get(ri.replica)} for ri in getattr(info, "replicas", [])]
    return JSONBody({"model": handle.name, "pid": info.pid, "in_flight": handle.in_flight, "engine": engine,
                     "stats": first.stats or {}, "replicas": replicas})  # fmt: skip


def routes() -> list[Route]:
    return [
        Route("/health", health, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
        Route("/api/stats", stats, methods=["GET"]),
    ]
