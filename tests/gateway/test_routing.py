"""The router alone: fingerprint chains, what a replica is known to hold, and each policy's choice."""

from __future__ import annotations

import pytest

from barrel_inference.gateway.routing import CHUNK_CHARS, Affinity, Candidate, Router, fingerprints
from barrel_inference.protocol import ChatMessage, Submit

SYSTEM = "You are a careful assistant. " * 120  # a long shared system prompt (~3.5 kB)


def chat(*turns: tuple[str, str], session: str | None = None, tools=None) -> Submit:
    return Submit(id="r", messages=[ChatMessage(role=r, content=c) for r, c in turns], session=session, tools=tools)


def idle(n: int = 2, n_seq_max: int = 4) -> list[Candidate]:
    return [Candidate(i, 0, n_seq_max, n_seq_max + 8) for i in range(n)]


def test_fingerprints_chain_by_message_and_by_chunk():
    one = fingerprints(chat(("user", "hello")))
    two = fingerprints(chat(("user", "hello"), ("assistant", "hi"), ("user", "more")))
    assert len(one) == 1 and len(two) == 3
    assert two[0] == one[0]  # the same first message: the same first link
    assert [link.assistant for link in two] == [False, True, False]
    assert two[0].size < two[1].size < two[2].size
    assert fingerprints(chat(("user", "hello"), tools=[{"type": "function"}]))[0] != one[0]  # tools change the prompt
    assert fingerprints(chat(("user", "hellO")))[0] != one[0]
    text = "x" * (CHUNK_CHARS * 2 + 10)
    links = fingerprints(Submit(id="p", prompt=text))
    assert len(links) == 3 and links[-1].size == len(text)
    assert fingerprints(Submit(id="p", prompt=text + "more"))[:2] == links[:2]  # a longer prompt shares the full chunks
    assert len(fingerprints(Submit(id="t", prompt_tokens=list(range(130))))) == 3
    assert fingerprints(Submit(id="p", prompt="abc"))[0] != fingerprints(chat(("user", "abc")))[0]


def test_affinity_matches_the_deepest_link_and_counts_a_generated_reply():
    aff = Affinity()
    turn1 = fingerprints(chat(("system", SYSTEM), ("user", "q1")))
    aff.record(0, turn1)
    turn2 = fingerprints(chat(("system", SYSTEM), ("user", "q1"), ("assistant", "a1 " * 300), ("user", "q2")))
    assert aff.match(0, turn2) == turn2[2].size  # system, q1 and the reply replica 0 generated
    assert aff.match(1, turn2) == 0
    other = fingerprints(chat(("system", SYSTEM), ("user", "something else")))
    assert aff.match(0, other) == other[0].size  # the shared system prompt only
    aff.drop(0)
    assert aff.match(0, turn2) == 0


def test_affinity_tables_are_bounded():
    aff = Affinity(table_size=4, sessions_size=2)
    for i in range(10):
        aff.record(0, fingerprints(chat(("user", f"m{i}"))))
        aff.pin(f"s{i}", 1)
    assert aff.entries(0) == 4
    assert aff.session("s0") is None and aff.session("s9") == 1
    assert aff.match(0, fingerprints(chat(("user", "m9")))) > 0 and aff.match(0, fingerprints(chat(("user", "m0")))) == 0


def test_affinity_policy_prefers_the_cached_replica_then_the_least_loaded():
    router = Router("affinity")
    first = chat(("system", SYSTEM), ("user", "q1"))
    route = router.choose(first, idle())
    assert route.reason == "least_loaded"
    router.affinity.record(route.index, route.links)
    turn2 = chat(("system", SYSTEM), ("user", "q1"), ("assistant", "a1"), ("user", "q2"))
    for _ in range(3):  # the idle tie-break turns over; the cached replica still wins
        assert router.choose(turn2, idle()) [:2] == (route.index, "affinity")
    # a new conversation sharing the long system prompt goes where it is cached
    assert router.choose(chat(("system", SYSTEM), ("user", "new")), idle())[:2] == (route.index, "affinity")
    # a short shared prefix does not pull unrelated requests onto one replica
    short = Router("affinity")
    r = short.choose(chat(("system", "Be brief."), ("user", "x" * 400)), idle())
    short.affinity.record(r.index, r.links)
    assert short.choose(chat(("system", "Be brief."), ("user", "y" * 400)), idle())[:2] == (1 - r.index, "least_loaded")


