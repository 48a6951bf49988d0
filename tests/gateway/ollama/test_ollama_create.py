"""/api/create (Modelfile text and JSON fields), /api/edit and /api/show capabilities, with a real registry
on disk and the official `ollama` client."""

from __future__ import annotations

import json

import httpx
import pytest
import structlog
from starlette.applications import Starlette

from barrel_inference.config import Settings
from barrel_inference.gateway.ollama.routes import routes
from barrel_inference.registry import Registry
from tinymodel import write_tiny_gguf

from .test_ollama_management import QWEN_TOOLS, StubModels

ollama = pytest.importorskip("ollama")


@pytest.fixture
def app(tmp_path):
    settings = Settings(model_cache_dir=str(tmp_path / "cache"))
    app = Starlette(routes=routes())
    app.state.registry = Registry(settings)
    app.state.models = StubModels()
    app.state.log = structlog.get_logger("test")
    gguf = write_tiny_gguf(tmp_path / "t.gguf")
    app.state.registry.register_local("tiny:1b", gguf, parameters={"num_ctx": 512})
    tools = write_tiny_gguf(tmp_path / "q.gguf", chat_template=QWEN_TOOLS, seed=1)
    app.state.registry.register_local("qwen:tools", tools)
    app.state.gguf = gguf
    return app


@pytest.fixture
def client(app):
    return ollama.AsyncClient(host="http://test", transport=httpx.ASGITransport(app=app))


@pytest.fixture
def http(app):
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test")


MODELFILE = 'FROM tiny:1b\nPARAMETER temperature 0.3\nPARAMETER stop "<|im_end|>"\nSYSTEM """You are terse."""\nMESSAGE user Hi\n'


async def test_create_from_a_modelfile_shares_the_blob_and_streams_progress(app, http):
    r = await http.post("/api/create", json={"model": "terse", "modelfile": MODELFILE})
    assert r.status_code == 200 and r.headers["content-type"].startswith("application/x-ndjson")
    statuses = [json.loads(x)["status"] for x in r.text.splitlines()]
    assert statuses[0] == "reading model metadata" and statuses[-2:] == ["writing manifest", "success"]
    assert sum(s.startswith("creating new layer sha256:") for s in statuses) == 3  # system, params, messages
    reg = app.state.registry
    made, base = reg.resolve("terse"), reg.resolve("tiny:1b")
    assert made.path == base.path  # the same GGUF, not a copy
    assert made.parameters == {"num_ctx": 512, "temperature": 0.3, "stop": ["<|im_end|>"]}  # inherits, then overrides
    assert made.system == "You are terse." and made.messages == [{"role": "user", "content": "Hi"}]


async def test_create_with_json_fields_through_the_client(app, client):
    progress = [p async for p in await client.create(
        model="pirate:v1", from_="tiny:1b", system="Arr.", parameters={"temperature": 0.9, "num_ctx": 256}, stream=True,
    )]  # fmt: skip
    assert progress[-1].status == "success"
    made = app.state.registry.resolve("pirate:v1")
    assert made.parameters["temperature"] == 0.9 and made.parameters["num_ctx"] == 256 and made.system == "Arr."
    done = await client.create(model="pirate:v2", from_="pirate:v1")
    assert done.status == "success"
    assert app.state.registry.resolve("pirate:v2").system == "Arr."  # built on a created model
    shown = await client.show("pirate:v1")
    assert 'SYSTEM """Arr."""' in shown.modelfile and "temperature" in shown.parameters


async def test_create_from_a_gguf_path(app, client):
    await client.create(model="frompath", from_=str(app.state.gguf))
    assert app.state.registry.resolve("frompath").path == app.state.gguf.resolve()


@pytest.mark.parametrize(
    "body, status, words",
    [
        ({"model": "x", "from": "tiny:1b", "parameters": {"temprature": 1}}, 400, "unknown option 'temprature'"),
        ({"model": "x", "from": "tiny:1b", "parameters": {"num_ctx": "big"}}, 400, "'num_ctx' must be an integer"),
        ({"model": "x", "modelfile": "FROM tiny:1b\nPARAMETER top_k lots"}, 400, "line 2"),
        ({"model": "x", "modelfile": "FROM tiny:1b\nADAPTER ./lora.gguf"}, 400, "ADAPTER"),
        ({"model": "x", "from": "absent"}, 404, "model 'absent' not found"),
        ({"model": "x"}, 400, "'from' is required"),
        ({"model": "x", "from": "tiny:1b", "quantize": "q4_K_M"}, 400, "quantize"),
        ({"model": "x", "files": {"m.gguf": "sha256:" + "0" * 64}}, 400, "files"),
        ({"model": "bad name!", "from": "tiny:1b"}, 400, "not a valid model name"),
        ({"model": "x", "from": "/no/such/file.gguf"}, 400, "no such file"),
    ],
)  # fmt: skip
async def test_create_errors(app, http, body, status, words):
    r = await http.post("/api/create", json=body)
    assert r.status_code == status and words in r.json()["error"], r.text
    assert not app.state.registry.exists("x")  # nothing written


