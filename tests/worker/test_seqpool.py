import pytest

from barrel_inference.worker.seqpool import SeqPool, common_prefix

BOS = 2


def test_acquire_until_full_then_none():
    pool = SeqPool(2)
    a, b = pool.acquire(None), pool.acquire(None)
    assert {a.seq, b.seq} == {0, 1}
    assert pool.acquire(None) is None
    assert pool.release(a.seq, [1, 2]) is False  # the KV is kept for whoever starts the same way
    assert pool.acquire(None, [1, 2, 3]).seq == a.seq
    assert pool.release(b.seq, None) is True  # unknown contents: the caller clears the KV


def test_two_conversations_a_b_a_keep_both_caches():
    """A's turn 1, B's turn 1, A's turn 2: B must not take A's sequence because both start with BOS."""
    pool = SeqPool(4)
    a1 = [BOS, 10, 11, 12, 13]
    pa = pool.acquire(None, a1)
    pool.release(pa.seq, a1 + [50, 51])
    b1 = [BOS, 20, 21, 22]
    pb = pool.acquire(None, b1)
    assert pb.seq != pa.seq and pb.evict is None  # an empty sequence, A's cache untouched
    assert pb.copy_from == pa.seq and pb.copy_n == 1  # only the shared BOS is copied, never taken
    pool.release(pb.seq, b1 + [60])
    a2 = a1 + [50, 51, 14, 15]
    again = pool.acquire(None, a2)
    assert again.seq == pa.seq and again.kind == "prefix" and again.keep == len(a1) + 2
    b2 = b1 + [60, 23]
    pool.release(again.seq, a2)
    bb = pool.acquire(None, b2)
    assert bb.seq == pb.seq and bb.keep == len(b1) + 1


def test_the_longest_prefix_of_any_sequence_is_copied_into_an_empty_one():
    pool = SeqPool(3)
    p0, p1 = pool.acquire(None, [1, 2, 3]), pool.acquire(None, [1, 2, 9, 9])
    pool.release(p0.seq, [1, 2, 3])
    pool.release(p1.seq, [1, 2, 9, 9])
    got = pool.acquire(None, [1, 2, 9, 4])  # diverges from both: neither cache is given up
    assert got.seq not in (p0.seq, p1.seq) and got.copy_from == p1.seq and got.copy_n == 3 and got.kind == "copy"
    assert got.evict is None


def test_a_busy_sequence_shares_its_committed_prefix():
    pool = SeqPool(2)
    busy = pool.acquire(None, [1, 2, 3, 4, 5, 6])
    live = {busy.seq: ([1, 2, 3, 4, 5, 6], 4)}  # 4 of its prompt tokens are in the KV so far
    got = pool.acquire(None, [1, 2, 3, 4, 5, 6, 7], live)
    assert got.copy_from == busy.seq and got.copy_n == 4
    assert pool.best_prefix([1, 2, 3, 9], live) == 3


def test_when_all_are_taken_the_least_recently_used_cache_is_evicted_and_handed_back():
    pool = SeqPool(2)
    pa = pool.acquire(None, [BOS, 1])
    pool.release(pa.seq, [BOS, 1, 1])
    pb = pool.acquire(None, [BOS, 2])
    pool.release(pb.seq, [BOS, 2, 2])
    pc = pool.acquire(None, [BOS, 3])
    assert pc.seq == pa.seq and pc.evict is not None and pc.evict.tokens == [BOS, 1, 1] and pc.keep == 1
    # the evicted conversation comes back: B's cache is now the least recently used
    pool.release(pc.seq, [BOS, 3])
    again = pool.acquire(None, [BOS, 1, 1, 4])
    assert again.seq == pb.seq and again.evict.tokens == [BOS, 2, 2]


def test_session_keeps_its_sequence_and_tokens():
    pool = SeqPool(2)
    lease = pool.acquire("s", [5])
    assert pool.release(lease.seq, [5, 6, 7]) is False
    other = pool.acquire(None, [5, 6, 7, 8])  # another session's cache is copied from, never taken
    assert other.seq != lease.seq and other.copy_from == lease.seq and other.copy_n == 3
    pool.release(other.seq, [9])
    again = pool.acquire("s", [5, 6, 7, 1])
    assert again.seq == lease.seq and again.kind == "sticky" and again.keep == 3


