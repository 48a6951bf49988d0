"""Operational routes: GET /health, GET /metrics (Prometheus), GET /api/stats?model=NAME."""

from __future__ import annotations

import asyncio

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
    """Sequences busy / free and KV cells used of every running worker (a GetStats each, bounded in time)."""
    handles = list(state.models.handles())

    async def one(handle):
        try:
            result = await handle.call(GetStats(id=""), 2.0)
        except (GatewayError, asyncio.TimeoutError):
            return
        if getattr(result, "error", None) is None and result.stats:
            state.metrics.worker_figures(handle.name, result.stats)

    await asyncio.gather(*(one(h) for h in handles))
    for h in handles:
        if getattr(h, "load_seconds", None) is not None:
            state.metrics.worker_load_seconds.labels(h.name).set(h.load_seconds)


async def stats(request: Request) -> Response:
    """The worker's stats (scheduler figures and its per-tick profile); starts the model if needed."""
    state = request.app.state
    name = request.query_params.get("model") or state.settings.default_model
    try:
        handle = await state.models.get(name)
        result = await handle.call(GetStats(id=""))
    except GatewayError as exc:
        return JSONBody({"error": exc.info.message}, status_code=STATUS.get(exc.code, 500))
    if result.error is not None:
        return JSONBody({"error": result.error.message}, status_code=STATUS.get(result.error.code, 500))
    info = handle.info()
    engine = {"profile": info.engine_profile, "extra_buffers": info.extra_buffers, "reason": info.engine_reason,
              "weight_buffers": info.weight_buffers}  # fmt: skip
    return JSONBody({"model": handle.name, "pid": info.pid, "in_flight": handle.in_flight, "engine": engine,
                     "stats": result.stats or {}})  # fmt: skip


def routes() -> list[Route]:
    return [
        Route("/health", health, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
        Route("/api/stats", stats, methods=["GET"]),
    ]
