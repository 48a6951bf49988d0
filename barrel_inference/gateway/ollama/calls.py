"""The worker helper calls the Ollama routes make (render, tokenize, detokenize, embed), in one place."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request

from ...protocol import ChatMessage, Detokenize, Embed, Render, Tokenize
from ..errors import GatewayError
from ..lifecycle import admitted_call


async def _call(handle: Any, call: Any) -> Any:
    result = await handle.call(call)
    if result.error is not None:
        raise GatewayError.from_info(result.error)
    return result


async def render(handle: Any, messages: list[ChatMessage], template_kwargs: dict | None = None) -> str:
    """The chat template's text of `messages`; template_kwargs: its switches (enable_thinking, reasoning_effort)."""
    return (await _call(handle, Render(id="", messages=messages, template_kwargs=dict(template_kwargs or {})))).text


async def tokenize(handle: Any, text: str, *, add_special: bool, parse_special: bool) -> list[int]:
    return list((await _call(handle, Tokenize(id="", text=text, add_special=add_special, parse_special=parse_special))).tokens)


async def detokenize(handle: Any, tokens: list[int]) -> str:
    return (await _call(handle, Detokenize(id="", tokens=tokens))).text


async def embed(request: Request, model: str, texts: list[str]) -> tuple[list[list[float]], int, Any]:
    """(vectors, tokens read, error info or None), holding one of the model's admission slots; the error is
    returned for the caller to retry on."""
    result = await admitted_call(request, model, Embed(id="", inputs=list(texts)))
    return result.embeddings, result.count, result.error