def test_affinity_yields_when_the_cached_replica_has_no_free_sequence():
    router = Router("affinity")
    links = fingerprints(chat(("system", SYSTEM), ("user", "q")))
    router.affinity.record(0, links)
    req = chat(("system", SYSTEM), ("user", "q"), ("assistant", "a"), ("user", "q2"))
    busy = [Candidate(0, 4, 4, 12), Candidate(1, 1, 4, 12)]
    assert router.choose(req, busy)[:2] == (1, "least_loaded")
    all_busy = [Candidate(0, 4, 4, 12), Candidate(1, 5, 4, 12)]
    assert router.choose(req, all_busy)[:2] == (0, "affinity")  # nowhere is free: keep the cache


def test_sessions_stick_while_their_replica_is_a_candidate():
    router = Router("affinity")
    r1 = router.choose(chat(("user", "a"), session="s"), idle())
    assert r1.reason == "least_loaded"
    loaded = [Candidate(r1.index, 3, 4, 12), Candidate(1 - r1.index, 0, 4, 12)]
    assert router.choose(chat(("user", "unrelated"), session="s"), loaded)[:2] == (r1.index, "session")
    # its replica is gone (dead): the session moves to a live one, and sticks there
    survivor = [Candidate(1 - r1.index, 0, 4, 12)]
    assert router.choose(chat(("user", "b"), session="s"), survivor)[:2] == (1 - r1.index, "least_loaded")
    router.affinity.drop(r1.index)
    assert router.choose(chat(("user", "c"), session="s"), idle())[:2] == (1 - r1.index, "session")
    # a replica at its limit takes nothing more, session or not
    full = [Candidate(0, 12, 4, 12), Candidate(1, 12, 4, 12)]
    full[1 - r1.index] = Candidate(1 - r1.index, 12, 4, 12)
    full[r1.index] = Candidate(r1.index, 0, 4, 12)
    assert router.choose(chat(("user", "d"), session="s"), full).index == r1.index


def test_least_loaded_orders_by_in_flight_then_waiting_then_in_turn():
    router = Router("least_loaded")
    assert router.choose(chat(("user", "x")), [Candidate(0, 3, 4, 12), Candidate(1, 1, 4, 12)]).index == 1
    assert router.choose(chat(("user", "x")), [Candidate(0, 5, 2, 12), Candidate(1, 5, 4, 12)]).index == 1  # fewer waiting
    picks = [router.choose(chat(("user", "same")), idle(3)).index for _ in range(6)]
    assert sorted(picks) == [0, 0, 1, 1, 2, 2]  # idle replicas take turns, even for the same prompt


def test_round_robin_alternates_and_ignores_affinity_and_sessions():
    router = Router("round_robin")
    req = chat(("system", SYSTEM), ("user", "q"), session="s")
    router.affinity.record(0, fingerprints(req))
    picks = [router.choose(req, idle()) for _ in range(4)]
    assert [p.index for p in picks] == [0, 1, 0, 1] and {p.reason for p in picks} == {"round_robin"}
    # replica 1 gone: the turn skips it
    assert [router.choose(req, [Candidate(0, 0, 4, 8), Candidate(2, 0, 4, 8)]).index for _ in range(3)] == [2, 0, 2]


def test_unknown_policy_is_refused():
    with pytest.raises(ValueError, match="routing"):
        Router("random")
