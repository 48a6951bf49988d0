"""Aliases changed on a running daemon: GET /api/aliases, PUT /api/aliases/{name} {"target"},
DELETE /api/aliases/{name} (what `bictl alias list / set / rm` call).

The config file's [aliases] are the base; what is set here is kept in `<model_cache_dir>/aliases.json`
and laid over them, at start and on every SIGHUP reload. A change replaces the settings' alias table
as a whole: a request that already resolved its model keeps the mapping it read.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ..config import Settings
from ..protocol import ErrorCode
from .errors import GatewayError
from .http import JSONBody

FILE_NAME = "aliases.json"


def aliases_file(settings: Settings) -> Path:
    return settings.cache_dir() / FILE_NAME


def read_overrides(settings: Settings) -> dict[str, str | None]:
    """name -> target set with `bictl alias set`, or None for a config alias removed with `bictl alias rm`."""
    try:
        data = json.loads(aliases_file(settings).read_text())
    except (FileNotFoundError, ValueError):
        return {}
    return {str(k): (str(v) if v is not None else None) for k, v in data.items()} if isinstance(data, dict) else {}


def write_overrides(settings: Settings, overrides: dict[str, str | None]) -> None:
    path = aliases_file(settings)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(overrides, indent=1, sort_keys=True))
    os.replace(tmp, path)


def effective(config_aliases: dict[str, str], overrides: dict[str, str | None]) -> dict[str, str]:
    out = dict(config_aliases)
    for name, target in overrides.items():
        if target is None:
            out.pop(name, None)
        else:
            out[name] = target
    return out


def apply_overrides(settings: Settings) -> None:
    """Lay the saved overrides over the aliases the settings were loaded with (at start, after a reload)."""
    settings.aliases = effective(settings.aliases, read_overrides(settings))


def _error(code: ErrorCode, message: str, status: int) -> Response:
    return JSONBody({"error": message, "code": code.value}, status_code=status)


async def list_aliases(request: Request) -> Response:
    return JSONBody({"aliases": dict(request.app.state.settings.aliases)})


async def set_alias(request: Request) -> Response:
    settings: Settings = request.app.state.settings
    name = request.path_params["name"]
    try:
        body = json.loads(await request.body() or b"{}")
    except ValueError:
        return _error(ErrorCode.INVALID_REQUEST, "the body must be JSON: {\"target\": \"name:tag\"}", 400)
    target = body.get("target") if isinstance(body, dict) else None
    if not isinstance(target, str) or not target or not name:
        return _error(ErrorCode.INVALID_REQUEST, "give the alias a target: {\"target\": \"name:tag\"}", 400)
    try:
        record = await request.app.state.models.resolve(target)
    except GatewayError as exc:
        return _error(exc.code, exc.info.message, 404 if exc.code == ErrorCode.MODEL_NOT_FOUND else 400)
    overrides = read_overrides(settings)
    overrides[name] = record.name
    write_overrides(settings, overrides)
    settings.aliases = {**settings.aliases, name: record.name}  # a new table: requests in flight keep theirs
    request.app.state.log.info("alias_set", alias=name, target=record.name)
    return JSONBody({"alias": name, "target": record.name})


async def remove_alias(request: Request) -> Response:
    settings: Settings = request.app.state.settings
    name = request.path_params["name"]
    if name not in settings.aliases:
        return _error(ErrorCode.NOT_FOUND, f"no alias {name!r}", 404)
    overrides = read_overrides(settings)
    overrides[name] = None
    write_overrides(settings, overrides)
    settings.aliases = {k: v for k, v in settings.aliases.items() if k != name}
    request.app.state.log.info("alias_removed", alias=name)
    return JSONBody({"alias": name, "removed": True})


def routes() -> list[Route]:
    return [
        Route("/api/aliases", list_aliases, methods=["GET"]),
        Route("/api/aliases/{name:path}", set_alias, methods=["PUT"]),
        Route("/api/aliases/{name:path}", remove_alias, methods=["DELETE"]),
    ]
