"""Tool calls and reasoning in the worker: the per-model setup and the per-request hook.

ModelTools (one per worker) knows the model's tool-call format and thinking markers, which markers
are single special tokens (rendered with their special text for the capture, named by id in
grammars), and turns a Submit's tools / tool_choice / template switches into what the prompt and
the sampler need. ToolHook (one per request) sits between sampling and detokenising: it feeds each
token's bytes to the Capture, passes the typed parts on, swaps in the call grammar once a start
marker is sampled, forces the end of a thinking span when its budget is spent, and applies the
stop-reason contract when the request ends.
"""

from __future__ import annotations

import hashlib
import re
import string
from collections import deque

import msgspec

from ..protocol import ChatMessage, ErrorCode, FinishReason, Submit, TextPart
from ..toolcalls import FormatTable, detect
from ..toolcalls.capture import Capture
from ..toolcalls.grammar import forces_call, generic_grammar, literal, only, span_grammar
from ..toolcalls.reasoning import detect_thinking
from ..toolcalls.schema import ToolSchemaError, ToolValidator
from .engine_api import EngineError
from .grammar import GrammarRefused
from .schema_gbnf import convert

# template variables a request may not set through its template kwargs
_RESERVED = {"messages", "tools", "add_generation_prompt", "bos_token", "eos_token", "raise_exception"}


def template_switches(kwargs: dict | None) -> dict:
    """A request's template kwargs without the variables the renderer itself sets."""
    return {k: v for k, v in (kwargs or {}).items() if k not in _RESERVED}


class PlanError(Exception):
    def __init__(self, code: ErrorCode, message: str, param: str | None = None):
        super().__init__(message)
        self.code = code
        self.param = param


class Plan:
    """What one chat request needs: render arguments, a first grammar, and how to build its hook."""

    __slots__ = ("messages", "tools", "template_kwargs", "grammar", "hook", "replay", "replayed", "unreplayed")

    def __init__(self, messages, tools, template_kwargs, grammar, hook, replay=None, replayed=None, unreplayed=None):
        # the messages without replayed content: for a template that refuses the replayed form
        # (Mistral's insists that roles alternate once calls are gone from a turn)
        self.unreplayed = unreplayed
        self.replay = replay or {}  # replay-map lookups of this request: result -> count
        # assistant turns (index in `messages`) whose content ends with the model's own replayed bytes:
        # index -> (those bytes as text, the model's tokens of them or None). Markers in them are the
        # model's control tokens; where the tokens are known the prompt splices them in as they were.
        self.replayed: dict[int, tuple[str, list[int] | None]] = dict(replayed or {})
        self.messages = messages
        self.tools = tools
        self.template_kwargs = template_kwargs
        self.grammar = grammar
        self.hook = hook  # (prompt tokens) -> ToolHook | None


