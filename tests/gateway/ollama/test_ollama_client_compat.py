"""The official `ollama` Python client drives the management routes (pull, list, show, copy, delete, ps)."""

from __future__ import annotations

import httpx
import pytest
from starlette.applications import Starlette

from barrel_inference.config import Settings
from barrel_inference.gateway.ollama import management
from barrel_inference.gateway.ollama.routes import routes
from barrel_inference.registry import Registry
from tests.registry.registry_fakes import FakeOllama, FileHost
from tinymodel import write_tiny_gguf

from .test_ollama_management import Running, StubModels

ollama = pytest.importorskip("ollama")


@pytest.fixture
async def client(tmp_path):
    async with FileHost() as cdn, FakeOllama(cdn) as reg:
        settings = Settings(model_cache_dir=str(tmp_path / "cache"), ollama_registry=reg.url)
        app = Starlette(routes=routes())
        app.state.registry = Registry(settings)
        app.state.models = StubModels()
        data = write_tiny_gguf(tmp_path / "t.gguf").read_bytes()
        reg.add_model("library/tiny:1b", data, params={"num_ctx": 512})
        c = ollama.AsyncClient(host="http://test", transport=httpx.ASGITransport(app=app))
        yield c, app, data
        await management.aclose(app)


async def test_ollama_client_pull_list_show_copy_delete_ps(client):
    c, app, data = client
    progress = [p async for p in await c.pull("tiny:1b", stream=True)]
    assert progress[0].status == "pulling manifest" and progress[-1].status == "success"
    assert any(p.total == len(data) and p.completed == len(data) for p in progress)
    listed = await c.list()
    assert [m.model for m in listed.models] == ["tiny:1b"] and listed.models[0].size == len(data)
    assert listed.models[0].details.family == "llama"
    shown = await c.show("tiny:1b")
    assert shown.details.quantization_level == "F32" and "num_ctx" in shown.parameters
    assert shown.modelinfo["general.architecture"] == "llama"
    assert (await c.copy("tiny:1b", "tiny:copy")).status == "success"
    assert (await c.delete("tiny:1b")).status == "success"
    assert [m.model for m in (await c.list()).models] == ["tiny:copy"]
    app.state.models.loaded["tiny:copy"] = Running("tiny:copy", size=len(data))
    ps = await c.ps()
    assert [m.model for m in ps.models] == ["tiny:copy"] and ps.models[0].size == len(data)
    with pytest.raises(ollama.ResponseError) as e:
        await c.show("absent")
    assert e.value.status_code == 404 and "not found" in e.value.error
