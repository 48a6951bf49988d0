"""The worker helper calls the Ollama routes make (render, tokenize, detokenize, embed), in one place."""

from __future__ import annotations

from typing import Any

from ...protocol import Call, ChatMessage
from ..errors import GatewayError


async def _call(handle: Any, call: Call) -> Any:
    result = await handle.call(call)
    if result.error is not None:
        raise GatewayError.from_info(result.error)
    return result


async def render(handle: Any, messages: list[ChatMessage]) -> str:
    return (await _call(handle, Call(id="", op="render", messages=messages))).text or ""


async def tokenize(handle: Any, text: str, *, add_special: bool, parse_special: bool) -> list[int]:
    call = Call(id="", op="tokenize", text=text, add_special=add_special, parse_special=parse_special)
    return list((await _call(handle, call)).tokens or [])


async def detokenize(handle: Any, tokens: list[int]) -> str:
    return (await _call(handle, Call(id="", op="detokenize", tokens=tokens))).text or ""


async def embed(handle: Any, texts: list[str]) -> tuple[list[list[float]] | None, int, Any]:
    """(vectors, tokens read, error info or None): the error is returned, for the caller to retry on."""
    result = await handle.call(Call(id="", op="embed", texts=texts))
    return result.embeddings, result.count or 0, result.error
