"""Pure conversions for the Responses API: input items -> protocol messages, request -> Submit,
generation parts -> output items, and the Response object itself.

Output items keep generation order: reasoning (thinking parts), then messages and function calls
as they came. A function call appears only once it ended (a call cut by max_output_tokens is not a
call; the response is then `incomplete` with reason max_output_tokens).
"""

from __future__ import annotations

import json
import secrets
from typing import Any

from ...protocol import ChatMessage, Done, FinishReason, Sampling, Submit, TextPart, ThinkingPart, ToolCall, ToolCallEnd, ToolCallStart, Usage
from ..errors import invalid, unsupported
from .responses_wire import ResponsesRequest

CALL_PREFIX = "call_"
BUILTIN_TOOLS = {
    "web_search", "web_search_preview", "web_search_preview_2025_03_11", "file_search", "computer_use_preview",
    "computer_use", "code_interpreter", "image_generation", "mcp", "local_shell", "shell", "apply_patch", "custom",
}  # fmt: skip
_ROLES = {"user": "user", "system": "system", "developer": "system", "assistant": "assistant"}
_UNSUPPORTED_CONTENT = {"input_image": "images", "input_file": "files", "input_audio": "audio"}
EFFORTS = ("minimal", "low", "medium", "high")


def item_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(12)}"


# ---- input ---------------------------------------------------------------------------------


def input_items(req: ResponsesRequest) -> list[dict]:
    """The request's input as a list of items (a string is one user message)."""
    if isinstance(req.input, str):
        return [{"type": "message", "role": "user", "content": req.input}]
    return [dict(item) for item in req.input]


