"""Ollama's model management routes: pull, tags, show, delete, copy, ps, version; ours: search, unload and
pull-job status. Errors are Ollama's `{"error": "..."}` with the fitting status."""

from __future__ import annotations

import asyncio
import json
from typing import Any, TypeVar

import msgspec
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from ... import __version__
from ...registry import RegistryError
from ...registry.gguf_header import read_header
from ...registry.jobs import PullManager
from ...registry.search import search as search_remotes
from ..http import ClientDisconnected, JSONBody, until_disconnect
from ..process import tool_settings
from . import convert, wire

T = TypeVar("T")


class BadRequest(Exception):
    pass


def error(message: str, status: int) -> Response:
    return JSONBody({"error": message}, status_code=status)


def registry_error(exc: RegistryError) -> Response:
    return error(exc.message, exc.status)


async def decode(request: Request, kind: type[T]) -> T:
    body = await request.body()
    if not body.strip():
        raise BadRequest("the request body is empty; send a JSON object")
    try:
        return msgspec.json.decode(body, type=kind)
    except msgspec.ValidationError as exc:
        raise BadRequest(f"invalid request body: {exc}") from None
    except msgspec.DecodeError as exc:
        raise BadRequest(f"the request body is not valid JSON: {exc}") from None


def require_model(ref: wire.ModelRef) -> str:
    name = ref.model_name()
    if not name or not name.strip():
        raise BadRequest("'model' is required")
    return name.strip()


def pull_manager(app: Any) -> PullManager:
    """The app's PullManager, made on first use (`app.state.pulls`); close it at shutdown with `aclose(app)`."""
    manager = getattr(app.state, "pulls", None)
    if manager is None:
        manager = PullManager(app.state.registry)
        app.state.pulls = manager
    return manager


async def aclose(app: Any) -> None:
    manager = getattr(app.state, "pulls", None)
    if manager is not None:
        await manager.close()


def handles_errors(handler):
    async def wrapped(request: Request) -> Response:
        try:
            return await handler(request)
        except BadRequest as exc:
            return error(str(exc), 400)
        except RegistryError as exc:
            return registry_error(exc)

    wrapped.__name__ = handler.__name__
    wrapped.__doc__ = handler.__doc__
    return wrapped


def ndjson(events) -> StreamingResponse:
    async def body():
        try:
            async for ev in events:
                yield json.dumps(ev, separators=(",", ":")) + "\n"
        except RegistryError as exc:
            yield json.dumps({"error": exc.message}) + "\n"

    return StreamingResponse(body(), media_type="application/x-ndjson")


# ---- routes -------------------------------------------------------------------------------------------------
@handles_errors
async def pull(request: Request) -> Response:
    """POST /api/pull: any pull spec (a name, hf://, ollama://, https://, file:///, an absolute path) is the model."""
    req = await decode(request, wire.PullRequest)
    spec = require_model(req)
    manager = pull_manager(request.app)
    job = manager.start(spec, name=req.destination, sha256=req.sha256)
    if req.background:
        job.detached = True
        return JSONBody(job.snapshot(), status_code=202)
    if req.stream:
        return ndjson(manager.follow(job))  # a client that goes away cancels the pull
    try:
        await until_disconnect(request, manager.wait_watched(job))
    except ClientDisconnected:
        return Response(status_code=499)
    return JSONBody({"status": "success"})


@handles_errors
async def pull_jobs(request: Request) -> Response:
    return JSONBody({"jobs": [j.snapshot() for j in pull_manager(request.app).jobs()]})


@handles_errors
async def pull_job(request: Request) -> Response:
    return JSONBody(pull_manager(request.app).get(request.path_params["job_id"]).snapshot())


@handles_errors
async def tags(request: Request) -> Response:
    records = await asyncio.to_thread(request.app.state.registry.list)
    return JSONBody({"models": [convert.tag_item(r) for r in records]})


