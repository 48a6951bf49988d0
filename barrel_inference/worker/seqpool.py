"""The seq_id pool: which llama.cpp sequence serves which request, and what each one's KV cache holds.

Pure bookkeeping; the scheduler performs the KV operations the pool asks for. A sequence keeps its
tokens in the KV cache after its request ends, so a later request that starts with the same tokens
(the next turn of a conversation, a shared system prompt) only prefills what is new: a request is
given the free sequence whose cached tokens share the longest prefix with its prompt. A sequence
can also be pinned to a session, which keeps it for that session's next turn; pinned sequences are
taken by others only when no unpinned one is free, least recently used first.
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

    def acquire(self, session: str | None, prompt: list[int] | None = None) -> Lease | None:
        """A sequence for a new request, or None when every sequence is busy.

        The session's own pinned sequence is preferred; otherwise, among the free unpinned
        sequences (or, when none is, the free pinned ones), the one whose cache shares the longest
        prefix with the prompt, the least recently used on a tie.
        """
        self._clock += 1
        slot = self._by_session.get(session) if session else None
        if slot is not None and slot.busy:
            slot = None  # the session's seq serves another of its requests: take a fresh one
        if slot is None:
            free = [s for s in self.slots if not s.busy]
            if not free:
                return None
            candidates = [s for s in free if s.session is None] or free
            prompt = prompt or []
            slot = max(candidates, key=lambda s: (common_prefix(s.tokens, prompt), -s.last_used))
            if slot.session is not None:
                self._unpin(slot)
                slot.tokens = []  # another session's cache: not to be matched
            if session:
                slot.session = session
                self._by_session[session] = slot
        slot.busy = True
        slot.last_used = self._clock
        return Lease(slot.seq, list(slot.tokens))

    def release(self, seq: int, tokens: list[int] | None) -> bool:
        """The request on seq ended; tokens: what its KV cache now holds (None: unknown).

        Returns True when the caller should clear the sequence's KV now.
        """
        slot = self.slots[seq]
        slot.busy = False
        if tokens is None:
            self._unpin(slot)
            slot.tokens = []
            return True
        slot.tokens = list(tokens)
        return False

    def forget(self, seq: int) -> None:
        """The sequence's KV was cleared: nothing of it is to be matched."""
        self.slots[seq].tokens = []

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


def common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i
