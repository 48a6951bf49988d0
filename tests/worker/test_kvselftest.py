"""The KV self-test's bookkeeping (worker/kvselftest.py) on a stub engine whose restored logits
differ the way llama.cpp's do: only at more than one thread (flash attention's per-thread shares
of a moved window), or at any thread count (a state that lacks cells); and the limit each
kv_restore policy gives the tiers, down to the worker server."""

from __future__ import annotations

import numpy as np
import pytest

from barrel_inference.worker.fake import FakeEngine
from barrel_inference.worker.kvselftest import relays, restore_limit, state_selftest


class StubEngine:
    """n_swa 512; a sequence restored from a state saved past the window gives other logits: at
    more than one thread ("split"), at any ("lossy"), or never ("exact"). Two sequences, a buffer
    each: seq_relayout lays a sequence out as a restore does (or, relays=False, does nothing)."""

    n_swa, n_ctx, n_batch, n_vocab, flash_attn = 512, 4096, 512, 64, "on"
    n_seq_total, kv_unified = 2, False

    def __init__(self, kind: str, relays: bool = True):
        self.kind = kind
        self.relays = relays
        self.threads: int | None = None
        self.thread_calls: list[int | None] = []
        self.ns = [0, 0]  # positions each sequence holds
        self.restored = [False, False]  # laid out as a restore lays it out, and not grown since
        self.out = np.zeros(self.n_vocab, dtype=np.float32)

    @property
    def n(self) -> int:
        return self.ns[0]

    def is_eog(self, token: int) -> bool:
        return token == 0

    def set_threads(self, n: int | None) -> None:
        self.threads = n
        self.thread_calls.append(n)

    def decode(self, tokens, pos, seqs, logits) -> int:
        s = seqs[0]
        assert pos[0] == self.ns[s], "the probe decodes its positions in order"
        if len(tokens) > 1:
            self.restored[s] = False
        self.ns[s] = n = pos[-1] + 1
        moved = self.restored[s] and n - 1 > self.n_swa
        off = (self.kind == "split" and self.threads != 1) or self.kind == "lossy"
        self.out = np.full(self.n_vocab, float(n), dtype=np.float32) + (0.5 if moved and off else 0.0)
        return 0

    def logits(self, row: int) -> np.ndarray:
        return self.out

    def seq_truncate(self, seq: int, keep: int) -> bool:
        self.ns[seq] = min(self.ns[seq], keep)
        return True

    def seq_clear(self, seq: int) -> None:
        self.ns[seq], self.restored[seq] = 0, False

    def seq_relayout(self, seq: int) -> bool:
        if self.relays:
            self.restored[seq] = True
        return True

    def state_seq_save(self, seq: int) -> bytes:
        return self.ns[seq].to_bytes(4, "little")

    def state_seq_load(self, seq: int, data: bytes) -> bool:
        self.ns[seq], self.restored[seq] = int.from_bytes(data, "little"), True
        return True


@pytest.mark.parametrize(
    ("kind", "exact_up_to", "complete_up_to", "at_576"),
    [
        ("exact", None, None, (True, True)),
        ("split", 512, None, (False, True)),  # Gemma 3 with flash attention on, at two threads
        ("lossy", 512, 512, (False, False)),
    ],
)
def test_selftest_tells_a_state_summed_in_other_shares_from_one_that_lacks_cells(kind, exact_up_to, complete_up_to, at_576):
    e = StubEngine(kind)
    got = state_selftest(e)
    assert [p["tokens"] for p in got["probes"]] == [512, 576]
    assert (got["exact_up_to"], got["complete_up_to"]) == (exact_up_to, complete_up_to)
    assert (got["probes"][1]["exact"], got["probes"][1]["complete"]) == at_576
    assert got["probes"][0]["exact"] and got["probes"][0]["complete"]
    assert 1 in e.thread_calls and e.threads is None  # it decoded at one thread and gave the engine its own back
    assert e.ns == [0, 0]  # the probe sequences are cleared


def test_without_a_sliding_window_complete_is_exact_and_no_decode_runs_at_one_thread():
    """A state of a model without a window leaves no cell out: the one-thread question (seconds
    per decode for a large model on a CPU) is not asked."""
    e = StubEngine("exact")
    e.n_swa = 0
    got = state_selftest(e)
    assert [p["tokens"] for p in got["probes"]] == [256]
    assert got["probes"][0]["exact"] and got["probes"][0]["complete"]
    assert (got["exact_up_to"], got["complete_up_to"]) == (None, None)
    assert 1 not in e.thread_calls


@pytest.mark.parametrize(
    ("selftest", "policy", "limit"),
    [
        (None, "exact", None),
        (None, "complete", None),
        ({"exact_up_to": None, "complete_up_to": None}, "exact", None),
        ({"exact_up_to": 512, "complete_up_to": None}, "exact", 512),
        ({"exact_up_to": 512, "complete_up_to": None}, "complete", None),
        ({"exact_up_to": 512, "complete_up_to": 512}, "complete", 512),
        ({"exact_up_to": 0, "complete_up_to": 0}, "complete", 0),
        ({"exact_up_to": 512}, "complete", 512),  # an older worker's test: the exact limit stands
    ],
)
def test_restore_limit_of_each_policy(selftest, policy, limit):
    assert restore_limit(selftest, policy) == limit


