"""The OpenAI API family: wire structs (wire.py), pure conversions (convert.py), the SSE encoders
(stream.py), and the routes with their lifecycle adapters (routes.py)."""

from __future__ import annotations


def family():
    from .routes import FAMILY

    return FAMILY
