"""Capture on tokens while streaming: generated pieces in, typed parts out.

Fed the bytes of each generated token (control tokens that are markers rendered with their
special text), a Capture splits the stream into text, thinking and tool calls:

- text streams out as TextParts, except a tail that could still begin a marker (held back, so a
  marker split over several tokens never leaks into the text);
- a thinking span (start marker … end marker) streams out as ThinkingParts;
- from a tool-call start marker the span is held whole, its exact text kept, until its end marker
  (or the end of generation, for formats that end there). Then it is parsed, every call checked
  against the declared tools, and each call goes out as ToolCallStart, ToolCallArgs (the
  canonical arguments), ToolCallEnd (with the span's exact text). A call is emitted only once
  it is complete and valid, so a client never sees part of a call that is then withdrawn.

The stop-reason contract (`finish`): a turn ends with tool calls only when at least one complete,
valid call was emitted; a span cut by the token limit is dropped and the turn ends as length; a
span that does not parse or validate makes the turn an error (`error`), never a call.
"""

from __future__ import annotations

import codecs
import enum
import secrets
from typing import Callable

from ..protocol import FinishReason, TextPart, ThinkingPart, ToolCall, ToolCallArgs, ToolCallEnd, ToolCallStart
from .base import ToolCallFormat, ToolCallParseError
from .schema import ToolValidator


class State(enum.Enum):
    PROBE = 0  # nothing but whitespace yet, for a format recognised by the reply's shape
    TEXT = 1
    THINK = 2
    CALL = 3


def new_call_id() -> str:
    return secrets.token_hex(12)


class CapturedCall:
    __slots__ = ("index", "id", "call", "raw")

    def __init__(self, index: int, id: str, call: ToolCall, raw: bytes):
        self.index, self.id, self.call, self.raw = index, id, call, raw


def _partial_suffix(buf: str, markers: list[str]) -> int:
    """Length of the longest suffix of buf that is a proper prefix of a marker."""
    longest = max((len(m) for m in markers), default=0)
    for n in range(min(len(buf), longest - 1), 0, -1):
        tail = buf[-n:]
        if any(m.startswith(tail) for m in markers):
            return n
    return 0


