"""Turning a Submit into prompt tokens: template rendering, tokenization and the context check."""

from __future__ import annotations

import re

import msgspec

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
                try:
                    text = self.render(plan.messages, plan.tools, msg.add_generation_prompt, plan.template_kwargs)
                except PromptError:
                    if plan.unreplayed is None:
                        raise
                    plan.messages, plan.replayed, plan.unreplayed = plan.unreplayed, {}, None  # as the client sent it
                    text = self.render(plan.messages, plan.tools, msg.add_generation_prompt, plan.template_kwargs)
                toks = self.spliced(text, msg, plan)
                if toks is None:
                    toks = self.tokenize_rendered(text)
            else:
                toks = self.tokenize_rendered(self.render(msg.messages, msg.tools, msg.add_generation_prompt))
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

    def spliced(self, plain: str, msg: Submit, plan) -> list[int] | None:
        """The prompt with each replayed turn's span as the very tokens the model wrote (re-tokenising
        the same bytes may split them otherwise, and then the KV cache of that turn is not reused).
        None when no replayed turn has tokens, or the template does not print the content as is."""
        marks: dict[str, tuple[str, list[int]]] = {}
        messages = list(plan.messages)
        for i, (raw, toks) in plan.replayed.items():
            m = messages[i]
            if not toks or not m.content.endswith(raw):
                continue
            mark = f"\x00replay-{i}\x00"
            messages[i] = msgspec.structs.replace(m, content=m.content[: len(m.content) - len(raw)] + mark)
            marks[mark] = (raw, toks)
        if not marks:
            return None
        marked = self.render(messages, plan.tools, msg.add_generation_prompt, plan.template_kwargs)
        splitter = re.compile("(" + "|".join(re.escape(k) for k in marks) + ")")
        pieces = splitter.split(marked)  # text, mark, text, mark, ..., text
        found = pieces[1::2]
        if sorted(found) != sorted(marks) or "".join(marks[p][0] if p in marks else p for p in pieces) != plain:
            return None
        bos = self.template.bos_token
        add = self.engine.add_bos and not (bos and plain.startswith(bos))
        out: list[int] = []
        for k, piece in enumerate(pieces):
            if k % 2:
                out += marks[piece][1]
            elif piece:
                out += self.engine.tokenize(piece, add_special=add and k == 0, parse_special=True)
            elif k == 0 and add:
                out += self.engine.tokenize("", add_special=True, parse_special=True)
        return out

    def grammar(self, msg: Submit) -> str | None:
        if msg.grammar is not None:
            return msg.grammar
        if msg.json_schema is not None:
            try:
                return self.engine.grammar_from_schema(msg.json_schema)
            except EngineError as exc:
                raise PromptError(ErrorCode.GRAMMAR, str(exc), "response_format") from exc
        return None
