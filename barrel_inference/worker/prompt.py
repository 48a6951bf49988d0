"""Turning a Submit into prompt tokens: template rendering, tokenization and the context check."""

from __future__ import annotations

from ..protocol import ErrorCode, Submit
from .engine_api import Engine, EngineError
from .templates import ChatTemplate, TemplateError


class PromptError(Exception):
    def __init__(self, code: ErrorCode, message: str, param: str | None = None):
        super().__init__(message)
        self.code = code
        self.param = param


class PromptBuilder:
    def __init__(self, engine: Engine, template: ChatTemplate, n_ctx: int, model: str):
        self.engine = engine
        self.template = template
        self.n_ctx = n_ctx
        self.model = model

    def render(self, messages, tools=None, add_generation_prompt: bool = True, extra: dict | None = None) -> str:
        try:
            return self.template.render(messages, tools, add_generation_prompt, extra)
        except TemplateError as exc:
            raise PromptError(ErrorCode.TEMPLATE, str(exc), "messages") from exc

    def tokenize_rendered(self, text: str) -> list[int]:
        """Rendered chat text: BOS is added unless the template already wrote it."""
        bos = self.template.bos_token
        add = self.engine.add_bos and not (bos and text.startswith(bos))
        return self.engine.tokenize(text, add_special=add, parse_special=True)

    def tokens(self, msg: Submit, plan=None) -> list[int]:
        """plan: the tool setup of a chat request (worker.toolhook.Plan): the messages, tools and
        template switches to render instead of the Submit's own."""
        if msg.messages is not None:
            if not msg.messages:
                raise PromptError(ErrorCode.INVALID_REQUEST, "messages must not be empty", "messages")
            if plan is not None:
                text = self.render(plan.messages, plan.tools, msg.add_generation_prompt, plan.template_kwargs)
            else:
                text = self.render(msg.messages, msg.tools, msg.add_generation_prompt)
            toks = self.tokenize_rendered(text)
        elif msg.prompt is not None:
            toks = self.engine.tokenize(msg.prompt, add_special=True, parse_special=True)
        elif msg.prompt_tokens is not None:
            bad = [t for t in msg.prompt_tokens if not 0 <= t < self.engine.n_vocab]
            if bad:
                raise PromptError(ErrorCode.INVALID_REQUEST, f"token id {bad[0]} is outside the vocabulary (0..{self.engine.n_vocab - 1})", "prompt")
            toks = list(msg.prompt_tokens)
        else:
            raise PromptError(ErrorCode.INVALID_REQUEST, "one of messages, prompt or prompt_tokens is required", "messages")
        if not toks:
            raise PromptError(ErrorCode.INVALID_REQUEST, "the prompt is empty", "prompt")
        if len(toks) >= self.n_ctx:
            raise PromptError(
                ErrorCode.CONTEXT_LENGTH,
                f"This model's maximum context length is {self.n_ctx} tokens. However, your prompt has "
                f"{len(toks)} tokens, leaving no room for a reply. Shorten the prompt or load {self.model} with a larger n_ctx.",
                "messages" if msg.messages is not None else "prompt",
            )
        return toks

    def grammar(self, msg: Submit) -> str | None:
        if msg.grammar is not None:
            return msg.grammar
        if msg.json_schema is not None:
            try:
                return self.engine.grammar_from_schema(msg.json_schema)
            except EngineError as exc:
                raise PromptError(ErrorCode.GRAMMAR, str(exc), "response_format") from exc
        return None
