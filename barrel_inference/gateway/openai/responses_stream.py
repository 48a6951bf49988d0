"""The Responses API's stream: named SSE events, each with a sequence_number, in OpenAI's order.

    response.created, response.in_progress,
    per output item: response.output_item.added,
      message:       response.content_part.added, response.output_text.delta..., response.output_text.done,
                     response.content_part.done
      reasoning:     response.reasoning_text.delta..., response.reasoning_text.done
      function_call: response.function_call_arguments.delta..., response.function_call_arguments.done
    response.output_item.done,
    then response.completed | response.incomplete (with incomplete_details) | response.failed (with error).
"""

from __future__ import annotations

import json
from typing import Any, Callable

from ...protocol import Delta, Done, ErrorInfo, TextPart, ThinkingPart, ToolCallArgs, ToolCallEnd, ToolCallStart
from .responses_convert import OutputBuilder, response_json, status_of
from .responses_wire import ResponsesRequest


def event(kind: str, payload: dict) -> bytes:
    return f"event: {kind}\ndata: {json.dumps(payload, separators=(',', ':'))}\n\n".encode()


class ResponsesStreamEncoder:
    def __init__(self, rid: str, req: ResponsesRequest, created: float, on_finish: Callable[[dict], None] | None = None):
        self.rid = rid
        self.req = req
        self.created = created
        self.out = OutputBuilder()
        self.seq = 0
        self.on_finish = on_finish  # called with the final response object (the store keeps it)

    def _emit(self, kind: str, **payload: Any) -> bytes:
        data = {"type": kind, "sequence_number": self.seq, **payload}
        self.seq += 1
        return event(kind, data)

    def _snapshot(self, done: Done | None = None, error: dict | None = None, output: list | None = None) -> dict:
        return response_json(self.rid, self.req, self.created, output=output if output is not None else [],
                             done=done, error=error)  # fmt: skip

    def start(self) -> bytes:
        snap = self._snapshot()
        return self._emit("response.created", response=snap) + self._emit("response.in_progress", response=snap)

    # ---- items ------------------------------------------------------------------------------
    def _index(self, item: dict) -> int:
        return self.out.items.index(item)

    def _close(self, item: dict | None) -> bytes:
        """The closing events of a message or reasoning item."""
        if item is None:
            return b""
        i = self._index(item)
        text = item["content"][0]["text"]
        if item["type"] == "message":
            part = item["content"][0]
            out = self._emit("response.output_text.done", item_id=item["id"], output_index=i, content_index=0, text=text, logprobs=[])
            out += self._emit("response.content_part.done", item_id=item["id"], output_index=i, content_index=0, part=part)
        else:
            out = self._emit("response.reasoning_text.done", item_id=item["id"], output_index=i, content_index=0, text=text)
        return out + self._emit("response.output_item.done", output_index=i, item=item)

    def _opened(self, item: dict) -> bytes:
        i = self._index(item)
        shell = {**item, "content": []} if item["type"] == "message" else {**item, "content": [{"type": "reasoning_text", "text": ""}]}
        out = self._emit("response.output_item.added", output_index=i, item=shell)
        if item["type"] == "message":
            out += self._emit("response.content_part.added", item_id=item["id"], output_index=i, content_index=0,
                              part={"type": "output_text", "text": "", "annotations": [], "logprobs": []})  # fmt: skip
        return out

    def _text(self, text: str, kind: str) -> bytes:
        before = self.out._open
        item, new = (self.out.text if kind == "message" else self.out.thinking)("")
        out = b""
        if new:
            if before is not None and before is not item:
                before["status"] = "completed"
                out += self._close(before)
            out += self._opened(item)
        item["content"][0]["text"] += text
        i = self._index(item)
        name = "response.output_text.delta" if kind == "message" else "response.reasoning_text.delta"
        extra = {"logprobs": []} if kind == "message" else {}
        return out + self._emit(name, item_id=item["id"], output_index=i, content_index=0, delta=text, **extra)

    def event(self, delta: Delta) -> bytes:
        out = b""
        for part in delta.parts:
            kind = type(part)
            if kind is TextPart and part.text:
                out += self._text(part.text, "message")
            elif kind is ThinkingPart and part.text:
                out += self._text(part.text, "reasoning")
            elif kind is ToolCallStart:
                out += self._close(self.out.close_open())
                item = self.out.call_start(part)
                out += self._emit("response.output_item.added", output_index=self._index(item), item=dict(item))
            elif kind is ToolCallArgs:
                item = self.out.call_args(part.index, part.text)
                if item is not None and part.text:
                    out += self._emit("response.function_call_arguments.delta", item_id=item["id"],
                                      output_index=self._index(item), delta=part.text)  # fmt: skip
            elif kind is ToolCallEnd:
                item = self.out.call_end(part)
                if item is not None:
                    i = self._index(item)
                    out += self._emit("response.function_call_arguments.done", item_id=item["id"], output_index=i,
                                      arguments=item["arguments"], name=item["name"])  # fmt: skip
                    out += self._emit("response.output_item.done", output_index=i, item=item)
        return out

    def finish(self, done: Done) -> bytes:
        status, _ = status_of(done)
        open_item = self.out._open
        out = b""
        if open_item is not None:
            open_item["status"] = "incomplete" if status == "incomplete" else "completed"
            out += self._close(open_item)
            self.out._open = None
        final = self._snapshot(done, output=self.out.finished(status == "incomplete"))
        if self.on_finish is not None:
            self.on_finish(final)
        name = "response.incomplete" if status == "incomplete" else "response.completed"
        return out + self._emit(name, response=final)

    def error(self, info: ErrorInfo) -> bytes:
        err = {"code": info.code.value if hasattr(info.code, "value") else str(info.code), "message": info.message}
        final = self._snapshot(None, error=err, output=self.out.finished(True))
        return self._emit("response.failed", response=final)
