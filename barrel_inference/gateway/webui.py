"""GET/HEAD /: the chat page for browsers, Ollama's liveness text for every other client (by `Accept`).

The page is one static file in the package (plain HTML, CSS and JavaScript: no build step, nothing fetched
from elsewhere); it talks to the daemon's own API (/v1/models, /v1/chat/completions, /api/ps, /api/stats).
"""

from __future__ import annotations

from functools import lru_cache
from importlib import resources

from starlette.requests import Request
from starlette.responses import HTMLResponse, PlainTextResponse, Response
from starlette.routing import Route

LIVENESS = "Ollama is running"


@lru_cache(maxsize=None)
def static_text(name: str) -> str:
    return resources.files(__package__).joinpath("static", name).read_text(encoding="utf-8")


def wants_html(accept: str | None) -> bool:
    """A browser's navigation asks for text/html ahead of */*; curl, Ollama's clients and probes do not."""
    if not accept:
        return False
    best_html = best_other = 0.0
    for item in accept.split(","):
        media, *params = [p.strip() for p in item.split(";")]
        q = 1.0
        for p in params:
            if p.startswith("q="):
                try:
                    q = float(p[2:])
                except ValueError:
                    q = 0.0
        if media in ("text/html", "application/xhtml+xml"):
            best_html = max(best_html, q)
        elif media and media != "*/*":
            best_other = max(best_other, q)
    return best_html > 0 and best_html >= best_other


async def root(request: Request) -> Response:
    headers = {"vary": "accept"}
    if wants_html(request.headers.get("accept")):
        return HTMLResponse(static_text("chat.html"), headers=headers)
    return PlainTextResponse(LIVENESS, headers=headers)


def routes() -> list[Route]:
    return [Route("/", root, methods=["GET", "HEAD"])]
