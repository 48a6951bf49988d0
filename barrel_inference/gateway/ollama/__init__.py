"""The Ollama API family: wire structs (wire.py), pure conversions (convert.py), model management routes
(management.py) and the route table (routes.py). The generation side (/api/chat, /api/generate, /api/embed)
plugs in beside management.py."""

from __future__ import annotations


def family():
    """Ollama owns /api: its errors are `{"error": "..."}`."""
    from ..family import Family, plain_error
    from . import routes

    return Family("ollama", ("/api",), render_error=plain_error, routes=routes.routes, aclose=routes.aclose)
