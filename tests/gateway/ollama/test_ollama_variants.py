"""A request whose loader options differ from the loaded worker's (num_ctx, ...) gets a worker with them,
while the model's own worker keeps streaming to its clients (child fake workers over real sockets)."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import tempfile
from pathlib import Path

import httpx
import pytest

from barrel_inference.gateway.app import create_app
from barrel_inference.gateway.variants import needed
from barrel_inference.gateway.workers import ModelManager
from barrel_inference.config import Settings

from ..conftest import LogCapture, StubRecord, StubRegistry, make_settings

REPO = Path(__file__).resolve().parents[3]
FAKE_CMD = [sys.executable, "-m", "tests.gateway.fake_worker"]


@pytest.fixture(autouse=True)
def _importable(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))


@pytest.fixture
async def gw():
    with tempfile.TemporaryDirectory(prefix="bi-var-", dir="/tmp") as d:
        tmp = Path(d)
        argv_file = tmp / "argv.txt"
        settings = make_settings(tmp, None)
        logs = LogCapture(settings)
        registry = StubRegistry(StubRecord("m:latest", loader={"n_ctx": 32768}))
        models = ModelManager(settings, registry, logger=logs.logger, worker_command=FAKE_CMD, extra_args=["--argv-file", str(argv_file)])
        app = create_app(settings, registry=registry, models=models, logger=logs.logger)
        client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gateway.test", timeout=20)
        yield client, models, argv_file
        await client.aclose()
        await models.aclose()


async def test_num_ctx_gets_its_own_worker_without_breaking_running_streams(gw):
    client, models, argv_file = gw
    running = asyncio.create_task(client.post("/api/generate", json={"model": "m", "prompt": "a b STALL", "raw": True}))
    for _ in range(1000):  # the worker starts (a child process), then the request runs on it
        if models.handles() and models.handles()[0].in_flight:
            break
        await asyncio.sleep(0.02)
    assert models.handles(), "the model's worker did not start"
    base = models.handles()[0]
    r = await client.post("/api/generate", json={"model": "m", "prompt": "x y", "stream": False, "options": {"num_ctx": 16384}})
    assert r.status_code == 200 and r.json()["response"] == "x y"
    assert r.json()["load_duration"] > 0  # this request waited for its worker to start
    names = sorted(h.name for h in models.handles())
    assert names == ["m:latest", "m:latest (num_ctx=16384)"]
    assert base.alive and base.in_flight == 1 and not running.done()  # the other client's stream goes on
    argvs = argv_file.read_text().splitlines()
    assert len(argvs) == 2 and "--n-ctx 8192" in argvs[0] and "--n-ctx 16384" in argvs[1]
    # the same options again: the same variant; a smaller num_ctx fits in the model's own worker
    await client.post("/api/generate", json={"model": "m", "prompt": "x", "stream": False, "options": {"num_ctx": 16384}})
    await client.post("/api/generate", json={"model": "m", "prompt": "x", "stream": False, "options": {"num_ctx": 2048}})
    assert len(argv_file.read_text().splitlines()) == 2
    ps = (await client.get("/api/ps")).json()["models"]
    assert sorted(m["name"] for m in ps) == names
    base.link.abort(base.link.in_flight())
    body = (await running).text.splitlines()
    assert "".join(json.loads(x).get("response", "") for x in body).startswith("a b")  # its stream kept going
    # unloading the model (keep_alive 0, empty prompt) stops its workers with other settings too
    r = await client.post("/api/generate", json={"model": "m", "keep_alive": 0})
    assert r.json()["done_reason"] == "unload" and models.handles() == []


def test_needed_overrides():
    rec = StubRecord("m:latest", loader={"n_ctx": 32768})
    s = Settings()
    assert needed(s, rec, {"n_ctx": 4096}) == {}  # fits in the default 8192
    assert needed(s, rec, {"n_ctx": 65536}) == {"n_ctx": 32768}  # capped by the model's own context
    assert needed(s, rec, {"n_batch": 512}) == {}  # already what the model loads with
    assert needed(s, rec, {"n_batch": 64, "threads": 1}) == {"n_batch": 64, "threads": 1}
    assert needed(s, StubRecord("m:latest", loader={"n_ctx": 8192}), {"n_ctx": 16384}) == {}
