"""Pure conversions between the OpenAI wire format and the protocol (engine terms)."""

from __future__ import annotations

import base64
import math
import struct
from typing import Any

from ...protocol import (
    ChatMessage, Done, ErrorCode, ErrorInfo, FinishReason, Sampling, Submit, ThinkingPart, ToolCall, ToolCallEnd,
    ToolCallStart, Usage,
)  # fmt: skip
from ..errors import invalid, unsupported
from ..family import STATUS
from .wire import ChatCompletionRequest, CompletionRequest, EmbeddingRequest, Message

COMPLETIONS_DEFAULT_MAX_TOKENS = 16
MAX_TOKEN_ID = 2**31 - 1  # llama_token is an int32  # OpenAI's documented default for /v1/completions
_ROLES = {"developer": "system", "function": "tool"}
_UNSUPPORTED_PARTS = {"image_url": "images", "input_audio": "audio", "file": "files"}


# ---- errors ----------------------------------------------------------------------------


def error_status(code: ErrorCode) -> int:
    return STATUS.get(code, 500)


def error_body(info: ErrorInfo, status: int | None = None) -> dict:
    """OpenAI's envelope: {"error": {message, type, param, code}}."""
    status = status or error_status(info.code)
    kind = "invalid_request_error" if status < 500 else "server_error"
    return {"error": {"message": info.message, "type": kind, "param": info.param, "code": info.code.value}}


# ---- requests ---------------------------------------------------------------------------


def sampling_of(req: ChatCompletionRequest | CompletionRequest) -> Sampling:
    s = Sampling()
    for field in ("temperature", "top_p", "top_k", "min_p", "presence_penalty", "frequency_penalty", "repeat_penalty", "seed"):
        value = getattr(req, field)
        if value is not None:
            setattr(s, field, value)
    if req.logit_bias:
        bias: dict[int, float] = {}
        for key, value in req.logit_bias.items():
            try:
                token = int(key)
            except ValueError:
                raise invalid(f"logit_bias keys must be token ids, got {key!r}", "logit_bias") from None
            if token < 0 or token > MAX_TOKEN_ID:
                raise invalid(f"logit_bias keys must be token ids, got {key[:32]!r}", "logit_bias")
            bias[token] = value
        s.logit_bias = bias
    return s


MAX_STOP = 16
MAX_TOP_LOGPROBS = 20


def stop_of(stop: str | list[str] | None) -> list[str]:
    if stop is None:
        return []
    items = [stop] if isinstance(stop, str) else list(stop)
    if len(items) > MAX_STOP:
        raise invalid(f"stop may hold at most {MAX_STOP} sequences, got {len(items)}", "stop")
    if any(s == "" for s in items):
        raise invalid("stop sequences must not be empty", "stop")
    return items


def _common_checks(req: ChatCompletionRequest | CompletionRequest) -> None:
    if req.n is not None and req.n != 1:
        raise invalid(f"only n=1 is supported, got n={req.n}", "n")
    if not req.model:
        raise invalid("model must not be empty", "model")


def _content_text(content: Any, where: str) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    texts = []
    for j, part in enumerate(content):
        param = f"{where}.content[{j}]"
        if part.type == "text":
            if part.text is None:
                raise invalid("a text part needs a 'text' field", param)
            texts.append(part.text)
        elif part.type in _UNSUPPORTED_PARTS:
            raise unsupported(f"{_UNSUPPORTED_PARTS[part.type]} in messages are not supported by this server", param)
        else:
            raise invalid(f"unknown content part type {part.type!r}", param + ".type")
    return "\n".join(texts)


def message_of(msg: Message, index: int) -> ChatMessage:
    where = f"messages[{index}]"
    out = ChatMessage(role=_ROLES.get(msg.role, msg.role), content=_content_text(msg.content, where))
    if msg.name:
        out.name = msg.name
    if msg.tool_calls:
        out.tool_calls = [ToolCall(name=c.function.name, arguments=c.function.arguments or "{}", id=c.id) for c in msg.tool_calls]
    if msg.tool_call_id:
        out.tool_call_id = msg.tool_call_id
    if msg.reasoning_content:
        out.thinking = msg.reasoning_content
    return out


