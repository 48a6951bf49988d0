"""The KV self-test's bookkeeping (worker/kvselftest.py) on a stub engine whose restored logits
differ the way llama.cpp's do: only at more than one thread (flash attention's per-thread shares
of a moved window), or at any thread count (a state that lacks cells); and the limit each
kv_restore policy gives the tiers, down to the worker server."""

from __future__ import annotations

import numpy as np
import pytest

from barrel_inference.worker.fake import FakeEngine
from barrel_inference.worker.kvselftest import restore_limit, state_selftest


class StubEngine:
    """n_swa 512; a sequence restored from a state saved past the window gives other logits: at
    more than one thread ("split"), at any ("lossy"), or never ("exact")."""

    n_swa, n_ctx, n_batch, n_vocab, flash_attn = 512, 4096, 512, 64, "on"

    def __init__(self, kind: str):
        self.kind = kind
        self.threads: int | None = None
        self.thread_calls: list[int | None] = []
        self.n = 0  # positions the probe sequence holds
        self.restored = False  # restored from a state and not grown since
        self.out = np.zeros(self.n_vocab, dtype=np.float32)

    def is_eog(self, token: int) -> bool:
        return token == 0

    def set_threads(self, n: int | None) -> None:
        self.threads = n
        self.thread_calls.append(n)

    def decode(self, tokens, pos, seqs, logits) -> int:
        assert pos[0] == self.n, "the probe decodes its positions in order"
        if len(tokens) > 1:
            self.restored = False
        self.n = pos[-1] + 1
        moved = self.restored and self.n - 1 > self.n_swa
        off = (self.kind == "split" and self.threads != 1) or self.kind == "lossy"
        self.out = np.full(self.n_vocab, float(self.n), dtype=np.float32) + (0.5 if moved and off else 0.0)
        return 0

    def logits(self, row: int) -> np.ndarray:
        return self.out

    def seq_truncate(self, seq: int, keep: int) -> bool:
        self.n = min(self.n, keep)
        return True

    def seq_clear(self, seq: int) -> None:
        self.n, self.restored = 0, False

    def state_seq_save(self, seq: int) -> bytes:
        return self.n.to_bytes(4, "little")

    def state_seq_load(self, seq: int, data: bytes) -> bool:
        self.n, self.restored = int.from_bytes(data, "little"), True
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
    assert e.n == 0  # the probe sequence is cleared


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
