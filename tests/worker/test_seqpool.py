from barrel_inference.worker.seqpool import SeqPool


def test_acquire_until_full_then_none():
    pool = SeqPool(2)
    a, b = pool.acquire(None), pool.acquire(None)
    assert {a.seq, b.seq} == {0, 1}
    assert pool.acquire(None) is None
    assert pool.release(a.seq, [1, 2]) is True  # unpinned: the caller clears the KV
    assert pool.acquire(None).seq == a.seq


def test_session_keeps_its_sequence_and_tokens():
    pool = SeqPool(2)
    lease = pool.acquire("s")
    assert pool.release(lease.seq, [5, 6, 7]) is False  # pinned: KV kept
    again = pool.acquire("s")
    assert again.seq == lease.seq and again.cached == [5, 6, 7]


def test_pinned_idle_sequences_are_evicted_lru_when_needed():
    pool = SeqPool(2)
    s1 = pool.acquire("s1")
    pool.release(s1.seq, [1])
    s2 = pool.acquire("s2")
    pool.release(s2.seq, [2])
    third = pool.acquire(None)
    assert third.seq == s1.seq and third.cached == []  # s1 was least recently used
    assert pool.acquire("s1").seq == s2.seq  # s1 lost its seq; s2's is the only free one
    assert pool.acquire("s2") is None


def test_end_session_unpins():
    pool = SeqPool(1)
    lease = pool.acquire("s")
    pool.release(lease.seq, [1])
    assert pool.end_session("s") == lease.seq
    assert pool.acquire("s").cached == []
