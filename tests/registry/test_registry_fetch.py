"""Pulls against local imitations of HuggingFace (hub + CDN), the Ollama registry and a plain file server."""

from __future__ import annotations

import asyncio
import hashlib

import pytest

from barrel_inference.config import Settings
from barrel_inference.registry import Registry, RegistryError
from barrel_inference.registry.fetch import Fetcher
from barrel_inference.registry.jobs import PullManager
from barrel_inference.registry.specs import parse_spec, pick_gguf
from tests.registry.registry_fakes import FakeHF, FakeOllama, Fault, FileHost


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture
async def cdn():
    async with FileHost() as host:
        yield host


@pytest.fixture
async def hf(cdn):
    async with FakeHF(cdn) as server:
        yield server


@pytest.fixture
async def ollama(cdn):
    async with FakeOllama(cdn) as server:
        yield server


@pytest.fixture
def settings(tmp_path, hf, ollama):
    return Settings(model_cache_dir=str(tmp_path / "cache"), hf_endpoint=hf.url, ollama_registry=ollama.url, ollama_search_url=ollama.url)


def manager_for(settings, env=None, **kw) -> PullManager:
    registry = Registry(settings)
    return PullManager(registry, fetcher=Fetcher(settings, env=env or {}), **kw)


@pytest.fixture
async def manager(settings):
    async with manager_for(settings) as m:
        yield m


def leftovers(registry: Registry) -> dict:
    lay = registry.layout
    return {
        "blobs": sorted(p.name for p in lay.blobs.iterdir()) if lay.blobs.exists() else [],
        "tmp": sorted(p.name for p in lay.tmp.iterdir()) if lay.tmp.exists() else [],
        "manifests": [str(p) for p in lay.manifest_files()],
    }


# ---- HuggingFace ------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "files, quant, want",
    [
        (["a.Q8_0.gguf", "b.Q4_0.gguf", "c.Q5_K_M.gguf", "d.Q4_K_M.gguf", "README.md"], None, "d.Q4_K_M.gguf"),
        (["a.Q8_0.gguf", "b.Q4_0.gguf", "c.Q5_K_M.gguf"], None, "c.Q5_K_M.gguf"),
        (["a.Q8_0.gguf", "b-Q4_0.gguf"], None, "b-Q4_0.gguf"),
        (["x.Q8_0.gguf", "y.IQ4_XS.gguf"], None, "x.Q8_0.gguf"),
        (["z.F16.gguf", "y.IQ4_XS.gguf"], None, "y.IQ4_XS.gguf"),  # no preferred quant: first .gguf alphabetically
        (["m-Q4_0_4_4.gguf", "m-Q4_0.gguf"], None, "m-Q4_0.gguf"),  # Q4_0_4_4 is not Q4_0
        (["m-Q4_K_M-00001-of-00002.gguf", "m-Q8_0.gguf"], None, "m-Q8_0.gguf"),  # split files are skipped
        (["mmproj-Q4_K_M.gguf", "m-Q5_K_M.gguf"], None, "m-Q5_K_M.gguf"),
        (["a.Q8_0.gguf", "d.Q4_K_M.gguf"], "q8_0", "a.Q8_0.gguf"),
        (["README.md", "model.safetensors"], None, None),
    ],
)
def test_auto_pick_preference(files, quant, want):
    assert pick_gguf(files, quant) == want


