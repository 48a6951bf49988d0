"""Server-sent events for streamed chat completions and completions.

`data: {chunk}\n\n` per event, ending with `data: [DONE]\n\n`. Chat streams open with a chunk whose
delta carries the assistant role; the finish reason rides on the last choice chunk; with
`stream_options.include_usage` every chunk has `"usage": null` and a trailing chunk with empty
`choices` carries the usage. An error after the stream started is sent as `data: {"error": ...}`.
The lifecycle calls start(), event(delta) per merged delta (its typed parts in order), finish(done)
or error(info).
"""

from __future__ import annotations

from typing import Any

import msgspec

from ...protocol import Delta, Done, ErrorInfo, TextPart, ThinkingPart, ToolCallArgs, ToolCallStart
from .convert import CALL_PREFIX, chat_logprobs_json, completion_logprobs_json, error_body, finish_reason_of, usage_json

DONE_LINE = b"data: [DONE]\n\n"
_encode = msgspec.json.Encoder().encode


def sse(data: Any) -> bytes:
    return b"data: " + _encode(data) + b"\n\n"


class _Encoder:
    object = ""

    def __init__(self, request_id: str, model: str, created: int, include_usage: bool, fingerprint: str | None = None) -> None:
        self.id = request_id
        self.model = model
        self.created = created
        self.include_usage = include_usage
        self.fingerprint = fingerprint
        self._logprobs: list = []  # this delta's, until a text chunk carries them
        self._offset = 0  # characters streamed so far (completions' text_offset)

    def logprobs_json(self, items: list) -> Any:
        raise NotImplementedError

    def _chunk(self, choices: list[dict]) -> dict:
        chunk = {"id": self.id, "object": self.object, "created": self.created, "model": self.model, "choices": choices}
        if self.fingerprint:
            chunk["system_fingerprint"] = self.fingerprint
        if self.include_usage:
            chunk["usage"] = None
        return chunk

    def _choice(self, text: str | None, finish_reason: str | None) -> dict:
        raise NotImplementedError

    def start(self) -> bytes:
        return b""

    def text(self, text: str) -> bytes:
        if not text:
            return b""
        choice = self._choice(text, None)
        if self._logprobs:
            choice["logprobs"] = self.logprobs_json(self._logprobs)
            self._logprobs = []
        self._offset += len(text)
        return sse(self._chunk([choice]))

    def thinking(self, text: str) -> bytes:
        return b""

    def tool_call(self, part) -> bytes:
        return b""

    def event(self, delta: Delta) -> bytes:
        out = b""
        self._logprobs = list(delta.logprobs)
        for part in delta.parts:
            if type(part) is TextPart:
                out += self.text(part.text)
            elif type(part) is ThinkingPart:
                out += self.thinking(part.text)
            else:
                out += self.tool_call(part)
        if self._logprobs:  # tokens whose text is still held back (a possible stop sequence)
            choice = self._choice("", None)
            choice["logprobs"] = self.logprobs_json(self._logprobs)
            self._logprobs = []
            out += sse(self._chunk([choice]))
        return out

    def finish(self, done: Done) -> bytes:
        out = sse(self._chunk([self._choice(None, finish_reason_of(done))]))
        if self.include_usage:
            chunk = self._chunk([])
            chunk["usage"] = usage_json(done.usage)
            out += sse(chunk)
        return out + DONE_LINE

    def error(self, info: ErrorInfo) -> bytes:
        return sse(error_body(info)) + DONE_LINE


class ChatStreamEncoder(_Encoder):
    object = "chat.completion.chunk"

    def start(self) -> bytes:
        return sse(self._chunk([{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}]))

    def _choice(self, text: str | None, finish_reason: str | None) -> dict:
        delta = {"content": text} if text is not None else {}
        return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}

    def logprobs_json(self, items: list) -> Any:
        return chat_logprobs_json(items)

    def thinking(self, text: str) -> bytes:
        """Reasoning text as `delta.reasoning_content` (the common extension clients read)."""
        if not text:
            return b""
        choice = {"index": 0, "delta": {"reasoning_content": text}, "logprobs": None, "finish_reason": None}
        return sse(self._chunk([choice]))


    def tool_call(self, part) -> bytes:
        """A call's start (id, name) and its argument text as `delta.tool_calls` entries."""
        if type(part) is ToolCallStart:
            entry = {"index": part.index, "id": CALL_PREFIX + part.id, "type": "function",
                     "function": {"name": part.name, "arguments": ""}}  # fmt: skip
        elif type(part) is ToolCallArgs:
            entry = {"index": part.index, "function": {"arguments": part.text}}
        else:
            return b""
        return sse(self._chunk([{"index": 0, "delta": {"tool_calls": [entry]}, "logprobs": None, "finish_reason": None}]))


class CompletionStreamEncoder(_Encoder):
    object = "text_completion"

    def _choice(self, text: str | None, finish_reason: str | None) -> dict:
        return {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish_reason}

    echo = ""  # the prompt, sent first (echo)

    def start(self) -> bytes:
        return self.text(self.echo) if self.echo else b""

    def logprobs_json(self, items: list) -> Any:
        return completion_logprobs_json(items, self._offset)
