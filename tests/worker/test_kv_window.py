"""KV reuse on a sliding-window cache, with a fake engine whose window layers keep only the last
positions a sequence's next token attends to (what llama.cpp's window cache keeps under pressure).

A saved state whose window no longer reaches back to where a new prompt diverges is not restored
(the load would be wasted: the cut state cannot be continued); one the prompt extends is.
"""

from __future__ import annotations

import pytest

from barrel_inference.worker.fake import FakeEngine
from barrel_inference.worker.kvreuse import KvReuse
from barrel_inference.worker.kvstore import KvStore

from .harness import make_request

N_SWA = 8


class WindowEngine(FakeEngine):
    n_swa = N_SWA

    def __init__(self, **kw):
        super().__init__(**kw)
        self.loads = 0

    def seq_pos_min(self, seq: int) -> int:
        n = len(self._match[seq]) - 1
        return max(0, n - N_SWA + 1) if n > 0 else -1

    def window_start(self, n_past: int) -> int:
        return max(0, n_past - N_SWA + 1)

    def can_share(self, seq: int, n: int) -> bool:
        return n <= 0 or 0 <= self.seq_pos_min(seq) <= self.window_start(n)

    def can_continue(self, seq: int, n_past: int) -> bool:
        return super().can_continue(seq, n_past) and self.seq_pos_min(seq) <= self.window_start(n_past)

    def state_seq_save(self, seq: int) -> bytes:
        return bytes(self._match[seq])

    def state_seq_load(self, seq: int, data) -> bool:
        self.loads += 1
        self._match[seq] = list(bytes(data))
        return True


def _turn(reuse: KvReuse, eng: WindowEngine, rid: str, prompt: list[int], session: str):
    req = make_request(eng, rid, prompt, session=session)
    assert reuse.admit(req, {}) is True
    rest = prompt[req.n_past :]
    assert eng.decode(rest, list(range(req.n_past, len(prompt))), [req.seq] * len(rest), [False] * len(rest)) == 0
    reuse.release(req, list(prompt))
    return req


def test_a_saved_state_is_restored_only_where_its_window_reaches():
    eng = WindowEngine(n_seq_max=1)
    store = KvStore(namespace={"m": "fake"}, ram_bytes=1 << 20)
    reuse = KvReuse(eng, n_seq=1, store=store)
    a = [ord(c) for c in "alpha conversation turn one"]
    b = [ord(c) for c in "bravo conversation turn one"]
    _turn(reuse, eng, "a1", a, "a")
    _turn(reuse, eng, "b1", b, "b")  # takes the only sequence: A's state goes to RAM, window from len(a) - 7
    assert store.stats()["ram_entries"] == 1
    diverged = a[:12] + [ord(c) for c in " something else entirely"]
    r = _turn(reuse, eng, "a2", diverged, "a")
    assert eng.loads == 0, "a state that cannot be cut back to 12 tokens was loaded anyway"
    assert r.cache_kind == "cold" and r.n_cached == 0
    extended = a + [ord(c) for c in " and two"]
    r = _turn(reuse, eng, "a3", extended, "a")
    assert eng.loads == 1 and r.cache_kind == "ram" and r.n_cached == len(a)


class FullEngine(FakeEngine):
    """A KV cache of `capacity` cells: a batch that does not fit is refused with status 1 (what
    llama_decode returns when it finds no KV slot), leaving the cache as it was."""

    capacity = 40

    def decode(self, tokens, pos, seqs, logits) -> int:
        used = sum(len(m) - 1 for m in self._match)
        if used + len(tokens) > self.capacity:
            return 1
        return super().decode(tokens, pos, seqs, logits)


