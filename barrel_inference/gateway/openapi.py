"""GET /openapi.json (OpenAPI 3.1 from the wire structs, via msgspec's JSON Schema) and GET /docs (a static page
that renders it, no CDN).

The document walks the app's routes, so every route is in it; what each operation takes and answers comes from
tables of structs: the core's below, and each API family's `schema` module (`OPERATIONS`), found next to the
family's routes module (the core names no family). A route without a table entry is still listed, with its
docstring and a generic JSON answer.
"""

from __future__ import annotations

import importlib
import re
from dataclasses import dataclass
from typing import Any

import msgspec
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response
from starlette.routing import BaseRoute, Mount, Route

from .. import __version__
from .http import JSONBody


@dataclass(frozen=True)
class Operation:
    """One method+path: its request body struct, its answer struct (or None) and media type, and a summary."""

    summary: str = ""
    request: Any = None
    response: Any = None
    media_type: str = "application/json"
    stream_media_type: str | None = None  # the media type of the streamed answer, when the request asks for one
    tag: str = ""


class Health(msgspec.Struct):
    status: str


class StatsAnswer(msgspec.Struct):
    model: str
    pid: int | None
    in_flight: int
    engine: dict[str, Any]
    stats: dict[str, Any]


class PlainError(msgspec.Struct):
    error: str


CORE_OPERATIONS: dict[tuple[str, str], Operation] = {
    ("GET", "/"): Operation("The chat page for a browser (Accept: text/html), else the liveness text 'Ollama is running'",
                            media_type="text/plain", tag="daemon"),  # fmt: skip
    ("HEAD", "/"): Operation("Liveness", media_type="text/plain", tag="daemon"),
    ("GET", "/health"): Operation("Liveness of the gateway", response=Health, tag="daemon"),
    ("GET", "/metrics"): Operation("Prometheus metrics", media_type="text/plain", tag="daemon"),
    ("GET", "/api/stats"): Operation("A running model's scheduler figures (starts the model if needed)", response=StatsAnswer, tag="daemon"),
    ("GET", "/api/system"): Operation("The system report: llama.cpp build, CPU, GPUs, engine profiles", response=dict, tag="daemon"),
    ("GET", "/openapi.json"): Operation("This document", response=dict, tag="daemon"),
    ("GET", "/docs"): Operation("The API reference page", media_type="text/html", tag="daemon"),
}


def family_operations(families: Any) -> dict[tuple[str, str], Operation]:
    """The `OPERATIONS` tables of the families' `schema` modules, found next to the module that defines each
    family's `routes` (a Family's `routes` callable, or a routes module's `routes` function)."""
    table: dict[tuple[str, str], Operation] = {}
    for family in getattr(families, "all", families) or []:
        module_name = getattr(getattr(family, "routes", None), "__module__", None) or getattr(family, "__name__", "")
        for package in dict.fromkeys([module_name.rsplit(".", 1)[0], module_name]):
            try:
                module = importlib.import_module(package + ".schema")
            except ImportError:
                continue
            table.update(getattr(module, "OPERATIONS", {}))
            break
    return table


def iter_routes(routes: list[BaseRoute], prefix: str = ""):
    for route in routes:
        if isinstance(route, Mount):
            yield from iter_routes(route.routes or [], prefix + route.path)
        elif isinstance(route, Route):
            yield prefix + route.path, route


_PARAM = re.compile(r"{([^}:]+)(:[^}]+)?}")


def openapi_path(path: str) -> str:
    """Starlette's `{name:path}` -> OpenAPI's `{name}`."""
    return _PARAM.sub(lambda m: "{" + m.group(1) + "}", path)


def build(routes: list[BaseRoute], families: list[Any]) -> dict:
    table = {**CORE_OPERATIONS, **family_operations(families)}
    types = sorted({t for op in table.values() for t in (op.request, op.response) if t is not None and t is not dict},
                   key=lambda t: getattr(t, "__qualname__", str(t)))  # fmt: skip
    schemas, components = msgspec.json.schema_components(types, ref_template="#/components/schemas/{name}")
    schema_of = dict(zip(types, schemas))
    schema_of[dict] = {"type": "object"}
    paths: dict[str, dict] = {}
    for path, route in iter_routes(routes):
        api_path = openapi_path(path)
        for method in sorted(route.methods or ["GET"]):
            op = table.get((method, path)) or table.get((method, api_path))
            if op is None and method == "HEAD" and "GET" in (route.methods or []):
                continue  # Starlette adds HEAD to every GET
            op = op or Operation()
            item: dict[str, Any] = {
                "operationId": f"{method.lower()}_{re.sub(r'[^A-Za-z0-9]+', '_', api_path).strip('_') or 'root'}",
                "summary": op.summary or (route.endpoint.__doc__ or route.name or "").strip().split("\n")[0],
                "tags": [op.tag or _tag(path)],
            }
            params = [{"name": name, "in": "path", "required": True, "schema": {"type": "string"}} for name, _ in _PARAM.findall(path)]
            if params:
                item["parameters"] = params
            if op.request is not None:
                item["requestBody"] = {"required": True, "content": {"application/json": {"schema": schema_of[op.request]}}}
            content: dict[str, Any] = {}
            if op.media_type == "application/json":
                content["application/json"] = {"schema": schema_of[op.response] if op.response is not None else {"type": "object"}}
            else:
                content[op.media_type] = {"schema": {"type": "string"}}
            if op.stream_media_type:
                content[op.stream_media_type] = {"schema": {"type": "string"}, "description": "with \"stream\": true"}
            item["responses"] = {
                "200": {"description": "success", "content": content},
                "default": {"description": "an error in the API's own envelope", "content": {"application/json": {"schema": {"type": "object"}}}},
            }
            paths.setdefault(api_path, {})[method.lower()] = item
    return {
        "openapi": "3.1.0",
        "info": {"title": "barrel-inference", "version": __version__,
                 "description": "One local daemon speaking the OpenAI, Anthropic and Ollama HTTP APIs."},  # fmt: skip
        "paths": dict(sorted(paths.items())),
        "components": {"schemas": components},
    }


def _tag(path: str) -> str:
    if path.startswith("/v1/"):
        return "openai"
    if path.startswith("/api/"):
        return "ollama"
    return "daemon"


async def openapi_json(request: Request) -> Response:
    state = request.app.state
    doc = getattr(state, "openapi_doc", None)
    if doc is None:
        doc = state.openapi_doc = build(request.app.routes, getattr(state, "families", None))
    return JSONBody(doc)


async def docs(request: Request) -> Response:
    from .webui import static_text

    return HTMLResponse(static_text("docs.html"))


def routes() -> list[Route]:
    return [Route("/openapi.json", openapi_json, methods=["GET"]), Route("/docs", docs, methods=["GET"])]
