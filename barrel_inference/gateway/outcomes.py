"""Counts every HTTP answer by route and status: the outermost middleware, so refusals, bad input,
aborted streams and the last-line-of-defence 500s are all counted (`barrel_inference_http_responses`)."""

from __future__ import annotations

from typing import Any

from starlette.routing import Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send


_METHODS = frozenset(("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"))


class OutcomeCounter:
    def __init__(self, app: ASGIApp, *, metrics: Any, routes: list) -> None:
        self.app = app
        self.metrics = metrics
        self.routes = routes

    def route_of(self, scope: Scope) -> str:
        partial = None
        for route in self.routes:
            match, _ = route.matches(scope)
            if match is Match.FULL:
                return getattr(route, "path", "other")
            if match is Match.PARTIAL and partial is None:
                partial = getattr(route, "path", "other")
        return partial or "unmatched"  # unknown paths share one label: clients cannot grow the series

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = 0

        async def counting_send(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, counting_send)
        finally:
            label = str(status) if status else "no_response"  # the client left before any answer
            method = scope.get("method", "")
            method = method if method in _METHODS else "other"
            self.metrics.http_responses.labels(self.route_of(scope), method, label).inc()
