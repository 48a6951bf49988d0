"""Operational routes: GET /health, GET /metrics (Prometheus), GET /api/stats?model=NAME."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ..protocol import Call
from .errors import GatewayError
from .http import JSONBody

_STATUS = {"model_not_found": 404, "overloaded": 503, "worker_unavailable": 503}


async def health(request: Request) -> Response:
    return JSONBody({"status": "ok"})


async def metrics(request: Request) -> Response:
    state = request.app.state
    state.metrics.refresh((h.name, h.waiting) for h in state.models.handles())
    return Response(state.metrics.render(), media_type=state.metrics.content_type)


async def stats(request: Request) -> Response:
    """The worker's stats (scheduler figures and its per-tick profile); starts the model if needed."""
    state = request.app.state
    name = request.query_params.get("model") or state.settings.default_model
    try:
        handle = await state.models.get(name)
        result = await handle.call(Call(id="", op="stats"))
    except GatewayError as exc:
        return JSONBody({"error": exc.info.message}, status_code=_STATUS.get(exc.code.value, 400))
    if result.error is not None:
        return JSONBody({"error": result.error.message}, status_code=_STATUS.get(result.error.code.value, 500))
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
