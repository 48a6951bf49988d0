from barrel_inference.worker.seqpool import SeqPool, common_prefix


def test_acquire_until_full_then_none():
    pool = SeqPool(2)
    a, b = pool.acquire(None), pool.acquire(None)
    assert {a.seq, b.seq} == {0, 1}
    assert pool.acquire(None) is None
    assert pool.release(a.seq, [1, 2]) is False  # the KV is kept for whoever starts the same way
    assert pool.acquire(None).seq == a.seq
    assert pool.release(b.seq, None) is True  # unknown contents: the caller clears the KV


def test_the_free_sequence_sharing_the_longest_prefix_is_chosen():
    pool = SeqPool(3)
    leases = [pool.acquire(None) for _ in range(3)]
    pool.release(leases[0].seq, [1, 2, 3])
    pool.release(leases[1].seq, [1, 2, 9, 9])
    pool.release(leases[2].seq, [7, 7])
    got = pool.acquire(None, [1, 2, 9, 4])
    assert got.seq == leases[1].seq and got.cached == [1, 2, 9, 9]
    got = pool.acquire(None, [7, 7, 7])
    assert got.seq == leases[2].seq
    got = pool.acquire(None, [5])  # nothing matches: the remaining one
    assert got.seq == leases[0].seq


def test_without_a_match_the_least_recently_used_cache_is_given_up():
    pool = SeqPool(2)
    a = pool.acquire(None)
    pool.release(a.seq, [1])
    b = pool.acquire(None)  # a's cache matches nothing here, but b must not take a's: b is unused
    assert b.seq != a.seq
    pool.release(b.seq, [2])
    c = pool.acquire(None, [3])
    assert c.seq == a.seq  # a was used least recently


def test_session_keeps_its_sequence_and_tokens():
    pool = SeqPool(2)
    lease = pool.acquire("s")
    assert pool.release(lease.seq, [5, 6, 7]) is False
    other = pool.acquire(None, [5, 6, 7])  # a matching prefix does not take a pinned sequence while another is free
    assert other.seq != lease.seq
    again = pool.acquire("s")
    assert again.seq == lease.seq and again.cached == [5, 6, 7]


def test_pinned_idle_sequences_are_evicted_lru_when_needed():
    pool = SeqPool(2)
    s1 = pool.acquire("s1")
    pool.release(s1.seq, [1])
    s2 = pool.acquire("s2")
    pool.release(s2.seq, [2])
    third = pool.acquire(None)
    assert third.seq == s1.seq and third.cached == []  # s1 was least recently used; its cache is not reused
    assert pool.acquire("s1").seq == s2.seq  # s1 lost its seq; s2's is the only free one
    assert pool.acquire("s2") is None


def test_end_session_unpins():
    pool = SeqPool(1)
    lease = pool.acquire("s")
    pool.release(lease.seq, [1])
    assert pool.end_session("s") == lease.seq
    assert pool.acquire("s").cached == []


def test_common_prefix():
    assert common_prefix([1, 2, 3], [1, 2, 4]) == 2
    assert common_prefix([], [1]) == 0
    assert common_prefix([1, 2], [1, 2, 3]) == 2
