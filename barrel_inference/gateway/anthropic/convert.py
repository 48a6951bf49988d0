"""Pure conversions from an Anthropic Messages request to engine terms (protocol Submit / Call).

System (a string or text blocks) becomes one system message; a user turn's tool_result blocks become
tool messages (in order, before the turn's text); an assistant turn's thinking, text and tool_use
blocks become one assistant message with its thinking and tool calls. Blocks this server cannot use
(image, document, server tool results...) and server tools (web_search, bash...) are refused with a
400 that names the block. cache_control marks are accepted everywhere a block or tool may carry them,
and honoured as a pin (Submit.pin_ttl_s): the worker keeps the request's cache for the mark's TTL
(5 minutes, or an hour with `ttl: "1h"`) before retention may drop it for unpinned caches' sake.
"""

from __future__ import annotations

from typing import Any

import msgspec

from ...protocol import ChatMessage, Sampling, Submit, ToolCall
from ..errors import invalid, unsupported
from ..sessions import session_id
from .wire import Block, Message, MessagesRequest, Tool, _Prompt

TOOL_ID_PREFIX = "toolu_"
CACHE_TTL_S = {None: 300.0, "5m": 300.0, "1h": 3600.0}  # cache_control ttl -> seconds the cache is pinned

# block types a client may send that this server cannot turn into text, with a word for each
_UNSUPPORTED_BLOCKS = {
    "image": "image blocks are not supported by this server (the model reads text only)",
    "document": "document blocks are not supported by this server (send the document's text as a text block)",
    "search_result": "search_result blocks are not supported by this server",
    "container_upload": "container_upload blocks are not supported by this server",
}
_SERVER_RESULT_SUFFIX = "_tool_result"  # web_search_tool_result, code_execution_tool_result, ...

_json = msgspec.json.Encoder()


def _refuse_block(block: Block, param: str):
    if block.type in _UNSUPPORTED_BLOCKS:
        return unsupported(f"{param}: {_UNSUPPORTED_BLOCKS[block.type]}", param)
    if block.type == "server_tool_use" or block.type.endswith(_SERVER_RESULT_SUFFIX):
        return unsupported(f"{param}: {block.type} blocks belong to server tools, which this server does not run", param)
    return invalid(f"{param}: unknown content block type {block.type!r}", param + ".type")


def _text_of(block: Block, param: str) -> str:
    if block.text is None:
        raise invalid(f"{param}: a text block needs a 'text' field", param + ".text")
    return block.text


def system_text(system: str | list[Block] | None) -> str | None:
    if system is None:
        return None
    if isinstance(system, str):
        return system
    texts = []
    for i, block in enumerate(system):
        param = f"system[{i}]"
        if block.type != "text":
            raise invalid(f"{param}: system blocks must be text blocks, got {block.type!r}", param + ".type")
        texts.append(_text_of(block, param))
    return "\n\n".join(texts)


def _tool_result_text(block: Block, param: str) -> str:
    content = block.content
    if content is None:
        text = ""
    elif isinstance(content, str):
        text = content
    else:
        parts = []
        for j, inner in enumerate(content):
            where = f"{param}.content[{j}]"
            if inner.type != "text":
                raise _refuse_block(inner, where)
            parts.append(_text_of(inner, where))
        text = "\n".join(parts)
    return f"Error: {text}" if block.is_error else text


def _user_messages(msg: Message, index: int) -> list[ChatMessage]:
    if isinstance(msg.content, str):
        return [ChatMessage(role="user", content=msg.content)]
    out: list[ChatMessage] = []
    texts: list[str] = []

    def flush() -> None:
        if texts:
            out.append(ChatMessage(role="user", content="\n".join(texts)))
            texts.clear()

    for j, block in enumerate(msg.content):
        param = f"messages[{index}].content[{j}]"
        if block.type == "text":
            texts.append(_text_of(block, param))
        elif block.type == "tool_result":
            if not block.tool_use_id:
                raise invalid(f"{param}: a tool_result block needs 'tool_use_id'", param + ".tool_use_id")
            flush()
            out.append(ChatMessage(role="tool", content=_tool_result_text(block, param), tool_call_id=block.tool_use_id))
        elif block.type in ("thinking", "redacted_thinking", "tool_use"):
            raise invalid(f"{param}: {block.type} blocks belong in assistant turns", param + ".type")
        else:
            raise _refuse_block(block, param)
    flush()
    return out


