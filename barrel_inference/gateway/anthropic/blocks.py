"""Typed output parts -> Anthropic content blocks, in generation order, as block events.

One `ContentAssembler` per request turns the worker's parts into content_block_start / _delta / _stop
events (the stream encoder writes them as SSE; the non-stream builder ignores them) and keeps the
final content list. The stop_reason contract lives here:
- a tool call is exposed only once it is complete (its ToolCallEnd arrived with arguments that are a
  JSON object), so a call cut by max_tokens never reaches the client, streamed or not;
- stop_reason is tool_use only when at least one complete call was exposed;
- text, thinking and tool_use blocks keep the order the model wrote them in.
"""

from __future__ import annotations

import base64
import hashlib
from typing import Any

import msgspec

from ...protocol import Done, FinishReason, TextPart, ThinkingPart, ToolCallArgs, ToolCallEnd, ToolCallStart
from .convert import tool_use_id

Event = tuple[str, dict]  # (SSE event name, data)


def thinking_signature(thinking: str) -> str:
    """The signature field of a thinking block: a digest of its text (this server does not verify it on return)."""
    return base64.b64encode(hashlib.sha256(thinking.encode()).digest()).decode()


class _PendingCall:
    __slots__ = ("id", "name", "args")

    def __init__(self, call_id: str, name: str) -> None:
        self.id = call_id
        self.name = name
        self.args: list[str] = []


class ContentAssembler:
    def __init__(self) -> None:
        self.content: list[dict] = []
        self._open: str | None = None  # "text" or "thinking": the block still receiving deltas
        self._calls: dict[int, _PendingCall] = {}
        self.tool_calls = 0  # complete calls exposed
        self.dropped_calls = 0  # calls that never completed or had invalid arguments

    # ---- parts -> events ----------------------------------------------------------------
    def feed(self, parts: list[Any]) -> list[Event]:
        events: list[Event] = []
        for part in parts:
            kind = type(part)
            if kind is TextPart:
                self._append("text", part.text, events)
            elif kind is ThinkingPart:
                self._append("thinking", part.text, events)
            elif kind is ToolCallStart:
                self._close(events)
                self._calls[part.index] = _PendingCall(part.id, part.name)
            elif kind is ToolCallArgs:
                call = self._calls.get(part.index)
                if call is not None:
                    call.args.append(part.text)
            elif kind is ToolCallEnd:
                self._close(events)
                self._end_call(part, events)
            # a part kind this family does not know yet is skipped (new kinds get new tags)
        return events

    def finish(self) -> list[Event]:
        """Close the open block; calls that never completed are dropped."""
        events: list[Event] = []
        self._close(events)
        self.dropped_calls += len(self._calls)
        self._calls.clear()
        return events

    # ---- internals --------------------------------------------------------------------------
    def _append(self, kind: str, text: str, events: list[Event]) -> None:
        if not text:
            return
        index = len(self.content) - 1
        if self._open != kind:
            self._close(events)
            block = {"type": "text", "text": ""} if kind == "text" else {"type": "thinking", "thinking": "", "signature": ""}
            self.content.append(block)
            index = len(self.content) - 1
            self._open = kind
            events.append(("content_block_start", {"type": "content_block_start", "index": index, "content_block": dict(block)}))
        block = self.content[index]
        if kind == "text":
            block["text"] += text
            delta = {"type": "text_delta", "text": text}
        else:
            block["thinking"] += text
            delta = {"type": "thinking_delta", "thinking": text}
        events.append(("content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta}))

    def _close(self, events: list[Event]) -> None:
        if self._open is None:
            return
        index = len(self.content) - 1
        block = self.content[index]
        if self._open == "thinking":
            block["signature"] = thinking_signature(block["thinking"])
            delta = {"type": "signature_delta", "signature": block["signature"]}
            events.append(("content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta}))
        events.append(("content_block_stop", {"type": "content_block_stop", "index": index}))
        self._open = None

    def _end_call(self, end: ToolCallEnd, events: list[Event]) -> None:
        call = self._calls.pop(end.index, None)
        if call is None:
            return
        arguments = end.arguments or "".join(call.args) or "{}"
        try:
            parsed = msgspec.json.decode(arguments)
        except msgspec.DecodeError:
            parsed = None
        if not isinstance(parsed, dict):
            self.dropped_calls += 1
            return
        index = len(self.content)
        block = {"type": "tool_use", "id": tool_use_id(call.id), "name": call.name, "input": parsed}
        self.content.append(block)
        self.tool_calls += 1
        start = {"type": "tool_use", "id": block["id"], "name": call.name, "input": {}}
        events.append(("content_block_start", {"type": "content_block_start", "index": index, "content_block": start}))
        delta = {"type": "input_json_delta", "partial_json": msgspec.json.encode(parsed).decode()}
        events.append(("content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta}))
        events.append(("content_block_stop", {"type": "content_block_stop", "index": index}))


def stop_reason_of(done: Done, tool_calls: int) -> tuple[str, str | None]:
    """(stop_reason, stop_sequence) by the contract: max_tokens beats everything, tool_use needs a complete call."""
    reason = getattr(done.finish_reason, "value", done.finish_reason)
    if reason == FinishReason.LENGTH.value:
        return "max_tokens", None
    if done.stop_sequence:
        return "stop_sequence", done.stop_sequence
    if tool_calls:
        return "tool_use", None
    return "end_turn", None


def usage_json(prompt_tokens: int, cached_tokens: int, output_tokens: int, created_tokens: int = 0,
               ttl_1h: bool = False) -> dict:  # fmt: skip
    """Anthropic usage: input_tokens counts only what was neither read from nor written to a cache.

    cache_read_input_tokens is the worker's real reused-token count; cache_creation_input_tokens what
    the worker says this request newly committed to its cache for the next request to reuse
    (CacheInfo.committed_tokens: prompt tokens it evaluated that stay cached), never a guess. The
    `cache_creation` breakdown puts them under the TTL the request pinned its cache for (`ttl_1h`:
    a cache_control with ttl "1h"; otherwise the 5-minute default).
    """
    cached = max(0, min(cached_tokens, prompt_tokens))
    created = max(0, min(created_tokens, prompt_tokens - cached))
    return {
        "input_tokens": prompt_tokens - cached - created,
        "cache_creation_input_tokens": created,
        "cache_read_input_tokens": cached,
        "cache_creation": {
            "ephemeral_5m_input_tokens": 0 if ttl_1h else created,
            "ephemeral_1h_input_tokens": created if ttl_1h else 0,
        },
        "output_tokens": output_tokens,
    }


def done_usage(done: Done, ttl_1h: bool = False, prompt_tokens: int = 0, cached_tokens: int = 0) -> dict:
    """The usage of a finished request from its Done (prompt_tokens / cached_tokens: the admission's
    figures, for a Done that carries none)."""
    u = done.usage
    prompt = u.prompt_tokens or prompt_tokens
    cached = u.cached_tokens if u.prompt_tokens else cached_tokens
    created = done.cache.committed_tokens if done.cache is not None else 0
    return usage_json(prompt, cached, u.completion_tokens, created, ttl_1h)


def message_json(message_id: str, model: str, content: list[dict], stop_reason: str | None,
                 stop_sequence: str | None, usage: dict) -> dict:  # fmt: skip
    return {
        "id": message_id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": stop_reason,
        "stop_sequence": stop_sequence,
        "usage": usage,
    }
