"""What the OpenAI routes take and answer, for /openapi.json: the request wire structs, and structs describing
the answers (the routes build them as plain dicts)."""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from ..openapi import Operation
from .wire import ChatCompletionRequest, CompletionRequest, EmbeddingRequest


class Usage(msgspec.Struct, omit_defaults=True):
    prompt_tokens: int
    completion_tokens: int = 0
    total_tokens: int = 0
    prompt_tokens_details: dict[str, int] | None = None


class AssistantMessage(msgspec.Struct, omit_defaults=True):
    role: Literal["assistant"]
    content: str | None = None
    reasoning_content: str | None = None
    tool_calls: list[dict[str, Any]] | None = None


class ChatChoice(msgspec.Struct):
    index: int
    message: AssistantMessage
    finish_reason: str | None


class ChatCompletion(msgspec.Struct):
    id: str
    object: Literal["chat.completion"]
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage


class CompletionChoice(msgspec.Struct):
    index: int
    text: str
    finish_reason: str | None


class Completion(msgspec.Struct):
    id: str
    object: Literal["text_completion"]
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage


class Embedding(msgspec.Struct):
    object: Literal["embedding"]
    index: int
    embedding: list[float]


class EmbeddingList(msgspec.Struct):
    object: Literal["list"]
    data: list[Embedding]
    model: str
    usage: Usage


class Model(msgspec.Struct):
    id: str
    object: Literal["model"]
    created: int
    owned_by: str


class ModelList(msgspec.Struct):
    object: Literal["list"]
    data: list[Model]


SSE = "text/event-stream"
OPERATIONS = {
    ("POST", "/v1/chat/completions"): Operation("Chat completion", ChatCompletionRequest, ChatCompletion, stream_media_type=SSE, tag="openai"),
    ("POST", "/v1/completions"): Operation("Text completion", CompletionRequest, Completion, stream_media_type=SSE, tag="openai"),
    ("POST", "/v1/embeddings"): Operation("Embeddings", EmbeddingRequest, EmbeddingList, tag="openai"),
    ("GET", "/v1/models"): Operation("The models on disk", response=ModelList, tag="openai"),
    ("GET", "/v1/models/{model_id:path}"): Operation("One model", response=Model, tag="openai"),
}
