"""What a manifest says about one model, as the rest of the daemon sees it."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from pathlib import Path

from .gguf_scan import apply_parameters

MANIFEST_SCHEMA = 1


@dataclass(frozen=True)
class ModelRecord:
    name: str  # canonical 'name:tag'
    path: Path  # the GGUF file (a blob, or a passthrough local file)
    size: int
    digest: str | None  # 'sha256:<hex>' of the GGUF; None for a passthrough file not hashed
    modified: dt.datetime
    details: dict = field(default_factory=dict)
    loader: dict = field(default_factory=dict)
    parameters: dict = field(default_factory=dict)
    source: dict = field(default_factory=dict)  # {'kind', 'spec', 'resolved', ...}
    # a template text: from the source (an Ollama Go template, informative only), or a Modelfile's TEMPLATE
    # (template_format "go": the model's worker renders its prompts with it)
    template: str | None = None
    manifest_digest: str = ""  # sha256 of the manifest file, an identity for this exact registration
    system: str | None = None  # a default system message (Modelfile SYSTEM)
    messages: list = field(default_factory=list)  # messages put before every chat (Modelfile MESSAGE)
    license: list = field(default_factory=list)
    template_format: str = ""  # "go": `template` is rendered (set by /api/create, /api/edit); "": shown only

    @property
    def passthrough(self) -> bool:
        return self.source.get("kind") == "file"

    def engine(self) -> dict:
        """Loader values with the manifest's `parameters` applied (parameters win): n_ctx, n_batch, n_seq_max, …"""
        return apply_parameters(self.loader, self.parameters)


def now_utc() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


def record_from_manifest(data: dict, path: Path, manifest_digest: str) -> ModelRecord:
    modified = data.get("modified_at")
    when = dt.datetime.fromisoformat(modified) if modified else now_utc()
    return ModelRecord(
        name=data["name"],
        path=path,
        size=int(data.get("size") or 0),
        digest=(data.get("blob") or {}).get("digest") or data.get("digest"),
        modified=when,
        details=data.get("details") or {},
        loader=data.get("loader") or {},
        parameters=data.get("parameters") or {},
        source=data.get("source") or {},
        template=data.get("template"),
        manifest_digest=manifest_digest,
        system=data.get("system"),
        messages=list(data.get("messages") or []),
        license=list(data.get("license") or []),
        template_format=data.get("template_format") or "",
    )
