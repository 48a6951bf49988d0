"""Special tokens only from the template: a rendered chat prompt tokenised segment by segment.

A message's content is text, whatever it contains: a user who writes `<start_of_turn>` or
`<|im_start|>` must not open a turn of another role. The template is rendered twice, once as is and
once with every content wrapped in markers no client can guess (a fresh nonce per render). The
markers say which spans of the rendered text are contents; the plain render says how the template
transformed them (a template may trim a content). Control tokens are then recognised in the
template's text only; contents, and the text runs they join, are tokenised with parse_special off.
"""

from __future__ import annotations

import secrets
from typing import Callable, Sequence

import msgspec

from ..protocol import ChatMessage

Segment = tuple[str, bool]  # (text, is_content)


class Markers:
    def __init__(self) -> None:
        nonce = self.nonce = secrets.token_hex(8)
        self.open = f"\ue000{nonce}\ue001"
        self.close = f"\ue002{nonce}\ue003"

    def splice_mark(self, index: int) -> str:
        """A mark for message `index`'s replayed span: template text to the segmenter, spliced later."""
        return f"\ue004{self.nonce}-{index}\ue005"

    def wrap(self, text: str | None) -> str | None:
        return f"{self.open}{text}{self.close}" if text else text

    def messages(self, messages: Sequence[ChatMessage]) -> list[ChatMessage]:
        return [msgspec.structs.replace(m, content=self.wrap(m.content) or "", thinking=self.wrap(m.thinking)) for m in messages]

    def split(self, marked: str) -> list[Segment]:
        """The marked render as segments. Tolerant: an open marker without its close runs to the end
        (content), a stray close is dropped; nothing a template does with the markers makes content
        count as template text."""
        out: list[Segment] = []
        i, n = 0, len(marked)
        while i < n:
            j = marked.find(self.open, i)
            stray = marked.find(self.close, i)
            if stray >= 0 and (j < 0 or stray < j):  # a close without an open: drop it
                if stray > i:
                    out.append((marked[i:stray], False))
                i = stray + len(self.close)
                continue
            if j < 0:
                out.append((marked[i:], False))
                break
            if j > i:
                out.append((marked[i:j], False))
            k = marked.find(self.close, j + len(self.open))
            end = n if k < 0 else k
            inner = marked[j + len(self.open) : end].replace(self.open, "")
            out.append((inner, True))
            i = n if k < 0 else k + len(self.close)
        return _merge(out)


def _merge(segments: list[Segment]) -> list[Segment]:
    out: list[Segment] = []
    for text, content in segments:
        if not text:
            continue
        if out and out[-1][1] == content:
            out[-1] = (out[-1][0] + text, content)
        else:
            out.append((text, content))
    return out


def align(segments: list[Segment], plain: str) -> list[Segment]:
    """The segments with each content as the plain render has it (the template may have trimmed it).

    Template text must match the plain render exactly; each content may appear as itself or
    stripped. Where that fails the marked segments are kept (raw contents: safe, slightly different
    whitespace)."""
    out: list[Segment] = []
    pos = 0
    for idx, (text, content) in enumerate(segments):
        if not content:
            if not plain.startswith(text, pos):
                return segments
            out.append((text, False))
            pos += len(text)
            continue
        following = next((t for t, c in segments[idx + 1 :] if not c), None)
        for cand in (text, text.strip(), text.rstrip(), text.lstrip()):
            if plain.startswith(cand, pos) and (following is None or plain.startswith(following, pos + len(cand))):
                out.append((cand, True))
                pos += len(cand)
                break
        else:
            return segments
    if pos != len(plain):
        return segments
    return _merge(out)


def tokenize_segments(segments: list[Segment], special: dict[str, int], tokenize: Callable[[str], list[int]]) -> list[int]:
    """Control tokens found in template text become their ids; every other run of text (template
    text and the contents it joins) is tokenised with parse_special off by `tokenize`."""
    by_len: dict[int, set[str]] = {}
    for name in special:
        if name:
            by_len.setdefault(len(name), set()).add(name)
    lengths = sorted(by_len, reverse=True)
    firsts = {name[0] for name in special if name}
    tokens: list[int] = []
    run: list[str] = []

    def flush() -> None:
        if run:
            text = "".join(run)
            run.clear()
            if text:
                tokens.extend(tokenize(text))

    for text, content in segments:
        if content or not lengths:
            run.append(text)
            continue
        start = i = 0
        n = len(text)
        while i < n:
            if text[i] in firsts:
                hit = next((text[i : i + k] for k in lengths if text[i : i + k] in by_len[k]), None)
                if hit is not None:  # the longest control token at the earliest place
                    run.append(text[start:i])
                    flush()
                    tokens.append(special[hit])
                    i = start = i + len(hit)
                    continue
            i += 1
        run.append(text[start:])
    flush()
    return tokens