async def test_hf_auto_pick_pull_registers_a_verified_blob(manager, hf, cdn, gguf_blobs):
    q8, q4km = gguf_blobs[0], gguf_blobs[1]
    hf.add_repo("org/tiny-GGUF", {"tiny.Q8_0.gguf": q8, "tiny.Q4_K_M.gguf": q4km, "README.md": b"# hi"})
    job = manager.start("hf://org/tiny-GGUF")
    events = [ev async for ev in job.events()]
    rec = await job.wait(5)
    assert rec.name == "hf.co/org/tiny-GGUF:Q4_K_M"
    assert rec.digest == f"sha256:{sha(q4km)}" and rec.path.read_bytes() == q4km
    assert rec.path == manager.registry.layout.blob_path(sha(q4km))
    assert rec.source["file"] == "tiny.Q4_K_M.gguf" and rec.source["kind"] == "hf"
    assert manager.registry.resolve("hf.co/org/tiny-GGUF:Q4_K_M").path == rec.path
    statuses = [e["status"] for e in events]
    label = f"pulling {sha(q4km)[:12]}"
    assert statuses[0] == "pulling manifest" and label in statuses
    assert statuses[-4:] == ["verifying sha256 digest", "writing manifest", "removing unused layers", "success"]
    layer = [e for e in events if e["status"] == label]
    assert all(e["digest"] == f"sha256:{sha(q4km)}" and e["total"] == len(q4km) for e in layer)
    assert layer[-1]["completed"] == len(q4km)
    assert leftovers(manager.registry)["tmp"] == []
    # only the picked file crossed the wire
    assert [s.path for s in cdn.log if s.method == "GET"] == [f"repos/{sha(q4km)}"]
    ref = manager.registry.layout.ref_path("hf://org/tiny-GGUF")
    assert ref.is_file() and sha(q4km) in ref.read_text()


async def test_hf_named_quant_and_revision(manager, hf, gguf_blobs):
    hf.add_repo("org/r", {"r.Q8_0.gguf": gguf_blobs[0], "r.Q4_K_M.gguf": gguf_blobs[1]})
    rec = await manager.pull("hf.co/org/r:Q8_0", timeout=5)
    assert rec.name == "hf.co/org/r:Q8_0" and rec.path.read_bytes() == gguf_blobs[0]
    rec = await manager.pull("hf://org/r/r.Q4_K_M.gguf@v1.0", name="mine", timeout=5)
    assert rec.name == "mine:latest" and rec.source["revision"] == "v1.0"
    assert any(s.path == "/org/r/resolve/v1.0/r.Q4_K_M.gguf" for s in hf.log)


async def test_hf_token_goes_to_the_hub_only(settings, hf, cdn, gguf_blobs):
    hf.token = "hf_secret"
    hf.add_repo("org/private", {"p.Q4_K_M.gguf": gguf_blobs[2]})
    async with manager_for(settings, env={"HF_TOKEN": "hf_secret"}) as m:
        rec = await m.pull("hf://org/private", timeout=5)
    assert rec.path.read_bytes() == gguf_blobs[2]
    assert hf.log and all(s.headers.get("Authorization") == "Bearer hf_secret" for s in hf.log)
    assert cdn.log and all("Authorization" not in s.headers for s in cdn.log)


async def test_hf_without_token_on_a_gated_repo_says_so(manager, hf, gguf_blobs):
    hf.token = "hf_secret"
    hf.add_repo("org/gated", {"g.Q4_K_M.gguf": gguf_blobs[0]})
    with pytest.raises(RegistryError) as e:
        await manager.pull("hf://org/gated", timeout=5)
    assert e.value.code == "http_status" and e.value.detail["status"] == 401 and "HF_TOKEN" in e.value.message


async def test_hf_repo_without_gguf(manager, hf):
    hf.add_repo("org/st", {"model.safetensors": b"x" * 10})
    with pytest.raises(RegistryError) as e:
        await manager.pull("hf://org/st", timeout=5)
    assert e.value.code == "hf_no_gguf"
    with pytest.raises(RegistryError) as e:
        await manager.pull("hf://org/absent", timeout=5)
    assert e.value.code == "http_status" and e.value.detail["status"] == 404 and e.value.status == 404


# ---- resume, Range, verification ----------------------------------------------------------------------
async def test_dropped_connection_resumes_and_sends_only_the_remainder(manager, cdn, gguf_blobs):
    data = gguf_blobs[0]
    half = len(data) // 2
    url = cdn.add("files/model.gguf", data, Fault(cut_after=half))
    rec = await manager.pull(url, timeout=10)
    assert rec.path.read_bytes() == data
    gets = cdn.requests("files/model.gguf")
    assert len(gets) == 2
    assert "Range" not in gets[0].headers and gets[0].bytes_sent == half
    assert gets[1].headers["Range"] == f"bytes={half}-" and gets[1].status == 206
    assert gets[1].bytes_sent == len(data) - half  # only the remainder crossed the wire
    assert sum(g.bytes_sent for g in gets) == len(data)


