"""Anthropic Messages API request bodies as msgspec Structs.

Unknown fields are ignored, as the real API does (service_tier, container, mcp_servers...); known
fields are type- and range-checked here, so a bad value becomes a 400 that names its field.
Content blocks and tools are decoded loosely (any `type`) so that convert.py can answer an
unsupported block or server tool with a message naming it, rather than a generic tag error.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Union

import msgspec
from msgspec import Meta

from ..wiredecode import WireError  # noqa: F401 - the family's routes import it from here
from ..wiredecode import decode as _decode

PositiveInt = Annotated[int, Meta(ge=1)]
Probability = Annotated[float, Meta(ge=0.0, le=1.0)]


class CacheControl(msgspec.Struct, omit_defaults=True):
    type: str = "ephemeral"
    ttl: str | None = None  # "5m" (default) or "1h"


class Block(msgspec.Struct, omit_defaults=True, kw_only=True):
    """One content block of any type; convert.py checks that the type is supported and its fields are set."""

    type: str
    text: str | None = None
    # tool_use (and server_tool_use)
    id: str | None = None
    name: str | None = None
    input: Any = None
    # tool_result
    tool_use_id: str | None = None
    content: Union[str, list["Block"], None] = None
    is_error: bool | None = None
    # thinking / redacted_thinking
    thinking: str | None = None
    signature: str | None = None
    data: str | None = None
    # image / document (refused with a clear message)
    source: Any = None
    cache_control: CacheControl | None = None
    citations: Any = None


class Message(msgspec.Struct, omit_defaults=True):
    role: Literal["user", "assistant"]
    content: Union[str, list[Block]]


class Tool(msgspec.Struct, omit_defaults=True, kw_only=True):
    """A custom tool (name + input_schema), or a server tool (a versioned `type`), refused in convert.py."""

    name: str | None = None
    type: str | None = None  # None or "custom" for a custom tool
    description: str | None = None
    input_schema: dict | None = None
    cache_control: CacheControl | None = None


class ToolChoice(msgspec.Struct, omit_defaults=True):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None


class ThinkingConfig(msgspec.Struct, omit_defaults=True):
    type: Literal["enabled", "disabled", "adaptive"]
    budget_tokens: Annotated[int, Meta(ge=1)] | None = None


class OutputFormat(msgspec.Struct, omit_defaults=True):
    type: Literal["json_schema"]
    schema: dict


class OutputConfig(msgspec.Struct, omit_defaults=True):
    """Structured output (`format`: a JSON Schema the reply must match) and `effort` (accepted, not used)."""

    format: OutputFormat | None = None
    effort: str | None = None


class Metadata(msgspec.Struct, omit_defaults=True):
    user_id: str | None = None


class _Prompt(msgspec.Struct, omit_defaults=True, kw_only=True):
    """What both /v1/messages and /v1/messages/count_tokens read."""

    model: str
    messages: list[Message]
    system: Union[str, list[Block], None] = None
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    thinking: ThinkingConfig | None = None


class MessagesRequest(_Prompt, kw_only=True):
    max_tokens: PositiveInt
    stop_sequences: list[str] | None = None
    stream: bool = False
    temperature: Probability | None = None
    top_p: Probability | None = None
    top_k: Annotated[int, Meta(ge=0)] | None = None
    metadata: Metadata | None = None
    output_config: OutputConfig | None = None


class CountTokensRequest(_Prompt, kw_only=True):
    pass


def decode(body: bytes, type_: type) -> Any:
    return _decode(body, type_, lambda message, param: f"{param + ': ' if param else ''}{message}")
