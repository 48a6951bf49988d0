"""Turning a Submit into prompt tokens: template rendering, tokenization and the context check.

Runs on the worker's preparation threads, never on the scheduler's. What grows with the input is
bounded before it is computed: a prompt longer (in characters) than n_ctx tokens of the
vocabulary's longest token could hold is refused without tokenising it, and a grammar or schema
beyond the bounds of `grammar.GrammarLimits` is refused before it is converted or compiled.
"""

from __future__ import annotations

import re

import msgspec

from ..protocol import ErrorCode, SchemaReceipt, Submit
from .engine_api import Engine
from .grammar import GrammarLimits, GrammarRefused, check_gbnf, check_schema
from .schema_gbnf import convert
from .segments import Markers, align, tokenize_segments
from .templates import ChatTemplate, TemplateError
from .tokcache import TokenCache


def _tail(message, spans: dict) -> str:
    """The splice mark a message's content ends with, if any."""
    return next((mark for mark in spans if message.content.endswith(mark)), "")


class PromptError(Exception):
    def __init__(self, code: ErrorCode, message: str, param: str | None = None):
        super().__init__(message)
        self.code = code
        self.param = param


class PromptBuilder:
    def __init__(self, engine: Engine, template: ChatTemplate, n_ctx: int, model: str, *,
                 content_special: bool = False, grammar_limits: GrammarLimits = GrammarLimits()):  # fmt: skip
        self.engine = engine
        self.template = template
        self.n_ctx = n_ctx
        self.model = model
        self.content_special = content_special  # the old behaviour: control tokens parsed inside contents too
        self.grammar_limits = grammar_limits
        # a token covers at most this many characters: longer texts cannot fit in n_ctx tokens
        self.max_chars = n_ctx * max(1, int(getattr(engine, "max_token_chars", 64)))
        # runs of text between control tokens, tokenised once (a conversation's history comes back every turn)
        self.run_tokens = TokenCache(lambda t: self.engine.tokenize(t, add_special=False, parse_special=False))

    def render(self, messages, tools=None, add_generation_prompt: bool = True, extra: dict | None = None) -> str:
        try:
            return self.template.render(messages, tools, add_generation_prompt, extra)
        except TemplateError as exc:
            raise PromptError(ErrorCode.TEMPLATE, str(exc), "messages") from exc

    def _add_bos(self, text: str) -> bool:
        bos = self.template.bos_token
        return self.engine.add_bos and not (bos and text.startswith(bos))

    def tokenize_rendered(self, text: str) -> list[int]:
        """Rendered chat text parsed as a whole (control tokens anywhere); BOS unless the template wrote it."""
        return self.engine.tokenize(text, add_special=self._add_bos(text), parse_special=True)

    def tokenize_messages(self, messages, tools=None, add_generation_prompt: bool = True, extra: dict | None = None,
                          replayed: dict | None = None, bounded: bool = True) -> list[int]:  # fmt: skip
        """The chat prompt with control tokens recognised in the template's text only. bounded=False (a
        count, off the scheduler thread): a prompt longer than the context is counted, not refused.

        `replayed`: message index -> (raw, tokens) of a tool-call span the model itself wrote (the
        replay map's exact bytes, which end that message's content): the span goes in as the model's
        own tokens, so the earlier turn's KV cache is reused, and its markers stay control tokens."""
        plain = self.render(messages, tools, add_generation_prompt, extra)
        if bounded:
            self.check_chars(len(plain), "messages")
        special = getattr(self.engine, "control_tokens", None)
        if self.content_special or special is None:
            toks = self.spliced(plain, messages, tools, add_generation_prompt, extra, replayed) if replayed else None
            return toks if toks is not None else self.tokenize_rendered(plain)
        markers = Markers()
        base, spans = self._splice_marks(messages, markers, replayed or {})
        template_plain = plain
        if spans:
            template_plain = self.render(base, tools, add_generation_prompt, extra)
            restored = template_plain
            for mark, (raw, _) in spans.items():
                restored = restored.replace(mark, raw) if template_plain.count(mark) == 1 else ""
            if restored != plain:  # the template does not print contents as they are: no splicing
                base, spans, template_plain = list(messages), {}, plain
        wrapped = []
        for m in base:  # contents wrapped as contents; a replayed span's mark stays template text
            tail = _tail(m, spans)
            content = markers.wrap(m.content[: len(m.content) - len(tail)]) or ""
            wrapped.append(msgspec.structs.replace(m, content=content + tail, thinking=markers.wrap(m.thinking)))
        segments = align(markers.split(self.render(wrapped, tools, add_generation_prompt, extra)), template_plain)
        sentinels = {mark: -(k + 1) for k, mark in enumerate(spans)}
        tokens = tokenize_segments(segments, {**special, **sentinels}, self.run_tokens)
        if sentinels:
            by_id = {sentinels[mark]: span for mark, span in spans.items()}
            out: list[int] = []
            for t in tokens:
                if t in by_id:
                    raw, toks = by_id[t]
                    out += toks if toks else self.engine.tokenize(raw, add_special=False, parse_special=True)
                else:
                    out.append(t)
            tokens = out
        bos = getattr(self.engine, "bos", -1)
        if self._add_bos(plain) and bos >= 0:
            tokens.insert(0, bos)
        return tokens

    @staticmethod
    def _splice_marks(messages, markers: Markers, replayed: dict) -> tuple[list, dict[str, tuple[str, list[int]]]]:
        """The messages with each replayed span replaced by a mark no client can write, and mark -> span."""
        base = list(messages)
        spans: dict[str, tuple[str, list[int]]] = {}
        for i, (raw, toks) in replayed.items():
            m = base[i]
            if raw and m.content.endswith(raw):
                mark = markers.splice_mark(i)
                base[i] = msgspec.structs.replace(m, content=m.content[: len(m.content) - len(raw)] + mark)
                spans[mark] = (raw, list(toks or []))
        return base, spans

    def check_chars(self, n_chars: int, param: str) -> None:
        if n_chars > self.max_chars:
            raise PromptError(
                ErrorCode.CONTEXT_LENGTH,
                f"This model's maximum context length is {self.n_ctx} tokens. However, your prompt has {n_chars} characters, "
                f"more than {self.n_ctx} tokens can hold. Shorten the prompt or load {self.model} with a larger n_ctx.",
                param,
            )

    def tokens(self, msg: Submit, plan=None) -> list[int]:
        """plan: the tool setup of a chat request (worker.toolhook.Plan): the messages, tools and
        template switches to render instead of the Submit's own."""
        if msg.messages is not None:
            if not msg.messages:
                raise PromptError(ErrorCode.INVALID_REQUEST, "messages must not be empty", "messages")
            chars = sum(len(m.content) + len(m.thinking or "") + sum(len(c.arguments) for c in m.tool_calls) for m in msg.messages)
            self.check_chars(chars, "messages")
            if plan is not None:
                try:
                    toks = self.tokenize_messages(plan.messages, plan.tools, msg.add_generation_prompt, plan.template_kwargs, plan.replayed)
                except PromptError:
                    if plan.unreplayed is None:
                        raise
                    plan.messages, plan.replayed, plan.unreplayed = plan.unreplayed, {}, None  # as the client sent it
                    toks = self.tokenize_messages(plan.messages, plan.tools, msg.add_generation_prompt, plan.template_kwargs)
            else:
                toks = self.tokenize_messages(msg.messages, msg.tools, msg.add_generation_prompt)
        elif msg.prompt is not None and msg.suffix is not None:
            self.check_chars(len(msg.prompt) + len(msg.suffix), "prompt")
            fim = getattr(self.engine, "fim_tokens", lambda: None)()
            if fim is None:
                raise PromptError(ErrorCode.INVALID_REQUEST, f"suffix needs a model with fill-in-the-middle tokens; {self.model} has none", "suffix")
            pre, suf, mid = fim
            body = lambda t: self.engine.tokenize(t, add_special=False, parse_special=False)  # noqa: E731
            toks = ([self.engine.bos] if self.engine.add_bos and self.engine.bos >= 0 else []) + [pre] + body(msg.prompt) + [suf] + body(msg.suffix) + [mid]
        elif msg.prompt is not None:
            self.check_chars(len(msg.prompt), "prompt")
            toks = self.engine.tokenize(msg.prompt, add_special=True, parse_special=True)
        elif msg.prompt_tokens is not None:
            if len(msg.prompt_tokens) >= self.n_ctx:
                raise PromptError(ErrorCode.CONTEXT_LENGTH, self._too_long(len(msg.prompt_tokens)), "prompt")
            bad = [t for t in msg.prompt_tokens if not 0 <= t < self.engine.n_vocab]
            if bad:
                raise PromptError(ErrorCode.INVALID_REQUEST, f"token id {bad[0]} is outside the vocabulary (0..{self.engine.n_vocab - 1})", "prompt")
            toks = list(msg.prompt_tokens)
        else:
            raise PromptError(ErrorCode.INVALID_REQUEST, "one of messages, prompt or prompt_tokens is required", "messages")
        if not toks:
            raise PromptError(ErrorCode.INVALID_REQUEST, "the prompt is empty", "prompt")
        if len(toks) >= self.n_ctx:
            raise PromptError(ErrorCode.CONTEXT_LENGTH, self._too_long(len(toks)), "messages" if msg.messages is not None else "prompt")
        return toks

    def spliced(self, plain: str, messages, tools, add_generation_prompt: bool, extra: dict | None, replayed: dict) -> list[int] | None:
        """The prompt with each replayed turn's span as the very tokens the model wrote (re-tokenising
        the same bytes may split them otherwise, and then the KV cache of that turn is not reused).
        None when no replayed turn has tokens, or the template does not print the content as is."""
        marks: dict[str, tuple[str, list[int]]] = {}
        messages = list(messages)
        for i, (raw, toks) in replayed.items():
            m = messages[i]
            if not toks or not m.content.endswith(raw):
                continue
            mark = f"\x00replay-{i}\x00"
            messages[i] = msgspec.structs.replace(m, content=m.content[: len(m.content) - len(raw)] + mark)
            marks[mark] = (raw, toks)
        if not marks:
            return None
        marked = self.render(messages, tools, add_generation_prompt, extra)
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

    def _too_long(self, n: int) -> str:
        return (f"This model's maximum context length is {self.n_ctx} tokens. However, your prompt has "
                f"{n} tokens, leaving no room for a reply. Shorten the prompt or load {self.model} with a larger n_ctx.")  # fmt: skip

    def check_tools(self, tools: list[dict] | None) -> None:
        """Tool parameter schemas become call grammars: the same bounds as a response_format schema."""
        try:
            for i, tool in enumerate(tools or []):
                fn = tool.get("function") if isinstance(tool, dict) else None
                params = fn.get("parameters") if isinstance(fn, dict) else None
                if isinstance(params, dict):
                    check_schema(params, self.grammar_limits, f"tools[{i}].function.parameters")
        except GrammarRefused as exc:
            raise PromptError(ErrorCode.GRAMMAR, str(exc), exc.param) from exc

    def checked_gbnf(self, text: str, param: str) -> str:
        try:
            check_gbnf(text, self.grammar_limits, param)
        except GrammarRefused as exc:
            raise PromptError(ErrorCode.GRAMMAR, str(exc), exc.param) from exc
        return text

    def grammar(self, msg: Submit) -> str | None:
        return self.constraint(msg)[0]

    def constraint(self, msg: Submit) -> tuple[str | None, SchemaReceipt | None]:
        """The request's grammar, and for a JSON schema the receipt of what the grammar enforces."""
        try:
            if msg.grammar is not None:
                check_gbnf(msg.grammar, self.grammar_limits, "grammar")
                return msg.grammar, None
            if msg.json_schema is not None:
                check_schema(msg.json_schema, self.grammar_limits, "response_format")
                conv = convert(msg.json_schema, strict=msg.json_schema_strict, limits=self.grammar_limits)
                check_gbnf(conv.grammar, self.grammar_limits, "response_format")
                receipt = SchemaReceipt(sorted(conv.enforced), sorted(conv.checked), sorted(conv.unenforced))
                return conv.grammar, receipt
        except GrammarRefused as exc:
            raise PromptError(ErrorCode.GRAMMAR, str(exc), exc.param) from exc
        return None, None
