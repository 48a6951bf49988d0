"""Pure conversions of Ollama generation requests to engine terms, and of typed stream parts back."""

from __future__ import annotations

import json
from typing import Any

from ...protocol import ChatMessage, ErrorCode, ErrorInfo, ToolCall
from ..errors import invalid, unsupported
from . import stream as enc
from .wire import ChatRequest, GenerateRequest, Message

def error_message(info: ErrorInfo, model: str | None = None) -> str:
    if info.code == ErrorCode.MODEL_NOT_FOUND and model:
        return f"model '{model}' not found, try pulling it first"
    return info.message


def schema_of(fmt: str | dict | None) -> dict | None:
    """`format`: "json" (any JSON value as an object), a JSON Schema, or nothing."""
    if fmt is None or fmt == "":
        return None
    if fmt == "json":
        return {}
    if isinstance(fmt, dict):
        return fmt
    raise invalid(f"format must be \"json\" or a JSON schema object, got {fmt!r}", "format")


def check_think(think: bool | str | None, capabilities: list[str], model: str) -> None:
    if think is None or think is False:
        return
    if isinstance(think, str) and think not in ("high", "medium", "low"):
        raise invalid(f"think must be true, false, \"high\", \"medium\" or \"low\", got {think!r}", "think")
    if "thinking" not in capabilities:
        raise invalid(f"\"{model}\" does not support thinking", "think")


def think_switches(think: bool | str | None) -> dict:
    """`think` as the chat template's own switches: enable_thinking, and reasoning_effort for a level."""
    if think is None:
        return {}
    if isinstance(think, str):
        return {"enable_thinking": True, "reasoning_effort": think}
    return {"enable_thinking": bool(think)}


def with_think(submit: Any, think: bool | str | None) -> Any:
    """Hand `think` to the worker where the link carries template switches (Submit.template_kwargs)."""
    switches = think_switches(think)
    if switches and "template_kwargs" in getattr(type(submit), "__struct_fields__", ()):
        submit.template_kwargs = {**(submit.template_kwargs or {}), **switches}
    return submit


def _forces(choice: str | dict | None) -> bool:
    return choice in ("required", "any") or isinstance(choice, dict)


def with_tool_choice(submit: Any, choice: str | dict | None, parallel: bool | None = None) -> Any:
    """Ours: force or forbid a call, where the link carries it (Submit.tool_choice). A forced call is one
    call (Ollama has no parallel-calls switch): the worker ends the turn as soon as it is complete, as
    OpenAI's and Anthropic's do without parallel calls; `parallel: true` (ours) allows several."""
    if choice is None:
        if parallel is not None:
            submit.parallel_tool_calls = parallel
        return submit
    if isinstance(choice, str) and choice not in ("auto", "none", "required", "any"):
        raise invalid(f"tool_choice must be auto, none, required or a function, got {choice!r}", "tool_choice")
    if "tool_choice" not in getattr(type(submit), "__struct_fields__", ()):
        raise unsupported("tool_choice is not supported by this server build", "tool_choice")
    submit.tool_choice = choice
    submit.parallel_tool_calls = parallel if parallel is not None else not _forces(choice)
    return submit


def _arguments_text(args: dict | str, where: str) -> str:
    if isinstance(args, str):
        try:
            parsed = json.loads(args) if args.strip() else {}
        except ValueError:
            raise invalid("tool call arguments must be an object (or its JSON text)", where) from None
        if not isinstance(parsed, dict):
            raise invalid("tool call arguments must be an object", where)
        return json.dumps(parsed, ensure_ascii=False)
    return json.dumps(args, ensure_ascii=False)