async def test_killed_pull_resumes_in_a_new_process_from_the_part(settings, cdn, gguf_blobs):
    data = gguf_blobs[1]
    url = cdn.add("files/slow.gguf", data, Fault(delay=0.01))
    first = manager_for(settings)
    job = first.start(url)
    part = first.registry.layout.part_path(url)
    for _ in range(500):
        await asyncio.sleep(0.01)
        if part.exists() and part.stat().st_size >= 1 << 20 or job.completed >= len(data) // 3:
            break
    await first.close()  # the daemon goes away mid-download
    assert job.status == "error" and job.error.code == "cancelled"
    kept = part.stat().st_size
    assert 0 < kept < len(data)
    assert first.registry.list() == [] and leftovers(first.registry)["blobs"] == []
    cdn.faults["files/slow.gguf"].delay = 0
    async with manager_for(settings) as second:
        rec = await second.pull(url, timeout=10)
    assert rec.path.read_bytes() == data
    last = cdn.requests("files/slow.gguf")[-1]
    assert last.headers["Range"] == f"bytes={kept}-"
    assert last.bytes_sent == len(data) - kept
    assert not part.exists()


async def test_server_that_ignores_range_restarts_cleanly(manager, cdn, gguf_blobs):
    data = gguf_blobs[2]
    url = cdn.add("files/norange.gguf", data, Fault(ignore_range=True, cut_after=len(data) // 3))
    rec = await manager.pull(url, sha256=sha(data), timeout=10)
    assert rec.path.read_bytes() == data and rec.digest == f"sha256:{sha(data)}"
    gets = cdn.requests("files/norange.gguf")
    assert len(gets) == 2 and gets[1].headers.get("Range") and gets[1].status == 200
    assert gets[1].bytes_sent == len(data)


async def test_sha256_mismatch_leaves_no_blob_and_no_part(manager, cdn, gguf_blobs):
    url = cdn.add("files/m.gguf", gguf_blobs[0])
    want = "ab" * 32
    with pytest.raises(RegistryError) as e:
        await manager.pull(url, sha256=want, timeout=10)
    assert e.value.code == "sha256_mismatch"
    assert e.value.detail == {"got": sha(gguf_blobs[0]), "want": want}
    assert "was expected" in e.value.message
    assert leftovers(manager.registry) == {"blobs": [], "tmp": [], "manifests": []}


async def test_corrupt_cdn_bytes_fail_the_linked_etag_check(manager, hf, cdn, gguf_blobs):
    hf.add_repo("org/bad", {"b.Q4_K_M.gguf": gguf_blobs[0]})
    cdn.files[hf.cdn_path(gguf_blobs[0])] = gguf_blobs[1][: len(gguf_blobs[0])]  # same size, other bytes
    with pytest.raises(RegistryError) as e:
        await manager.pull("hf://org/bad", timeout=10)
    assert e.value.code == "sha256_mismatch" and e.value.detail["want"] == sha(gguf_blobs[0])
    assert leftovers(manager.registry) == {"blobs": [], "tmp": [], "manifests": []}


async def test_not_a_gguf_is_discarded(manager, cdn):
    url = cdn.add("files/page.gguf", b"<html>sign in</html>")
    with pytest.raises(RegistryError) as e:
        await manager.pull(url, timeout=10)
    assert e.value.code == "not_gguf"
    assert leftovers(manager.registry) == {"blobs": [], "tmp": [], "manifests": []}


async def test_http_error_status_is_typed(manager, cdn):
    with pytest.raises(RegistryError) as e:
        await manager.pull(f"{cdn.url}/files/missing.gguf", timeout=10)
    assert e.value.code == "http_status" and e.value.detail["status"] == 404
    cdn.add("files/boom.gguf", b"GGUF", Fault(status=503))
    with pytest.raises(RegistryError) as e:
        await manager.pull(f"{cdn.url}/files/boom.gguf", timeout=10)
    assert e.value.code == "http_status" and e.value.detail["status"] == 503 and "503" in e.value.message


# ---- jobs ------------------------------------------------------------------------------------------------
async def test_concurrent_pulls_of_one_spec_make_one_download(manager, hf, cdn, gguf_blobs):
    hf.add_repo("org/shared", {"s.Q4_K_M.gguf": gguf_blobs[3]})
    cdn.faults[hf.cdn_path(gguf_blobs[3])] = Fault(delay=0.005)
    a = manager.start("hf://org/shared")
    b = manager.start("hf://org/shared")
    assert a is b
    # a different spelling of the same file waits for the first download and reuses its blob
    c = manager.start("hf://org/shared/s.Q4_K_M.gguf")
    recs = await asyncio.gather(manager.pull("hf://org/shared", timeout=10), a.wait(10), c.wait(10))
    assert len({r.path for r in recs}) == 1
    assert len(cdn.requests(hf.cdn_path(gguf_blobs[3]))) == 1
    assert len([s for s in hf.log if s.path == "/api/models/org/shared"]) == 1


async def test_job_status_wait_timeout_and_retention(settings, cdn, gguf_blobs):
    url = cdn.add("files/t.gguf", gguf_blobs[0], Fault(delay=0.01))
    async with manager_for(settings, retention=0.3) as m:
        job = m.start(url)
        with pytest.raises(RegistryError) as e:
            await job.wait(timeout=0.05)
        assert e.value.code == "timeout" and not job.done  # the pull goes on
        mid = m.get(job.id).snapshot()
        assert mid["status"] == "running" and mid["total"] == len(gguf_blobs[0])
        rec = await job.wait(10)
        snap = m.get(job.id).snapshot()
        assert snap["status"] == "success" and snap["completed"] == snap["total"] == len(gguf_blobs[0]) and snap["model"] == rec.name
        await asyncio.sleep(0.4)
        with pytest.raises(RegistryError) as e:
            m.get(job.id)
        assert e.value.code == "job_not_found"


async def test_progress_events_are_throttled(manager, cdn, gguf_blobs):
    url = cdn.add("files/p.gguf", gguf_blobs[0], Fault(delay=0.02))
    job = manager.start(url)
    stamps = []
    async for ev in job.events():
        if ev["status"].startswith("pulling ") and ev["status"] != "pulling manifest":
            stamps.append((asyncio.get_running_loop().time(), ev["completed"]))
    completed = [c for _, c in stamps]
    assert completed == sorted(completed) and completed[-1] == len(gguf_blobs[0])
    assert len(stamps) >= 3  # progress arrived while the download ran, not only at the end
    assert len(stamps) <= 2 + (stamps[-1][0] - stamps[0][0]) / 0.1 + 2


async def test_repull_under_the_same_name_removes_the_unused_blob(manager, cdn, gguf_blobs):
    u1 = cdn.add("files/v1.gguf", gguf_blobs[0])
    u2 = cdn.add("files/v2.gguf", gguf_blobs[1])
    r1 = await manager.pull(u1, name="model", timeout=10)
    r2 = await manager.pull(u2, name="model", timeout=10)
    assert not r1.path.exists() and r2.path.exists()
    assert leftovers(manager.registry)["blobs"] == [r2.path.name]


# ---- Ollama registry -------------------------------------------------------------------------------------
async def test_ollama_pull_takes_model_layer_params_and_template(manager, ollama, cdn, gguf_blobs):
    ollama.add_model("library/tiny:1b", gguf_blobs[0], params={"num_ctx": 1024, "stop": ["<|im_end|>"]}, template="{{ .Prompt }}")
    job = manager.start("tiny:1b")  # the ollama client's spelling
    statuses = [e["status"] async for e in job.events()]
    rec = await job.wait(1)
    assert rec.name == "tiny:1b" and rec.path.read_bytes() == gguf_blobs[0]
    assert rec.parameters == {"num_ctx": 1024, "stop": ["<|im_end|>"]} and rec.engine()["n_ctx"] == 1024
    assert rec.template == "{{ .Prompt }}"
    assert f"pulling {sha(gguf_blobs[0])[:12]}" in statuses
    manifest_reqs = [s for s in ollama.log if "/manifests/" in s.path]
    assert manifest_reqs[0].headers["Accept"] == "application/vnd.docker.distribution.manifest.v2+json"
    rec2 = await manager.pull("ollama://library/tiny:1b", timeout=5)
    assert rec2.path == rec.path
    assert len(cdn.requests(f"ollama-blobs/sha256:{sha(gguf_blobs[0])}")) == 1  # the verified blob is reused


async def test_ollama_errors(manager, ollama, gguf_blobs):
    with pytest.raises(RegistryError) as e:
        await manager.pull("ollama://library/absent:7b", timeout=5)
    assert e.value.code == "ollama_manifest_status" and e.value.detail["status"] == 404 and e.value.status == 404
    m = ollama.add_model("library/adapter:1", gguf_blobs[0])
    m["layers"][0]["mediaType"] = "application/vnd.ollama.image.adapter"
    with pytest.raises(RegistryError) as e:
        await manager.pull("ollama://library/adapter:1", timeout=5)
    assert e.value.code == "ollama_no_model_layer"
    ollama.add_model("library/liar:1", gguf_blobs[1], model_digest=f"sha256:{sha(gguf_blobs[0])}")
    with pytest.raises(RegistryError) as e:
        await manager.pull("ollama://library/liar:1", timeout=5)
    assert e.value.code == "sha256_mismatch"
    assert leftovers(manager.registry)["blobs"] == [] and leftovers(manager.registry)["tmp"] == []
    evil = ollama.add_model("library/evil:1", gguf_blobs[1])
    evil["layers"][0]["digest"] = "sha256:../../../../etc/passwd"
    with pytest.raises(RegistryError) as e:
        await manager.pull("ollama://library/evil:1", timeout=5)
    assert e.value.code == "ollama_manifest_status" and "malformed layer digest" in e.value.message


async def test_caller_sha256_must_be_a_digest(manager, cdn, gguf_blobs):
    url = cdn.add("files/s.gguf", gguf_blobs[0])
    with pytest.raises(RegistryError) as e:
        await manager.pull(url, sha256="../../x", timeout=5)
    assert e.value.code == "invalid_request" and e.value.status == 400
    rec = await manager.pull(url, sha256="SHA256:" + sha(gguf_blobs[0]).upper(), timeout=5)
    assert rec.digest == f"sha256:{sha(gguf_blobs[0])}"


# ---- specs and local files ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "spec, code",
    [
        ("s3://bucket/model.gguf", "unsupported_spec"),
        ("", "unsupported_spec"),
        ("./model.gguf", "unsupported_spec"),
        ("registry.example.com/ns/model:1", "unsupported_spec"),
        ("hf://onlyorg", "bad_hf_spec"),
        ("hf://org/repo/weights.bin", "bad_hf_spec"),
        ("hf://org/repo/../x.gguf", "bad_hf_spec"),
        ("hf://org/repo/m-00001-of-00003.gguf", "bad_hf_spec"),
        ("ollama://a/b/c", "bad_ollama_spec"),
        ("ollama://", "bad_ollama_spec"),
        ("ollama://library/x:bad tag", "bad_ollama_spec"),
        ("file:///definitely/not/here.gguf", "enoent"),
        ("/definitely/not/here.gguf", "enoent"),
    ],
)
def test_bad_specs_are_typed(spec, code):
    with pytest.raises(RegistryError) as e:
        parse_spec(spec)
    assert e.value.code == code
    assert e.value.message.endswith((".gguf", ")", "supported", "tag]", "file.gguf", "path", "spec", "file://", "revision")) or e.value.message


async def test_bad_spec_fails_at_start(manager):
    with pytest.raises(RegistryError) as e:
        manager.start("ftp://x/y.gguf")
    assert e.value.code == "unsupported_spec" and "ftp://" in e.value.message


async def test_local_file_is_registered_in_place(manager, tmp_path, gguf_blobs):
    p = tmp_path / "Local-Model.gguf"
    p.write_bytes(gguf_blobs[0])
    rec = await manager.pull(p.as_uri(), timeout=5)
    assert rec.name == "local-model:latest" and rec.path == p and rec.passthrough
    assert leftovers(manager.registry)["blobs"] == []
    rec = await manager.pull(str(p), name="again", sha256=sha(gguf_blobs[0]), timeout=5)
    assert rec.name == "again:latest"
    with pytest.raises(RegistryError) as e:
        await manager.pull(str(p), name="bad", sha256="00" * 32, timeout=5)
    assert e.value.code == "sha256_mismatch"
