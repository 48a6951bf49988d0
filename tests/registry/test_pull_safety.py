"""Pulls cannot be turned against the machine: no loopback / private targets (SSRF) unless allowed, a
non-GGUF download stops at its first bytes and is never echoed, over-long names and paths are 400s."""

from __future__ import annotations

import pytest
from aiohttp import web

from barrel_inference.config import Settings
from barrel_inference.registry import Registry, RegistryError
from barrel_inference.registry.fetch import Fetcher
from barrel_inference.registry.jobs import PullManager
from barrel_inference.registry.names import normalize
from barrel_inference.registry.specs import parse_spec

from .registry_fakes import Fault, FileHost, start

SECRET = b'{"models": [{"name": "private-model", "token": "s3cret"}]}'


def manager(tmp_path, **kw) -> PullManager:
    # the configured registries are elsewhere: nothing on this machine is trusted by name
    settings = Settings(model_cache_dir=str(tmp_path / "cache"), hf_endpoint="https://hf.invalid",
                        ollama_registry="https://registry.invalid", ollama_search_url="https://search.invalid", **kw)  # fmt: skip
    return PullManager(Registry(settings), fetcher=Fetcher(settings, env={}))


@pytest.fixture
async def host():
    async with FileHost() as h:
        h.add("api/tags", SECRET)
        yield h


@pytest.mark.parametrize("where", ["{url}/api/tags", "http://localhost:{port}/api/tags", "http://[::ffff:127.0.0.1]:{port}/api/tags",
                                   "http://169.254.169.254/latest/meta-data/", "http://10.0.0.1/x.gguf"])  # fmt: skip
async def test_pulls_of_local_and_private_addresses_are_refused(tmp_path, host, where):
    """The probe: /api/pull http://127.0.0.1:8080/api/tags fetched a loopback URL and echoed its first bytes."""
    url = where.format(url=host.url, port=host.url.rsplit(":", 1)[1])
    async with manager(tmp_path) as m:
        with pytest.raises(RegistryError) as err:
            await m.pull(url, timeout=10)
    assert err.value.code == "forbidden_address" and err.value.status == 403
    assert "pull_allow_private" in err.value.message and "s3cret" not in err.value.message
    assert host.requests("api/tags") == []  # nothing was fetched


async def test_a_redirect_to_a_local_address_is_refused(tmp_path, host):
    async def redirect(request):
        raise web.HTTPFound(f"http://localhost:{host.url.rsplit(':', 1)[1]}/api/tags")

    app = web.Application()
    app.router.add_get("/model.gguf", redirect)
    runner, url = await start(app)
    try:
        # the first hop is allowed here (pull_allow_private would allow the second too): trust 127.0.0.1 by name
        settings = Settings(model_cache_dir=str(tmp_path / "cache"), hf_endpoint=url, ollama_registry="https://r.invalid",
                            ollama_search_url="https://s.invalid")  # fmt: skip
        async with PullManager(Registry(settings), fetcher=Fetcher(settings, env={})) as m:
            with pytest.raises(RegistryError) as err:
                await m.pull(url + "/model.gguf", timeout=10)
        assert err.value.code == "forbidden_address"
        assert host.requests("api/tags") == []
    finally:
        await runner.cleanup()


async def test_a_non_gguf_download_stops_at_its_first_bytes_and_is_not_echoed(tmp_path, host):
    """The probe: a 200 MB non-GGUF URL was downloaded in full before the format check (16 MB here, throttled)."""
    big = b"<html>" + b"x" * (16 << 20)
    url = host.add("big.bin", big, Fault(delay=0.002))
    async with manager(tmp_path, pull_allow_private=True) as m:
        with pytest.raises(RegistryError) as err:
            await m.pull(url, timeout=30)
    assert err.value.code == "not_gguf" and err.value.status == 400
    assert "html" not in err.value.message and "xxxx" not in err.value.message
    served = host.requests("big.bin")
    assert len(served) == 1 and served[0].bytes_sent < 4 << 20
    assert not any((tmp_path / "cache").rglob("*.part"))


async def test_a_private_url_is_pulled_when_allowed(tmp_path, host):
    url = host.add("api/tags", SECRET)
    async with manager(tmp_path, pull_allow_private=True) as m:
        with pytest.raises(RegistryError) as err:
            await m.pull(url, timeout=10)
    assert err.value.code == "not_gguf" and "s3cret" not in err.value.message  # reached, refused as not a GGUF, not echoed


@pytest.mark.parametrize("text", ["/" + "a" * 10_000 + ".gguf", "https://example.com/" + "a" * 10_000])
def test_over_long_pull_specs_are_400(text):
    with pytest.raises(RegistryError) as err:
        parse_spec(text)
    assert err.value.status == 400


@pytest.mark.parametrize("name", ["a" * 4096, "a/" * 2000 + "b", "x:" + "t" * 300])
def test_over_long_names_are_400(name):
    with pytest.raises(RegistryError) as err:
        normalize(name)
    assert err.value.status == 400 and err.value.code == "invalid_name"
