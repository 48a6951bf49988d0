"""A live daemon for CLI tests: the real gateway (hypercorn on a real 127.0.0.1 port) with the real registry,
a scripted worker for `fake:latest` and local imitations of the remotes, all on a background event loop so that
click's CliRunner and real `bictl` subprocesses can talk to it."""

from __future__ import annotations

import asyncio
import io
import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from netutil import wait_healthy
import pytest

from barrel_inference.config import ModelSettings, Settings
from barrel_inference.gateway.logging import make_logger
from barrel_inference.gateway.server import serve
from barrel_inference.registry import Registry
from tests.gateway.fake_worker import FakeWorker
from tests.registry.registry_fakes import FakeHF, FakeOllama, FileHost
from tinymodel import write_tiny_gguf

MODEL = "fake:latest"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Daemon:
    url: str
    host: str  # for BARREL_INFERENCE_HOST
    settings: Settings
    registry: Registry
    worker: FakeWorker
    cdn: FileHost
    hf: FakeHF
    ollama: FakeOllama
    loop: asyncio.AbstractEventLoop

    def run(self, coro, timeout: float = 10):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)


class DaemonThread:
    def __init__(self, tmp: Path, tiny: Path, **settings: object):
        self.tmp = tmp
        self.tiny = tiny
        self.extra_settings = settings
        self.ready = threading.Event()
        self.daemon: Daemon | None = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._main, name="bictl-test-daemon", daemon=True)

    def _main(self):
        try:
            asyncio.run(self._serve())
        except BaseException as exc:  # noqa: BLE001 - reported to the test
            self.error = exc
            self.ready.set()

    async def _serve(self):
        self.stop_event = asyncio.Event()
        async with FileHost() as cdn, FakeHF(cdn) as hf, FakeOllama(cdn) as ol:
            worker = FakeWorker(model=MODEL)
            await worker.start()
            port = free_port()
            settings = Settings(host="127.0.0.1", port=port, model_cache_dir=str(self.tmp / "cache"), runtime_dir=str(self.tmp / "run"),
                                embed_default_model=False, models={MODEL: ModelSettings(endpoint=worker.endpoint, insecure=True)},
                                hf_endpoint=hf.url, ollama_registry=ol.url, ollama_search_url=ol.url, log_json=True,
                                **self.extra_settings)  # fmt: skip
            self.log = io.StringIO()
            logger = make_logger(settings, stream=self.log)
            registry = Registry(settings, logger=logger)
            registry.register_local(MODEL, self.tiny)
            task = asyncio.create_task(serve(settings, self.stop_event, registry=registry, logger=logger))
            url = settings.base_url()
            await wait_healthy(url)
            self.daemon = Daemon(url, f"127.0.0.1:{port}", settings, registry, worker, cdn, hf, ol, asyncio.get_running_loop())
            self.ready.set()
            await task
            await worker.stop()

    def start(self) -> Daemon:
        self.thread.start()
        self.ready.wait(30)
        if self.error:
            raise self.error
        assert self.daemon is not None
        return self.daemon

    def stop(self):
        if self.daemon is not None:
            self.daemon.loop.call_soon_threadsafe(self.stop_event.set)
        self.thread.join(20)


@pytest.fixture
def daemon(tmp_path, tiny_gguf):
    t = DaemonThread(tmp_path, tiny_gguf)
    d = t.start()
    yield d
    t.stop()


@pytest.fixture(scope="session")
def tiny_bytes(tmp_path_factory) -> list[bytes]:
    d = tmp_path_factory.mktemp("cli-ggufs")
    return [write_tiny_gguf(d / f"c{i}.gguf", seed=10 + i).read_bytes() for i in range(2)]


def wait_for(pred, timeout=5.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(0.02)
    return False