async def test_edit_merges_parameters_atomically_and_answers_like_show(app, http):
    r = await http.post("/api/edit", json={"model": "tiny:1b", "parameters": {"temperature": 0.1, "num_ctx": None}, "system": "S"})
    assert r.status_code == 200
    body = r.json()
    assert {"modelfile", "parameters", "template", "details", "model_info", "capabilities"} <= set(body)
    assert "temperature" in body["parameters"] and "num_ctx" not in body["parameters"]
    made = app.state.registry.resolve("tiny:1b")
    assert made.parameters == {"temperature": 0.1} and made.system == "S"
    r = await http.post("/api/edit", json={"model": "tiny:1b", "parameters": {"top_k": "x"}})
    assert r.status_code == 400 and "top_k" in r.json()["error"]
    assert app.state.registry.resolve("tiny:1b").parameters == {"temperature": 0.1}  # unchanged
    r = await http.post("/api/edit", json={"model": "absent", "parameters": {}})
    assert r.status_code == 404


async def test_show_capabilities_from_the_template_scan(client):
    assert (await client.show("tiny:1b")).capabilities == ["completion"]
    assert (await client.show("qwen:tools")).capabilities == ["completion", "tools", "thinking"]


async def test_root_and_version(http):
    r = await http.get("/")
    assert r.status_code == 200 and r.text == "Ollama is running"
    r = await http.head("/")
    assert r.status_code == 200
    r = await http.get("/api/version")
    assert set(r.json()) == {"version"}


def test_capabilities_of_an_embedding_model():
    from barrel_inference.gateway.ollama.convert import capabilities

    class R:
        details = {"architecture": "bert", "model_info": {"bert.pooling_type": 1}}
        loader = {}

    assert capabilities(R()) == ["embedding"]


GO_TEMPLATE = "{{ if .System }}S: {{ .System }}\n{{ end }}{{ range .Messages }}{{ .Role }}: {{ .Content }}\n{{ end }}A: "


@pytest.mark.parametrize("template,fragment", [
    ('{{ define "t" }}x{{ end }}', "{{ define }} is not supported"),
    ("{{ range .Messages }}{{ upper .Content }}{{ end }}", "function 'upper' is not defined"),
    ("{{ if .System }}no end", "has no {{ end }}"),
])  # fmt: skip
async def test_create_refuses_a_template_the_renderer_cannot_run(app, http, template, fragment):
    r = await http.post("/api/create", json={"model": "bad", "from": "tiny:1b", "template": template, "stream": False})
    assert r.status_code == 400 and fragment in r.json()["error"] and r.json()["error"].startswith("TEMPLATE:")
    r = await http.post("/api/create", json={"model": "bad", "modelfile": f'FROM tiny:1b\nTEMPLATE """{template}"""\n', "stream": False})
    assert r.status_code == 400 and fragment in r.json()["error"]
    assert not app.state.registry.exists("bad")  # nothing written
    r = await http.post("/api/edit", json={"model": "tiny:1b", "template": template})
    assert r.status_code == 400 and fragment in r.json()["error"]
    assert app.state.registry.resolve("tiny:1b").template is None


async def test_a_created_template_is_marked_for_rendering(app, http):
    r = await http.post("/api/create", json={"model": "go", "modelfile": f'FROM tiny:1b\nTEMPLATE """{GO_TEMPLATE}"""\n', "stream": False})
    assert r.status_code == 200, r.text
    made = app.state.registry.resolve("go")
    assert made.template == GO_TEMPLATE and made.template_format == "go"
    assert app.state.registry.resolve("tiny:1b").template_format == ""  # the base is untouched
    r = await http.post("/api/edit", json={"model": "tiny:1b", "template": "{{ .Prompt }}"})
    assert r.status_code == 200 and app.state.registry.resolve("tiny:1b").template_format == "go"