def test_a_second_request_of_a_busy_session_copies_the_prefix():
    pool = SeqPool(3)
    first = pool.acquire("s", [1, 2, 3, 4])
    second = pool.acquire("s", [1, 2, 3, 5], {first.seq: ([1, 2, 3, 4], 4)})
    assert second.seq != first.seq and second.copy_from == first.seq and second.copy_n == 3
    assert pool.session_seq("s") == second.seq  # the latest turn owns the session


def test_pinned_idle_sequences_are_reclaimed_lru_rather_than_waiting():
    pool = SeqPool(2)
    s1 = pool.acquire("s1", [1])
    pool.release(s1.seq, [1, 1])
    s2 = pool.acquire("s2", [2])
    pool.release(s2.seq, [2, 2])
    third = pool.acquire(None, [3])
    assert third.seq == s1.seq and third.evict.session == "s1"  # least recently used
    assert pool.session_seq("s1") is None
    back = pool.acquire("s1", [1, 1, 5])
    assert back.seq == s2.seq and back.evict.session == "s2"
    assert pool.acquire("s2", [2]) is None


def test_retention_bound_drops_least_recently_used_idle_caches():
    pool = SeqPool(3)
    leases = [pool.acquire(None, [i]) for i in range(3)]
    for i, lease in enumerate(leases):
        pool.release(lease.seq, [i] * 10)
    assert pool.retained() == 30
    assert pool.over_retention(15) == []  # released in this round: kept through it (test_cache_pins)
    pool.tick += 1
    drop = pool.over_retention(15)
    assert [s.seq for s in drop] == [leases[0].seq, leases[1].seq]
    assert pool.over_retention(30) == []
    assert [s.seq for s in pool.over_retention(0)] == [leases[0].seq, leases[1].seq]  # the latest stays


def test_end_session_unpins():
    pool = SeqPool(1)
    lease = pool.acquire("s", [1])
    pool.release(lease.seq, [1])
    assert pool.end_session("s") == lease.seq
    assert pool.acquire("s", [1, 2]).keep == 0


def test_common_prefix():
    assert common_prefix([1, 2, 3], [1, 2, 4]) == 2
    assert common_prefix([], [1]) == 0
    assert common_prefix([1, 2], [1, 2, 3]) == 2
    long = list(range(2000))
    assert common_prefix(long, long[:1500] + [-1]) == 1500
    assert common_prefix(long, long, 700) == 700


def test_a_prefix_that_cannot_be_continued_is_neither_copied_nor_kept():
    """A sliding-window cache keeps only the latest positions of a long sequence, so a short prefix
    of it cannot be continued (the engine's can_share says so): the pool copies from a sequence
    that can share, else nothing, and hands the target's cache over to be saved."""
    pool = SeqPool(3)
    system = [BOS] + list(range(10, 30))
    long_conv = system + list(range(100, 160))  # ran far past the shared prefix
    short_conv = system + [200, 201]
    for toks in (long_conv, short_conv):
        p = pool.acquire(None, toks)
        pool.release(p.seq, toks)
    long_seq = next(s.seq for s in pool.slots if s.tokens == long_conv)
    short_seq = next(s.seq for s in pool.slots if s.tokens == short_conv)

    def shareable(seq, n):  # the long sequence holds only its last 40 positions
        return seq != long_seq or n >= len(long_conv) - 40

    newcomer = system + [300, 301]
    plan = pool.acquire("new", newcomer, shareable=shareable)
    assert plan.copy_from == short_seq and plan.copy_n == len(system)
    pool.release(plan.seq, newcomer)
    # without a sequence that can share, nothing is copied (without the check: the long one)
    plan = SeqPool(2)
    p = plan.acquire(None, long_conv)
    plan.release(p.seq, long_conv)
    fresh = plan.acquire(None, system + [400], shareable=lambda s, n: n >= len(long_conv) - 40)
    assert fresh.copy_n == 0 and fresh.kind == "cold"
    # the target's own prefix is not kept when it cannot be continued; its cache goes to a tier
    full = SeqPool(1)
    p = full.acquire(None, long_conv)
    full.release(p.seq, long_conv)
    other = full.acquire(None, system + [500], shareable=lambda s, n: n >= len(long_conv) - 40)
    assert other.keep == 0 and other.kind == "cold"
    assert other.evict is not None and other.evict.tokens == long_conv


