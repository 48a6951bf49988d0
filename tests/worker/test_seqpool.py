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