def _gguf_template(path) -> str | None:
    try:
        meta, _ = read_header(path)
    except RegistryError:
        return None
    value = meta.get("tokenizer.chat_template")
    return value if isinstance(value, str) else None


@handles_errors
async def show(request: Request) -> Response:
    req = await decode(request, wire.ShowRequest)
    record = await asyncio.to_thread(request.app.state.registry.resolve, require_model(req))
    running = next((m for m in request.app.state.models.running() if m.name == record.name), None)
    configured = request.app.state.settings.models.get(record.name) if hasattr(request.app.state, "settings") else None
    override = (configured and configured.chat_template) or (record.engine() or {}).get("chat_template")
    gguf_template = None if record.template else await asyncio.to_thread(_gguf_template, record.path)
    # ours: where the chat template comes from; "architecture" means the model brought none (a base model)
    origin = "override" if override else "source" if record.template else "gguf" if gguf_template else "architecture"
    settings = getattr(request.app.state, "settings", None)
    tools = tool_settings(settings, record) if settings is not None else None  # as the worker sees them
    if running is not None:  # the worker says exactly which template it renders with
        body = convert.show_body(record, verbose=req.verbose, template=running.chat_template_source, tools=tools)
        body["chat_template"] = running.chat_template
    else:
        body = convert.show_body(record, verbose=req.verbose, template=gguf_template, tools=tools)
        arch = (record.details or {}).get("architecture", "")
        body["chat_template"] = override or ("gguf" if gguf_template else f"built-in for architecture '{arch}' (chosen when loaded)")
    body["chat_template_origin"] = origin
    return JSONBody(body)


@handles_errors
async def delete(request: Request) -> Response:
    req = await decode(request, wire.DeleteRequest)
    registry = request.app.state.registry
    name = require_model(req)
    if not registry.exists(name):
        raise RegistryError("model_not_found", f"model '{name}' not found")
    canonical = registry.canonical(name)
    models = getattr(request.app.state, "models", None)
    if models is not None and any(m.name == canonical or m.name.startswith(canonical + " (") for m in models.running()):
        residency = getattr(models, "residency", None)  # a model being deleted stops serving first (all its workers)
        await (residency.unload_all(canonical) if residency is not None else models.unload(canonical))
    await asyncio.to_thread(registry.delete, canonical)
    if (admission := getattr(request.app.state, "admission", None)) is not None:
        admission.forget(canonical)
    if (metrics := getattr(request.app.state, "metrics", None)) is not None:
        metrics.forget_model(canonical)  # a deleted model's series go with it
    return Response(status_code=200)


@handles_errors
async def copy(request: Request) -> Response:
    req = await decode(request, wire.CopyRequest)
    await asyncio.to_thread(request.app.state.registry.copy, req.source, req.destination)
    return Response(status_code=200)


@handles_errors
async def ps(request: Request) -> Response:
    models = getattr(request.app.state, "models", None)
    running = models.running() if models is not None else []
    return JSONBody({"models": [convert.ps_item(m) for m in running]})


async def version(request: Request) -> Response:
    return JSONBody({"version": __version__})


@handles_errors
async def search(request: Request) -> Response:
    req = await decode(request, wire.SearchRequest)
    if not req.query.strip():
        raise BadRequest("'query' is required")
    result = await search_remotes(
        pull_manager(request.app).fetcher, req.query, limit=req.limit, sources=req.sources, hf_filter=req.hf_filter, timeout=req.timeout
    )
    if not result["hits"] and len(result["errors"]) == len(set(req.sources)):
        return JSONBody({"error": "; ".join(f"{k}: {v}" for k, v in result["errors"].items()), **result}, status_code=502)
    return JSONBody(result)


@handles_errors
async def unload(request: Request) -> Response:
    req = await decode(request, wire.UnloadRequest)
    record = await asyncio.to_thread(request.app.state.registry.resolve, require_model(req))
    unloaded = await request.app.state.models.unload(record.name)
    return JSONBody({"model": record.name, "unloaded": bool(unloaded)})