class Capture:
    def __init__(
        self,
        fmt: ToolCallFormat | None,
        tools: list[dict] | None = None,
        *,
        thinking: tuple[str, str] | None = None,
        in_thinking: bool = False,
        parallel: bool = True,
        validator: ToolValidator | None = None,
        new_id: Callable[[], str] = new_call_id,
    ):
        self.fmt = fmt if tools else None  # no tools declared: calls are not captured
        self.thinking = thinking
        self.parallel = parallel
        self.validator = validator if validator is not None else (ToolValidator(tools) if tools else None)
        self.new_id = new_id
        self.parts: list = []
        self.calls: list[CapturedCall] = []
        self.error: str | None = None
        self.thinking_tokens = 0
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._buf = ""
        self._lstrip = False  # drop the whitespace that follows a thinking span
        self._text_seen = False
        if in_thinking and thinking:
            self.state = State.THINK
        else:
            self.state = self._after_text_start()

    # ---- properties the scheduler reads ------------------------------------------------------
    @property
    def in_call(self) -> bool:
        return self.state is State.CALL

    @property
    def in_thinking(self) -> bool:
        return self.state is State.THINK

    @property
    def finished(self) -> bool:
        """No more output is wanted: an error, or the one call allowed without parallel calls."""
        return self.error is not None or (not self.parallel and bool(self.calls))

    def span_is_start(self) -> bool:
        """The open span holds its start marker and nothing else yet (a grammar can take over)."""
        return self.state is State.CALL and self._buf == (self.fmt.start if self.fmt else "")

    def take(self) -> list:
        out, self.parts = self.parts, []
        return out

    # ---- input --------------------------------------------------------------------------------
    def feed(self, piece: bytes, token: int = -1) -> None:
        if self.finished:
            return
        if self.state is State.THINK:
            self.thinking_tokens += 1
        text = self._decoder.decode(piece, final=False)
        if text:
            self._buf += text
            self._scan(final=False)

    def finish(self, reason: FinishReason, *, eog: bool = True) -> FinishReason:
        """The generation ended (eog: by an end-of-generation token). Flushes what was held back and
        returns the turn's finish reason under the stop-reason contract."""
        tail = self._decoder.decode(b"", final=True)
        if tail:
            self._buf += tail
        if not self.finished:
            self._scan(final=False)
        if not self.finished:
            self._scan(final=True, cut=reason is FinishReason.LENGTH, eog=eog)
        if self.error is not None:
            return FinishReason.ERROR
        if reason is FinishReason.LENGTH:
            return FinishReason.LENGTH
        return FinishReason.TOOL_CALLS if self.calls else reason

    # ---- the state machine ------------------------------------------------------------------
    def _after_text_start(self) -> State:
        if self.fmt is not None and (not self.fmt.start or self.fmt.bare_start) and not self._text_seen:
            return State.PROBE
        return State.TEXT

    def _text(self, s: str) -> None:
        if self._lstrip:
            s = s.lstrip()
            if not s:
                return
            self._lstrip = False
        if s:
            self._text_seen = True
            self.parts.append(TextPart(s))

    def _scan(self, final: bool, cut: bool = False, eog: bool = True) -> None:
        while not self.finished:
            before = (self.state, len(self._buf))
            if self.state is State.PROBE:
                self._probe(final)
            elif self.state is State.TEXT:
                self._scan_text(final)
            elif self.state is State.THINK:
                self._scan_think(final)
            else:
                self._scan_call(final, cut, eog)
            if (self.state, len(self._buf)) == before:
                return

    def _probe(self, final: bool) -> None:
        stripped = self._buf.lstrip()
        if not stripped:
            if final:
                self._buf = ""
            return
        if stripped[0] in "{[":
            self._buf = stripped
            self.state = State.CALL
        else:  # text (which may still open a thinking span)
            self.state = State.TEXT

    def _scan_text(self, final: bool) -> None:
        markers = []
        if self.fmt is not None and self.fmt.start:
            markers.append((self.fmt.start, State.CALL))
        if self.thinking:
            markers.append((self.thinking[0], State.THINK))
        buf = self._buf
        hit = None
        for marker, state in markers:
            i = buf.find(marker)
            if i >= 0 and (hit is None or i < hit[0]):
                hit = (i, marker, state)
        if hit is not None:
            i, marker, state = hit
            self._text(buf[:i])
            self._buf = buf[i:] if state is State.CALL else buf[i + len(marker) :]
            self.state = state
            return
        keep = 0 if final else _partial_suffix(buf, [m for m, _ in markers])
        self._text(buf[: len(buf) - keep])
        self._buf = buf[len(buf) - keep :]

    def _scan_think(self, final: bool) -> None:
        end = self.thinking[1]
        buf = self._buf
        i = buf.find(end)
        if i >= 0:
            if buf[:i]:
                self.parts.append(ThinkingPart(buf[:i]))
            self._buf = buf[i + len(end) :]
            self._lstrip = True
            self.state = self._after_text_start()
            return
        keep = 0 if final else _partial_suffix(buf, [end])
        if buf[: len(buf) - keep]:
            self.parts.append(ThinkingPart(buf[: len(buf) - keep]))
        self._buf = buf[len(buf) - keep :]

    def _scan_call(self, final: bool, cut: bool, eog: bool) -> None:
        fmt = self.fmt
        buf = self._buf
        hit = None
        for end in fmt.ends:
            i = buf.find(end, len(fmt.start) if buf.startswith(fmt.start) else 0)
            if i >= 0 and (hit is None or i < hit[0]):
                hit = (i, end)
        if hit is not None:
            i, end = hit
            span = buf[: i + len(end)] if fmt.end_in_span else buf[:i]
            self._buf = buf[i + len(end) :]
            self.state = self._after_text_start()
            self._complete(span)
            return
        if not final:
            return
        self._buf = ""
        self.state = State.TEXT
        if not fmt.start or not buf.startswith(fmt.start):  # a marker-less reply that is not a call stays text
            if cut:  # a format holding the whole reply (generic) keeps only an answer's text, never a call's start
                partial = getattr(fmt, "partial_text", None)
                self._text(partial(buf.encode()) if partial is not None else buf)
                return
            try:
                calls = fmt.parse(buf.encode())
            except ToolCallParseError:
                text = getattr(fmt, "as_text", lambda b: None)(buf.encode())
                self._text(text if text is not None else buf)
                return
            self._emit(calls, buf)
            return
        if cut:
            return  # a call cut by the token limit is dropped
        if fmt.at_eog and eog:
            self._complete(buf)
        elif fmt.ends:  # the generation ended before the end marker: accept the call if it is whole
            try:
                calls = fmt.parse((buf + fmt.ends[0]).encode())
            except ToolCallParseError as exc:
                self.error = f"the model's tool call is incomplete: {exc}"
                return
            self._emit(calls, buf)
        else:
            self.error = "the model's tool call ended before it was complete"

    def _complete(self, span: str) -> None:
        try:
            calls = self.fmt.parse(span.encode())
        except ToolCallParseError as exc:
            self.error = f"the model wrote a malformed {self.fmt.name} tool call: {exc}"
            return
        self._emit(calls, span)

    def _emit(self, calls: list[ToolCall], span: str) -> None:
        if not self.parallel:
            calls = calls[: max(0, 1 - len(self.calls))]
        if self.validator is not None:
            for c in calls:
                err = self.validator.error(c)
                if err is not None:
                    self.error = err
                    return
        raw = span.encode()
        for c in calls:
            cc = CapturedCall(len(self.calls), self.new_id(), c, raw)
            self.calls.append(cc)
            self.parts.append(ToolCallStart(cc.index, cc.id, c.name))
            self.parts.append(ToolCallArgs(cc.index, c.arguments))
            self.parts.append(ToolCallEnd(cc.index, c.arguments, span))