def test_prefixes_count_up_to_all_but_the_last_prompt_token():
    pool = SeqPool(2)
    toks = [BOS, 5, 6, 7]
    p = pool.acquire(None, toks)
    pool.release(p.seq, toks)
    seen = []
    again = pool.acquire(None, toks, shareable=lambda s, n: seen.append(n) or True)
    assert again.keep == len(toks) - 1 and seen == [len(toks) - 1]


def test_idle_sequences_hold_caches_but_never_run_more_than_max_busy():
    pool = SeqPool(3, max_busy=1)
    a = pool.acquire("a", [BOS, 1, 2])
    assert pool.acquire("b", [BOS, 5, 6]) is None  # two sequences are free, but one runs at a time
    pool.release(a.seq, [BOS, 1, 2, 3])
    b = pool.acquire("b", [BOS, 5, 6])
    assert b.seq != a.seq and b.evict is None  # an empty sequence: a's cache stays where it is
    pool.release(b.seq, [BOS, 5, 6, 7])
    c = pool.acquire("c", [BOS, 8])
    pool.release(c.seq, [BOS, 8, 9])
    again = pool.acquire("a", [BOS, 1, 2, 3, 4])
    assert again.seq == a.seq and again.kind == "sticky" and again.keep == 4


@pytest.mark.parametrize("neighbours, want", [(True, 2), (False, 3)])
def test_with_a_buffer_per_sequence_an_empty_sequence_next_to_a_busy_one_is_taken_first(neighbours, want):
    """llama.cpp decodes each run of consecutive running sequence ids as a pass of its own: with
    0 and 1 running, sequence 2 keeps one run where 3 (used longer ago) would make two."""
    pool = SeqPool(4, neighbours=neighbours)
    for _ in range(3):
        pool.acquire(None, [1, 2, 3])
    assert pool.release(2, None)  # 2 is empty again, and used more recently than 3
    plan = pool.acquire(None, [9, 9, 9])
    assert plan.seq == want and plan.kind == "cold"


@pytest.mark.parametrize("neighbours", [True, False])
def test_with_a_buffer_per_sequence_a_session_cache_away_from_the_running_ones_is_copied_next_to_them(neighbours):
    pool = SeqPool(4, neighbours=neighbours)
    conv = [BOS, 5, 6, 7]
    assert [pool.acquire("S", conv).seq] + [pool.acquire(None, [BOS, 50 + i]).seq for i in range(3)] == [0, 1, 2, 3]
    pool.release(0, conv)  # S's cache at 0; 1 and 2 empty; 3 runs
    assert pool.release(1, None) and pool.release(2, None)
    plan = pool.acquire("S", conv + [8, 9])
    if neighbours:  # 0 would be a run of its own: the cache is copied into 2, next to 3
        assert (plan.seq, plan.kind, plan.copy_from, plan.copy_n, plan.keep) == (2, "copy", 0, 4, 0)
    else:
        assert (plan.seq, plan.kind, plan.keep) == (0, "sticky", 4)
    assert pool.session_seq("S") == plan.seq


@pytest.mark.parametrize("finishing, want", [(False, (2, "copy")), (True, (0, "sticky"))])
def test_a_sequence_only_finishing_its_last_token_is_not_a_running_neighbour(finishing, want):
    """3's request is answered and only its last token is still to enter the cache: it is idle a
    row later, so S's cache at 0 stays where it is rather than being copied next to 3 (a copy of
    the whole conversation, and a checkpoint of it, for nothing)."""
    pool = SeqPool(4, neighbours=True)
    conv = [BOS, 5, 6, 7]
    assert [pool.acquire("S", conv).seq] + [pool.acquire(None, [BOS, 50 + i]).seq for i in range(3)] == [0, 1, 2, 3]
    pool.release(0, conv)
    assert pool.release(1, None) and pool.release(2, None)
    if finishing:
        pool.finishing(3)
    plan = pool.acquire("S", conv + [8, 9])
    assert (plan.seq, plan.kind) == want
    assert pool.slots[3].busy  # still busy until its last token is in
    pool.release(3, [BOS, 53, 1])
    assert not pool.slots[3].finishing
