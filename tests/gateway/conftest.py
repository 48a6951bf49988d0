"""Gateway fixtures: an in-process fake worker, a stub registry, the app and an HTTP client."""

from __future__ import annotations

import datetime as dt
import io
import json
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import msgspec
import pytest

from barrel_inference.config import ModelSettings, Settings
from barrel_inference.gateway.app import create_app
from barrel_inference.gateway.logging import make_logger
from barrel_inference.gateway.workers import ModelManager
from barrel_inference.registry import RegistryError

from .fake_worker import FakeWorker

MODEL = "fake:latest"


@dataclass
class StubRecord:
    name: str
    path: Path = Path("/nonexistent/model.gguf")
    size: int = 1234
    digest: str | None = "sha256:" + "ab" * 32
    modified: dt.datetime = dt.datetime(2025, 1, 2, tzinfo=dt.timezone.utc)
    details: dict = field(default_factory=dict)
    loader: dict = field(default_factory=dict)
    parameters: dict = field(default_factory=dict)


class StubRegistry:
    """resolve / list like the real registry: alias-or-identity, a tag-less name means ':latest'."""

    def __init__(self, *records: StubRecord, aliases: dict[str, str] | None = None) -> None:
        self.records = {r.name: r for r in records}
        self.aliases = aliases or {}

    def resolve(self, name: str) -> StubRecord:
        name = self.aliases.get(name, name)
        if ":" not in name:
            name += ":latest"
        try:
            return self.records[name]
        except KeyError:
            raise RegistryError("model_not_found", f"model '{name}' not found") from None

    def list(self) -> list[StubRecord]:
        return list(self.records.values())


class LogCapture:
    """A structlog logger writing JSON lines into memory."""

    def __init__(self, settings: Settings) -> None:
        self.buffer = io.StringIO()
        self.logger = make_logger(settings, stream=self.buffer)

    def events(self, name: str | None = None) -> list[dict]:
        out = [json.loads(line) for line in self.buffer.getvalue().splitlines() if line.strip()]
        return [e for e in out if name is None or e.get("event") == name]


def make_settings(tmp_path: Path, endpoint: str | None = None, **kw) -> Settings:
    models = {MODEL: ModelSettings(endpoint=endpoint, insecure=True)} if endpoint else {}
    kw.setdefault("allowed_hosts", ["gateway.test"])  # the test client's base URL
    for name, ms in kw.pop("models", {}).items():  # the fake workers listen on plain local tcp
        models[name] = msgspec.structs.replace(ms, insecure=True) if ms.endpoint and ms.insecure is None else ms
    return Settings(runtime_dir=str(tmp_path / "run"), model_cache_dir=str(tmp_path / "cache"), models=models,
                    embed_default_model=False, worker_start_timeout=kw.pop("worker_start_timeout", 5.0), **kw)  # fmt: skip


@pytest.fixture
async def fake_worker():
    worker = FakeWorker(model=MODEL)
    await worker.start()
    yield worker
    await worker.stop()


class Gateway:
    def __init__(self, app, settings, manager, logs) -> None:
        self.app = app
        self.settings = settings
        self.models = manager
        self.logs = logs
        self.client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gateway.test", timeout=10)

    async def aclose(self) -> None:
        await self.client.aclose()
        await self.models.aclose()


@pytest.fixture
async def make_gateway(tmp_path):
    made: list[Gateway] = []

    async def make(endpoint: str | None, *, registry=None, heartbeat=(0.5, 5.0), families=None, **settings_kw) -> Gateway:
        settings = make_settings(tmp_path, endpoint, **settings_kw)
        logs = LogCapture(settings)
        registry = registry or StubRegistry(StubRecord(MODEL), aliases={"gpt-4o": MODEL})
        manager = ModelManager(settings, registry, logger=logs.logger, heartbeat=heartbeat)
        gw = Gateway(create_app(settings, registry=registry, models=manager, logger=logs.logger, families=families), settings, manager, logs)
        made.append(gw)
        return gw

    yield make
    for gw in made:
        await gw.aclose()


@pytest.fixture
async def gateway(make_gateway, fake_worker) -> Gateway:
    return await make_gateway(fake_worker.endpoint)
