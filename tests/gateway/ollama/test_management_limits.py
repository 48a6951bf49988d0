"""The probe's 500s from over-long names, as HTTP requests: a 10k-character pull path, a 4 KB copy destination."""

from __future__ import annotations

from tinymodel import write_tiny_gguf

from .test_ollama_management import env, remotes  # noqa: F401 - fixtures


async def test_over_long_pull_path_and_copy_destination_are_400(env, tmp_path):
    app, client, _ = env
    r = await client.post("/api/pull", json={"model": "/" + "a" * 10_000 + ".gguf", "stream": False})
    assert r.status_code == 400 and "at most" in r.json()["error"]
    path = write_tiny_gguf(tmp_path / "t.gguf")
    r = await client.post("/api/pull", json={"model": str(path), "stream": False})
    assert r.status_code == 200
    r = await client.post("/api/copy", json={"source": "t", "destination": "d" * 4096})
    assert r.status_code == 400 and "at most" in r.json()["error"]
    r = await client.post("/api/copy", json={"source": "t", "destination": "a/" * 2000 + "b"})
    assert r.status_code == 400
    assert (await client.get("/api/tags")).json()["models"][0]["name"] == "t:latest"
