"""The Ollama family's route table."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

from . import create, generate, management
from .management import aclose  # the app's lifespan closes the family's pull jobs with it

__all__ = ["routes", "aclose"]


async def root(request: Request) -> Response:
    """GET / and HEAD /: what Ollama answers, so clients that probe for a server find one."""
    return PlainTextResponse("Ollama is running")


def routes() -> list[Route]:
    return [
        Route("/", root, methods=["GET", "HEAD"]),
        Route("/api/generate", generate.generate, methods=["POST"]),
        Route("/api/chat", generate.chat, methods=["POST"]),
        Route("/api/embed", generate.embed, methods=["POST"]),
        Route("/api/embeddings", generate.embeddings, methods=["POST"]),
        Route("/api/create", create.create, methods=["POST"]),
        Route("/api/edit", create.edit, methods=["POST"]),
        Route("/api/pull", management.pull, methods=["POST"]),
        Route("/api/pulls", management.pull_jobs, methods=["GET"]),
        Route("/api/pulls/{job_id}", management.pull_job, methods=["GET"]),
        Route("/api/tags", management.tags, methods=["GET"]),
        Route("/api/show", management.show, methods=["POST"]),
        Route("/api/delete", management.delete, methods=["DELETE"]),
        Route("/api/copy", management.copy, methods=["POST"]),
        Route("/api/ps", management.ps, methods=["GET"]),
        Route("/api/version", management.version, methods=["GET", "HEAD"]),
        Route("/api/search", management.search, methods=["POST"]),
        Route("/api/unload", management.unload, methods=["POST"]),
    ]