class ModelTools:
    def __init__(self, engine, template_source: str | None, *, tool_format: str | None = None,
                 thinking: tuple[str, str] | None = None, plugins: dict[str, str] | None = None,
                 replay=None, log=None):  # fmt: skip
        self.engine = engine
        self.table = FormatTable(plugins)
        name = tool_format or detect(template_source)["tool_format"]
        self.fmt = self.table.get(name) if name else None
        self.generic = self.table.get("generic")
        if thinking is None:
            found = detect_thinking(template_source)
            thinking = (found["thinking_start"], found["thinking_end"]) if found["thinking_start"] else None
        self.thinking = thinking
        self.replay = replay
        self.log = log or (lambda *a, **k: None)
        # templates that insist on 9-character alphanumeric call ids (Mistral's) get ids derived from ours
        self.short_ids = bool(template_source and _NINE.search(template_source))
        markers = list(self.fmt.markers()) if self.fmt else []
        markers += list(thinking or ())
        self.special: dict[int, str] = {}  # token id -> marker text, for markers spelled as one special token
        self.marker_ids: dict[str, int] = {}
        for m in markers:
            toks = engine.tokenize(m, add_special=False, parse_special=True)
            if len(toks) == 1 and engine.piece(toks[0], special=True) == m.encode() and engine.piece(toks[0]) != m.encode():
                self.special[toks[0]] = m
                self.marker_ids[m] = toks[0]
        self.think_end_tokens = engine.tokenize(thinking[1], add_special=False, parse_special=True) if thinking else []

    # ---- per token ----------------------------------------------------------------------
    def piece(self, tok: int) -> bytes:
        """A token's bytes for the capture: markers with their special text, other tokens as usual."""
        m = self.special.get(tok)
        return m.encode() if m is not None else self.engine.piece(tok)

    def gbnf_marker(self, text: str) -> str:
        tok = self.marker_ids.get(text)
        return f"<[{tok}]>" if tok is not None else literal(text)

    def _to_gbnf(self, schema: dict) -> str:
        """The same converter as structured output: what it does not enforce, the call's schema check catches."""
        try:
            return convert(schema, param="tools").grammar
        except GrammarRefused as exc:
            raise EngineError("grammar_error", str(exc)) from exc

    # ---- per request --------------------------------------------------------------------
    def plan(self, msg: Submit) -> Plan:
        choice = msg.tool_choice
        tools = list(msg.tools or []) if choice != "none" else []
        kwargs = template_switches(msg.template_kwargs)
        if choice is not None and choice != "none":
            kwargs.setdefault("tool_choice", choice)
        replay: dict[str, int] = {}
        replayed: dict[int, tuple[str, list[int] | None]] = {}
        base = list(msg.messages or [])
        messages = self._replayed(base, replay, replayed)
        if self.short_ids:
            messages = [_short_ids(m) for m in messages]
            base = [_short_ids(m) for m in base]
        if forces_call(choice):
            allowed = only(tools, choice)
            if not allowed:
                raise PlanError(ErrorCode.INVALID_REQUEST, "tool_choice names a tool that is not in tools", "tool_choice")
        else:
            allowed = tools
        try:
            validator = ToolValidator(allowed) if allowed else None
        except ToolSchemaError as exc:
            raise PlanError(ErrorCode.INVALID_REQUEST, str(exc), f"tools[{exc.index}]") from exc
        parallel = msg.parallel_tool_calls
        fmt, grammar, span = None, None, None
        template_tools = tools or None
        try:
            if allowed and self.fmt is not None:
                fmt = self.fmt
                span = span_grammar(fmt, allowed, self._to_gbnf, parallel=parallel, forced=False, marker=self.gbnf_marker)
                if forces_call(choice):
                    grammar = span_grammar(fmt, allowed, self._to_gbnf, parallel=parallel, forced=True, marker=self.gbnf_marker)
            elif allowed:  # no tool format of its own: the generic one, the tools described in a system message
                fmt = self.generic
                required = forces_call(choice)
                grammar = generic_grammar(allowed, self._to_gbnf, required=required, parallel=parallel)
                note = fmt.system_prompt(allowed, required=required, parallel=parallel)
                if not (messages and messages[0].role == "system"):
                    replayed = {i + 1: v for i, v in replayed.items()}  # a system message goes in front
                messages = _with_system(messages, note)
                base = _with_system(base, note)
                template_tools = None
        except EngineError as exc:
            raise PlanError(ErrorCode.GRAMMAR, f"the tools' parameters cannot be enforced: {exc}", "tools") from exc
        budget = msg.thinking_budget

        def hook(prompt: list[int]) -> ToolHook | None:
            if fmt is None and self.thinking is None:
                return None
            in_thinking = bool(self.thinking) and self.engine.detokenize(prompt[-8:], special=True).rstrip().endswith(self.thinking[0])
            cap = Capture(fmt, allowed or None, thinking=self.thinking, in_thinking=in_thinking, parallel=parallel, validator=validator)
            own = grammar is not None or msg.grammar is not None or msg.json_schema is not None  # a grammar already holds the reply
            return ToolHook(self, cap, span_grammar=None if own else span, thinking_budget=budget)

        return Plan(messages, template_tools, kwargs, grammar, hook, replay, replayed, base if replayed else None)

    def thinking_hook(self, msg: Submit):
        """For a request with a prompt already rendered (Ollama's /api/generate renders its chat turn through
        Render, then sends tokens) that turned thinking on (template_kwargs enable_thinking): a hook that
        splits the reply into thinking and text, as a chat request's would. None otherwise."""
        if self.thinking is None or not (msg.template_kwargs or {}).get("enable_thinking"):
            return None
        budget = msg.thinking_budget

        def hook(prompt: list[int]) -> ToolHook:
            in_thinking = self.engine.detokenize(prompt[-8:], special=True).rstrip().endswith(self.thinking[0])
            return ToolHook(self, Capture(None, None, thinking=self.thinking, in_thinking=in_thinking), span_grammar=None,
                            thinking_budget=budget)  # fmt: skip

        return hook

    def _replayed(self, messages: list[ChatMessage], counts: dict[str, int], replayed: dict) -> list[ChatMessage]:
        """Assistant turns whose calls this worker wrote: their content becomes the exact bytes it
        generated, so the prompt is byte-stable from turn to turn."""
        if self.replay is None:
            return messages
        out = []
        for m in messages:
            if m.role == "assistant" and m.tool_calls:
                raw, raw_tokens, result = self.replay.lookup_calls([c.id for c in m.tool_calls], has_format=self.fmt is not None)
                counts[result] = counts.get(result, 0) + 1
                if raw is not None:
                    m = ChatMessage(role="assistant", content=m.content + raw, name=m.name, thinking=m.thinking)
                    replayed[len(out)] = (raw, raw_tokens)
            out.append(m)
        return out