def _tools_of(req: ChatCompletionRequest) -> list[dict] | None:
    if not req.tools or req.tool_choice == "none":
        return None
    for i, tool in enumerate(req.tools):
        fn = tool.get("function") if isinstance(tool, dict) else None
        if tool.get("type", "function") != "function" or not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise invalid("each tool needs type 'function' and a function with a name", f"tools[{i}]")
    return list(req.tools)


def _tool_choice_of(req: ChatCompletionRequest) -> str | dict | None:
    """auto / none / required, or {"type": "function", "function": {"name": …}} naming a declared tool."""
    choice = req.tool_choice
    if choice is None:
        return None
    if isinstance(choice, str):
        if choice not in ("auto", "none", "required"):
            raise invalid("tool_choice must be 'auto', 'none', 'required' or a named function", "tool_choice")
        if choice == "required" and not req.tools:
            raise invalid("tool_choice 'required' needs tools", "tool_choice")
        return choice
    fn = choice.get("function")
    name = fn.get("name") if isinstance(fn, dict) else None
    if choice.get("type", "function") != "function" or not isinstance(name, str):
        raise invalid("a named tool_choice is {'type': 'function', 'function': {'name': ...}}", "tool_choice")
    if not any(isinstance(t.get("function"), dict) and t["function"].get("name") == name for t in req.tools or []):
        raise invalid(f"tool_choice names {name!r}, which is not in tools", "tool_choice")
    return {"type": "function", "function": {"name": name}}


def _template_kwargs_of(req: ChatCompletionRequest) -> dict:
    kwargs = dict(req.chat_template_kwargs or {})
    if req.reasoning_effort is not None:
        kwargs.setdefault("reasoning_effort", req.reasoning_effort)
    return kwargs


def _schema_of(req: ChatCompletionRequest) -> dict | None:
    rf = req.response_format
    if rf is None or rf.type == "text":
        return None
    if rf.type == "json_object":
        return {}
    if rf.json_schema is None or rf.json_schema.schema is None:
        raise invalid("response_format of type json_schema needs json_schema.schema", "response_format.json_schema.schema")
    return rf.json_schema.schema


def _strict_of(req: ChatCompletionRequest) -> bool:
    rf = req.response_format
    return bool(rf is not None and rf.type == "json_schema" and rf.json_schema is not None and rf.json_schema.strict)


def chat_to_submit(req: ChatCompletionRequest, request_id: str) -> Submit:
    _common_checks(req)
    logprobs = None
    if req.top_logprobs is not None:
        if not req.logprobs:
            raise invalid("top_logprobs needs logprobs set to true", "top_logprobs")
        if not 0 <= req.top_logprobs <= MAX_TOP_LOGPROBS:
            raise invalid(f"top_logprobs must be between 0 and {MAX_TOP_LOGPROBS}", "top_logprobs")
    if req.logprobs:
        logprobs = req.top_logprobs or 0
    max_tokens = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
    return Submit(
        id=request_id,
        messages=[message_of(m, i) for i, m in enumerate(req.messages)],
        tools=_tools_of(req),
        tool_choice=_tool_choice_of(req),
        parallel_tool_calls=req.parallel_tool_calls is not False,
        template_kwargs=_template_kwargs_of(req),
        thinking_budget=req.thinking_budget,
        sampling=sampling_of(req),
        stop=stop_of(req.stop),
        max_tokens=max_tokens,
        json_schema=_schema_of(req),
        json_schema_strict=_strict_of(req),
        logprobs=logprobs,
    )


