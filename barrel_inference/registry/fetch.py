"""Resolve a pull spec to a download plan (HuggingFace listing and HEAD probe, Ollama manifest, plain URL,
local file) and carry it out into the blob store."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote, urlsplit

from .errors import RegistryError
from .httpclient import AddressGuard, HTTPClient, status_error
from .download import Progress, download
from .layout import CacheLayout, atomic_write_json, bare_hex, is_sha256
from .specs import FileSpec, HFSpec, OllamaSpec, Spec, URLSpec, pick_gguf

DEFAULT_HF_ENDPOINT = "https://huggingface.co"
OLLAMA_MANIFEST_ACCEPT = "application/vnd.docker.distribution.manifest.v2+json"
OLLAMA_MODEL = "application/vnd.ollama.image.model"
OLLAMA_TEMPLATE = "application/vnd.ollama.image.template"
OLLAMA_PARAMS = "application/vnd.ollama.image.params"
SMALL_LAYER_MAX = 1 << 20


@dataclass
class Plan:
    """What a pull will do: download `url` (verify `sha256` when known) or register `path` in place."""

    spec: Spec
    name: str
    key: str  # the resolved spec: names the part and the ref
    url: str | None = None
    path: Path | None = None
    sha256: str | None = None
    size: int | None = None
    parameters: dict = field(default_factory=dict)
    template: str | None = None
    source: dict = field(default_factory=dict)

    @property
    def layer_digest(self) -> str | None:
        return f"sha256:{self.sha256}" if self.sha256 else None


class Fetcher:
    """Remote access for pulls and search. Endpoints come from the settings (real hosts by default)."""

    def __init__(self, settings, *, env: dict | None = None):
        env = os.environ if env is None else env
        self.hf_endpoint = (getattr(settings, "hf_endpoint", None) or env.get("HF_ENDPOINT") or DEFAULT_HF_ENDPOINT).rstrip("/")
        self.ollama_registry = (getattr(settings, "ollama_registry", None) or "https://registry.ollama.ai").rstrip("/")
        self.ollama_search_url = (getattr(settings, "ollama_search_url", None) or "https://ollama.com").rstrip("/")
        token = env.get("HF_TOKEN") or env.get("HUGGING_FACE_HUB_TOKEN")
        trusted = [urlsplit(u).hostname for u in (self.hf_endpoint, self.ollama_registry, self.ollama_search_url)]
        guard = AddressGuard(trusted, allow_private=bool(getattr(settings, "pull_allow_private", False)))
        self.http = HTTPClient(token=token, token_origin=self.hf_endpoint if token else None, guard=guard)

    async def close(self) -> None:
        await self.http.close()

    # ---- planning -----------------------------------------------------------------------------------
    async def plan(self, spec: Spec, *, name: str | None = None, sha256: str | None = None) -> Plan:
        if sha256 is not None and not is_sha256(sha256):
            raise RegistryError("invalid_request", f"'{sha256}' is not a sha256 digest (64 hex digits, optionally prefixed 'sha256:')")
        if isinstance(spec, FileSpec):
            if not spec.path.is_file():
                raise RegistryError("enoent", f"no such file: {spec.path}", path=str(spec.path))
            return Plan(spec, name or spec.default_name(), spec.canonical, path=spec.path, sha256=bare_hex(sha256) if sha256 else None,
                        source={"kind": "file", "spec": spec.canonical})  # fmt: skip
        if isinstance(spec, URLSpec):
            return Plan(spec, name or spec.default_name(), spec.canonical, url=spec.url, sha256=bare_hex(sha256) if sha256 else None,
                        source={"kind": "url", "spec": spec.canonical})  # fmt: skip
        if isinstance(spec, HFSpec):
            plan = await self._plan_hf(spec, name)
        elif isinstance(spec, OllamaSpec):
            plan = await self._plan_ollama(spec, name)
        else:  # pragma: no cover
            raise RegistryError("unsupported_spec", f"cannot pull {spec!r}")
        if sha256:
            want = bare_hex(sha256)
            if plan.sha256 and plan.sha256 != want:
                raise RegistryError(
                    "sha256_mismatch", f"the source publishes sha256 {plan.sha256} but {want} was asked for", got=plan.sha256, want=want
                )
            plan.sha256 = want
        return plan

    async def hf_files(self, spec: HFSpec) -> list[str]:
        rev = "" if spec.rev == "main" else f"/revision/{quote(spec.rev, safe='')}"
        url = f"{self.hf_endpoint}/api/models/{spec.repo_id}{rev}"
        resp = await self.http.request("GET", url)
        try:
            if resp.status != 200:
                raise status_error(resp, f"listing HuggingFace repo {spec.repo_id}")
            data = await resp.json(content_type=None)
        finally:
            resp.release()
        return [s.get("rfilename", "") for s in data.get("siblings") or []]

    def hf_resolve_url(self, spec: HFSpec) -> str:
        return f"{self.hf_endpoint}/{spec.repo_id}/resolve/{quote(spec.rev, safe='')}/{quote(spec.path or '')}"

    async def _plan_hf(self, spec: HFSpec, name: str | None) -> Plan:
        if spec.path is None:
            files = await self.hf_files(spec)
            picked = pick_gguf(files, spec.quant)
            if picked is None:
                what = f"no {spec.quant} .gguf file" if spec.quant else "no .gguf file"
                raise RegistryError("hf_no_gguf", f"{what} in HuggingFace repo {spec.repo_id}", repo=spec.repo_id)
            resolved = spec.with_path(picked)
            default_name = spec.default_name() if spec.quant else resolved.default_name()
        else:
            resolved = spec
            default_name = spec.default_name()
        url = self.hf_resolve_url(resolved)
        # HEAD probe: the LFS sha256 and size ride on the first (redirect) answer as X-Linked-ETag / X-Linked-Size
        resp = await self.http.request("HEAD", url, same_origin_only=True)
        try:
            if resp.status >= 400:
                raise status_error(resp, f"HuggingFace file {resolved.repo_id}/{resolved.path}")
            etag = resp.headers.get("X-Linked-ETag") or resp.headers.get("X-Linked-Etag") or ""
            size = resp.headers.get("X-Linked-Size")
            commit = resp.headers.get("X-Repo-Commit")
        finally:
            resp.release()
        etag = etag.strip()
        if etag.startswith("W/"):
            etag = etag[2:]
        etag = etag.strip('"').lower()
        sha = etag if len(etag) == 64 and all(c in "0123456789abcdef" for c in etag) else None
        source = {"kind": "hf", "spec": spec.canonical, "resolved": resolved.canonical, "repo": resolved.repo_id, "file": resolved.path,
                  "revision": resolved.rev, **({"commit": commit} if commit else {})}  # fmt: skip
        return Plan(spec, name or default_name, resolved.canonical, url=url, sha256=sha, size=int(size) if size and size.isdigit() else None,
                    source=source)  # fmt: skip

    async def _plan_ollama(self, spec: OllamaSpec, name: str | None) -> Plan:
        base = f"{self.ollama_registry}/v2/{spec.namespace}/{spec.name}"
        resp = await self.http.request("GET", f"{base}/manifests/{spec.tag}", headers={"Accept": OLLAMA_MANIFEST_ACCEPT})
        try:
            if resp.status != 200:
                hint = {404: "no such model or tag in the Ollama registry", 401: "the registry asks for authentication"}.get(resp.status, resp.reason or "")
                raise RegistryError(
                    "ollama_manifest_status",
                    f"the Ollama registry answered HTTP {resp.status} for {spec.namespace}/{spec.name}:{spec.tag} ({hint})",
                    status=resp.status,
                )
            manifest = json.loads(await resp.read())
        except ValueError as exc:
            raise RegistryError("ollama_manifest_status", f"the Ollama registry sent an unreadable manifest for {spec.canonical}", status=200) from exc
        finally:
            resp.release()
        layers = manifest.get("layers") or []
        model = next((layer for layer in layers if layer.get("mediaType") == OLLAMA_MODEL), None)
        if model is None or not model.get("digest"):
            raise RegistryError("ollama_no_model_layer", f"{spec.canonical} has no model layer (is it a GGUF model?)")
        bad = [layer.get("digest") for layer in layers if not is_sha256(layer.get("digest") or "") or not str(layer.get("digest")).startswith("sha256:")]
        if bad:
            raise RegistryError("ollama_manifest_status", f"the Ollama registry's manifest for {spec.canonical} has a malformed layer digest {bad[0]!r}", status=200)
        parameters: dict = {}
        template = None
        for layer in layers:
            mt = layer.get("mediaType")
            if mt in (OLLAMA_PARAMS, OLLAMA_TEMPLATE) and int(layer.get("size") or 0) <= SMALL_LAYER_MAX:
                text = await self._small_blob(f"{base}/blobs/{layer['digest']}", layer["digest"])
                if mt == OLLAMA_PARAMS:
                    try:
                        parameters = json.loads(text)
                    except ValueError:
                        parameters = {}
                else:
                    template = text
        sha = bare_hex(model["digest"])
        source = {"kind": "ollama", "spec": spec.canonical, "registry": self.ollama_registry, "layer": model["digest"]}
        return Plan(spec, name or spec.default_name(), spec.canonical, url=f"{base}/blobs/{model['digest']}", sha256=sha,
                    size=int(model["size"]) if model.get("size") else None, parameters=parameters if isinstance(parameters, dict) else {},
                    template=template, source=source)  # fmt: skip

    async def _small_blob(self, url: str, digest: str) -> str:
        import hashlib

        resp = await self.http.request("GET", url)
        try:
            if resp.status != 200:
                raise status_error(resp, f"Ollama layer {digest}")
            data = await resp.read()
        finally:
            resp.release()
        got = hashlib.sha256(data).hexdigest()
        if got != bare_hex(digest):
            raise RegistryError("sha256_mismatch", f"Ollama layer {digest}: got sha256 {got}", got=got, want=bare_hex(digest))
        return data.decode("utf-8", "replace")

    # ---- carrying out ---------------------------------------------------------------------------------
    async def fetch_part(self, plan: Plan, layout: CacheLayout, progress: Progress | None = None) -> tuple[str, int, Path | None]:
        """Download the plan's file into its part (resuming) and verify it; return (sha256 hex, size, part path).
        The part is None when the blob is already in the store. The caller moves the part into `blobs/`."""
        layout.ensure()
        if plan.sha256 and layout.blob_path(plan.sha256).is_file():
            size = layout.blob_path(plan.sha256).stat().st_size
            if progress:
                progress(size, size)
            return plan.sha256, size, None
        part = layout.part_path(plan.key)
        digest, size = await download(
            self.http, plan.url, part, expected_sha256=plan.sha256, expected_size=plan.size, progress=progress, what=f"pulling {plan.key}",
            magic=b"GGUF",
        )  # fmt: skip
        with open(part, "rb") as f:
            magic = f.read(4)
        if magic != b"GGUF":  # what was fetched is never echoed: it may be a private page's content
            part.unlink(missing_ok=True)
            raise RegistryError("not_gguf", f"{plan.key} is not a GGUF file; the download was discarded")
        return digest, size, part

    def write_ref(self, layout: CacheLayout, plan: Plan, digest: str | None) -> None:
        data = {"spec": plan.spec.canonical, "resolved": plan.key, "name": plan.name, "digest": f"sha256:{digest}" if digest else None,
                "path": str(plan.path) if plan.path else None}  # fmt: skip
        atomic_write_json(layout.ref_path(plan.spec.canonical), data)
