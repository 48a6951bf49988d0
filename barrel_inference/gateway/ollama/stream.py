"""Ollama's response objects, field for field: generate and chat chunks, the final chunk's figures, NDJSON.

Field order and presence follow Ollama's Go structs (omitempty where Ollama omits): every chunk has model,
created_at (RFC 3339 with nanoseconds, UTC) and done; the final one adds done_reason and the figures, with
durations in nanoseconds.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

from ...protocol import Done, FinishReason


def created_at(ns: int | None = None) -> str:
    """RFC 3339 with up to nine fraction digits, trailing zeros dropped, as Go's RFC3339Nano writes UTC."""
    ns = time.time_ns() if ns is None else ns
    secs, frac = divmod(ns, 1_000_000_000)
    text = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(secs))
    if frac:
        text += "." + f"{frac:09d}".rstrip("0")
    return text + "Z"


def line(obj: dict) -> bytes:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode() + b"\n"


def done_reason(done: Done) -> str:
    return "length" if done.finish_reason == FinishReason.LENGTH else "stop"


@dataclass
class Figures:
    """What the final chunk reports. Nanoseconds; counts in tokens."""

    total_duration: int = 0
    load_duration: int = 0
    prompt_eval_count: int = 0
    prompt_eval_duration: int = 0
    eval_count: int = 0
    eval_duration: int = 0

    @classmethod
    def of(cls, done: Done, *, total_ns: int, load_ns: int) -> "Figures":
        u, t = done.usage, done.timings
        return cls(
            total_duration=total_ns,
            load_duration=load_ns,
            prompt_eval_count=max(0, u.prompt_tokens - u.cached_tokens),  # tokens evaluated, not reused
            prompt_eval_duration=int(t.prefill_ms * 1e6),
            eval_count=u.completion_tokens,
            eval_duration=int(t.decode_ms * 1e6),
        )

    def json(self) -> dict:
        return dict(self.__dict__)


def tool_call_json(index: int, call_id: str, name: str, arguments: Any) -> dict:
    """One entry of message.tool_calls: arguments as an object, as Ollama sends them."""
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except ValueError:
            arguments = {"_raw": arguments}
    return {"id": call_id, "function": {"index": index, "name": name, "arguments": arguments}}


# ---- generate ---------------------------------------------------------------------------------------------
def generate_chunk(model: str, text: str, thinking: str = "") -> dict:
    out: dict[str, Any] = {"model": model, "created_at": created_at(), "response": text}
    if thinking:
        out["thinking"] = thinking
    out["done"] = False
    return out


def generate_final(model: str, reason: str, figures: Figures | None, *, response: str = "", thinking: str = "",
                   context: list[int] | None = None) -> dict:  # fmt: skip
    out: dict[str, Any] = {"model": model, "created_at": created_at(), "response": response}
    if thinking:
        out["thinking"] = thinking
    out["done"] = True
    out["done_reason"] = reason
    if context is not None:
        out["context"] = context
    if figures is not None:
        out.update(figures.json())
    return out


# ---- chat -------------------------------------------------------------------------------------------------
def message(content: str = "", thinking: str = "", tool_calls: list[dict] | None = None) -> dict:
    out: dict[str, Any] = {"role": "assistant", "content": content}
    if thinking:
        out["thinking"] = thinking
    if tool_calls:
        out["tool_calls"] = tool_calls
    return out


def chat_chunk(model: str, msg: dict) -> dict:
    return {"model": model, "created_at": created_at(), "message": msg, "done": False}


def chat_final(model: str, reason: str, figures: Figures | None, msg: dict | None = None) -> dict:
    out: dict[str, Any] = {"model": model, "created_at": created_at(), "message": msg or message()}
    out["done_reason"] = reason
    out["done"] = True
    if figures is not None:
        out.update(figures.json())
    return out


@dataclass
class Collected:
    """A whole answer read to its end (stream: false)."""

    text: str = ""
    thinking: str = ""
    tool_calls: list[dict] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
