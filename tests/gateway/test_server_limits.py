"""hypercorn's limits as configured: a head that never completes is cut off, open connections are capped
(the probe held 3,000 slowloris connections open with nothing bounding them)."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from netutil import wait_healthy

from barrel_inference.gateway.server import serve
from barrel_inference.gateway.workers import ModelManager

from .conftest import MODEL, LogCapture, StubRecord, StubRegistry, make_settings
from .test_server import free_port


@pytest.fixture
async def limited(tmp_path, fake_worker):
    settings = make_settings(tmp_path, fake_worker.endpoint, host="127.0.0.1", port=free_port(),
                             keep_alive_timeout=0.5, max_connections=4, max_header_bytes=4096)  # fmt: skip
    logs = LogCapture(settings)
    registry = StubRegistry(StubRecord(MODEL))
    models = ModelManager(settings, registry, logger=logs.logger)
    stop = asyncio.Event()
    task = asyncio.create_task(serve(settings, stop, registry=registry, models=models, logger=logs.logger))
    await wait_healthy(settings.base_url())
    yield settings
    stop.set()
    await asyncio.wait_for(task, 15)


async def _slowloris(port: int):
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")  # the head never ends
    await writer.drain()
    return reader, writer


async def test_slow_heads_are_cut_off_and_connections_capped(limited):
    port = limited.port
    await asyncio.sleep(1.0)  # the health poll's keep-alive connection has been closed by now
    slow = [await _slowloris(port) for _ in range(4)]
    # a fifth connection is over the cap: 503 and closed
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    await writer.drain()
    answer = await asyncio.wait_for(reader.read(), 5)
    assert answer.startswith(b"HTTP/1.1 503") and b"too many open connections" in answer
    writer.close()
    # the slow heads are closed by the server after keep_alive_timeout
    for r, w in slow:
        assert await asyncio.wait_for(r.read(), 5) == b""
        w.close()
    async with httpx.AsyncClient(base_url=limited.base_url()) as client:  # and normal requests go on
        assert (await client.get("/health")).status_code == 200


async def test_an_oversized_head_is_refused(limited):
    reader, writer = await asyncio.open_connection("127.0.0.1", limited.port)
    writer.write(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: " + b"a" * 8000)  # past max_header_bytes, unfinished
    await writer.drain()
    answer = await asyncio.wait_for(reader.read(), 5)
    assert answer == b"" or answer.split(b" ", 2)[1] in (b"400", b"431")
    writer.close()
    async with httpx.AsyncClient(base_url=limited.base_url()) as client:
        assert (await client.get("/health")).status_code == 200
