"""GET /api/system: the daemon's system report (llama.cpp build, CPU, GPUs, engine profiles, fallbacks)."""

from __future__ import annotations

import asyncio

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from .. import __version__
from ..sysreport import build_report, engine_facts, model_entry
from .http import JSONBody


async def _facts(request: Request) -> dict:
    """The llama.cpp build's facts: asked of a short-lived worker process once, then kept (the build is fixed)."""
    state = request.app.state
    lock = getattr(state, "system_facts_lock", None)
    if lock is None:
        lock = state.system_facts_lock = asyncio.Lock()
    async with lock:
        facts = getattr(state, "system_facts", None)
        if facts is None:
            setting = state.settings.model_settings("").extra_buffers or "auto"
            facts = await engine_facts(setting)
            if "error" not in facts:
                state.system_facts = facts
        return facts


async def system(request: Request) -> Response:
    state = request.app.state
    models = state.models
    report = build_report(
        state.settings, await _facts(request), fallbacks=models.fallbacks.entries(),
        models=[model_entry(info) for info in models.running()], version=__version__,
    )  # fmt: skip
    return JSONBody(report)


def routes() -> list[Route]:
    return [Route("/api/system", system, methods=["GET"])]