def _assistant_message(msg: Message, index: int) -> ChatMessage:
    if isinstance(msg.content, str):
        return ChatMessage(role="assistant", content=msg.content)
    texts: list[str] = []
    thinking: list[str] = []
    calls: list[ToolCall] = []
    for j, block in enumerate(msg.content):
        param = f"messages[{index}].content[{j}]"
        if block.type == "text":
            texts.append(_text_of(block, param))
        elif block.type == "thinking":
            thinking.append(block.thinking or "")
        elif block.type == "redacted_thinking":
            continue  # opaque by design: nothing a local model can read
        elif block.type == "tool_use":
            if not block.id or not block.name:
                raise invalid(f"{param}: a tool_use block needs 'id' and 'name'", param)
            if block.input is not None and not isinstance(block.input, dict):
                raise invalid(f"{param}: a tool_use block's 'input' must be an object", param + ".input")
            calls.append(ToolCall(name=block.name, arguments=_json.encode(block.input or {}).decode(), id=block.id))
        elif block.type == "tool_result":
            raise invalid(f"{param}: tool_result blocks belong in user turns", param + ".type")
        else:
            raise _refuse_block(block, param)
    out = ChatMessage(role="assistant", content="".join(texts), tool_calls=calls)
    if thinking:
        out.thinking = "\n".join(thinking)
    return out


def messages_of(req: _Prompt) -> list[ChatMessage]:
    if not req.messages:
        raise invalid("messages: at least one message is required", "messages")
    out: list[ChatMessage] = []
    system = system_text(req.system)
    if system is not None:
        out.append(ChatMessage(role="system", content=system))
    for i, msg in enumerate(req.messages):
        if msg.role == "user":
            out.extend(_user_messages(msg, i))
        else:
            out.append(_assistant_message(msg, i))
    return out


def _tool_of(tool: Tool, index: int) -> dict:
    param = f"tools[{index}]"
    if tool.type not in (None, "custom"):
        raise unsupported(
            f"{param}: server tool {tool.type!r} is not available on this server; declare a custom tool with "
            "name, description and input_schema instead",
            param + ".type",
        )
    if not tool.name:
        raise invalid(f"{param}: a tool needs a 'name'", param + ".name")
    if tool.input_schema is None:
        raise invalid(f"{param}: a custom tool needs an 'input_schema'", param + ".input_schema")
    function: dict[str, Any] = {"name": tool.name, "parameters": tool.input_schema}
    if tool.description:
        function["description"] = tool.description
    return {"type": "function", "function": function}


def tools_of(req: _Prompt) -> list[dict] | None:
    """The declared tools as JSON-Schema function definitions (the shape chat templates read).

    tool_choice none removes them from the turn; a named tool_choice must name a declared tool.
    """
    if not req.tools:
        if req.tool_choice is not None and req.tool_choice.type in ("any", "tool"):
            raise invalid(f"tool_choice: type {req.tool_choice.type!r} needs tools", "tool_choice")
        return None
    tools = [_tool_of(t, i) for i, t in enumerate(req.tools)]
    choice = req.tool_choice
    if choice is not None:
        if choice.type == "tool":
            names = {t["function"]["name"] for t in tools}
            if not choice.name:
                raise invalid("tool_choice: type 'tool' needs a 'name'", "tool_choice.name")
            if choice.name not in names:
                raise invalid(f"tool_choice: tool {choice.name!r} is not among the declared tools", "tool_choice.name")
        if choice.type == "none":
            return None
    return tools


def sampling_of(req: MessagesRequest) -> Sampling:
    s = Sampling()
    for field in ("temperature", "top_p", "top_k"):
        value = getattr(req, field)
        if value is not None:
            setattr(s, field, value)
    return s


def stop_of(req: MessagesRequest) -> list[str]:
    stops = list(req.stop_sequences or [])
    for i, s in enumerate(stops):
        if s == "":
            raise invalid(f"stop_sequences[{i}]: stop sequences must not be empty", f"stop_sequences[{i}]")
    return stops


