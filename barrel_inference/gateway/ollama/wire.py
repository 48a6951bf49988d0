"""Ollama request bodies for the management routes (msgspec). `name` is accepted where Ollama's older clients
send it instead of `model`."""

from __future__ import annotations

import msgspec


class ModelRef(msgspec.Struct, omit_defaults=True):
    model: str | None = None
    name: str | None = None  # older clients

    def model_name(self) -> str | None:
        return self.model or self.name


class PullRequest(ModelRef):
    insecure: bool = False
    stream: bool = True
    # ours: register under this name instead of the one derived from the spec; verify this sha256;
    # start the pull and answer with its job id at once (poll GET /api/pulls/{id})
    destination: str | None = None
    sha256: str | None = None
    background: bool = False


class ShowRequest(ModelRef):
    verbose: bool = False


class DeleteRequest(ModelRef):
    pass


class UnloadRequest(ModelRef):
    pass


class CopyRequest(msgspec.Struct):
    source: str
    destination: str


class SearchRequest(msgspec.Struct):
    query: str
    limit: int = 20
    sources: list[str] = msgspec.field(default_factory=lambda: ["hf", "ollama"])
    hf_filter: str = "gguf"
    timeout: float = 10.0
