"""The seq_id pool: which llama.cpp sequence serves which request, and what each one's KV cache holds.

Pure bookkeeping; the scheduler performs the KV operations a Plan asks for. A sequence keeps its
tokens in the KV cache after its request ends, so a later request that starts with the same tokens
(the next turn of a conversation, a shared system prompt) prefills only what is new.

The choice never destroys a cache that is worth something for a newcomer that gains less:
1. a session's own idle sequence (sticky);
2. else an idle sequence whose whole cache the prompt extends and that no other session owns
   (taking it loses nothing: the next turn of a conversation sent without a session id);
3. else an empty sequence, and failing that the least recently used idle one that is not pinned
   (a pinned one only when every idle sequence is; its cache is handed to the caller to save in a
   tier before it is overwritten).
Whatever the target, the longest committed prefix of ANY other sequence, busy or idle, is copied
into it when that beats what the target holds itself (a shared system prompt is never prefilled
twice). A prefix counts only where the engine can continue it (`shareable`: a sliding-window cache
keeps only the last window of a sequence's positions).

There may be more sequences than run at once (`max_busy`): the others hold idle caches, so more
conversations than running requests keep their cells between turns.

`neighbours`: with a KV buffer per sequence llama.cpp decodes each run of consecutive running
sequence ids as a pass of its own, so an empty sequence next to a running one is taken first, and a
cache chosen away from the running ones (a session's own) is copied into such a sequence if there is
one. A sequence whose request is only finishing (`finishing`: its last token still to enter the
cache, one row, then it is idle) does not count as running.

Pins: a request may ask that its cache be kept for a while (Submit.pin_ttl_s, from Anthropic's
cache_control). A pinned sequence is not dropped by retention (`over_retention`) before its pin
runs out, and is the last choice to overwrite; unpinned caches go first. A sequence released in
the current scheduler round (`tick`) is safe from that round's retention, so the worker can tell a
request, when it ends, that its cache stays.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable


@dataclass
class Slot:
    seq: int
    session: str | None = None  # pinned to this session
    tokens: list[int] = field(default_factory=list)  # what the KV cache holds for this seq (idle)
    busy: bool = False
    last_used: int = 0
    pin_until: float = 0.0  # clock time until which retention keeps this cache (0: not pinned)
    released_tick: int = -1  # the scheduler round in which it was last released
    finishing: bool = False  # busy only until its request's last token enters the cache (a tail)


@dataclass
class Evicted:
    """A cache the plan overwrites: the caller may save it first (state of `seq`, `tokens`)."""

    seq: int
    tokens: list[int]
    session: str | None
    pin_until: float = 0.0


@dataclass
class Plan:
    seq: int
    kind: str  # "sticky" | "prefix" | "copy" | "cold" (the scheduler may turn it into "ram" / "disk")
    keep: int  # tokens of the target's own cache to keep (the rest is dropped)
    copy_from: int = -1  # a sequence whose first copy_n committed tokens are copied into seq
    copy_n: int = 0
    evict: Evicted | None = None
    keep_kind: str = "cold"  # what keeping the target's own prefix is ("sticky" | "prefix"), whatever kind says
    held: int = 0  # tokens the target's own cache held (keep == held: it is continued whole)

    @property
    def reused(self) -> int:
        return max(self.keep, self.copy_n)


# busy seq -> (its tokens, how many of them are committed to the KV cache)
Live = dict[int, tuple[list[int], int]]
# (seq, n) -> can the first n positions of seq's cache be continued at n (kept or copied)? A sliding
# window cache may no longer hold what position n attends to (the engine's can_share)
Shareable = Callable[[int, int], bool]


class SeqPool:
    def __init__(self, n_seq: int, clock: Callable[[], float] = time.monotonic, max_busy: int | None = None,
                 neighbours: bool = False):  # fmt: skip
        self.slots = [Slot(i) for i in range(n_seq)]
        self.neighbours = neighbours
        # at most this many run at once; the other sequences only hold idle caches (the engine's
        # n_seq_idle: a conversation between turns keeps its cells, and its next turn is sticky)
        self.max_busy = n_seq if max_busy is None else max(1, min(max_busy, n_seq))
        self._by_session: dict[str, Slot] = {}
        self._clock = 0
        self.clock = clock  # seconds, for pins
        self.tick = 0  # the scheduler's round: sequences released in the current one are not dropped in it

    def pinned(self, slot: Slot) -> bool:
        return bool(slot.tokens) and slot.pin_until > self.clock()

    def __len__(self) -> int:
        return len(self.slots)

    @property
    def n_busy(self) -> int:
        return sum(s.busy for s in self.slots)

    def session_seq(self, session: str | None) -> int | None:
        slot = self._by_session.get(session) if session else None
        return slot.seq if slot is not None else None

    def best_prefix(self, prompt: list[int], live: Live | None = None, shareable: Shareable | None = None) -> int:
        """The longest prefix of prompt that some sequence (busy or idle) holds and can share."""
        return max((self._usable(s, prompt, live, shareable) for s in self.slots), default=0)

    def acquire(self, session: str | None, prompt: list[int] | None = None, live: Live | None = None,
                shareable: Shareable | None = None) -> Plan | None:  # fmt: skip
        """A plan for a new request, or None when every sequence is busy. Prefixes are counted up to
        len(prompt) - 1 (one prompt token is always decoded, for its logits) and only where
        `shareable` says the cache can be continued there."""
        self._clock += 1
        prompt = prompt or []
        free = [s for s in self.slots if not s.busy]
        if not free or len(self.slots) - len(free) >= self.max_busy:
            return None
        own = self._by_session.get(session) if session else None
        kind = "cold"
        if own is not None and not own.busy:
            target, kind = own, "sticky"
        else:
            extend = [
                s for s in free
                if s.tokens and s.session in (None, session) and common_prefix(s.tokens, prompt) == len(s.tokens)
            ]  # fmt: skip
            if extend:
                target, kind = max(extend, key=lambda s: (len(s.tokens), -s.last_used)), "prefix"
            else:
                empty = [s for s in free if not s.tokens]
                if empty:
                    target = min(empty, key=lambda s: (not self._next_to_busy(s), s.last_used))
                else:
                    target = min(free, key=lambda s: (self.pinned(s), s.last_used, len(s.tokens)))
                kind = "prefix"
        if target.tokens and not self._next_to_busy(target) and any(self._running(s) for s in self.slots):
            # a cache away from the running sequences is copied next to them (a buffer copy costs
            # less than a decode pass more for every token of the request)
            near = [s for s in free if not s.tokens and self._next_to_busy(s)]
            if near:
                target = min(near, key=lambda s: s.last_used)
        common = common_prefix(target.tokens, prompt)  # target is free: all it holds is committed
        keep = self._usable(target, prompt, None, shareable, common)
        evict = None
        if target.tokens and (keep == 0 or common < len(target.tokens)) and kind != "sticky":
            evict = Evicted(target.seq, list(target.tokens), target.session, target.pin_until)
            target.pin_until = 0.0  # the pin goes with the cache (to a tier), not with the sequence
        src, src_n = -1, 0
        for s in self.slots:
            if s is target:
                continue
            n = self._usable(s, prompt, live, shareable)
            if n > src_n:
                src, src_n = s.seq, n
        kept_kind = kind if keep > 0 else "cold"
        plan = Plan(target.seq, kept_kind, keep, keep_kind=kept_kind, held=len(target.tokens))
        if src_n > keep:
            plan.copy_from, plan.copy_n, plan.kind = src, src_n, "copy"
        plan.evict = evict
        if target.session != session:
            self._unpin(target)
        if session:
            if own is not None and own is not target:
                self._unpin(own)  # the session's latest turn is the one on target
            target.session = session
            self._by_session[session] = target
        target.busy = True
        target.finishing = False
        target.tokens = []
        target.last_used = self._clock
        return plan

    def finishing(self, seq: int) -> None:
        """seq's request is answered; only its last token is still to enter the cache."""
        self.slots[seq].finishing = True

    @staticmethod
    def _running(slot: Slot) -> bool:
        return slot.busy and not slot.finishing

    def _next_to_busy(self, slot: Slot) -> bool:
        if not self.neighbours:
            return True  # no preference: every empty sequence is as good
        near = (self.slots[i] for i in (slot.seq - 1, slot.seq + 1) if 0 <= i < len(self.slots))
        return any(self._running(s) for s in near)

    def release(self, seq: int, tokens: list[int] | None, pin_ttl_s: float = 0.0) -> bool:
        """The request on seq ended; tokens: what its KV cache now holds (None: unknown). pin_ttl_s:
        keep it that long (a pin it already had from an earlier turn is never shortened).

        Returns True when the caller should clear the sequence's KV now.
        """
        slot = self.slots[seq]
        slot.busy = False
        slot.finishing = False
        self._clock += 1
        slot.last_used = self._clock
        slot.released_tick = self.tick
        if tokens is None:
            self._unpin(slot)
            slot.tokens = []
            slot.pin_until = 0.0
            return True
        slot.tokens = list(tokens)
        if pin_ttl_s > 0:
            slot.pin_until = max(slot.pin_until, self.clock() + pin_ttl_s)
        return False

    def forget(self, seq: int) -> None:
        """The sequence's KV was cleared: nothing of it is to be matched, and no session owns it."""
        slot = self.slots[seq]
        slot.tokens = []
        slot.pin_until = 0.0
        if not slot.busy:
            self._unpin(slot)

    def over_retention(self, limit: int) -> list[Slot]:
        """Idle sequences to drop, least recently used first, until idle caches hold at most
        `limit` tokens together. The most recently used idle cache is always kept (a lone
        conversation keeps its own cache whatever its length); so are pinned caches until their
        pin runs out (they count towards `limit`, so unpinned ones go first) and those released
        in the current round."""
        idle = sorted(self.idle_slots(), key=lambda s: s.last_used)
        total = sum(len(s.tokens) for s in idle)
        out = []
        for s in idle[:-1]:
            if total <= limit:
                break
            if self.pinned(s) or s.released_tick == self.tick:
                continue
            out.append(s)
            total -= len(s.tokens)
        return out

    def idle_slots(self) -> list[Slot]:
        """The sequences that hold an idle cache."""
        return [s for s in self.slots if not s.busy and s.tokens]

    def oldest_idle(self) -> Slot | None:
        """The idle cache to give up first when the KV cache is full: unpinned before pinned, then
        least recently used; None when no sequence holds one."""
        return min(self.idle_slots(), key=lambda s: (self.pinned(s), s.last_used), default=None)

    def retained(self) -> int:
        return sum(len(s.tokens) for s in self.idle_slots())

    def end_session(self, session: str) -> int | None:
        """Unpin a session; returns the seq to clear if it was idle."""
        slot = self._by_session.get(session)
        if slot is None:
            return None
        self._unpin(slot)
        if slot.busy:
            return None
        slot.tokens = []
        slot.pin_until = 0.0
        return slot.seq

    def reset(self) -> None:
        for s in self.slots:
            self._unpin(s)
            s.tokens = []
            s.busy = False
            s.pin_until = 0.0

    def _usable(self, slot: Slot, prompt: list[int], live: Live | None, shareable: Shareable | None,
                common: int | None = None) -> int:  # fmt: skip
        """common: the slot's committed common prefix with prompt, when the caller has it already."""
        if common is None:
            common = self._committed_common(slot, prompt, live)
        n = min(common, max(0, len(prompt) - 1))
        if n > 0 and shareable is not None and not shareable(slot.seq, n):
            return 0
        return n

    def _committed_common(self, slot: Slot, prompt: list[int], live: Live | None) -> int:
        if not slot.busy:
            return common_prefix(slot.tokens, prompt)
        if live is None or slot.seq not in live:
            return 0
        toks, n = live[slot.seq]
        return common_prefix(toks, prompt, n)

    def _unpin(self, slot: Slot) -> None:
        if slot.session is not None:
            if self._by_session.get(slot.session) is slot:
                del self._by_session[slot.session]
            slot.session = None


def common_prefix(a, b, limit: int | None = None) -> int:
    """Length of the common prefix of two token sequences (lists or arrays, mixed)."""
    if type(a) is not type(b):
        a = a if isinstance(a, list) else list(a)
        b = b if isinstance(b, list) else list(b)
    n = min(len(a), len(b))
    if limit is not None:
        n = min(n, limit)
    i, step = 0, 512
    while i < n:  # whole chunks compare at C speed; only the diverging chunk is walked
        j = min(n, i + step)
        if a[i:j] != b[i:j]:
            while i < j and a[i] == b[i]:
                i += 1
            return i
        i = j
    return n
