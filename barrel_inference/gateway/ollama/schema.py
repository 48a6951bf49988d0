"""What the Ollama routes take and answer, for /openapi.json: the request wire structs, and structs describing
the answers (the routes build them as plain dicts)."""

from __future__ import annotations

from typing import Any

import msgspec

from ..openapi import Operation
from .wire import CopyRequest, DeleteRequest, PullRequest, SearchRequest, ShowRequest, UnloadRequest


class Details(msgspec.Struct):
    parent_model: str
    format: str
    family: str
    families: list[str] | None
    parameter_size: str
    quantization_level: str


class TagItem(msgspec.Struct):
    name: str
    model: str
    modified_at: str
    size: int
    digest: str
    details: Details


class Tags(msgspec.Struct):
    models: list[TagItem]


class PsItem(msgspec.Struct, kw_only=True):
    name: str
    model: str
    size: int
    digest: str
    details: Details
    expires_at: str
    size_vram: int
    context_length: int
    n_seq_max: int | None = None
    in_flight: int | None = None
    pid: int | None = None
    started_at: str | None = None
    engine: dict[str, Any] | None = None
    replicas: list[dict[str, Any]] | None = None


class Ps(msgspec.Struct):
    models: list[PsItem]


class Show(msgspec.Struct, kw_only=True):
    modelfile: str
    parameters: str
    template: str
    details: Details
    model_info: dict[str, Any]
    capabilities: list[str]
    modified_at: str
    loader: dict[str, Any] | None = None
    source: dict[str, Any] | None = None
    chat_template: str | None = None


class Progress(msgspec.Struct, omit_defaults=True):
    status: str
    digest: str | None = None
    total: int | None = None
    completed: int | None = None


class PullJob(msgspec.Struct):
    id: str
    spec: str
    model: str | None
    status: str
    phase: str
    digest: str | None
    completed: int
    total: int | None
    error: dict[str, Any] | None
    started_at: str
    finished_at: str | None


class PullJobs(msgspec.Struct):
    jobs: list[PullJob]


class Version(msgspec.Struct):
    version: str


class Unloaded(msgspec.Struct):
    model: str
    unloaded: bool


class SearchHit(msgspec.Struct, kw_only=True):
    id: str
    source: str | None = None
    downloads: int | None = None
    last_modified: str | None = None
    description: str | None = None


class SearchResult(msgspec.Struct):
    hits: list[SearchHit]
    errors: dict[str, str]


NDJSON = "application/x-ndjson"
OPERATIONS = {
    ("POST", "/api/pull"): Operation("Pull a model (a name, hf://, ollama://, https://, file:// or a path)", PullRequest, Progress,
                                     stream_media_type=NDJSON, tag="ollama"),  # fmt: skip
    ("GET", "/api/pulls"): Operation("Pull jobs", response=PullJobs, tag="ollama"),
    ("GET", "/api/pulls/{job_id}"): Operation("One pull job", response=PullJob, tag="ollama"),
    ("GET", "/api/tags"): Operation("The models on disk", response=Tags, tag="ollama"),
    ("POST", "/api/show"): Operation("A model's details", ShowRequest, Show, tag="ollama"),
    ("DELETE", "/api/delete"): Operation("Delete a model", DeleteRequest, None, media_type="text/plain", tag="ollama"),
    ("POST", "/api/copy"): Operation("Copy a model", CopyRequest, None, media_type="text/plain", tag="ollama"),
    ("GET", "/api/ps"): Operation("The running models", response=Ps, tag="ollama"),
    ("GET", "/api/version"): Operation("The daemon's version", response=Version, tag="ollama"),
    ("POST", "/api/search"): Operation("Search HuggingFace and the Ollama library", SearchRequest, SearchResult, tag="ollama"),
    ("POST", "/api/unload"): Operation("Stop a model's worker", UnloadRequest, Unloaded, tag="ollama"),
}
