"""The Responses API's request (POST /v1/responses), as the openai SDK and Codex send it.

Input items stay plain dicts here (their shapes vary by `type`); responses_convert checks each one
and names the offending item in its errors. Fields the server does not act on (service_tier,
include, prompt_cache_key, safety_identifier, ...) are accepted and ignored, as OpenAI does for
fields a model does not use.
"""

from __future__ import annotations

from typing import Any

import msgspec


class ResponsesRequest(msgspec.Struct, kw_only=True):
    model: str
    input: str | list[dict] = []
    instructions: str | None = None
    tools: list[dict] | None = None
    tool_choice: str | dict | None = None
    parallel_tool_calls: bool | None = None
    stream: bool = False
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    previous_response_id: str | None = None
    store: bool = True
    text: dict | None = None  # {"format": {"type": "text" | "json_object" | "json_schema", ...}}
    reasoning: dict | None = None  # {"effort": "low" | "medium" | "high", "summary": ...}
    metadata: dict[str, Any] | None = None
    truncation: str | None = None  # "disabled" (default) | "auto"
    user: str | None = None
    top_logprobs: int | None = None
    seed: int | None = None  # not in OpenAI's API; llama-server and vLLM accept it too
    top_k: int | None = None
    min_p: float | None = None


_decoder = msgspec.json.Decoder(ResponsesRequest)


class WireError(ValueError):
    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


def decode(body: bytes) -> ResponsesRequest:
    try:
        return _decoder.decode(body)
    except msgspec.ValidationError as exc:
        text = str(exc)
        param = text.rsplit("at `$.", 1)[1].rstrip("`") if "at `$." in text else None
        raise WireError(f"invalid request: {text}", param) from None
    except msgspec.DecodeError as exc:
        raise WireError(f"the body is not valid JSON: {exc}") from None