def _content_text(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise invalid("content must be a string or a list of content parts", where)
    texts = []
    for j, part in enumerate(content):
        param = f"{where}[{j}]"
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in ("input_text", "output_text", "text", "summary_text", "reasoning_text"):
            if not isinstance(part.get("text"), str):
                raise invalid(f"a {kind} part needs a 'text' string", param + ".text")
            texts.append(part["text"])
        elif kind == "refusal":
            texts.append(str(part.get("refusal", "")))
        elif kind in _UNSUPPORTED_CONTENT:
            raise unsupported(f"{kind} ({_UNSUPPORTED_CONTENT[kind]}) is not supported by this server", param + ".type")
        else:
            raise invalid(f"unknown content part type {kind!r}", param + ".type")
    return "\n".join(texts)


def messages_of(items: list[dict], where: str = "input") -> list[ChatMessage]:
    """Input items (messages, function calls and their outputs, reasoning) as chat messages."""
    out: list[ChatMessage] = []
    thinking: list[str] = []
    for i, item in enumerate(items):
        param = f"{where}[{i}]"
        if not isinstance(item, dict):
            raise invalid("each input item must be an object", param)
        kind = item.get("type", "message")
        if kind == "message":
            role = _ROLES.get(item.get("role", ""))
            if role is None:
                raise invalid(f"role must be user, system, developer or assistant, not {item.get('role')!r}", param + ".role")
            msg = ChatMessage(role=role, content=_content_text(item.get("content", ""), param + ".content"))
            if role == "assistant" and thinking:
                msg.thinking, thinking = "\n".join(thinking), []
            out.append(msg)
        elif kind == "function_call":
            name, call_id = item.get("name"), item.get("call_id")
            if not isinstance(name, str) or not isinstance(call_id, str):
                raise invalid("a function_call item needs 'name' and 'call_id'", param)
            args = item.get("arguments", "{}")
            call = ToolCall(name=name, arguments=args if isinstance(args, str) else json.dumps(args), id=call_id)
            last = out[-1] if out else None
            if last is not None and last.role == "assistant":
                last.tool_calls = [*last.tool_calls, call]
            else:
                msg = ChatMessage(role="assistant", content="", tool_calls=[call])
                if thinking:
                    msg.thinking, thinking = "\n".join(thinking), []
                out.append(msg)
        elif kind == "function_call_output":
            call_id = item.get("call_id")
            if not isinstance(call_id, str):
                raise invalid("a function_call_output item needs 'call_id'", param + ".call_id")
            output = item.get("output", "")
            text = output if isinstance(output, str) else _content_text(output, param + ".output")
            out.append(ChatMessage(role="tool", content=text, tool_call_id=call_id))
        elif kind == "reasoning":
            parts = [*(item.get("content") or []), *(item.get("summary") or [])]
            text = _content_text(parts, param + ".content") if parts else ""
            if text:
                thinking.append(text)
        elif kind == "item_reference":
            raise unsupported("item_reference input items are not supported; send the items themselves", param + ".type")
        else:
            raise invalid(f"unknown input item type {kind!r}", param + ".type")
    return out


# ---- the request -------------------------------------------------------------------------


def tools_of(req: ResponsesRequest) -> list[dict] | None:
    """Function tools in the chat shape the worker's templates take; built-in tools are refused."""
    if not req.tools:
        return None
    out = []
    for i, tool in enumerate(req.tools):
        kind = tool.get("type") if isinstance(tool, dict) else None
        if kind in BUILTIN_TOOLS:
            raise unsupported(f"the built-in tool type {kind!r} is not supported by this server (function tools are)", f"tools[{i}].type")
        if kind != "function" or not isinstance(tool.get("name"), str):
            raise invalid("each tool needs type 'function' and a name", f"tools[{i}]")
        fn = {"name": tool["name"], "parameters": tool.get("parameters") or {"type": "object", "properties": {}}}
        if tool.get("description"):
            fn["description"] = tool["description"]
        out.append({"type": "function", "function": fn})
    return out


def tool_choice_of(req: ResponsesRequest, tools: list[dict] | None) -> str | dict | None:
    choice = req.tool_choice
    if choice is None:
        return None
    if isinstance(choice, str):
        if choice not in ("auto", "none", "required"):
            raise invalid("tool_choice must be 'auto', 'none', 'required' or {'type': 'function', 'name': ...}", "tool_choice")
        if choice == "required" and not tools:
            raise invalid("tool_choice 'required' needs tools", "tool_choice")
        return choice
    if choice.get("type") in BUILTIN_TOOLS:
        raise unsupported(f"tool_choice of the built-in tool type {choice.get('type')!r} is not supported", "tool_choice.type")
    name = choice.get("name")
    if choice.get("type") != "function" or not isinstance(name, str):
        raise invalid("a named tool_choice is {'type': 'function', 'name': ...}", "tool_choice")
    if not any(t["function"]["name"] == name for t in tools or []):
        raise invalid(f"tool_choice names {name!r}, which is not in tools", "tool_choice.name")
    return {"type": "function", "function": {"name": name}}


def schema_of(req: ResponsesRequest) -> dict | None:
    fmt = (req.text or {}).get("format")
    if not fmt or fmt.get("type") == "text":
        return None
    if fmt.get("type") == "json_object":
        return {}
    if fmt.get("type") == "json_schema":
        schema = fmt.get("schema")
        if not isinstance(schema, dict):
            raise invalid("text.format of type json_schema needs a 'schema' object", "text.format.schema")
        return schema
    raise invalid(f"unknown text.format type {fmt.get('type')!r}", "text.format.type")


def to_submit(req: ResponsesRequest, rid: str, history: list[dict]) -> Submit:
    """`history`: the stored conversation this request continues (previous_response_id), as items."""
    if not req.model:
        raise invalid("model must not be empty", "model")
    if req.max_output_tokens is not None and req.max_output_tokens < 1:
        raise invalid("max_output_tokens must be at least 1", "max_output_tokens")
    if req.truncation not in (None, "disabled", "auto"):
        raise invalid("truncation must be 'disabled' or 'auto'", "truncation")
    # instructions apply to this request only (a previous response's are not carried over), first
    messages = [ChatMessage(role="system", content=req.instructions)] if req.instructions else []
    messages += messages_of(history, "previous_response") + messages_of(input_items(req))
    if not messages:
        raise invalid("input must not be empty", "input")
    tools = tools_of(req)
    choice = tool_choice_of(req, tools)
    if choice == "none":
        tools = None
    sampling = Sampling()
    for field in ("temperature", "top_p", "top_k", "min_p", "seed"):
        value = getattr(req, field)
        if value is not None:
            setattr(sampling, field, value)
    kwargs: dict = {}
    effort = (req.reasoning or {}).get("effort")
    if effort is not None:
        if effort not in EFFORTS:
            raise invalid(f"reasoning.effort must be one of {', '.join(EFFORTS)}", "reasoning.effort")
        kwargs["reasoning_effort"] = effort
    return Submit(
        id=rid, messages=messages, tools=tools, tool_choice=choice if tools else None,
        parallel_tool_calls=req.parallel_tool_calls is not False, template_kwargs=kwargs, sampling=sampling,
        max_tokens=req.max_output_tokens, json_schema=schema_of(req),
        json_schema_strict=bool(((req.text or {}).get("format") or {}).get("strict")),
    )  # fmt: skip


# ---- output -------------------------------------------------------------------------------


class OutputBuilder:
    """Output items from parts as they arrive (the stream encoder and the plain response share it)."""

    def __init__(self) -> None:
        self.items: list[dict] = []
        self._open: dict | None = None  # the item text/thinking is being appended to
        self._calls: dict[int, dict] = {}  # call index -> its function_call item

    def _item(self, kind: str) -> tuple[dict, bool]:
        """The open item of `kind`, or a new one (True when new)."""
        if self._open is not None and self._open["type"] == kind:
            return self._open, False
        if kind == "message":
            item = {"type": "message", "id": item_id("msg"), "status": "in_progress", "role": "assistant",
                    "content": [{"type": "output_text", "text": "", "annotations": [], "logprobs": []}]}  # fmt: skip
        else:
            item = {"type": "reasoning", "id": item_id("rs"), "summary": [],
                    "content": [{"type": "reasoning_text", "text": ""}], "status": "in_progress"}  # fmt: skip
        self.items.append(item)
        self._open = item
        return item, True

    def text(self, text: str) -> tuple[dict, bool]:
        item, new = self._item("message")
        item["content"][0]["text"] += text
        return item, new

    def thinking(self, text: str) -> tuple[dict, bool]:
        item, new = self._item("reasoning")
        item["content"][0]["text"] += text
        return item, new

    def call_start(self, part: ToolCallStart) -> dict:
        item = {"type": "function_call", "id": item_id("fc"), "call_id": CALL_PREFIX + part.id, "name": part.name,
                "arguments": "", "status": "in_progress"}  # fmt: skip
        self.items.append(item)
        self._open = None
        self._calls[part.index] = item
        return item

    def call_args(self, index: int, text: str) -> dict | None:
        item = self._calls.get(index)
        if item is not None:
            item["arguments"] += text
        return item

    def call_end(self, part: ToolCallEnd) -> dict | None:
        item = self._calls.get(part.index)
        if item is not None:
            item["arguments"] = part.arguments
            item["status"] = "completed"
        return item

    def close_open(self, status: str = "completed") -> dict | None:
        item, self._open = self._open, None
        if item is not None:
            item["status"] = status
        return item

    def add(self, part: Any) -> None:
        kind = type(part)
        if kind is TextPart:
            self.text(part.text)
        elif kind is ThinkingPart:
            self.thinking(part.text)
        elif kind is ToolCallStart:
            self.call_start(part)
        elif kind is ToolCallEnd:
            self.call_end(part)
        elif hasattr(part, "index") and hasattr(part, "text"):
            self.call_args(part.index, part.text)

    def finished(self, incomplete: bool) -> list[dict]:
        """The final items: unfinished calls dropped, the rest completed (or incomplete)."""
        self.close_open("incomplete" if incomplete else "completed")
        out = []
        for item in self.items:
            if item["type"] == "function_call" and item["status"] != "completed":
                continue
            if item["status"] == "in_progress":
                item["status"] = "incomplete" if incomplete else "completed"
            out.append(item)
        return out


def usage_json(usage: Usage, reasoning_tokens: int = 0) -> dict:
    return {
        "input_tokens": usage.prompt_tokens,
        "input_tokens_details": {"cached_tokens": usage.cached_tokens, "cache_write_tokens": 0},
        "output_tokens": usage.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": reasoning_tokens},
        "total_tokens": usage.prompt_tokens + usage.completion_tokens,
    }


def status_of(done: Done | None) -> tuple[str, dict | None]:
    if done is None:
        return "in_progress", None
    if done.finish_reason == FinishReason.LENGTH:
        return "incomplete", {"reason": "max_output_tokens"}
    return "completed", None


def response_json(rid: str, req: ResponsesRequest, created: float, *, output: list[dict], done: Done | None,
                  reasoning_tokens: int = 0, error: dict | None = None) -> dict:  # fmt: skip
    status, incomplete = status_of(done)
    if error is not None:
        status, incomplete = "failed", None
    fmt = (req.text or {}).get("format") or {"type": "text"}
    return {
        "id": rid,
        "object": "response",
        "created_at": created,
        "status": status,
        "error": error,
        "incomplete_details": incomplete,
        "instructions": req.instructions,
        "max_output_tokens": req.max_output_tokens,
        "model": req.model,
        "output": output,
        "parallel_tool_calls": req.parallel_tool_calls is not False,
        "previous_response_id": req.previous_response_id,
        "reasoning": {"effort": (req.reasoning or {}).get("effort"), "summary": None},
        "store": req.store,
        "temperature": req.temperature,
        "text": {"format": fmt},
        "tool_choice": req.tool_choice if req.tool_choice is not None else "auto",
        "tools": list(req.tools or []),
        "top_p": req.top_p,
        "truncation": req.truncation or "disabled",
        "usage": usage_json(done.usage, reasoning_tokens) if done is not None else None,
        "user": req.user,
        "metadata": dict(req.metadata or {}),
    }


def output_text(output: list[dict]) -> str:
    return "".join(c["text"] for item in output if item["type"] == "message" for c in item["content"])
