"""Checkpoints of shared prefixes (worker/kvreuse.py) on the fake engine, given a sliding window:
a cache can be shared only near its end. A newcomer whose prompt shares a long prefix with a
conversation that has gone on past it recomputes it, stopping its prefill at the shared length to
save a state there; the next newcomer restores it. (Numerics on Gemma 3: test_kv_reuse_gemma.py.)"""

from __future__ import annotations

import json

import pytest

from barrel_inference.worker.fake import FakeEngine
from barrel_inference.worker.kvreuse import MIN_CHECKPOINT, KvReuse
from barrel_inference.worker.kvstore import KvStore

from .harness import Running, make_request

SYSTEM = "You are a terse assistant. " * 24  # 648 tokens (bytes), shared by every conversation


class WindowEngine(FakeEngine):
    """A fake whose caches can be continued or shared only within `reach` of their end, as a
    sliding window's, and whose copies and saved states carry what the sequence held."""

    reach = 64

    def __init__(self, n_swa: int, **kw):
        super().__init__(**kw)
        self.n_swa = n_swa
        self.prefill_ends: list[tuple[int, int]] = []  # (seq, position after the batch's last row of it)

    def decode(self, tokens, pos, seqs, logits) -> int:
        ends: dict[int, int] = {}
        for p, q in zip(pos, seqs):
            ends[q] = max(ends.get(q, 0), p + 1)
        self.prefill_ends += [(q, n) for q, n in ends.items()]
        return super().decode(tokens, pos, seqs, logits)

    def can_share(self, seq: int, n: int) -> bool:
        return not self.n_swa or len(self._match[seq]) - 1 - n < self.reach

    def seq_copy(self, src: int, dst: int, n: int) -> None:
        self._match[dst] = list(self._match[src][: n + 1])

    def state_seq_save(self, seq: int) -> bytes:
        return b"fs:" + json.dumps(self._match[seq]).encode()

    def state_seq_load(self, seq: int, data) -> bool:
        self._match[seq] = json.loads(bytes(data)[3:])
        return True


def run(n_swa: int) -> tuple[dict, WindowEngine, KvReuse]:
    e = WindowEngine(n_swa, n_seq_max=2)
    kv = KvReuse(e, n_seq=e.n_seq_total, max_busy=e.n_seq_max,
                 store=KvStore(namespace={"m": 1}, ram_bytes=1 << 24, disk_bytes=0, directory=None))  # fmt: skip
    done = {}
    with Running(e, prefill_chunk=256, reuse=kv) as (s, c):
        for rid, user in (("x", "x: " + "tell me more. " * 20), ("y", "y: " + "and more. " * 20), ("z", "z: hi")):
            s.submit(make_request(e, rid, SYSTEM + user, max_tokens=4, session=rid))
            c.wait([rid])
            done[rid] = c.done()[rid]
    return done, e, kv


def test_the_first_newcomer_checkpoints_the_shared_prefix_and_the_next_restores_it():
    done, e, kv = run(n_swa=64)
    b = len(SYSTEM)  # "x: " / "y: " / "z: " differ at once
    assert b >= MIN_CHECKPOINT
    assert done["y"].cache.kind == "cold"  # x had gone on past the shared prompt: no copy
    # y's prefill stopped at the shared length (chunks of 256 from 0 would not end there)
    assert b % 256 and any(n == b for _, n in e.prefill_ends)
    assert kv.stats()["checkpoints"] == 1
    assert (done["z"].cache.kind, done["z"].usage.cached_tokens) == ("ram", b)


def test_without_a_window_nothing_is_checkpointed_for_a_copy_serves_newcomers():
    done, e, kv = run(n_swa=0)
    assert "checkpoints" not in kv.stats()
    assert done["y"].cache.kind == "copy" and done["z"].cache.kind in ("copy", "prefix")
    assert done["z"].usage.cached_tokens >= len(SYSTEM)


@pytest.mark.parametrize("restore_up_to", [0, 600])
def test_no_checkpoint_longer_than_the_tiers_keep(restore_up_to):
    e = WindowEngine(64, n_seq_max=2)
    store = KvStore(namespace={"m": 1}, ram_bytes=1 << 24, disk_bytes=0, directory=None)
    kv = KvReuse(e, n_seq=e.n_seq_total, max_busy=e.n_seq_max, store=store, restore_up_to=restore_up_to)
    assert kv.checkpoints is (restore_up_to != 0)  # a limit of 0 turns the tiers off
    with Running(e, prefill_chunk=256, reuse=kv) as (s, c):
        for rid, user in (("x", "x: " + "tell me more. " * 20), ("y", "y: hello")):
            s.submit(make_request(e, rid, SYSTEM + user, max_tokens=4, session=rid))
            c.wait([rid])
    assert kv.n_checkpoints == 0