def message_of(m: Message, i: int) -> ChatMessage:
    where = f"messages[{i}]"
    if m.images:
        raise unsupported("images in messages are not supported by this server", f"{where}.images")
    if m.role not in ("system", "user", "assistant", "tool"):
        raise invalid(f"role must be system, user, assistant or tool, got {m.role!r}", f"{where}.role")
    out = ChatMessage(role=m.role, content=m.content or "")
    if m.thinking:
        out.thinking = m.thinking
    if m.tool_calls:
        out.tool_calls = [
            ToolCall(name=c.function.name, arguments=_arguments_text(c.function.arguments, f"{where}.tool_calls[{j}].function.arguments"), id=c.id)
            for j, c in enumerate(m.tool_calls)
        ]  # fmt: skip
    if m.tool_name:
        out.name = m.tool_name
    if m.tool_call_id:
        out.tool_call_id = m.tool_call_id
    return out


def tools_of(tools: list[dict] | None) -> list[dict] | None:
    if not tools:
        return None
    for i, tool in enumerate(tools):
        fn = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or tool.get("type", "function") != "function":
            raise invalid("each tool needs type 'function' and a function with a name", f"tools[{i}]")
    return list(tools)


def chat_messages(req: ChatRequest, record: Any) -> list[ChatMessage]:
    """The request's messages after the model's own (Modelfile SYSTEM / MESSAGE), as Ollama builds them."""
    msgs = [message_of(m, i) for i, m in enumerate(req.messages or [])]
    preset = [ChatMessage(role=m.get("role", "user"), content=m.get("content", "")) for m in getattr(record, "messages", None) or []]
    system = getattr(record, "system", None)
    if system and not any(m.role == "system" for m in msgs):
        preset.insert(0, ChatMessage(role="system", content=system))
    return preset + msgs


def generate_messages(req: GenerateRequest, record: Any) -> list[ChatMessage]:
    system = req.system if req.system is not None else getattr(record, "system", None)
    msgs = [ChatMessage(role="system", content=system)] if system else []
    return msgs + [ChatMessage(role="user", content=req.prompt or "")]


def check_generate(req: GenerateRequest) -> None:
    if req.images:
        raise unsupported("images are not supported by this server", "images")
    if req.suffix:
        raise unsupported("suffix (fill-in-the-middle) is not supported by this server", "suffix")
    if req.template:
        raise unsupported("a per-request template (Go template text) is not supported; send raw: true with a full prompt", "template")
    if req.logprobs or req.top_logprobs:
        raise unsupported("logprobs are not supported by this server", "logprobs")


class PartMapper:
    """Delta parts -> (text, thinking, finished tool calls), keeping the calls' order.

    Tool calls come as start (index, id, name), argument text, end (canonical JSON arguments); Ollama sends a
    call whole, once it is complete, with its arguments as an object.
    """

    def __init__(self) -> None:
        self._calls: dict[int, dict] = {}
        self.tool_calls: list[dict] = []

    def feed(self, delta: Any) -> tuple[str, str, list[dict]]:
        parts = getattr(delta, "parts", None)
        if not parts:
            return getattr(delta, "text", "") or "", "", []
        text, thinking, done_calls = [], [], []
        for p in parts:
            kind = getattr(p, "type", None) or type(p).__name__
            if kind in ("text", "TextPart"):
                text.append(p.text)
            elif kind in ("thinking", "ThinkingPart"):
                thinking.append(p.text)
            elif kind in ("tool_call_start", "ToolCallStart"):
                self._calls[p.index] = {"id": p.id, "name": p.name, "args": ""}
            elif kind in ("tool_call_args", "ToolCallArgs"):
                self._calls.setdefault(p.index, {"id": "", "name": "", "args": ""})["args"] += p.text
            elif kind in ("tool_call_end", "ToolCallEnd"):
                call = self._calls.pop(p.index, {"id": "", "name": "", "args": ""})
                args = p.arguments if getattr(p, "arguments", None) not in (None, "") else call["args"]
                item = enc.tool_call_json(p.index, ollama_call_id(call["id"]), call["name"], args)
                done_calls.append(item)
                self.tool_calls.append(item)
        return "".join(text), "".join(thinking), done_calls


def ollama_call_id(neutral: str) -> str:
    return neutral if not neutral or neutral.startswith("call_") else "call_" + neutral
