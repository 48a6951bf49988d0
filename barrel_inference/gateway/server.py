"""Serve the gateway with hypercorn until SIGINT/SIGTERM (or a shutdown event); SIGHUP re-reads the
config file's reloadable keys (aliases, API keys) without a restart."""

from __future__ import annotations

import asyncio
import os
import signal
from typing import Callable

from hypercorn.asyncio import run as hypercorn_run
from hypercorn.asyncio import serve as hypercorn_serve
from hypercorn.asyncio.tcp_server import TCPServer
from hypercorn.config import Config

from ..config import Settings
from .aliases import apply_overrides
from .app import create_app
from .logging import configure_process_logging, make_logger, stdlib_logger
from .ports import check_free
from .runtime import RuntimeLock


BUSY = b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\ncontent-length: 51\r\nconnection: close\r\n\r\n" \
       b'{"error": "too many open connections; retry later"}'


class ConnectionGate:
    """At most `limit` connections open at once (counted for the life of each connection)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.open = 0

    def enter(self) -> bool:
        if self.open >= self.limit:
            return False
        self.open += 1
        return True

    def leave(self) -> None:
        self.open -= 1


class CappedTCPServer(TCPServer):
    """hypercorn's connection handler, refusing connections beyond the config's ConnectionGate.

    hypercorn has no connection cap of its own; its asyncio runner looks this class up by name, so
    `_install_connection_cap` puts it there. A config without a `connection_gate` runs as before."""

    async def run(self) -> None:
        gate = getattr(self.config, "connection_gate", None)
        if gate is None:
            await super().run()
            return
        if not gate.enter():
            try:
                self.writer.write(BUSY)
                await self.writer.drain()
                self.writer.write_eof()
                await asyncio.wait_for(self.reader.read(65536), 0.2)  # what the client sent, so closing does not reset
            except (OSError, RuntimeError, asyncio.TimeoutError):
                pass
            finally:
                self.writer.close()
            return
        try:
            await super().run()
        finally:
            gate.leave()


def _install_connection_cap() -> None:
    if hypercorn_run.TCPServer is TCPServer:
        hypercorn_run.TCPServer = CappedTCPServer


def hypercorn_config(settings: Settings, log=None) -> Config:
    config = Config()
    host = f"[{settings.host}]" if ":" in settings.host and not settings.host.startswith("[") else settings.host
    config.bind = [f"{host}:{settings.port}"]
    config.accesslog = None  # the gateway writes its own line per request
    # hypercorn's own messages go through the gateway's structlog logger: one stream, one format
    config.errorlog = stdlib_logger(log or make_logger(settings), "hypercorn.error", settings)
    config.graceful_timeout = 5.0
    # hypercorn's idle timer runs from a connection's start (and each response's end) until a
    # request's head is complete: it bounds both keep-alive and how long a head may take (slowloris)
    config.keep_alive_timeout = settings.keep_alive_timeout
    config.h11_max_incomplete_size = settings.max_header_bytes
    config.backlog = min(2048, max(100, settings.max_connections))
    config.connection_gate = ConnectionGate(settings.max_connections)
    return config


async def serve(settings: Settings, shutdown_event: asyncio.Event, **app_kwargs) -> None:
    """Serve until `shutdown_event` is set; the app's lifespan starts and stops the workers.

    The daemon holds its runtime dir's lock throughout (RuntimeDirBusy when another one has it)."""
    log = app_kwargs.pop("logger", None) or make_logger(settings)
    check_free(settings.host, settings.port)  # PortInUse: one line for a person, before anything starts
    with RuntimeLock(settings.run_dir()):
        app = create_app(settings, logger=log, **app_kwargs)
        log.info("gateway_listening", url=settings.base_url(), pid=os.getpid(), runtime_dir=str(settings.run_dir()))
        _install_connection_cap()
        await hypercorn_serve(app, hypercorn_config(settings, log), shutdown_trigger=shutdown_event.wait)


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
