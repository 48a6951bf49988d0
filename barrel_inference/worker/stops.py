"""Stop sequences matched across token boundaries; no part of a stop sequence is ever emitted."""

from __future__ import annotations


class StopMatcher:
    """Holds back the tail of the text that could still begin a stop sequence.

    push(text) -> (text safe to emit, matched stop or None). After a match the generation ends;
    flush() returns what was held back when it ends for another reason.
    """

    __slots__ = ("stops", "_held", "_max")

    def __init__(self, stops: list[str]):
        self.stops = [s for s in stops if s]
        self._held = ""
        self._max = max((len(s) for s in self.stops), default=0)

    def push(self, text: str) -> tuple[str, str | None]:
        if not self.stops:
            return text, None
        buf = self._held + text
        first: tuple[int, str] | None = None
        for s in self.stops:
            i = buf.find(s)
            if i >= 0 and (first is None or i < first[0]):
                first = (i, s)
        if first is not None:
            self._held = ""
            return buf[: first[0]], first[1]
        keep = self._partial_suffix(buf)
        self._held = buf[len(buf) - keep :] if keep else ""
        return buf[: len(buf) - keep], None

    def _partial_suffix(self, buf: str) -> int:
        """Length of the longest suffix of buf that is a proper prefix of some stop sequence."""
        for n in range(min(len(buf), self._max - 1), 0, -1):
            tail = buf[-n:]
            if any(s.startswith(tail) for s in self.stops):
                return n
        return 0

    def flush(self) -> str:
        out, self._held = self._held, ""
        return out
