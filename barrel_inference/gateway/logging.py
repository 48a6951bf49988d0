"""structlog for the gateway, built from the settings: JSON lines (default) or a console renderer.

`make_logger(settings)` returns a bound logger that the app passes around (no global state).
`configure_process_logging(settings)` is for a process's entry point only (`server.run`): it gives
structlog's global configuration the same shape, so modules that log through
`structlog.get_logger()` (the registry, for one) write the same lines to the same place.
"""

from __future__ import annotations

import logging as std_logging
import sys
from typing import Any, TextIO

import structlog

from ..config import Settings


def _level(settings: Settings) -> int:
    level = std_logging.getLevelName(settings.log_level.upper())
    return level if isinstance(level, int) else std_logging.INFO


def _processors(settings: Settings) -> list:
    renderer = structlog.processors.JSONRenderer() if settings.log_json else structlog.dev.ConsoleRenderer(colors=False)
    return [
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        structlog.processors.format_exc_info,
        renderer,
    ]


def make_logger(settings: Settings, *, stream: TextIO | None = None, name: str = "barrel_inference.gateway") -> Any:
    return structlog.wrap_logger(
        structlog.PrintLogger(stream or sys.stderr),
        processors=_processors(settings),
        wrapper_class=structlog.make_filtering_bound_logger(_level(settings)),
        logger_name=name,
    )


class StructlogHandler(std_logging.Handler):
    """A stdlib logging handler that writes each record as a structlog event (hypercorn's own messages, for one),
    so the daemon writes one stream of lines in one format."""

    def __init__(self, log: Any, name: str) -> None:
        super().__init__()
        self.log = log.bind(logger_name=name)

    def emit(self, record: std_logging.LogRecord) -> None:
        try:
            method = getattr(self.log, record.levelname.lower(), self.log.info)
            fields: dict[str, Any] = {}
            if record.exc_info:
                fields["exc_info"] = record.exc_info
            method("server_message", message=record.getMessage(), **fields)
        except Exception:  # noqa: BLE001 - logging must not raise
            self.handleError(record)


def stdlib_logger(log: Any, name: str, settings: Settings) -> std_logging.Logger:
    """A stdlib logger named `name` whose records go through `log` (and nowhere else). It is not registered in
    the logging module's global tree: each app has its own."""
    logger = std_logging.Logger(name)
    logger.handlers = [StructlogHandler(log, name)]
    logger.propagate = False
    logger.setLevel(_level(settings))
    return logger


def configure_process_logging(settings: Settings) -> None:
    structlog.configure(
        processors=[structlog.contextvars.merge_contextvars, *_processors(settings)],
        wrapper_class=structlog.make_filtering_bound_logger(_level(settings)),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
        cache_logger_on_first_use=True,
    )
