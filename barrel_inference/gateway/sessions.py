"""Sessions and prompt normalising for KV reuse, the same for every API family.

A session id lets the worker keep a conversation's sequence (and its saved state) for the next
turn. It needs no client coordination: the `x-conversation-id` / `x-session-id` header when a
client sends one; else, for clients that identify their user (Anthropic `metadata.user_id`), that
id with the conversation's first user message (one agent's sub-conversations differ there);
else none, and prefix matching alone finds what is reusable.

Normalisers remove, from system messages, text that changes on every request but means nothing
to the model (Claude Code's attribution line), so that it never breaks the reusable prefix.
"""

from __future__ import annotations

import hashlib
import re
from typing import Iterable, Mapping

import msgspec

from ..protocol import ChatMessage, Submit

SESSION_HEADERS = ("x-conversation-id", "x-session-id")
CACHE_MISS_HEADER = "x-cache-miss"
MAX_SESSION_LEN = 256


def session_id(
    headers: Mapping[str, str] | None = None,
    *,
    user_id: str | None = None,
    messages: Iterable[ChatMessage] | None = None,
) -> str | None:
    """The session of one request, or None."""
    if headers is not None:
        for name in SESSION_HEADERS:
            value = headers.get(name)
            if value and value.strip():
                value = value.strip()
                if len(value) > MAX_SESSION_LEN:
                    value = "h-" + hashlib.sha256(value.encode()).hexdigest()[:32]
                return "h:" + value
    if user_id:
        first = next((m.content for m in messages or () if m.role == "user"), "")
        digest = hashlib.sha256(f"{user_id}\0{first}".encode()).hexdigest()[:32]
        return "u:" + digest
    return None


class PromptNormalizer:
    """Regexes whose matches are removed from system messages."""

    def __init__(self, patterns: Iterable[str] = ()):
        self.patterns = [re.compile(p) for p in patterns]

    def messages(self, messages: list[ChatMessage]) -> list[ChatMessage]:
        if not self.patterns:
            return messages
        out = []
        for m in messages:
            if m.role == "system" and m.content:
                text = m.content
                for p in self.patterns:
                    text = p.sub("", text)
                if text != m.content:
                    m = msgspec.structs.replace(m, content=text)
            out.append(m)
        return out

    def apply(self, submit: Submit) -> None:
        if submit.messages:
            submit.messages = self.messages(submit.messages)


def prepare(submit: Submit, normalizer: PromptNormalizer | None, headers: Mapping[str, str] | None = None) -> Submit:
    """What every family does to a Submit before it goes out: the session id (a session header's;
    else what the family derived from its own fields, such as Anthropic's metadata.user_id) and
    normalised system messages."""
    named = session_id(headers) if headers is not None else None
    if named is not None:
        submit.session = named
    if normalizer is not None:
        normalizer.apply(submit)
    return submit