_NINE = re.compile(r"id\s*\|\s*length\s*!=\s*9")


def short_id(call_id: str) -> str:
    """A stable 9-character alphanumeric id for a call id (the same call gets the same one every turn)."""
    digest = hashlib.sha256(call_id.encode()).digest()
    alphabet = string.ascii_letters + string.digits
    return "".join(alphabet[b % len(alphabet)] for b in digest[:9])


def _short_ids(m: ChatMessage) -> ChatMessage:
    if not m.tool_calls and not m.tool_call_id:
        return m
    calls = [msgspec.structs.replace(c, id=short_id(c.id)) if c.id else c for c in m.tool_calls]
    return msgspec.structs.replace(m, tool_calls=calls, tool_call_id=short_id(m.tool_call_id) if m.tool_call_id else None)


def _with_system(messages: list[ChatMessage], note: str) -> list[ChatMessage]:
    if messages and messages[0].role == "system":
        first = messages[0]
        return [ChatMessage(role="system", content=f"{first.content}\n\n{note}" if first.content else note), *messages[1:]]
    return [ChatMessage(role="system", content=note), *messages]


class ToolHook:
    """One request's capture, between sampling and detokenising."""

    __slots__ = ("tools", "capture", "span_grammar", "budget", "forced", "generated", "span_from", "call_tokens")

    def __init__(self, tools: ModelTools, capture: Capture, *, span_grammar: str | None, thinking_budget: int | None):
        self.tools = tools
        self.capture = capture
        self.span_grammar = span_grammar
        self.budget = thinking_budget
        self.forced: deque[int] = deque()  # tokens to decode instead of sampling (the end of a thinking span)
        self.generated: list[int] = []  # the tokens fed so far
        self.span_from = -1  # index in `generated` of the token that opened the current call span
        self.call_tokens: dict[int, list[int] | None] = {}  # call index -> the tokens of its span, where exact

    def _pass(self, r, parts) -> str | None:
        """Parts to the request's output; text through its stop sequences. Returns a matched stop."""
        for p in parts:
            if type(p) is TextPart:
                text, stop = r.stops.push(p.text)
                r.emit_text(text)
                if stop is not None:
                    return stop
            else:
                r.emit_text(r.stops.flush())
                r.emit(p)
        return None

    def token(self, r, tok: int, engine) -> tuple[FinishReason | None, str | None]:
        """After sampling `tok` (not an end-of-generation token): (an early end, a matched stop)."""
        cap = self.capture
        was_in_call = cap.in_call
        n_calls = len(cap.calls)
        self.generated.append(tok)
        cap.feed(self.tools.piece(tok), tok)
        if cap.in_call and not was_in_call:
            self.span_from = len(self.generated) - 1
        self._span_tokens(n_calls, len(self.generated), was_in_call)
        stop = self._pass(r, cap.take())
        if stop is not None:
            return FinishReason.STOP, stop
        if cap.error is not None:
            return FinishReason.ERROR, None
        if cap.finished:
            return FinishReason.TOOL_CALLS, None
        if cap.in_call and not was_in_call and self.span_grammar is not None and cap.span_is_start():
            sampler = engine.make_sampler(r.sampling, self.span_grammar)
            if r.sampler is not None:
                r.sampler.free()
            r.sampler = sampler
            self.span_grammar = None
        if self.budget is not None and cap.in_thinking and cap.thinking_tokens >= self.budget and not self.forced:
            self.forced.extend(self.tools.think_end_tokens)
            self.budget = None
        return None, None

    def _span_tokens(self, n_before: int, upto: int, was_in_call: bool) -> None:
        """Calls completed by the last token: the tokens of their span, kept where they spell exactly
        its bytes (the replay map then gives a later prompt the very tokens the model wrote)."""
        cap = self.capture
        if len(cap.calls) == n_before:
            return
        start = self.span_from if was_in_call or self.span_from >= 0 else -1
        toks = self.generated[start:upto] if start >= 0 else None
        if toks is not None and b"".join(self.tools.piece(t) for t in toks) != cap.calls[n_before].raw:
            toks = None
        for c in cap.calls[n_before:]:
            self.call_tokens[c.index] = toks
        self.span_from = -1

    def finish(self, r, reason: FinishReason, *, eog: bool) -> FinishReason:
        cap = self.capture
        n_calls, was_in_call = len(cap.calls), cap.in_call
        end = cap.finish(reason, eog=eog)
        self._span_tokens(n_calls, len(self.generated), was_in_call)
        self._pass(r, cap.take())
        r.emit_text(r.stops.flush())
        replay = self.tools.replay
        if replay is not None and end is not FinishReason.ERROR:
            for c in cap.calls:
                replay.put(c.id, c.raw, self.call_tokens.get(c.index))
        return end

    @property
    def error(self) -> str | None:
        return self.capture.error


