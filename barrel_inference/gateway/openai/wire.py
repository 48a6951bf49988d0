"""OpenAI request bodies as msgspec Structs (chat completions and legacy completions).

Unknown fields are ignored (clients send many); known fields are type- and range-checked here, so a
bad value becomes a 400 that names its field. Checks that need more than a type live in convert.py.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Union

import msgspec
from msgspec import Meta

from ..wiredecode import WireError  # noqa: F401 - the family's routes import it from here
from ..wiredecode import decode as _decode

Temperature = Annotated[float, Meta(ge=0.0, le=2.0)]
Probability = Annotated[float, Meta(ge=0.0, le=1.0)]
Penalty = Annotated[float, Meta(ge=-2.0, le=2.0)]
PositiveInt = Annotated[int, Meta(ge=1, le=2**31 - 1)]  # token counts: an int32 in the engine
Seed = Annotated[int, Meta(ge=-(2**63), le=2**63 - 1)]  # an int64, as OpenAI documents it


class ContentPart(msgspec.Struct, omit_defaults=True):
    """A part of a message's content; only type 'text' is supported."""

    type: str
    text: str | None = None
    image_url: Any = None
    input_audio: Any = None
    file: Any = None


class FunctionCall(msgspec.Struct, omit_defaults=True):
    name: str
    arguments: str = "{}"


class ToolCallIn(msgspec.Struct, omit_defaults=True):
    function: FunctionCall
    id: str | None = None
    type: str = "function"


class Message(msgspec.Struct, omit_defaults=True):
    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: Union[str, list[ContentPart], None] = None
    name: str | None = None
    tool_calls: list[ToolCallIn] | None = None
    tool_call_id: str | None = None
    reasoning_content: str | None = None  # thinking of an earlier assistant turn (a common extension)


class StreamOptions(msgspec.Struct, omit_defaults=True):
    include_usage: bool = False


class JsonSchemaFormat(msgspec.Struct, omit_defaults=True):
    name: str = "response"
    schema: dict | None = None
    strict: bool | None = None
    description: str | None = None


class ResponseFormat(msgspec.Struct, omit_defaults=True):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class _Sampling(msgspec.Struct, omit_defaults=True, kw_only=True):
    """Sampling fields shared by both endpoints (top_k, min_p, repeat_penalty: common extensions)."""

    model: str
    stream: bool = False
    stream_options: StreamOptions | None = None
    max_tokens: PositiveInt | None = None
    temperature: Temperature | None = None
    top_p: Probability | None = None
    top_k: Annotated[int, Meta(ge=0, le=2**31 - 1)] | None = None
    min_p: Probability | None = None
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    repeat_penalty: Annotated[float, Meta(gt=0.0)] | None = None
    seed: Seed | None = None
    stop: Union[str, list[str], None] = None
    n: Annotated[int, Meta(ge=-(2**31), le=2**31 - 1)] | None = None
    logit_bias: dict[str, Annotated[float, Meta(ge=-100.0, le=100.0)]] | None = None
    user: str | None = None


class ChatCompletionRequest(_Sampling, kw_only=True):
    messages: Annotated[list[Message], Meta(min_length=1)]
    max_completion_tokens: PositiveInt | None = None
    response_format: ResponseFormat | None = None
    tools: list[dict] | None = None
    tool_choice: Union[str, dict, None] = None
    parallel_tool_calls: bool | None = None
    reasoning_effort: str | None = None  # handed to the chat template (models that read it)
    chat_template_kwargs: dict | None = None  # extension: the template's own switches (enable_thinking, ...)
    thinking_budget: Annotated[int, Meta(ge=0)] | None = None  # extension: thinking tokens before the span is closed
    logprobs: bool | None = None
    top_logprobs: int | None = None


class CompletionRequest(_Sampling, kw_only=True):
    prompt: Union[str, list[Any]]  # a string, a list of one string, or a list of token ids
    echo: bool | None = None
    suffix: str | None = None
    best_of: int | None = None
    logprobs: int | None = None


class EmbeddingRequest(msgspec.Struct, kw_only=True):
    model: str
    input: Union[str, list[Any]]  # a string, strings, token ids, or lists of token ids (checked in convert.py)
    encoding_format: Literal["float", "base64"] | None = None  # the openai SDK asks for base64 by default
    dimensions: PositiveInt | None = None
    user: str | None = None


def decode(body: bytes, type_: type) -> Any:
    return _decode(body, type_, lambda message, param: f"{message}{f' (field {param!r})' if param else ''}")
