"""Serve the gateway with hypercorn until SIGINT/SIGTERM (or a shutdown event)."""

from __future__ import annotations

import asyncio
import os
import signal

from hypercorn.asyncio import serve as hypercorn_serve
from hypercorn.config import Config

from ..config import Settings
from .app import create_app
from .logging import configure_process_logging, make_logger, stdlib_logger
from .ports import check_free


def hypercorn_config(settings: Settings, log=None) -> Config:
    config = Config()
    host = f"[{settings.host}]" if ":" in settings.host and not settings.host.startswith("[") else settings.host
    config.bind = [f"{host}:{settings.port}"]
    config.accesslog = None  # the gateway writes its own line per request
    # hypercorn's own messages go through the gateway's structlog logger: one stream, one format
    config.errorlog = stdlib_logger(log or make_logger(settings), "hypercorn.error", settings)
    config.graceful_timeout = 5.0
    config.keep_alive_timeout = 75.0  # clients reuse connections across turns
    return config


async def serve(settings: Settings, shutdown_event: asyncio.Event, **app_kwargs) -> None:
    """Serve until `shutdown_event` is set; the app's lifespan starts and stops the workers."""
    log = app_kwargs.pop("logger", None) or make_logger(settings)
    check_free(settings.host, settings.port)  # PortInUse: one line for a person, before anything starts
    app = create_app(settings, logger=log, **app_kwargs)
    log.info("gateway_listening", url=settings.base_url(), pid=os.getpid())
    await hypercorn_serve(app, hypercorn_config(settings, log), shutdown_trigger=shutdown_event.wait)


def run(settings: Settings) -> None:
    """Block serving until SIGINT or SIGTERM."""

    configure_process_logging(settings)

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await serve(settings, stop)

    asyncio.run(main())
