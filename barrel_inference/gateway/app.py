"""create_app: the Starlette app of one gateway, built from the settings (nothing at import time)."""

from __future__ import annotations

import asyncio
import contextlib
import importlib
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..config import Settings
from ..protocol import ErrorCode, ErrorInfo
from . import aliases, health, openapi, system, webui
from .admission import Admission
from .auth import ApiKeyMiddleware
from .drain import DrainGate
from .errors import GatewayError
from .family import Families, Family
from .http import new_id
from .logging import make_logger
from .metrics import GatewayMetrics, build_labels
from .outcomes import OutcomeCounter
from .security import BrowserGuard
from .sessions import PromptNormalizer
from .workers import ModelManager

# The API families, by module: each has `family() -> Family` (prefixes, routes, error envelope).
# Order matters where two families serve one path: Anthropic's GET /v1/models matches only requests
# carrying `anthropic-version`, and must come before OpenAI's, which answers every other client.
FAMILIES = (
    "barrel_inference.gateway.anthropic",
    "barrel_inference.gateway.openai",
    "barrel_inference.gateway.ollama",
)


def load_families(names: tuple[str, ...] = FAMILIES) -> Families:
    out: list[Family] = []
    for name in names:
        module = importlib.import_module(name)
        out.append(module.family())
    return Families(out)


class ErrorMiddleware:
    """Any exception a route did not handle still gets a JSON error answer and a log line, not a bare 500."""

    def __init__(self, app: ASGIApp, log: Any, families: Families) -> None:
        self.app = app
        self.log = log
        self.families = families

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
        except GatewayError as exc:  # raised outside a family's handling (e.g. a body over the limit)
            if not started:
                await self.families.error_response(scope.get("path", ""), exc.info)(scope, receive, send)
        except Exception as exc:  # noqa: BLE001 - the last line of defence
            error_id = new_id("err-")
            self.log.exception("unhandled_error", path=scope.get("path"), method=scope.get("method"), error_id=error_id)
            if started:
                return
            if isinstance(exc, RecursionError):  # a body nested deeper than the decoder goes
                info = ErrorInfo(ErrorCode.INVALID_REQUEST, "the request body is nested too deeply")
            else:  # a fixed message and the id of the log line that has the details
                info = ErrorInfo(ErrorCode.INTERNAL, f"internal error (request id {error_id})")
            response = self.families.error_response(scope.get("path", ""), info, headers={"x-request-id": error_id})
            await response(scope, receive, send)


class BodyLimitMiddleware:
    """Every request body is at most max_request_body_bytes: a larger Content-Length is answered 413 at
    once, and a body without one (chunked) is cut off with 413 when it passes the limit while it is
    read, so no route ever buffers more than the limit."""

    def __init__(self, app: ASGIApp, limit: int, families: Families) -> None:
        self.app = app
        self.limit = limit
        self.families = families

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.limit
        for key, value in scope.get("headers", ()):
            if key == b"content-length" and value.isdigit() and int(value) > limit:
                await self.families.error_response(scope.get("path", ""), too_large(limit))(scope, receive, send)
                return
        seen = 0

        async def limited_receive() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    raise GatewayError.from_info(too_large(limit))
            return message

        await self.app(scope, limited_receive, send)


def too_large(limit: int) -> ErrorInfo:
    return ErrorInfo(ErrorCode.REQUEST_TOO_LARGE, f"the request body is larger than max_request_body_bytes ({limit} bytes)")


_HTTP_CODES = {404: ErrorCode.NOT_FOUND, 405: ErrorCode.METHOD_NOT_ALLOWED, 413: ErrorCode.REQUEST_TOO_LARGE}


async def _http_exception(request: Request, exc: Exception) -> Response:
    """Unknown routes and wrong methods, answered in the envelope of the family that owns the path."""
    assert isinstance(exc, HTTPException)
    message = f"{request.method} {request.url.path}: {exc.detail}"
    info = ErrorInfo(_HTTP_CODES.get(exc.status_code, ErrorCode.INVALID_REQUEST), message)
    families: Families = request.app.state.families
    return families.error_response(request.url.path, info, status=exc.status_code, headers=exc.headers)


def create_app(
    settings: Settings, *, registry: Any = None, models: ModelManager | None = None, logger: Any = None,
    families: list[Family] | None = None,
) -> Starlette:
    """The app. `families`: the API families to serve (default: those named in FAMILIES)."""
    log = logger if logger is not None else make_logger(settings)
    if registry is None:
        from ..registry import Registry

        registry = Registry(settings)
    if models is None:
        models = ModelManager(settings, registry, logger=log)

    families = Families(families) if families is not None else load_families()
    aliases.apply_overrides(settings)  # what `bictl alias` set, over the config file's [aliases]

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette):
        await _startup(settings, registry, models, log)
        try:
            yield
        finally:
            for family in families.all:
                if family.aclose is not None:
                    try:
                        await family.aclose(app)
                    except Exception as exc:  # noqa: BLE001 - stopping the workers must still happen
                        log.error("shutdown_error", family=family.name, error=str(exc))
            await models.aclose()
            log.info("gateway_stopped")

    app = Starlette(
        routes=[*webui.routes(), *openapi.routes(), *health.routes(), *aliases.routes(), *system.routes(),
                *(r for family in families.all for r in family.routes())],
        exception_handlers={HTTPException: _http_exception},
        lifespan=lifespan,
    )
    app.state.settings = settings
    app.state.registry = registry
    app.state.models = models
    app.state.metrics = GatewayMetrics(**build_labels(settings))
    app.state.admission = Admission(settings, app.state.metrics)
    if hasattr(models, "residency"):  # a slot held by a helper call (an embedding) keeps its model loaded too
        models.residency.admission = app.state.admission
    app.state.log = log
    app.state.normalizer = PromptNormalizer(settings.prompt_normalizers)
    app.state.families = families  # /openapi.json reads their schema tables too
    models.metrics = app.state.metrics
    app.add_middleware(BodyLimitMiddleware, limit=settings.max_request_body_bytes, families=families)
    app.add_middleware(ApiKeyMiddleware, settings=settings, families=families)
    app.add_middleware(ErrorMiddleware, log=log, families=families)
    app.add_middleware(DrainGate, state=app.state)
    app.add_middleware(BrowserGuard, allowed_hosts=settings.allowed_hosts, allowed_origins=settings.allowed_origins, families=families)
    app.add_middleware(OutcomeCounter, metrics=app.state.metrics, routes=app.routes)
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
