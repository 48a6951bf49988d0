"""What a request commits to the worker's cache (CacheInfo.committed_tokens) and pinned caches
(Submit.pin_ttl_s): retention drops unpinned caches first and a pinned one only after its pin ran out.

The scheduler runs the fake engine (per-sequence KV bookkeeping like llama.cpp's); the pool and the
RAM tier get a fake clock.
"""

from __future__ import annotations

import time

from barrel_inference.protocol import FinishReason
from barrel_inference.worker.fake import FakeEngine
from barrel_inference.worker.kvreuse import KvReuse
from barrel_inference.worker.kvstore import KvStore
from barrel_inference.worker.seqpool import SeqPool

from .harness import Running, make_request


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


# ---- the pool ------------------------------------------------------------------------------------


def test_retention_skips_a_pinned_cache_until_its_pin_runs_out():
    clock = Clock()
    pool = SeqPool(3, clock)
    a, b, c = (pool.acquire(None, [k, 1, 2]) for k in (10, 20, 30))
    pool.tick += 1
    pool.release(a.seq, [10] * 30, pin_ttl_s=300)
    pool.release(b.seq, [20] * 30)
    pool.release(c.seq, [30] * 30)
    pool.tick += 1  # a later round: the releases above are no longer protected
    assert [s.seq for s in pool.over_retention(40)] == [b.seq]  # A is older, but pinned: B goes instead
    clock.now += 301
    assert [s.seq for s in pool.over_retention(40)] == [a.seq, b.seq]  # the pin ran out: oldest first again


def test_without_a_pin_the_oldest_cache_goes_first():
    pool = SeqPool(3, Clock())
    plans = [pool.acquire(None, [k, 1, 2]) for k in (10, 20, 30)]
    for p, k in zip(plans, (10, 20, 30)):
        pool.release(p.seq, [k] * 30)
    pool.tick += 1
    assert [s.seq for s in pool.over_retention(40)] == [plans[0].seq, plans[1].seq]


def test_a_sequence_released_in_this_round_is_not_dropped_in_it():
    pool = SeqPool(3, Clock())
    plans = [pool.acquire(None, [k, 1, 2]) for k in (10, 20, 30)]
    pool.tick += 1
    pool.release(plans[0].seq, [10] * 30)
    pool.tick += 1
    pool.release(plans[1].seq, [20] * 30)
    pool.release(plans[2].seq, [30] * 30)
    # B was released in this round: only A (an earlier round's) may go, however far over the limit
    assert [s.seq for s in pool.over_retention(0)] == [plans[0].seq]


def test_a_newcomer_overwrites_an_unpinned_cache_before_a_pinned_older_one():
    clock = Clock()
    pool = SeqPool(2, clock)
    a, b = pool.acquire(None, [10, 1]), pool.acquire(None, [20, 1])
    pool.release(a.seq, [10, 1, 5], pin_ttl_s=60)
    pool.release(b.seq, [20, 1, 5])
    plan = pool.acquire(None, [30, 1])
    assert plan.seq == b.seq and plan.evict.tokens == [20, 1, 5] and plan.evict.pin_until == 0.0
    pool.release(plan.seq, [30, 1, 5])
    clock.now += 61
    assert pool.acquire(None, [40, 1]).seq == a.seq  # the pin ran out: the least recently used goes


def test_the_ram_tier_spills_unpinned_entries_first():
    clock = Clock()
    store = KvStore(namespace={"m": "x"}, ram_bytes=20, clock=clock)
    store.put([1] * 20, b"a" * 10, pin_until=clock.now + 300)
    store.put([2] * 20, b"b" * 10)
    store.put([3] * 20, b"c" * 10)  # over the budget: the unpinned older entry goes, not the pinned oldest
    assert store.find([1] * 20)[1] == 20 and store.find([2] * 20)[1] == 0 and store.find([3] * 20)[1] == 20
    clock.now += 301
    store.put([4] * 20, b"d" * 10)
    assert store.find([1] * 20)[1] == 0  # the pin ran out: the oldest went


# ---- the scheduler: committed tokens and pins end to end --------------------------------------------------


def _settle(s, c):
    """Wait until every sequence is released (a finished request's last token enters the cache a tick later)."""
    c.wait_for(lambda: s.pool.n_busy == 0 and not s.active)


def _run(s, c, eng, rid, prompt, pin=0.0, max_tokens=4):
    req = make_request(eng, rid, prompt, max_tokens=max_tokens)
    req.pin_ttl_s = pin
    s.submit(req)
    c.wait([rid])
    _settle(s, c)
    return c.done()[rid]


