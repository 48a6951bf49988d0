"""create_app: the Starlette app of one gateway, built from the settings (nothing at import time)."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..config import Settings
from ..protocol import ErrorCode, ErrorInfo
from . import health, openapi, system, webui
from .errors import GatewayError
from .http import JSONBody
from .logging import make_logger
from .metrics import GatewayMetrics, build_labels
from .openai import routes as openai_routes
from .openai.convert import error_body, error_status
from .workers import ModelManager


def _families() -> list[Any]:
    """The API families' route modules: each has `routes() -> list`, and may have `async aclose(app)`."""
    families: list[Any] = [openai_routes]
    try:
        from .ollama import routes as ollama_routes
    except ImportError:
        pass
    else:
        families.append(ollama_routes)
    return families


def error_json(path: str, info: ErrorInfo, status: int | None = None) -> Response:
    """An error in the envelope of the API that `path` belongs to (OpenAI's under /v1, else {"error": msg})."""
    status = status or error_status(info.code)
    if path.startswith("/v1/") or path == "/v1":
        return JSONBody(error_body(info), status_code=status)
    return JSONBody({"error": info.message}, status_code=status)


class ErrorMiddleware:
    """Any exception a route did not handle still gets a JSON error answer and a log line, not a bare 500."""

    def __init__(self, app: ASGIApp, log: Any) -> None:
        self.app = app
        self.log = log

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracking_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, tracking_send)
        except ClientDisconnect:
            return  # the client left while its request was being read: nobody to answer
        except Exception as exc:  # noqa: BLE001 - the last line of defence
            self.log.exception("unhandled_error", path=scope.get("path"), method=scope.get("method"))
            if started:
                return
            info = exc.info if isinstance(exc, GatewayError) else ErrorInfo(ErrorCode.INTERNAL, f"internal error: {type(exc).__name__}: {exc}")
            await error_json(scope.get("path", ""), info)(scope, receive, send)


async def _http_exception(request: Request, exc: Exception) -> Response:
    """Unknown routes and wrong methods, answered in the envelope of the API the path belongs to."""
    assert isinstance(exc, HTTPException)
    message = f"{request.method} {request.url.path}: {exc.detail}"
    if request.url.path.startswith("/v1"):
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "invalid_request")
        body = {"error": {"message": message, "type": "invalid_request_error", "param": None, "code": code}}
        return JSONBody(body, status_code=exc.status_code, headers=exc.headers)
    return JSONBody({"error": message}, status_code=exc.status_code, headers=exc.headers)


def create_app(settings: Settings, *, registry: Any = None, models: ModelManager | None = None, logger: Any = None) -> Starlette:
    log = logger if logger is not None else make_logger(settings)
    if registry is None:
        from ..registry import Registry

        registry = Registry(settings)
    if models is None:
        models = ModelManager(settings, registry, logger=log)

    families = _families()

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette):
        await _startup(settings, registry, models, log)
        try:
            yield
        finally:
            for family in families:
                if hasattr(family, "aclose"):
                    try:
                        await family.aclose(app)
                    except Exception as exc:  # noqa: BLE001 - stopping the workers must still happen
                        log.error("shutdown_error", family=family.__name__, error=str(exc))
            await models.aclose()
            log.info("gateway_stopped")

    app = Starlette(
        routes=[*webui.routes(), *openapi.routes(), *health.routes(), *system.routes(), *(r for family in families for r in family.routes())],
        exception_handlers={HTTPException: _http_exception},
        lifespan=lifespan,
    )
    app.state.settings = settings
    app.state.families = families  # /openapi.json reads their schema tables
    app.state.registry = registry
    app.state.models = models
    app.state.metrics = GatewayMetrics(**build_labels(settings))
    app.state.log = log
    app.add_middleware(ErrorMiddleware, log=log)
    return app


async def _startup(settings: Settings, registry: Any, models: ModelManager, log: Any) -> None:
    if settings.embed_default_model and hasattr(registry, "ensure_default"):
        try:
            record = await asyncio.to_thread(registry.ensure_default)
        except Exception as exc:  # noqa: BLE001 - serving other models must still work
            log.error("default_model_failed", error=str(exc))
        else:
            if record is not None:
                log.info("default_model_registered", model=record.name, path=str(record.path))
    for name in settings.preload:
        try:
            handle = await models.get(name)
            log.info("model_preloaded", model=handle.name)
        except Exception as exc:  # noqa: BLE001 - a model that fails to load must not stop the gateway
            log.error("model_preload_failed", model=name, error=str(exc))