# ---- worker command line ---------------------------------------------------------------------


def add_arguments(p) -> None:
    p.add_argument("--tool-format", default=None, help="tool-call format name (default: detected from the template)")
    p.add_argument("--thinking-start", default=None, help="thinking start marker (default: detected)")
    p.add_argument("--thinking-end", default=None)
    p.add_argument("--tool-call-formats", default=None, help="JSON object: operator format name -> importable module")
    p.add_argument("--tool-replay-path", default=None, help="SQLite file of the replay map (none: no replay)")
    p.add_argument("--tool-replay-ttl-ms", type=int, default=30 * 24 * 3600 * 1000)
    p.add_argument("--tool-replay-gc-interval-ms", type=int, default=3600 * 1000)


def from_args(args, engine, template, log=None) -> ModelTools:
    """The worker's ModelTools; raises UnknownFormat for a format name nobody provides."""
    import json

    plugins = json.loads(args.tool_call_formats) if args.tool_call_formats else {}
    thinking = (args.thinking_start, args.thinking_end) if args.thinking_start and args.thinking_end else None
    replay = None
    if args.tool_replay_path:
        from ..toolcalls.replay import ReplayMap

        replay = ReplayMap(args.tool_replay_path, ttl_ms=args.tool_replay_ttl_ms, gc_interval_ms=args.tool_replay_gc_interval_ms)
    return ModelTools(engine, template.source, tool_format=args.tool_format, thinking=thinking, plugins=plugins,
                      replay=replay, log=log)  # fmt: skip