def completion_to_submit(req: CompletionRequest, request_id: str) -> Submit:
    _common_checks(req)
    if req.best_of is not None and req.best_of != 1:
        raise invalid(f"only best_of=1 is supported, got best_of={req.best_of}", "best_of")
    if req.echo:
        echo_text(req)
        if req.logprobs is not None:
            raise invalid("echo with logprobs (log-probabilities of the prompt) is not supported", "echo")
        if req.suffix is not None:
            raise invalid("echo cannot be combined with suffix", "echo")
    if req.logprobs is not None and not 0 <= req.logprobs <= MAX_TOP_LOGPROBS:
        raise invalid(f"logprobs must be between 0 and {MAX_TOP_LOGPROBS}", "logprobs")
    prompt, prompt_tokens = _prompt_of(req.prompt)
    max_tokens = req.max_tokens if req.max_tokens is not None else COMPLETIONS_DEFAULT_MAX_TOKENS
    return Submit(
        id=request_id, prompt=prompt, prompt_tokens=prompt_tokens, sampling=sampling_of(req),
        stop=stop_of(req.stop), max_tokens=max_tokens, logprobs=req.logprobs, suffix=req.suffix,
    )  # fmt: skip


def echo_text(req: CompletionRequest) -> str:
    """The prompt as text, for echo (a text prompt only)."""
    p = req.prompt
    if isinstance(p, str):
        return p
    if isinstance(p, list) and len(p) == 1 and isinstance(p[0], str):
        return p[0]
    raise invalid("echo needs a text prompt", "echo")


def _prompt_of(prompt: str | list[Any]) -> tuple[str | None, list[int] | None]:
    if isinstance(prompt, str):
        return prompt, None
    if not prompt:
        raise invalid("prompt must not be empty", "prompt")
    if all(isinstance(p, str) for p in prompt):
        if len(prompt) != 1:
            raise unsupported("only one prompt per request is supported", "prompt")
        return prompt[0], None
    if all(isinstance(p, int) and not isinstance(p, bool) and p >= 0 for p in prompt):
        if any(p > MAX_TOKEN_ID for p in prompt):
            raise invalid(f"token ids are at most {MAX_TOKEN_ID}", "prompt")
        return None, list(prompt)
    raise invalid("prompt must be a string, a list of one string, or a list of token ids", "prompt")


# ---- responses --------------------------------------------------------------------------


def finish_reason_of(done: Done) -> str:
    if done.finish_reason == FinishReason.LENGTH:
        return "length"
    if done.finish_reason == FinishReason.TOOL_CALLS:
        return "tool_calls"
    return "stop"


def usage_json(usage: Usage) -> dict:
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.prompt_tokens + usage.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": usage.cached_tokens},
    }


CALL_PREFIX = "call_"


def tool_calls_json(parts: list) -> list[dict]:
    """The completed tool calls among `parts`, as OpenAI's message.tool_calls."""
    calls: dict[int, dict] = {}
    ended: set[int] = set()
    for p in parts:
        if type(p) is ToolCallStart:
            calls[p.index] = {"id": CALL_PREFIX + p.id, "type": "function", "function": {"name": p.name, "arguments": ""}}
        elif type(p) is ToolCallEnd and p.index in calls:
            calls[p.index]["function"]["arguments"] = p.arguments
            ended.add(p.index)
    return [calls[i] for i in sorted(ended)]  # a call without its end never completed: not a call


def _token_text(b: bytes) -> str:
    return b.decode("utf-8", "replace")


def chat_logprobs_json(items: list) -> dict:
    """TokenLogprobs as a chat choice's `logprobs` ({"content": [...], "refusal": null})."""
    return {
        "content": [
            {"token": _token_text(i.piece), "logprob": i.logprob, "bytes": list(i.piece),
             "top_logprobs": [{"token": _token_text(t.piece), "logprob": t.logprob, "bytes": list(t.piece)} for t in i.top]}
            for i in items
        ],
        "refusal": None,
    }  # fmt: skip