def test_a_full_kv_cache_drops_the_oldest_idle_cache_rather_than_failing_the_running_request():
    from barrel_inference.protocol import FinishReason

    from .harness import Running

    eng = FullEngine(n_seq_max=1, n_seq_idle=2)
    eng.capacity = 80
    reuse = KvReuse(eng, n_seq=eng.n_seq_total, max_busy=eng.n_seq_max)
    with Running(eng, reuse=reuse) as (s, c):
        for rid, prompt in (("a", "alpha conversation, first turn"), ("b", "bravo conversation, first turn")):
            s.submit(make_request(eng, rid, prompt, max_tokens=4))
            c.wait([rid])
            c.wait_for(lambda: s.pool.n_busy == 0 and not s.active)
        held = {slot.seq: list(slot.tokens) for slot in s.pool.slots if slot.tokens}
        assert len(held) == 2
        used = sum(len(m) - 1 for m in eng._match)
        newcomer = "charlie, a different thing entirely"
        assert used + len(newcomer) > eng.capacity >= used - min(len(t) for t in held.values()) + len(newcomer) + 4
        s.submit(make_request(eng, "c", newcomer, max_tokens=4))
        c.wait(["c"])
        done = c.done()["c"]
    assert done.finish_reason is FinishReason.LENGTH, done.error  # not a decode failure
    assert s.n_decode_failures == 0
    assert reuse.evictions == 1  # alpha's cache, the older, gave way; bravo's stayed
    kept = [slot.tokens for slot in s.pool.slots if slot.tokens and slot.tokens[: len("bravo")] == [ord(ch) for ch in "bravo"]]
    assert kept, "bravo's idle cache was dropped too"


def _two_turns(grace_s: float, pause_s: float):
    import time

    from .harness import Running

    eng = FakeEngine(n_seq_max=2)
    with Running(eng) as (s, c):
        s.tail_grace_s = grace_s
        first = "alpha asks a question"
        s.submit(make_request(eng, "t1", first, max_tokens=4, session="A"))
        c.wait(["t1"])
        pending = s.stats()["tails_pending"]  # t1 is answered; its last token may still wait
        time.sleep(pause_s)
        second = first + c.text("t1") + " and then another"
        s.submit(make_request(eng, "t2", second, max_tokens=4, session="A"))
        c.wait(["t2"])
        done = c.done()
    return s, done, len(first), pending


def test_a_next_turn_arriving_within_the_grace_takes_the_last_token_into_its_own_batch():
    """With a grace, the finished turn's last token waits; the next turn of the conversation arrives
    meanwhile and prefills that token itself (first in its prompt past the cache): it never waits
    for a decode of its own, and it reports one token less cached, truthfully."""
    s, done, n_first, pending = _two_turns(grace_s=5.0, pause_s=0.0)
    assert pending == 1 and s.stats()["tails_pending"] == 0  # /api/stats shows the waiting token
    assert s.n_tails_folded == 1
    assert done["t2"].usage.cached_tokens == n_first + 4 - 1
    assert done["t2"].finish_reason is done["t1"].finish_reason


def test_without_a_next_turn_the_last_token_enters_the_cache_after_the_grace():
    s, done, n_first, _ = _two_turns(grace_s=0.05, pause_s=0.5)
    assert s.n_tails_folded == 0
    assert done["t2"].usage.cached_tokens == n_first + 4  # prompt and every generated token


@pytest.mark.parametrize(("pos_min", "saved"), [(0, 1), (-1, 0)])
def test_a_sequence_without_cells_in_the_window_layers_is_not_saved(pos_min, saved):
    """llama.cpp's pos_min -1: the sequence holds no cells in (the window layers of) the cache, so a
    restore of its state could never be continued; it is not saved, and an entry's -1 keeps
    meaning "written before pos_min was recorded"."""
    from barrel_inference.worker.seqpool import Evicted

    eng = FakeEngine()
    eng.seq_pos_min = lambda seq: pos_min
    store = KvStore(namespace={"m": 1}, ram_bytes=1 << 20)
    reuse = KvReuse(eng, n_seq=eng.n_seq_total, store=store, max_busy=eng.n_seq_max)
    reuse._save(Evicted(seq=0, tokens=list(range(40)), session="s"))
    assert store.stats()["ram_entries"] == saved
    assert reuse.evictions == 1  # counted either way
