"""structlog for the gateway, built from the settings: JSON lines (default) or a console renderer.

No global configuration: `make_logger(settings)` returns a bound logger that the app passes around.
"""

from __future__ import annotations

import logging as std_logging
import sys
from typing import Any, TextIO

import structlog

from ..config import Settings


def make_logger(settings: Settings, *, stream: TextIO | None = None, name: str = "barrel_inference.gateway") -> Any:
    level = std_logging.getLevelName(settings.log_level.upper())
    if not isinstance(level, int):
        level = std_logging.INFO
    renderer = structlog.processors.JSONRenderer() if settings.log_json else structlog.dev.ConsoleRenderer(colors=False)
    return structlog.wrap_logger(
        structlog.PrintLogger(stream or sys.stderr),
        processors=[
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(level),
        logger_name=name,
    )