def completion_logprobs_json(items: list, offset: int = 0) -> dict:
    """TokenLogprobs as a legacy completion choice's `logprobs` (tokens, token_logprobs, top_logprobs, text_offset)."""
    tokens, offsets = [], []
    for i in items:
        offsets.append(offset)
        text = _token_text(i.piece)
        tokens.append(text)
        offset += len(text)
    return {
        "tokens": tokens,
        "token_logprobs": [i.logprob for i in items],
        "top_logprobs": [{_token_text(t.piece): t.logprob for t in i.top} for i in items],
        "text_offset": offsets,
    }


def fingerprint(model: str, hello: Any) -> str:
    """system_fingerprint: changes with the model, this build (ours and llama.cpp's) and the engine profile."""
    import hashlib

    from ... import __version__

    info = getattr(hello, "engine_info", None)
    parts = [model, getattr(hello, "architecture", ""), str(getattr(hello, "n_vocab", "")), __version__,
             getattr(info, "llama_cpp_version", ""), getattr(info, "profile", ""), str(getattr(info, "extra_buffers", ""))]  # fmt: skip
    return "fp_" + hashlib.sha256("\x00".join(parts).encode()).hexdigest()[:12]


def chat_response(request_id: str, model: str, created: int, text: str, done: Done, parts: list | None = None) -> dict:
    message: dict = {"role": "assistant", "content": text}
    thinking = "".join(p.text for p in parts or [] if type(p) is ThinkingPart)
    if thinking:
        message["reasoning_content"] = thinking
    calls = tool_calls_json(parts or [])
    if calls:
        message["tool_calls"] = calls
        message["content"] = text or None
    return {
        "id": request_id,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": message,
                "logprobs": None,
                "finish_reason": finish_reason_of(done),
            }
        ],
        "usage": usage_json(done.usage),
    }


def completion_response(request_id: str, model: str, created: int, text: str, done: Done) -> dict:
    return {
        "id": request_id,
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason_of(done)}],
        "usage": usage_json(done.usage),
    }


def model_json(name: str, created: int) -> dict:
    return {"id": name, "object": "model", "created": created, "owned_by": "barrel-inference"}



# ---- embeddings -------------------------------------------------------------------------


def _is_token(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0


def embedding_inputs(req: EmbeddingRequest) -> list[str | list[int]]:
    """`input` as the engine takes it: a string, strings, one list of token ids, or lists of token ids."""
    if not req.model:
        raise invalid("model must not be empty", "model")
    value = req.input
    if isinstance(value, str):
        items: list = [value]
    elif not value:
        raise invalid("input must not be empty", "input")
    elif all(isinstance(x, str) for x in value):
        items = list(value)
    elif all(_is_token(x) for x in value):
        items = [list(value)]
    elif all(isinstance(x, list) and x and all(_is_token(t) for t in x) for x in value):
        items = [list(x) for x in value]
    else:
        raise invalid("input must be a string, a list of strings, a list of token ids or a list of lists of token ids", "input")
    for i, item in enumerate(items):
        if isinstance(item, str) and not item:
            raise invalid(f"input[{i}] is an empty string", "input")
    return items


def embedding_json(vector: list[float], index: int, encoding_format: str | None, dimensions: int | None) -> dict:
    """One `data` item: the vector cut to `dimensions` and renormalised, as floats or base64 of
    little-endian float32 (what the openai SDK decodes)."""
    if dimensions is not None:
        if dimensions > len(vector):
            raise invalid(f"dimensions must be at most {len(vector)} for this model, got {dimensions}", "dimensions")
        vector = vector[:dimensions]
        norm = math.sqrt(sum(x * x for x in vector)) or 1.0
        vector = [x / norm for x in vector]
    if encoding_format == "base64":
        value: Any = base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode("ascii")
    else:
        value = vector
    return {"object": "embedding", "index": index, "embedding": value}
