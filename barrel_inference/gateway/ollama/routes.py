"""The Ollama family's route table."""

from __future__ import annotations

from starlette.routing import Route

from . import management
from .management import aclose  # the app's lifespan closes the family's pull jobs with it

__all__ = ["routes", "aclose"]


def routes() -> list[Route]:
    return [
        Route("/api/pull", management.pull, methods=["POST"]),
        Route("/api/pulls", management.pull_jobs, methods=["GET"]),
        Route("/api/pulls/{job_id}", management.pull_job, methods=["GET"]),
        Route("/api/tags", management.tags, methods=["GET"]),
        Route("/api/show", management.show, methods=["POST"]),
        Route("/api/delete", management.delete, methods=["DELETE"]),
        Route("/api/copy", management.copy, methods=["POST"]),
        Route("/api/ps", management.ps, methods=["GET"]),
        Route("/api/version", management.version, methods=["GET"]),
        Route("/api/search", management.search, methods=["POST"]),
        Route("/api/unload", management.unload, methods=["POST"]),
    ]
