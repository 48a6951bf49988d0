"""Serve the gateway with hypercorn until SIGINT/SIGTERM (or a shutdown event); SIGHUP re-reads the
config file's reloadable keys (aliases, API keys) without a restart."""

from __future__ import annotations

import asyncio
import os
import signal
from typing import Callable

from hypercorn.asyncio import serve as hypercorn_serve
from hypercorn.config import Config

from ..config import Settings
from .aliases import apply_overrides
from .app import create_app
from .logging import configure_process_logging, make_logger


def hypercorn_config(settings: Settings) -> Config:
    config = Config()
    host = f"[{settings.host}]" if ":" in settings.host and not settings.host.startswith("[") else settings.host
    config.bind = [f"{host}:{settings.port}"]
    config.accesslog = None  # the gateway writes its own line per request
    config.errorlog = "-"
    config.graceful_timeout = 5.0
    config.keep_alive_timeout = 75.0  # clients reuse connections across turns
    return config


async def serve(settings: Settings, shutdown_event: asyncio.Event, **app_kwargs) -> None:
    """Serve until `shutdown_event` is set; the app's lifespan starts and stops the workers."""
    log = app_kwargs.pop("logger", None) or make_logger(settings)
    app = create_app(settings, logger=log, **app_kwargs)
    log.info("gateway_listening", url=settings.base_url(), pid=os.getpid())
    await hypercorn_serve(app, hypercorn_config(settings), shutdown_trigger=shutdown_event.wait)


def reload_config(settings: Settings, load: Callable[[], Settings], log) -> list[str]:
    """Load the config again and apply its reloadable keys; a config that does not load changes nothing."""
    try:
        fresh = load()
        apply_overrides(fresh)  # aliases set with `bictl alias` stay over the file's
    except Exception as exc:  # noqa: BLE001 - a bad edit must not take the daemon down
        log.error("config_reload_failed", error=str(exc))
        return []
    changed = settings.apply_reload(fresh)
    log.info("config_reloaded", changed=changed)
    return changed


def run(settings: Settings, reload: Callable[[], Settings] | None = None) -> None:
    """Block serving until SIGINT or SIGTERM; on SIGHUP apply `reload()`'s reloadable keys."""

    configure_process_logging(settings)

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        if reload is not None:
            log = make_logger(settings)
            loop.add_signal_handler(signal.SIGHUP, lambda: reload_config(settings, reload, log))
        await serve(settings, stop)

    asyncio.run(main())
