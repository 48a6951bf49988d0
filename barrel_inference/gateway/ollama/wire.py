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


# ---- generation ---------------------------------------------------------------------------------------------
# `options` stays a plain object here: options.validate checks each name and type and names the bad one.
KeepAlive = str | int | float | None


class ToolCallFunction(msgspec.Struct):
    name: str
    arguments: dict | str = {}
    index: int | None = None


class ToolCallIn(msgspec.Struct):
    function: ToolCallFunction
    id: str | None = None
    type: str | None = None


class Message(msgspec.Struct):
    role: str
    content: str | None = ""
    thinking: str | None = None
    images: list[str] | None = None
    tool_calls: list[ToolCallIn] | None = None
    tool_name: str | None = None
    tool_call_id: str | None = None


class GenerateRequest(ModelRef):
    prompt: str | None = None
    suffix: str | None = None
    system: str | None = None
    template: str | None = None
    context: list[int] | None = None
    stream: bool = True
    raw: bool = False
    format: str | dict | None = None
    images: list[str] | None = None
    options: dict | None = None
    keep_alive: KeepAlive = None
    think: bool | str | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None


class ChatRequest(ModelRef):
    messages: list[Message] | None = None
    tools: list[dict] | None = None
    # ours (Ollama has none): "auto" | "none" | "required" | {"type": "function", "function": {"name": ...}};
    # a forced call is one call unless parallel_tool_calls (ours too) is true
    tool_choice: str | dict | None = None
    parallel_tool_calls: bool | None = None
    stream: bool = True
    format: str | dict | None = None
    options: dict | None = None
    keep_alive: KeepAlive = None
    think: bool | str | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None


class EmbedRequest(ModelRef):
    input: str | list[str] = ""
    truncate: bool = True
    dimensions: int | None = None
    options: dict | None = None
    keep_alive: KeepAlive = None


class EmbeddingsRequest(ModelRef):
    prompt: str = ""
    options: dict | None = None
    keep_alive: KeepAlive = None


# ---- create / edit ------------------------------------------------------------------------------------------
class CreateRequest(ModelRef):
    from_: str | None = msgspec.field(default=None, name="from")
    modelfile: str | None = None  # older clients: the Modelfile text
    path: str | None = None  # older clients: a Modelfile path on the server (not supported)
    files: dict[str, str] | None = None
    adapters: dict[str, str] | None = None
    template: str | None = None
    license: str | list[str] | None = None
    system: str | None = None
    parameters: dict | None = None
    messages: list[dict] | None = None
    quantize: str | None = None
    stream: bool = True


class EditRequest(ModelRef):
    parameters: dict | None = None  # merged key by key into the manifest's; a null value removes the key
    template: str | None = None
    system: str | None = None
    messages: list[dict] | None = None