def _check_model(req: _Prompt) -> None:
    if not req.model:
        raise invalid("model: must not be empty", "model")


def turn_options(req: _Prompt) -> dict:
    """tool_choice, disable_parallel_tool_use and the thinking config in engine terms: Submit's
    tool_choice ("auto" / "required" / "none" / a named function), parallel_tool_calls, thinking_budget
    and the template's enable_thinking switch. Only what the request set is returned."""
    out: dict[str, Any] = {}
    choice = req.tool_choice
    if choice is not None and req.tools:
        if choice.type == "tool":
            out["tool_choice"] = {"type": "function", "function": {"name": choice.name}}
        else:
            out["tool_choice"] = {"auto": "auto", "any": "required", "none": "none"}[choice.type]
        if choice.disable_parallel_tool_use:
            out["parallel_tool_calls"] = False
    thinking = req.thinking
    if thinking is not None:
        enabled = thinking.type != "disabled"
        out["template_kwargs"] = {"enable_thinking": enabled}
        if enabled and thinking.budget_tokens is not None:
            out["thinking_budget"] = thinking.budget_tokens
    return out


def _submit_options(req: _Prompt) -> dict:
    """The turn options this protocol's Submit carries (a link without them takes the request as it is)."""
    return {k: v for k, v in turn_options(req).items() if k in Submit.__struct_fields__}


def _marks(req: _Prompt):
    """(param, cache_control) of every block and tool that carries one."""
    if isinstance(req.system, list):
        for i, block in enumerate(req.system):
            yield f"system[{i}]", block.cache_control
    for i, tool in enumerate(req.tools or []):
        yield f"tools[{i}]", tool.cache_control
    for i, msg in enumerate(req.messages):
        if isinstance(msg.content, list):
            for j, block in enumerate(msg.content):
                yield f"messages[{i}].content[{j}]", block.cache_control
                if isinstance(block.content, list):
                    for k, inner in enumerate(block.content):
                        yield f"messages[{i}].content[{j}].content[{k}]", inner.cache_control


def pin_ttl_of(req: _Prompt) -> float:
    """The seconds to pin the request's cache for: the longest TTL among its cache_control marks (0: none).

    The real API caches the prefix up to each marked block; the worker pins the request's whole cache
    (the prompt, the last marked block included, and the reply), which keeps that prefix and a little more.
    """
    ttl = 0.0
    for param, mark in _marks(req):
        if mark is None:
            continue
        if mark.ttl not in CACHE_TTL_S:
            raise invalid(f"{param}.cache_control.ttl: must be \"5m\" or \"1h\", got {mark.ttl!r}", f"{param}.cache_control.ttl")
        ttl = max(ttl, CACHE_TTL_S[mark.ttl])
    return ttl


def to_submit(req: MessagesRequest, request_id: str) -> Submit:
    _check_model(req)
    pin = pin_ttl_of(req)
    messages = messages_of(req)
    # a client that names its user (Claude Code does) gets a session without a session header:
    # that user's id with the conversation's first user message (a session header still wins)
    user = req.metadata.user_id if req.metadata is not None else None
    return Submit(
        **({"pin_ttl_s": pin} if pin and "pin_ttl_s" in Submit.__struct_fields__ else {}),
        **_submit_options(req),
        id=request_id,
        session=session_id(user_id=user, messages=messages),
        messages=messages,
        tools=tools_of(req),
        sampling=sampling_of(req),
        stop=stop_of(req),
        max_tokens=req.max_tokens,
        json_schema=req.output_config.format.schema if req.output_config and req.output_config.format else None,
    )


def prompt_of(req: _Prompt) -> tuple[list[ChatMessage], list[dict] | None]:
    """What count_tokens renders: the same messages and tools a generation request would."""
    _check_model(req)
    return messages_of(req), tools_of(req)


def tool_use_id(neutral: str) -> str:
    """The family's spelling of a worker's call id."""
    return neutral if neutral.startswith(TOOL_ID_PREFIX) else TOOL_ID_PREFIX + neutral