def test_committed_tokens_are_the_evaluated_prompt_of_a_kept_sequence():
    eng = FakeEngine(n_seq_max=2)
    with Running(eng) as (s, c):
        first = _run(s, c, eng, "a1", "alpha says hello")
        assert first.finish_reason is FinishReason.LENGTH
        assert first.cache.committed_tokens == first.cache.evaluated_tokens == len("alpha says hello")
        prompt2 = "alpha says hello" + c.text("a1") + " and more"
        second = _run(s, c, eng, "a2", prompt2)
        assert second.usage.cached_tokens == len("alpha says hello") + 4  # the turn before, its reply included
        assert second.cache.committed_tokens == len(prompt2) - second.usage.cached_tokens > 0


def test_a_failed_request_commits_nothing():
    class FailOnce(FakeEngine):
        failed = False

        def decode(self, tokens, pos, seqs, logits):
            if not self.failed and len(tokens) > 1:
                self.failed = True
                return -3
            return super().decode(tokens, pos, seqs, logits)

    eng = FailOnce(n_seq_max=2)
    with Running(eng) as (s, c):
        bad = _run(s, c, eng, "bad", "bravo fails here")
        assert bad.finish_reason is FinishReason.ERROR and bad.cache.committed_tokens == 0
        good = _run(s, c, eng, "good", "bravo fails here")
        assert good.cache.committed_tokens == len("bravo fails here")


def _three_conversations(pin_a: float, clock: Clock):
    eng = FakeEngine(n_seq_max=3)
    reuse = KvReuse(eng, n_seq=3, max_retained_tokens=40, clock=clock)  # no tiers: a dropped cache is gone
    run = Running(eng, reuse=reuse)
    s, c = run.__enter__()
    try:
        a1 = _run(s, c, eng, "a1", "alpha conversation one", pin=pin_a)
        _run(s, c, eng, "b1", "bravo conversation one")
        _run(s, c, eng, "c1", "charlie conversation 1")  # three idle caches of 26 tokens: over the limit of 40
        a2 = _run(s, c, eng, "a2", "alpha conversation one" + c.text("a1") + " two")
        b2 = _run(s, c, eng, "b2", "bravo conversation one" + c.text("b1") + " two")
    finally:
        run.__exit__(None, None, None)
    return a1, a2, b2


def test_a_pinned_conversation_survives_retention_that_drops_an_unpinned_one():
    a1, a2, b2 = _three_conversations(pin_a=300.0, clock=Clock())
    assert a2.usage.cached_tokens == a1.usage.prompt_tokens + 4  # A's cache was kept: its next turn reads it
    assert b2.usage.cached_tokens == 0 and b2.cache.kind == "cold"  # B's went instead


def test_without_the_pin_the_same_conversation_is_dropped():
    _, a2, _ = _three_conversations(pin_a=0.0, clock=Clock())
    assert a2.usage.cached_tokens == 0


def test_after_its_ttl_a_pinned_cache_can_be_dropped():
    clock = Clock()
    eng = FakeEngine(n_seq_max=3)
    reuse = KvReuse(eng, n_seq=3, max_retained_tokens=40, clock=clock)
    with Running(eng, reuse=reuse) as (s, c):
        _run(s, c, eng, "a1", "alpha conversation one", pin=300.0)
        _run(s, c, eng, "b1", "bravo conversation one")
        clock.now += 301  # A's pin ran out
        _run(s, c, eng, "c1", "charlie conversation 1")
        a2 = _run(s, c, eng, "a2", "alpha conversation one" + c.text("a1") + " two")
    assert a2.usage.cached_tokens == 0


def test_pin_ttl_reaches_the_request_from_submit():
    from barrel_inference.protocol import Submit
    from barrel_inference.worker.server import WorkerServer
    from barrel_inference.worker.templates import ChatTemplate

    eng = FakeEngine()
    server = WorkerServer(eng, ChatTemplate.choose(None, None, "fake", "", ""), model="m", bind="inproc://pins", n_ctx=512)
    got = []
    server.scheduler.submit = got.append  # the prepared request, as the scheduler would get it
    server._prepare(b"p", Submit(id="r", prompt="hello", max_tokens=2, pin_ttl_s=3600.0))
    deadline = time.monotonic() + 5
    while not got and time.monotonic() < deadline:
        time.sleep(0.01)
    assert got and got[0].pin_ttl_s == 3600.0
