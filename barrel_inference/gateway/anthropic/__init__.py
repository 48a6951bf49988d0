"""The Anthropic Messages API family: wire structs (wire.py), pure conversions (convert.py), content
blocks and the stop_reason contract (blocks.py), the named-event SSE encoder (stream.py), the error
envelope (errors.py, definition.py), the key allowlist (auth.py), the models list (models.py), and the
routes with their lifecycle adapter (routes.py)."""

from __future__ import annotations


def family():
    from .definition import FAMILY

    return FAMILY
