"""Server-sent events of a streamed Message, with named events as the SDKs and Claude Code read them.

    event: message_start        {"type": "message_start", "message": {... "content": [], "usage": {...}}}
    event: ping                 {"type": "ping"}            (also every 15 s while nothing else is sent)
    event: content_block_start / content_block_delta / content_block_stop   (per block, in order)
    event: message_delta        {"delta": {"stop_reason", "stop_sequence"}, "usage": {...}}
    event: message_stop
    event: error                {"type": "error", "error": {"type", "message"}}   (a failure mid-stream)
"""

from __future__ import annotations

from typing import Any

import msgspec

from ...protocol import Done, ErrorInfo
from .blocks import ContentAssembler, Event, done_usage, message_json, stop_reason_of, usage_json
from .errors import error_body

PING_INTERVAL_S = 15.0
START_OUTPUT_TOKENS = 1  # message_start's output_tokens, as the real API reports it
_encode = msgspec.json.Encoder().encode


def sse(event: str, data: Any) -> bytes:
    return b"event: " + event.encode() + b"\ndata: " + _encode(data) + b"\n\n"


PING = sse("ping", {"type": "ping"})


class MessageStreamEncoder:
    """Pure: bytes out for each step of one streamed Message."""

    def __init__(self, message_id: str, model: str, ttl_1h: bool = False) -> None:
        self.id = message_id
        self.model = model
        self.ttl_1h = ttl_1h  # the request pinned its cache for an hour (cache_control ttl "1h")
        self.blocks = ContentAssembler()
        self.prompt_tokens = 0
        self.cached_tokens = 0
        self.started = False

    def start(self, prompt_tokens: int = 0, cached_tokens: int = 0) -> bytes:
        """message_start, then a ping. Its usage has the fields the real API sends there: the prompt as
        admitted (cache reads known; what the request commits to the cache is known only at its end,
        so 0 here, and message_delta carries the final split) and output_tokens 1, the real API's
        figure at this point (message_delta's output_tokens is the total, which clients keep)."""
        self.started = True
        self.prompt_tokens, self.cached_tokens = prompt_tokens, cached_tokens
        usage = usage_json(prompt_tokens, cached_tokens, START_OUTPUT_TOKENS, 0, self.ttl_1h)
        message = message_json(self.id, self.model, [], None, None, usage)
        return sse("message_start", {"type": "message_start", "message": message}) + PING

    def parts(self, parts: list[Any]) -> bytes:
        return _write(self.blocks.feed(parts))

    def finish(self, done: Done) -> bytes:
        out = _write(self.blocks.finish())
        stop_reason, stop_sequence = stop_reason_of(done, self.blocks.tool_calls)
        usage = done_usage(done, self.ttl_1h, self.prompt_tokens, self.cached_tokens)
        usage.pop("cache_creation")  # message_delta's usage carries the four counts only, as the real API's does
        delta = {
            "type": "message_delta",
            "delta": {"stop_reason": stop_reason, "stop_sequence": stop_sequence},
            "usage": usage,
        }
        return out + sse("message_delta", delta) + sse("message_stop", {"type": "message_stop"})

    def error(self, info: ErrorInfo) -> bytes:
        return sse("error", error_body(info))

    @staticmethod
    def ping() -> bytes:
        return PING


def _write(events: list[Event]) -> bytes:
    return b"".join(sse(name, data) for name, data in events)
