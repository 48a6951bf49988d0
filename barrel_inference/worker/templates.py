"""Chat templates: the GGUF's own Jinja template in a sandbox, a built-in one by architecture, or a
Modelfile's TEMPLATE (Ollama's Go text/template, rendered by barrel_inference.gotemplate)."""

from __future__ import annotations

import datetime
import json

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

from ..protocol import ChatMessage

# Built-in templates for GGUFs that carry none. Written for the same variables HF templates use.
BUILTIN: dict[str, str] = {
    "gemma": (
        "{{ bos_token }}"
        "{% if messages and messages[0]['role'] == 'system' %}"
        "{% set system = messages[0]['content'] %}{% set loop_messages = messages[1:] %}"
        "{% else %}{% set system = '' %}{% set loop_messages = messages %}{% endif %}"
        "{% for m in loop_messages %}"
        "{% set role = 'model' if m['role'] == 'assistant' else 'user' %}"
        "<start_of_turn>{{ role }}\n"
        "{% if loop.first and system %}{{ system | trim }}\n\n{% endif %}"
        "{{ m['content'] | trim }}<end_of_turn>\n"
        "{% endfor %}"
        "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
    ),
    "chatml": (
        "{% for m in messages %}"
        "<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
        "{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    ),
    "llama3": (
        "{{ bos_token }}"
        "{% for m in messages %}"
        "<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n{{ m['content'] | trim }}<|eot_id|>"
        "{% endfor %}"
        "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
    ),
}

# architecture -> built-in template for GGUFs without their own
BY_ARCHITECTURE: dict[str, str] = {
    "gemma": "gemma",
    "gemma2": "gemma",
    "gemma3": "gemma",
    "gemma3n": "gemma",
    "llama": "llama3",
    "qwen2": "chatml",
    "qwen3": "chatml",
}
FALLBACK = "chatml"


class TemplateError(Exception):
    pass


def _raise(message: str):
    raise TemplateError(message)


def _tojson(value, indent=None, ensure_ascii=False, sort_keys=False, separators=None):
    return json.dumps(value, indent=indent, ensure_ascii=ensure_ascii, sort_keys=sort_keys, separators=separators)


def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, undefined=jinja2.Undefined)
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = lambda fmt: datetime.datetime.now().strftime(fmt)
    return env


def message_dict(m: ChatMessage) -> dict:
    """The shape HF chat templates expect for one message."""
    d: dict = {"role": m.role, "content": m.content}
    if m.name:
        d["name"] = m.name
    if m.tool_call_id:
        d["tool_call_id"] = m.tool_call_id
    if m.thinking:
        d["reasoning_content"] = m.thinking
    if m.tool_calls:
        calls = []
        for c in m.tool_calls:
            try:
                args = json.loads(c.arguments) if c.arguments else {}
            except ValueError:
                args = c.arguments
            calls.append({"id": c.id, "type": "function", "function": {"name": c.name, "arguments": args}})
        d["tool_calls"] = calls
    return d


class ChatTemplate:
    """A compiled chat template. name is "gguf" for the model's own, else the built-in's name."""

    def __init__(self, source: str, name: str, bos_token: str = "", eos_token: str = ""):
        self.source = source
        self.name = name
        self.bos_token = bos_token
        self.eos_token = eos_token
        self._template = self._compile(source)

    @staticmethod
    def _compile(source: str):
        try:
            return _environment().from_string(source)
        except jinja2.TemplateError as exc:
            raise TemplateError(f"chat template does not compile: {exc}") from exc

    @classmethod
    def choose(
        cls, override: str | None, gguf_template: str | None, architecture: str, bos_token: str, eos_token: str,
        go_template: str | None = None,
    ) -> "ChatTemplate":
        """A Modelfile's Go template > override (a built-in name or Jinja text) > the GGUF's own > the
        architecture's built-in. (The gateway sends a Go template only where the operator set no chat_template.)"""
        if go_template:
            return GoChatTemplate(go_template, "modelfile", bos_token, eos_token)
        if override:
            if override in BUILTIN:
                return cls(BUILTIN[override], override, bos_token, eos_token)
            return cls(override, "custom", bos_token, eos_token)
        if gguf_template:
            return cls(gguf_template, "gguf", bos_token, eos_token)
        name = BY_ARCHITECTURE.get(architecture, FALLBACK)
        return cls(BUILTIN[name], name, bos_token, eos_token)

    def render(self, messages: list[ChatMessage], tools: list[dict] | None = None, add_generation_prompt: bool = True,
               extra: dict | None = None) -> str:  # fmt: skip
        """extra: the template's own switches (enable_thinking, reasoning_effort, tool_choice, …)."""
        try:
            return self._template.render(
                **(extra or {}),
                messages=[message_dict(m) for m in messages],
                tools=tools or None,
                add_generation_prompt=add_generation_prompt,
                bos_token=self.bos_token,
                eos_token=self.eos_token,
            )
        except TemplateError:
            raise
        except jinja2.TemplateError as exc:
            raise TemplateError(f"chat template failed: {exc}") from exc
        except Exception as exc:  # templates can raise anything from inside the sandbox
            raise TemplateError(f"chat template failed: {exc}") from exc


class GoChatTemplate(ChatTemplate):
    """A Modelfile's TEMPLATE (Ollama's Go text/template) in ChatTemplate's place. It renders what
    Ollama would: the generation prompt always follows the conversation (Ollama's templates have no
    add_generation_prompt switch); the request's enable_thinking / reasoning_effort become its
    .Think / .IsThinkSet / .ThinkLevel."""

    @staticmethod
    def _compile(source: str):
        from ..gotemplate import GoTemplateError, OllamaTemplate

        try:
            return OllamaTemplate(source)
        except GoTemplateError as exc:
            raise TemplateError(f"model template does not parse: {exc}") from exc

    def render(self, messages: list[ChatMessage], tools: list[dict] | None = None, add_generation_prompt: bool = True,
               extra: dict | None = None) -> str:  # fmt: skip
        from ..gotemplate import GoTemplateError

        extra = extra or {}
        think = bool(extra["enable_thinking"]) if "enable_thinking" in extra else None
        try:
            return self._template.render([_go_message(m) for m in messages], tools, think=think,
                                         think_level=str(extra.get("reasoning_effort") or ""))  # fmt: skip
        except GoTemplateError as exc:
            raise TemplateError(f"model template failed: {exc}") from exc


def _go_message(m: ChatMessage) -> dict:
    calls = []
    for c in m.tool_calls:
        try:
            args = json.loads(c.arguments) if c.arguments else {}
        except ValueError:
            args = {}
        calls.append({"id": c.id, "name": c.name, "arguments": args})
    return {"role": m.role, "content": m.content, "thinking": m.thinking or "", "tool_calls": calls,
            "tool_name": m.name or "", "tool_call_id": m.tool_call_id or ""}  # fmt: skip