def test_an_unknown_restore_policy_is_refused():
    with pytest.raises(ValueError, match="kv_restore must be one of exact, complete"):
        restore_limit({"exact_up_to": 512}, "close-enough")


@pytest.mark.parametrize(("policy", "limit"), [("exact", 512), ("complete", None)])
def test_the_worker_gives_its_tiers_the_limit_of_its_policy(monkeypatch, policy, limit):
    from barrel_inference.worker.server import WorkerServer
    from barrel_inference.worker.templates import ChatTemplate

    eng = FakeEngine()
    gemma = {"exact_up_to": 512, "complete_up_to": None, "probes": [], "flash_attn": "on"}
    monkeypatch.setattr(eng, "state_selftest", lambda: dict(gemma))
    server = WorkerServer(eng, ChatTemplate.choose(None, None, "fake", "", ""), model="m", bind="inproc://selftest",
                          n_ctx=512, kv_ram_bytes=1 << 20, kv_restore=policy)  # fmt: skip
    assert server.scheduler.reuse.restore_up_to == limit
    assert server.kv_selftest["kv_restore"] == policy and server.kv_selftest["restore_up_to"] == limit
    assert server.store is not None and server.store.namespace["restore_up_to"] == limit


@pytest.mark.parametrize(
    ("kind", "relays", "relayout_up_to", "relayout", "limit"),
    [
        ("split", True, None, True, None),  # Gemma 3 with flash attention on: relaid, restored at any length
        ("split", False, 512, False, 512),  # a relayout that does not lay out as a restore: the check fails
        ("exact", True, None, False, None),  # restores are exact in place: nothing to relay
        ("lossy", True, 512, False, 512),  # a state that lacks cells is never relaid (it would lose them in place)
    ],
)
def test_selftest_relays_sequences_only_where_that_makes_restores_exact(kind, relays, relayout_up_to, relayout, limit):
    e = StubEngine(kind, relays=relays)
    got = state_selftest(e)
    assert (got["relayout_up_to"], got["relayout"]) == (relayout_up_to, relayout)
    assert [p["relayout"] for p in got["probes"]] == [True, relayout_up_to is None]
    assert restore_limit(got, "exact") == limit
    assert e.ns == [0, 0]


@pytest.mark.parametrize("layout", ["unified", "no-window"])
def test_relayout_is_not_asked_in_one_buffer_or_without_a_window(layout):
    """One buffer places a restore among other sequences' cells (a layout no relayout can foresee);
    without a window a state holds every cell, restored where it was."""
    e = StubEngine("split")
    if layout == "unified":
        e.kv_unified = True
    else:
        e.n_swa = 0
    got = state_selftest(e)
    assert "relayout_up_to" not in got and got["relayout"] is False
    assert all("relayout" not in p for p in got["probes"])


@pytest.mark.parametrize(
    ("selftest", "policy", "limit"),
    [
        ({"exact_up_to": 512, "complete_up_to": None, "relayout": True, "relayout_up_to": None}, "exact", None),
        ({"exact_up_to": 512, "complete_up_to": None, "relayout": True, "relayout_up_to": 576}, "exact", 576),
        ({"exact_up_to": 512, "complete_up_to": None, "relayout": False, "relayout_up_to": 512}, "exact", 512),
        # "complete" relays nothing: what restores in place or at one thread
        ({"exact_up_to": 512, "complete_up_to": 576, "relayout": True, "relayout_up_to": None}, "complete", 576),
        ({"exact_up_to": 512, "complete_up_to": None, "relayout": True, "relayout_up_to": None}, "complete", None),
    ],
)
def test_restore_limit_with_relaid_sequences(selftest, policy, limit):
    assert restore_limit(selftest, policy) == limit
    assert relays(selftest, policy) is (policy == "exact" and selftest["relayout"])


@pytest.mark.parametrize(("relayout", "policy"), [(True, "exact"), (False, "exact"), (True, "complete")])
def test_the_worker_relays_sequences_where_its_selftest_says_so(monkeypatch, relayout, policy):
    from barrel_inference.worker.server import WorkerServer
    from barrel_inference.worker.templates import ChatTemplate

    eng = FakeEngine()
    gemma = {"exact_up_to": 512, "complete_up_to": None, "probes": [], "flash_attn": "on", "relayout": relayout,
             "relayout_up_to": None if relayout else 512}  # fmt: skip
    monkeypatch.setattr(eng, "state_selftest", lambda: dict(gemma))
    server = WorkerServer(eng, ChatTemplate.choose(None, None, "fake", "", ""), model="m", bind="inproc://relayout",
                          n_ctx=512, kv_ram_bytes=1 << 20, kv_restore=policy)  # fmt: skip
    reuse = server.scheduler.reuse
    relaid = relayout and policy == "exact"  # "complete" restores the states it would make exact anyway
    assert reuse.relayout is relaid and server.kv_selftest["relayout"] is relaid  # (what /api/stats shows)
    assert reuse.restore_up_to == (None if relayout or policy == "complete" else 512)
    assert server.store.namespace["relayout"] is relaid  # entries of one never serve the other
    assert ("relayout_ms_max" in reuse.stats()) is relaid
