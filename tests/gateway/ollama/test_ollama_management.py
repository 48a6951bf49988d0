"""Ollama's management routes on a small app built from `routes()`, a real registry on disk, stub running models
and local imitations of the remotes."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field

import httpx
import pytest
from starlette.applications import Starlette

from barrel_inference import __version__
from barrel_inference.config import Settings
from barrel_inference.gateway.ollama import management
from barrel_inference.gateway.ollama.routes import routes
from barrel_inference.registry import Registry
from tests.registry.registry_fakes import OLLAMA_SEARCH_PAGE, FakeHF, FakeOllama, Fault, FileHost
from tinymodel import write_tiny_gguf

QWEN_TOOLS = "{% for m in messages %}{{ m['content'] }}{% endfor %}<tool_call>{{ tools }}</tool_call><think>"


@dataclass
class Running:
    name: str
    n_ctx: int = 2048
    n_seq_max: int = 4
    in_flight: int = 1
    pid: int = 4242
    endpoint: str = "ipc:///tmp/x.sock"
    started_at: float = 1_700_000_000.0
    size: int = 0
    digest: str | None = None
    details: dict = field(default_factory=dict)
    architecture: str = "llama"
    chat_template: str = "gguf"
    chat_template_source: str = ""


class StubModels:
    def __init__(self):
        self.loaded: dict[str, Running] = {}
        self.unloads: list[str] = []

    def running(self):
        return list(self.loaded.values())

    async def unload(self, name: str) -> bool:
        self.unloads.append(name)
        return self.loaded.pop(name, None) is not None


def sha(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


@pytest.fixture(scope="module")
def ggufs(tmp_path_factory):
    d = tmp_path_factory.mktemp("og")
    return [write_tiny_gguf(d / "a.gguf", seed=1).read_bytes(), write_tiny_gguf(d / "b.gguf", seed=2, chat_template=QWEN_TOOLS).read_bytes()]


@pytest.fixture
async def remotes():
    async with FileHost() as cdn, FakeHF(cdn) as hf, FakeOllama(cdn) as ol:
        yield cdn, hf, ol


@pytest.fixture
async def env(tmp_path, remotes):
    cdn, hf, ol = remotes
    settings = Settings(model_cache_dir=str(tmp_path / "cache"), hf_endpoint=hf.url, ollama_registry=ol.url, ollama_search_url=ol.url,
                        aliases={"gpt-4o": "tiny:latest"})  # fmt: skip
    app = Starlette(routes=routes())
    app.state.registry = Registry(settings)
    app.state.models = StubModels()
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1") as client:
        yield app, client, remotes
    await management.aclose(app)


def lines(resp: httpx.Response) -> list[dict]:
    return [json.loads(x) for x in resp.text.splitlines() if x.strip()]


async def test_pull_streams_ollama_progress_then_tags_show_it(env, ggufs):
    app, client, (cdn, hf, ol) = env
    ol.add_model("library/tiny:1b", ggufs[1], params={"num_ctx": 1024, "stop": ["<|im_end|>", "</s>"]}, template="{{ .Prompt }}")
    r = await client.post("/api/pull", json={"model": "tiny:1b"})
    assert r.status_code == 200 and r.headers["content-type"].startswith("application/x-ndjson")
    evs = lines(r)
    d = "sha256:" + sha(ggufs[1])
    assert evs[0] == {"status": "pulling manifest"}
    layer = [e for e in evs if e["status"] == f"pulling {d[7:19]}"]
    assert layer and all(e["digest"] == d and e["total"] == len(ggufs[1]) for e in layer) and layer[-1]["completed"] == len(ggufs[1])
    assert [e["status"] for e in evs[-4:]] == ["verifying sha256 digest", "writing manifest", "removing unused layers", "success"]

    tags = (await client.get("/api/tags")).json()["models"]
    assert [t["name"] for t in tags] == ["tiny:1b"]
    t = tags[0]
    assert t["model"] == "tiny:1b" and t["size"] == len(ggufs[1]) and t["digest"] == sha(ggufs[1])
    assert t["details"] == {"parent_model": "", "format": "gguf", "family": "llama", "families": ["llama"],
                            "parameter_size": t["details"]["parameter_size"], "quantization_level": "F32"}  # fmt: skip
    assert t["details"]["parameter_size"].endswith("K")

    s = (await client.post("/api/show", json={"model": "tiny:1b"})).json()
    assert s["template"] == "{{ .Prompt }}"
    assert s["parameters"].splitlines() == [f"{'num_ctx':<30} 1024", f"{'stop':<30} \"<|im_end|>\"", f"{'stop':<30} \"</s>\""]
    assert "PARAMETER stop \"</s>\"" in s["modelfile"] and f"FROM {app.state.registry.resolve('tiny:1b').path}" in s["modelfile"]
    assert s["model_info"]["general.architecture"] == "llama" and s["model_info"]["tokenizer.ggml.tokens"] == []
    assert s["capabilities"] == ["completion", "tools", "thinking"]
    assert s["loader"]["n_ctx"] == 1024 and s["loader"]["tool_format"] == "qwen-xml"


async def test_pull_any_spec_without_streaming(env, ggufs):
    _, client, (cdn, hf, ol) = env
    hf.add_repo("org/repo-GGUF", {"m.Q4_K_M.gguf": ggufs[0]})
    r = await client.post("/api/pull", json={"model": "hf://org/repo-GGUF", "stream": False})
    assert r.status_code == 200 and r.json() == {"status": "success"}
    url = cdn.add("files/direct.gguf", ggufs[1])
    r = await client.post("/api/pull", json={"model": url, "stream": False, "destination": "direct:v1", "sha256": sha(ggufs[1])})
    assert r.json() == {"status": "success"}
    names = [t["name"] for t in (await client.get("/api/tags")).json()["models"]]
    assert names == ["direct:v1", "hf.co/org/repo-GGUF:Q4_K_M"]
    s = (await client.post("/api/show", json={"model": "direct:v1"})).json()
    assert "<tool_call>" in s["template"]  # the GGUF's own template when the source has none


@pytest.mark.parametrize(
    "body, status, needle",
    [
        ({"model": "s3://x/y.gguf"}, 400, "s3://"),
        ({"model": "hf://justorg"}, 400, "hf://org/repo"),
        ({"model": "ollama://a/b/c"}, 400, "ollama://name"),
        ({"model": "/no/such/file.gguf"}, 404, "no such file"),
        ({}, 400, "'model' is required"),
        ({"model": 5}, 400, "$.model"),
    ],
)
async def test_pull_bad_requests(env, body, status, needle):
    _, client, _ = env
    r = await client.post("/api/pull", json=body)
    assert r.status_code == status and needle in r.json()["error"]


async def test_pull_upstream_errors(env, ggufs):
    _, client, (cdn, hf, ol) = env
    r = await client.post("/api/pull", json={"model": "ollama://library/nope:1", "stream": False})
    assert r.status_code == 404 and "HTTP 404" in r.json()["error"]
    r = await client.post("/api/pull", json={"model": "ollama://library/nope:1"})
    assert r.status_code == 200 and lines(r)[-1] == {"error": lines(r)[-1]["error"]} and "404" in lines(r)[-1]["error"]
    url = cdn.add("files/x.gguf", ggufs[0])
    r = await client.post("/api/pull", json={"model": url, "stream": False, "sha256": "cd" * 32})
    assert r.status_code == 502 and "sha256" in r.json()["error"]
    assert (await client.post("/api/pull", json="nope")).status_code == 400
    assert (await client.post("/api/pull", content=b"{not json")).status_code == 400


async def test_background_pull_and_job_status(env, ggufs):
    _, client, (cdn, _, _) = env
    url = cdn.add("files/bg.gguf", ggufs[0], Fault(delay=0.01))
    r = await client.post("/api/pull", json={"model": url, "background": True})
    assert r.status_code == 202
    job = r.json()
    assert job["status"] == "running" and job["id"]
    listed = (await client.get("/api/pulls")).json()["jobs"]
    assert [j["id"] for j in listed] == [job["id"]]
    import asyncio

    for _ in range(300):
        snap = (await client.get(f"/api/pulls/{job['id']}")).json()
        if snap["status"] != "running":
            break
        await asyncio.sleep(0.02)
    assert snap["status"] == "success" and snap["model"] == "bg:latest" and snap["completed"] == len(ggufs[0])
    r = await client.get("/api/pulls/pull-999-nope")
    assert r.status_code == 404 and "no pull job" in r.json()["error"]


async def test_show_unknown_and_alias(env, tmp_path, ggufs):
    app, client, _ = env
    p = tmp_path / "tiny.gguf"
    p.write_bytes(ggufs[0])
    app.state.registry.register_local("tiny", p)
    r = await client.post("/api/show", json={"model": "missing"})
    assert r.status_code == 404 and r.json() == {"error": "model 'missing' not found; pull it first (bictl pull missing)"}
    s = (await client.post("/api/show", json={"name": "gpt-4o"})).json()  # `name`, as older clients send it; an alias
    assert s["details"]["family"] == "llama" and s["capabilities"] == ["completion"]
    assert s["chat_template"] == "gguf" and "<|im_start|>" in s["template"]


async def test_show_says_which_chat_template_is_used(env, tmp_path):
    app, client, _ = env
    bare = write_tiny_gguf(tmp_path / "bare.gguf", chat_template=None)
    app.state.registry.register_local("bare", bare)
    s = (await client.post("/api/show", json={"model": "bare"})).json()
    assert s["chat_template"] == "built-in for architecture 'llama' (chosen when loaded)"
    # once loaded, the worker's own word: the template's name and the exact text it renders with
    app.state.models.loaded["bare:latest"] = Running("bare:latest", chat_template="llama3", chat_template_source="{{ bos_token }}...")
    s = (await client.post("/api/show", json={"model": "bare"})).json()
    assert (s["chat_template"], s["template"]) == ("llama3", "{{ bos_token }}...")
    ps = (await client.get("/api/ps")).json()["models"]
    assert ps[0]["chat_template"] == "llama3"


@pytest.mark.parametrize("configured,caps", [
    ({}, ["completion"]),
    ({"thinking_start": "<thinking>", "thinking_end": "</thinking>"}, ["completion", "thinking"]),
    ({"chat_template": "{{ messages[0]['content'] }}{% if enable_thinking %}<think>{% endif %}"}, ["completion", "thinking"]),
    ({"tool_format": "qwen-xml"}, ["completion", "tools"]),
])  # fmt: skip
async def test_show_capabilities_use_the_operators_tool_and_reasoning_settings(env, tmp_path, ggufs, configured, caps):
    """The pull-time scan of this GGUF's template finds no thinking markers nor tool format; markers, a format or
    a template the operator configures for the model are what its worker uses, and /api/show says so."""
    from barrel_inference.config import ModelSettings

    app, client, _ = env
    p = tmp_path / "tiny.gguf"
    p.write_bytes(ggufs[0])
    app.state.registry.register_local("tiny", p)
    app.state.settings = Settings(models={"tiny:latest": ModelSettings(**configured)})
    s = (await client.post("/api/show", json={"model": "tiny"})).json()
    assert s["capabilities"] == caps


async def test_copy_and_delete_remove_unreferenced_blobs(env, ggufs):
    app, client, (cdn, _, _) = env
    url = cdn.add("files/c.gguf", ggufs[0])
    assert (await client.post("/api/pull", json={"model": url, "stream": False})).status_code == 200
    blob = app.state.registry.resolve("c").path
    r = await client.post("/api/copy", json={"source": "c", "destination": "c-copy:1"})
    assert r.status_code == 200
    assert [t["name"] for t in (await client.get("/api/tags")).json()["models"]] == ["c-copy:1", "c:latest"]
    r = await client.post("/api/copy", json={"source": "absent", "destination": "x"})
    assert r.status_code == 404
    r = await client.post("/api/copy", json={"source": "c", "destination": "../evil"})
    assert r.status_code == 400
    app.state.models.loaded["c:latest"] = Running("c:latest")
    r = await client.request("DELETE", "/api/delete", json={"model": "c"})
    assert r.status_code == 200 and app.state.models.unloads == ["c:latest"]
    assert blob.exists()  # still referenced by the copy
    r = await client.request("DELETE", "/api/delete", json={"model": "c-copy:1"})
    assert r.status_code == 200 and not blob.exists()
    r = await client.request("DELETE", "/api/delete", json={"model": "c"})
    assert r.status_code == 404 and "not found" in r.json()["error"]


async def test_ps_version_unload(env, tmp_path, ggufs):
    app, client, _ = env
    p = tmp_path / "m.gguf"
    p.write_bytes(ggufs[0])
    app.state.registry.register_local("m", p)
    assert (await client.get("/api/ps")).json() == {"models": []}
    app.state.models.loaded["m:latest"] = Running("m:latest", size=123, digest="sha256:" + "ef" * 32, details={"architecture": "llama", "family": "llama",
                                                  "parameter_size": "1M", "quantization_level": "F32"})  # fmt: skip
    ps = (await client.get("/api/ps")).json()["models"]
    assert len(ps) == 1
    m = ps[0]
    assert m["name"] == m["model"] == "m:latest" and m["size"] == 123 and m["digest"] == "ef" * 32
    assert m["details"]["family"] == "llama" and m["context_length"] == 2048 and m["size_vram"] == 0 and m["expires_at"]
    assert m["n_seq_max"] == 4 and m["in_flight"] == 1
    assert (await client.get("/api/version")).json() == {"version": __version__}
    r = await client.post("/api/unload", json={"model": "m"})
    assert r.json() == {"model": "m:latest", "unloaded": True}
    r = await client.post("/api/unload", json={"model": "m"})
    assert r.json() == {"model": "m:latest", "unloaded": False}
    r = await client.post("/api/unload", json={"model": "ghost"})
    assert r.status_code == 404


async def test_search_route(env):
    _, client, (cdn, hf, ol) = env
    hf.add_repo("org/granite-GGUF", {"g.Q4_K_M.gguf": b"GGUF"}, downloads=5)
    ol.search_html = OLLAMA_SEARCH_PAGE
    r = await client.post("/api/search", json={"query": "granite"})
    body = r.json()
    assert r.status_code == 200 and body["errors"] == {}
    # the fake library page lists the same two models for any query
    assert [h["id"] for h in body["hits"]] == ["ollama://library/qwen3", "ollama://library/granite3.2-vision", "hf://org/granite-GGUF"]
    r = await client.post("/api/search", json={"query": "granite", "sources": ["nuget"]})
    assert r.status_code == 400 and "nuget" in r.json()["error"]
    r = await client.post("/api/search", json={"query": ""})
    assert r.status_code == 400


async def test_search_all_sources_down_is_502(tmp_path):
    settings = Settings(model_cache_dir=str(tmp_path), hf_endpoint="http://127.0.0.1:9", ollama_search_url="http://127.0.0.1:9")
    app = Starlette(routes=routes())
    app.state.registry = Registry(settings)
    app.state.models = StubModels()
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1") as client:
        r = await client.post("/api/search", json={"query": "x", "timeout": 2})
    await management.aclose(app)
    assert r.status_code == 502 and "hf:" in r.json()["error"] and "ollama:" in r.json()["error"]
