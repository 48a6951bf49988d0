"""KvReuse relays a sequence before it continues its whole cache where the self-test says
restores are exact only so (worker/kvselftest.py, "relayout"), as a restore of it would lie: on
the fake engine, which records the calls. A sequence cut back is not relaid (a relaid one holds
just the window and could not be cut; no restore could serve that turn). One that cannot be
relaid is not continued (left as it lay, it would continue otherwise than a restore of it)."""

from __future__ import annotations

import pytest

from barrel_inference.worker.fake import FakeEngine
from barrel_inference.worker.kvreuse import KvReuse
from barrel_inference.worker.kvstore import KvStore

from .harness import make_request


class RelayEngine(FakeEngine):
    def __init__(self, fail: bool = False):
        super().__init__()
        self.fail = fail
        self.relaid: list[int] = []

    def seq_relayout(self, seq: int) -> bool:
        self.relaid.append(seq)
        return not self.fail


def reuse(engine, *, store: bool = True, relayout: bool = True) -> KvReuse:
    kv = KvStore(namespace={"m": 1}, ram_bytes=1 << 20, disk_bytes=0, directory=None) if store else None
    return KvReuse(engine, n_seq=engine.n_seq_total, max_busy=engine.n_seq_max, store=kv, relayout=relayout)


def turn(kv: KvReuse, engine, rid: str, prompt: list[int], session: str = "S"):
    req = make_request(engine, rid, prompt, session=session)
    assert kv.admit(req, {}) is True
    # what the turn committed: its prompt and one generated token
    engine.decode(prompt[req.n_past :] + [7], list(range(req.n_past, len(prompt) + 1)), [req.seq] * (len(prompt) - req.n_past + 1),
                  [False] * (len(prompt) - req.n_past + 1))  # fmt: skip
    kv.release(req, prompt + [7])
    return req


def test_a_sequence_continued_whole_is_relaid_first():
    e = RelayEngine()
    kv = reuse(e)
    first = turn(kv, e, "a", [1, 2, 3, 4, 5])
    assert e.relaid == []  # a cold turn: nothing to relay
    second = turn(kv, e, "b", [1, 2, 3, 4, 5, 7, 8, 9])
    assert e.relaid == [first.seq] and second.seq == first.seq
    assert second.cache_kind == "sticky" and second.n_cached == 6
    assert kv.stats()["relayouts_failed"] == 0 and "relayout_ms_max" in kv.stats()


def test_a_sequence_cut_back_is_not_relaid():
    """The session's next prompt diverged before the end of what its sequence holds."""
    e = RelayEngine()
    kv = reuse(e)
    turn(kv, e, "a", [1, 2, 3, 4, 5])
    second = turn(kv, e, "b", [1, 2, 3, 4, 9, 9])
    assert e.relaid == []
    assert second.cache_kind == "sticky" and second.n_cached == 4 and second.cache_miss == "diverged-at=4"


@pytest.mark.parametrize(("store", "relayout"), [(True, False), (False, True)], ids=["no-selftest", "no-tiers"])
def test_no_relayout_without_the_selftest_or_without_tiers(store, relayout):
    e = RelayEngine()
    kv = reuse(e, store=store, relayout=relayout)
    turn(kv, e, "a", [1, 2, 3, 4, 5])
    turn(kv, e, "b", [1, 2, 3, 4, 5, 7, 8, 9])
    assert e.relaid == [] and kv.relayout is False
    assert "relayout_ms_max" not in kv.stats()


def test_a_sequence_that_cannot_be_relaid_is_not_continued():
    e = RelayEngine(fail=True)
    kv = reuse(e)
    first = turn(kv, e, "a", [1, 2, 3, 4, 5])
    second = turn(kv, e, "b", [1, 2, 3, 4, 5, 7, 8, 9])
    assert e.relaid == [first.seq, first.seq]  # refused with its cells left: tried again after a decode
    assert second.cache_kind == "cold" and second.n_cached == 0 and second.cache_miss == "evicted"
    assert kv.stats()["relayouts_failed"] == 1


class PendingCopyEngine(RelayEngine):
    """Refuses to relay a sequence while a copy out of it waits for a decode, as llama.cpp's
    buffer copies do (engine.seq_relayout)."""

    def __init__(self):
        super().__init__()
        self.copy_from: set[int] = set()
        self.decodes = 0

    def seq_copy(self, src: int, dst: int, n: int) -> None:
        self._match[dst] = list(self._match[src][: n + 1])
        self.copy_from.add(src)

    def decode(self, tokens, pos, seqs, logits) -> int:
        self.decodes += 1
        self.copy_from.clear()
        return super().decode(tokens, pos, seqs, logits)

    def seq_relayout(self, seq: int) -> bool:
        self.relaid.append(seq)
        return seq not in self.copy_from


def test_a_copy_out_of_a_sequence_queued_in_the_same_round_is_made_before_it_is_relaid():
    """A newcomer copies the prefix of S's idle cache, and in the same round S's own session
    continues it whole: the relay is refused while the copy waits, so a one-token decode makes the
    copy (its token taken back) and the relay goes through; S's turn stays sticky."""
    e = PendingCopyEngine()
    kv = reuse(e)
    first = turn(kv, e, "a", [1, 2, 3, 4, 5], session="S")
    other = make_request(e, "n", [1, 2, 3, 4, 5, 7, 6], session="N")
    assert kv.admit(other, {}) is True and other.cache_kind == "copy" and e.copy_from == {first.seq}
    decodes = e.decodes
    own = make_request(e, "b", [1, 2, 3, 4, 5, 7, 8, 9], session="S")
    assert kv.admit(own, {}) is True
    assert own.seq == first.seq and own.cache_kind == "sticky" and own.n_cached == 6
    assert e.relaid == [first.seq, first.seq] and e.decodes == decodes + 1
    assert e.seq_pos_min(own.seq) >= 0 and e.can_continue(own.seq, 6)  # the token was taken back
