"""Drive a Scheduler in-process and collect what it emits."""

from __future__ import annotations

import threading
import time

from barrel_inference.protocol import Sampling
from barrel_inference.worker.request import Request
from barrel_inference.worker.scheduler import Scheduler


class Collector:
    def __init__(self):
        self.ticks = []
        self.lock = threading.RLock()
        self.cond = threading.Condition(self.lock)

    def emit(self, peer, tick):
        with self.cond:
            self.ticks.append((time.perf_counter(), peer, tick))
            self.cond.notify_all()

    def done(self):
        with self.lock:
            return {d.id: d for _, _, t in self.ticks for d in t.done}

    def text(self, rid):
        with self.lock:
            return "".join(d.text for _, _, t in self.ticks for d in t.deltas if d.id == rid)

    def first_delta_time(self, rid):
        with self.lock:
            for ts, _, t in self.ticks:
                if any(d.id == rid and d.n_tokens for d in t.deltas):
                    return ts
        return None

    def wait(self, ids, timeout=60.0):
        deadline = time.monotonic() + timeout
        with self.cond:
            while True:
                got = {d.id for _, _, t in self.ticks for d in t.done}
                if set(ids) <= got:
                    return
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"not done: {set(ids) - got}")
                self.cond.wait(left)

    def wait_for(self, pred, timeout=30.0):
        deadline = time.monotonic() + timeout
        with self.cond:
            while not pred():
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError("condition not met")
                self.cond.wait(left)


def make_request(engine, rid, prompt, *, max_tokens=16, stop=(), session=None, temperature=0.0, peer=b"p", **kw):
    toks = engine.tokenize(prompt, add_special=False) if isinstance(prompt, str) else list(prompt)
    return Request(rid, peer, toks, sampling=Sampling(temperature=temperature, **kw), grammar=None, max_tokens=max_tokens,
                   session=session, stop=list(stop), ignore_eos=True, want_tokens=True, piece=engine.piece)  # fmt: skip


def settle_tails(s, timeout=10.0):
    """Wait until every finished request's last token is in its cache (no event tells of it)."""
    deadline = time.monotonic() + timeout
    while s.stats()["tails_pending"] and time.monotonic() < deadline:
        time.sleep(0.01)


class Running:
    """Context manager: a started scheduler with a collector."""

    def __init__(self, engine, n_ctx=None, prefill_chunk=256, reuse=None):
        self.c = Collector()
        self.s = Scheduler(engine, self.c.emit, n_ctx=n_ctx or engine.n_ctx, prefill_chunk=prefill_chunk, reuse=reuse)

    def __enter__(self):
        self.s.start()
        return self.s, self.c

    def __exit__(self, *exc):
        self.s.stop()