def test_a_copied_prefix_is_checkpointed_before_its_source_goes_on():
    """y copies the shared prompt from x while x's cache still reaches back to it, and keeps it as a
    checkpoint then (the copy is made by a one-token decode, taken back): once x and y have both
    gone on past it, z restores it instead of recomputing it (without that checkpoint z would be
    the first to find the prompt out of reach, and recompute it)."""
    e = WindowEngine(64, n_seq_max=2)
    kv = KvReuse(e, n_seq=e.n_seq_total, max_busy=e.n_seq_max,
                 store=KvStore(namespace={"m": 1}, ram_bytes=1 << 24, disk_bytes=0, directory=None))  # fmt: skip
    done, prompts = {}, {}
    with Running(e, prefill_chunk=256, reuse=kv) as (s, c):

        def turn(rid: str, session: str, prompt: str) -> None:
            prompts[rid] = prompt
            s.submit(make_request(e, rid, prompt, max_tokens=4, session=session))
            c.wait([rid])
            done[rid] = c.done()[rid]

        turn("x1", "x", SYSTEM + "x: hi")
        turn("y1", "y", SYSTEM + "y: hi")
        assert kv.stats()["checkpoints"] == 1  # made at y1's copy
        for k in ("x", "y"):  # both go on well past the shared prompt
            turn(k + "2", k, prompts[k + "1"] + c.text(k + "1") + " and more." * 20)
        turn("z1", "z", SYSTEM + "z: hi")
    assert done["y1"].cache.kind == "copy"
    assert [done[k].cache.kind for k in ("x2", "y2")] == ["sticky", "sticky"]
    assert done["z1"].cache.kind == "ram" and done["z1"].usage.cached_tokens == len(SYSTEM)
    assert kv.stats()["checkpoints"] == 1


def test_a_request_whose_checkpoint_lost_its_cache_is_recomputed():
    """Fault injection: relaying before a checkpoint is saved fails and clears the sequence
    (llama.cpp refusing the load), once at y's copy, then again where its prefill stops to save
    the prefix it shares: each time y starts over, and is answered in full, never continued on
    nothing."""

    class Refusing(WindowEngine):
        def seq_relayout(self, seq: int) -> bool:
            self.seq_clear(seq)
            return False

    e = Refusing(64, n_seq_max=2)
    kv = KvReuse(e, n_seq=e.n_seq_total, max_busy=e.n_seq_max, relayout=True,
                 store=KvStore(namespace={"m": 1}, ram_bytes=1 << 24, disk_bytes=0, directory=None))  # fmt: skip
    with Running(e, prefill_chunk=256, reuse=kv) as (s, c):
        s.submit(make_request(e, "x", SYSTEM + "x: hi", max_tokens=4, session="x"))
        c.wait(["x"])
        s.submit(make_request(e, "y", SYSTEM + "y: hi", max_tokens=4, session="y"))
        c.wait(["y"])
        y = c.done()["y"]
    assert y.error is None and y.cache.kind == "cold" and y.usage.cached_tokens == 0
    assert y.usage.completion_tokens == 4
    assert kv.stats()["relayouts_failed"] == 2 and kv.stats()["checkpoints"] == 0
    assert kv.stats()["hits"]["copy"] == 0 and kv.stats()["hits"]["cold"] == 2


def test_find_skips_a_longer_entry_that_cannot_be_cut_back():
    """A conversation's saved state shares the whole system prompt with a newcomer, and so does a
    checkpoint of that prompt; only the checkpoint can be continued there (`usable`)."""
    store = KvStore(namespace={"m": 1}, ram_bytes=1 << 20, disk_bytes=0, directory=None)
    system = [7] * 300
    store.put(system + [1] * 200, b"conversation", pos_min=300)
    store.put(system, b"checkpoint", pos_min=0)
    newcomer = system + [2] * 10
    whole, n = store.find(newcomer)
    assert (store.take(whole), n) == (b"conversation", 300)  # a tie: the first entry found stands
    usable = lambda entry, k: entry.pos_min <= k - 256  # noqa: E731  (a window of 256)
    found, n = store.find(newcomer, usable)
    assert (store.take(found), n) == (b"checkpoint", 300)
