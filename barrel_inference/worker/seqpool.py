"""The seq_id pool: which llama.cpp sequence serves which request, and which stay pinned to a session.

Pure bookkeeping; the scheduler performs the KV operations the pool asks for. A sequence whose
request ended can stay pinned to its session with its tokens still in the KV cache, so the
session's next turn only prefills what is new. Pinned sequences are evicted least recently used
when a request needs a sequence and none is free.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Slot:
    seq: int
    session: str | None = None  # pinned to this session
    tokens: list[int] = field(default_factory=list)  # what the KV cache holds for this seq
    busy: bool = False
    last_used: int = 0


@dataclass
class Lease:
    seq: int
    cached: list[int]  # tokens already in this seq's KV (to be matched against the new prompt)


class SeqPool:
    def __init__(self, n_seq: int):
        self.slots = [Slot(i) for i in range(n_seq)]
        self._by_session: dict[str, Slot] = {}
        self._clock = 0

    def __len__(self) -> int:
        return len(self.slots)

    @property
    def n_busy(self) -> int:
        return sum(s.busy for s in self.slots)

    def acquire(self, session: str | None) -> Lease | None:
        """A sequence for a new request, or None when every sequence is busy.

        The session's own pinned sequence is preferred (its KV may be reused); otherwise an
        unpinned free one; otherwise the least recently used idle pinned one is evicted.
        """
        self._clock += 1
        slot = self._by_session.get(session) if session else None
        if slot is not None and slot.busy:
            slot = None  # the session's seq serves another of its requests: take a fresh one
        if slot is None:
            free = [s for s in self.slots if not s.busy]
            if not free:
                return None
            unpinned = [s for s in free if s.session is None]
            slot = unpinned[0] if unpinned else min(free, key=lambda s: s.last_used)
            self._unpin(slot)
            slot.tokens = []
            if session:
                slot.session = session
                self._by_session[session] = slot
        slot.busy = True
        slot.last_used = self._clock
        return Lease(slot.seq, list(slot.tokens))

    def release(self, seq: int, tokens: list[int] | None) -> bool:
        """The request on seq ended. tokens: what its KV holds (kept for a pinned session).

        Returns True when the caller should clear the sequence's KV now.
        """
        slot = self.slots[seq]
        slot.busy = False
        if slot.session is not None and tokens is not None:
            slot.tokens = list(tokens)
            return False
        self._unpin(slot)
        slot.tokens = []
        return True

    def end_session(self, session: str) -> int | None:
        """Unpin a session; returns the seq to clear if it was idle."""
        slot = self._by_session.get(session)
        if slot is None:
            return None
        self._unpin(slot)
        if slot.busy:
            return None
        slot.tokens = []
        return slot.seq

    def reset(self) -> None:
        for s in self.slots:
            self._unpin(s)
            s.tokens = []
            s.busy = False

    def _unpin(self, slot: Slot) -> None:
        if slot.session is not None:
            if self._by_session.get(slot.session) is slot:
                del self._by_session[slot.session]
            slot.session = None
