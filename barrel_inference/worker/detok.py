"""Incremental detokenization that never splits a UTF-8 character across deltas."""

from __future__ import annotations

import codecs
from typing import Callable


class IncrementalDetokenizer:
    """Feed token ids, get text. Bytes of a partial UTF-8 character wait for the next token."""

    __slots__ = ("_piece", "_decoder")

    def __init__(self, piece: Callable[[int], bytes]):
        self._piece = piece
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def feed(self, token: int) -> str:
        return self._decoder.decode(self._piece(token), final=False)

    def flush(self) -> str:
        """At the end of a generation: whatever bytes remain, invalid ones replaced."""
        return self._decoder.decode(b"", final=True)
