"""KV reuse: gives each new request a sequence and fills it with the longest proven-equal prefix.

Runs on the scheduler thread. The pool (seqpool.py) decides which sequence a request gets and
which other sequence holds the longest committed prefix; this module performs it on the engine:
keep the target's own prefix, copy a prefix from another sequence (llama_memory_seq_cp, busy or
not), or restore a saved state from the RAM / disk tiers (kvstore.py), whichever reuses most;
if that one cannot be continued after all, the next longest is tried.
A cache that a plan overwrites, and caches beyond `max_retained_tokens`, are saved to the tiers
first. Saving and restoring are memcpys of one sequence's KV (bounded by n_ctx); disk reads and
writes run on the store's I/O thread, and a request whose best prefix is on disk is parked until
it is read (other requests are admitted meanwhile).

On sliding-window models (without swa_full) a cache can be continued only near its end: the
window layers hold just the last window and a ubatch. So shared prefixes are kept as checkpoints
in the tiers, from which later newcomers restore them once every sequence holding them has gone
on: a long prefix copied from another sequence is saved as soon as it is copied, and a prompt that
shares a long prefix with another sequence or saved state which could not give it stops its
prefill at the shared length to save its state there.

It also keeps, per session, what the session's last turn committed, to explain a miss when a
later turn of the session reuses less (`evicted`, `diverged-at=<index>`, `template-changed`,
`model-reloaded`).
"""

from __future__ import annotations

import time
from array import array
from collections import OrderedDict
from dataclasses import dataclass

from .kvstore import KvStore
from .seqpool import Evicted, Live, SeqPool, common_prefix

KINDS = ("sticky", "prefix", "copy", "ram", "disk", "cold")
MAX_SESSIONS = 1024  # remembered sessions (for miss explanations), least recently seen dropped
MIN_SAVE = 16  # shorter caches are not worth a tier entry
MIN_LOAD_GAIN = 64  # a disk load must beat what the sequences hold by this many tokens
MIN_CHECKPOINT = 256  # a checkpoint must save a newcomer at least this many tokens of prefill


@dataclass
class SessionRec:
    tokens: array
    template: str


class KvReuse:
    def __init__(self, engine, *, n_seq: int, store: KvStore | None = None, max_retained_tokens: int | None = None,
                 restore_up_to: int | None = None, template_id: str = "", log=None, clock=time.monotonic,
                 max_busy: int | None = None, relayout: bool = False):  # fmt: skip
        self.engine = engine
        # clock: seconds, for pins (tests pass a fake one)
        self.pool = SeqPool(n_seq, clock, max_busy, neighbours=not engine.kv_unified)
        self.store = store if store is not None and store.enabled and restore_up_to != 0 else None
        # the bound keeps retained caches from widening what every row of one unified KV buffer
        # attends over; with a buffer per sequence they cost nothing (their cells are there anyway)
        self.max_retained = max_retained_tokens if engine.kv_unified else None
        self.restore_up_to = restore_up_to  # the longest state the tiers keep (kvselftest.restore_limit); None: any
        # a sequence continued whole is first relaid as a restore of it would lie, so that it
        # continues alike in place and restored (kvselftest.py, "relayout"); only where the tiers
        # restore. Not at its turn's end: a relaid sequence holds just the window, so it could
        # no longer be cut back (a next turn that diverged near the end, a prefix copied out)
        self.relayout = relayout and self.store is not None
        self.relayout_ms_max = 0.0
        self.relayouts_failed = 0
        # checkpoints of shared prefixes, where only the end of a cache can be continued
        self.checkpoints = self.store is not None and engine.n_swa > 0 and not getattr(engine, "swa_full", False)
        self.n_checkpoints = 0
        self.template_id = template_id
        self.log = log or (lambda *a, **k: None)
        self.sessions: OrderedDict[str, SessionRec] = OrderedDict()
        self.hits = dict.fromkeys(KINDS, 0)
        self.reused_tokens = 0
        self.evaluated_tokens = 0
        self.evictions = 0  # caches taken out of sequences (saved or lost)
        self.save_ms_max = 0.0  # the longest state copy out of / into llama.cpp on the scheduler thread
        self.restore_ms_max = 0.0

    # ---- admission ----------------------------------------------------------------------
    def admit(self, req, live: Live) -> bool | None:
        """Give req a sequence with its reused prefix in the KV cache; sets req.seq, n_past, n_cached,
        cache_kind, cache_miss. False: no sequence is free; None: parked while a disk entry loads."""
        prompt = req.prompt
        limit = len(prompt) - 1  # at least one prompt token is decoded, for its logits
        store, e = self.store, self.engine
        usable = lambda en, k: self._restorable(en, min(k, limit))  # noqa: E731
        entry, n_t, stored = store.match(prompt, usable) if store is not None else (None, 0, 0)
        n_t = min(n_t, limit)  # (match returns only an entry usable there)
        if entry is not None and entry.data is None and not req.parked:
            if n_t >= self.pool.best_prefix(prompt, live, e.can_share) + MIN_LOAD_GAIN and store.load(entry):
                req.parked = True
                req.parked_on = entry
                return None
        plan = self.pool.acquire(req.session, prompt, live, e.can_share)
        if plan is None:
            return False
        req.seq = seq = plan.seq
        if plan.evict is not None:
            self._save(plan.evict)
        # the candidates, longest first; each one the pool or the saved window proved continuable,
        # and a failure falls through to the next (the target's own prefix only while untouched)
        cands = [(min(plan.keep, limit), plan.keep_kind), (min(plan.copy_n, limit), "copy")]
        data = store.take(entry) if entry is not None and n_t > max(c[0] for c in cands) else None
        if data is not None:
            cands.append((n_t, "disk" if entry.on_disk and req.parked else "ram"))
        n, kind, touched = 0, "cold", False
        for want, how in sorted(cands, key=lambda c: -c[0]):
            if want <= 0 or (how not in ("copy", "ram", "disk") and touched):
                continue
            if how in ("ram", "disk"):
                t0 = time.perf_counter()
                ok = e.state_seq_load(seq, data)
                self.restore_ms_max = max(self.restore_ms_max, (time.perf_counter() - t0) * 1000.0)
                ok = ok and self._fit(seq, entry.n, want)
            elif how == "copy":
                e.seq_clear(seq)
                e.seq_copy(plan.copy_from, seq, want)
                ok = self._fit(seq, want, want)
            elif self.relayout and want == plan.held:
                ok = self._relay(seq, (prompt[want], want)) and e.can_continue(seq, want)
            else:
                ok = e.seq_truncate(seq, want) and e.can_continue(seq, want)
            touched = True
            if ok:
                n, kind = want, how
                break
            e.seq_clear(seq)
        if n == 0:
            e.seq_clear(seq)
        elif kind in ("copy", "ram", "disk"):
            e.seq_truncate(seq, n)  # nothing beyond the reused prefix stays
        if kind == "copy" and self.checkpoints and n >= MIN_CHECKPOINT and self._new_checkpoint(prompt, n):
            if not self._checkpoint_copy(seq, prompt, n):  # relaying lost the copy: recomputed
                e.seq_clear(seq)
                n, kind = 0, "cold"
        req.seq = seq
        req.n_past = req.n_cached = n
        req.checkpoint_at = 0
        if self.checkpoints:  # the longest prefix another sequence holds or a saved state shares
            req.checkpoint_at = self._checkpoint_at(prompt, n, max(stored, self.pool.best_prefix(prompt, live)))
        req.cache_kind = kind if n > 0 else "cold"
        req.cache_miss = self._explain(req.session, prompt, n)
        self.hits[req.cache_kind] += 1
        self.reused_tokens += n
        self.evaluated_tokens += len(prompt) - n
        if req.cache_miss:
            self.log("cache_miss", id=req.id, session=req.session, reason=req.cache_miss, reused=n, prompt=len(prompt))
        return True

    def _new_checkpoint(self, prompt: list[int], b: int) -> bool:
        """Would a checkpoint of prompt[:b] be kept, and is none there yet?"""
        if self.restore_up_to is not None and b > self.restore_up_to:
            return False
        found, n = self.store.find(prompt[:b])
        return found is None or not (n == found.n == b)

    def _checkpoint_at(self, prompt: list[int], n: int, shared: int) -> int:
        """Where req's prefill should save a state for newcomers (0: nowhere): `shared`, the longest
        prefix it shares with another sequence's committed tokens or a saved state, where that is
        at least MIN_CHECKPOINT beyond what it reused (so that one could not give it) and the
        tiers keep states of that length."""
        b = min(shared, len(prompt) - 1)
        if b < n + MIN_CHECKPOINT or not self._new_checkpoint(prompt, b):
            return 0
        return b

    def _checkpoint_copy(self, seq: int, prompt: list[int], n: int) -> bool:
        """seq just got a prefix of n tokens copied from another sequence, which will go on past it:
        keep it as a checkpoint. A copy between KV buffers waits for the next decode, so one is run
        here: the prompt's next token, taken back at once. False when seq lost what it held."""
        e = self.engine
        if not e.kv_unified and not self._make_copies(seq, prompt[n], n):
            return e.seq_pos_min(seq) >= 0  # the decode failed: no checkpoint, the copy stands
        return self._save_checkpoint(seq, prompt[:n])

    def _make_copies(self, seq: int, token: int, n: int) -> bool:
        """Make now the copies between KV buffers that llama.cpp has queued (it makes them at the
        next decode): decode seq's next token at n, where it holds n positions, and take it back.
        False when the decode failed (nothing changed) or, the sequence then cleared, when the
        token could not be taken back."""
        e = self.engine
        if e.decode([token], [n], [seq], [False]) != 0:
            return False
        if not e.seq_truncate(seq, n):  # cannot happen: the token just added goes as it came
            e.seq_clear(seq)
            return False
        return True

    def checkpoint(self, req) -> None:
        """req's prefill reached req.checkpoint_at: its state there goes to the tiers. Where that
        lost its cache, req is recomputed from the start (it is counted as cold)."""
        req.checkpoint_at = 0
        if self._save_checkpoint(req.seq, req.prompt[: req.n_past]):
            return
        self.engine.seq_clear(req.seq)
        self.log("kv_checkpoint_lost", id=req.id, tokens=req.n_past)
        self.hits[req.cache_kind] -= 1
        self.hits["cold"] += 1
        self.reused_tokens -= req.n_cached
        self.evaluated_tokens += req.n_cached
        req.n_past = req.n_cached = 0
        req.cache_kind = "cold"

    def _save_checkpoint(self, seq: int, tokens: list[int]) -> bool:
        """Save seq's state (it holds exactly `tokens`) to the tiers, relaid first where restores are
        exact only so, so that it goes on as the restores will. False when relaying lost its cache."""
        e, n = self.engine, len(tokens)
        if self.relayout and not self._relay(seq):
            return e.seq_pos_min(seq) >= 0  # left as it was (a queued copy): no checkpoint
        pos_min = e.seq_pos_min(seq)
        if pos_min < 0 or pos_min > e.window_start(n):
            return True
        t0 = time.perf_counter()
        data = e.state_seq_save(seq)
        self.save_ms_max = max(self.save_ms_max, (time.perf_counter() - t0) * 1000.0)
        if data and self.store.put(tokens, data, template=self.template_id, pos_min=pos_min) is not None:
            self.n_checkpoints += 1
            self.log("kv_checkpoint", seq=seq, tokens=n, bytes=len(data))
        return True

    def _restorable(self, entry, n: int) -> bool:
        """Can a saved state be continued at n? Its window layers hold positions from pos_min on
        (recorded at save, where a sequence without cells there is not saved; -1: an entry written
        before pos_min was recorded, which the restore finds out)."""
        return entry.pos_min < 0 or entry.pos_min <= self.engine.window_start(n)

    def _fit(self, seq: int, have: int, want: int) -> bool:
        e = self.engine
        if want < have and not e.seq_truncate(seq, want):
            return False
        return e.can_continue(seq, want)

    def unadmit(self, req) -> None:
        """The request could not start after all (its sampler failed): free its sequence."""
        if req.seq >= 0:
            if self.pool.release(req.seq, None):
                self.engine.seq_clear(req.seq)
            req.seq = -1

    # ---- endings ------------------------------------------------------------------------
    def release(self, req, tokens: list[int] | None) -> None:
        """req's sequence is free again; tokens: what its KV holds (None: unknown, cleared). Its pin
        (req.pin_ttl_s) keeps the cache from retention until it runs out."""
        if self.pool.release(req.seq, tokens, getattr(req, "pin_ttl_s", 0.0)):
            self.engine.seq_clear(req.seq)
        if req.session and tokens is not None:
            self.sessions[req.session] = SessionRec(array("i", tokens), self.template_id)
            self.sessions.move_to_end(req.session)
            while len(self.sessions) > MAX_SESSIONS:
                self.sessions.popitem(last=False)
        self.enforce_retention()

    def _relay(self, seq: int, nxt: tuple[int, int] | None = None) -> bool:
        """Relay a sequence about to be continued whole (engine.seq_relayout). False where that
        cannot be done (then its cache is not continued: left in its own layout it would continue
        otherwise than a restore of it). A copy out of it that another request of this round queued
        is refused until a decode makes it: given the sequence's next (token, position), one is
        run there and taken back."""
        e = self.engine
        t0 = time.perf_counter()
        ok = e.seq_relayout(seq)
        if not ok and nxt is not None and e.seq_pos_min(seq) >= 0 and self._make_copies(seq, *nxt):
            ok = e.seq_relayout(seq)
        self.relayout_ms_max = max(self.relayout_ms_max, (time.perf_counter() - t0) * 1000.0)
        if not ok:
            self.relayouts_failed += 1
            self.log("kv_relayout_failed", seq=seq)
        return ok

    def enforce_retention(self) -> None:
        if self.max_retained is None:
            return
        for slot in self.pool.over_retention(self.max_retained):
            self._drop(slot)

    def drop_idle(self) -> bool:
        """The KV cache is full: the least recently used idle cache (unpinned first) goes to the
        tiers (or away). False when there is none."""
        slot = self.pool.oldest_idle()
        if slot is None:
            return False
        self.log("kv_full_idle_dropped", seq=slot.seq, tokens=len(slot.tokens), idle=len(self.pool.idle_slots()))
        self._drop(slot)
        return True

    def _drop(self, slot) -> None:
        self._save(Evicted(slot.seq, slot.tokens, slot.session, slot.pin_until))
        self.engine.seq_clear(slot.seq)
        self.pool.forget(slot.seq)

    def end_session(self, session: str) -> None:
        seq = self.pool.end_session(session)
        if seq is not None:
            self.engine.seq_clear(seq)
        self.sessions.pop(session, None)

    def persist(self) -> None:
        """At shutdown: idle sequences' caches go to the tiers, the RAM tier to disk."""
        if self.store is None:
            return
        for slot in self.pool.idle_slots():
            self._save(Evicted(slot.seq, slot.tokens, slot.session, slot.pin_until), count=False)
        self.store.persist()

    def reset(self) -> None:
        """The context was recreated: every sequence is empty (saved tiers stay valid)."""
        self.pool.reset()

    def _save(self, ev: Evicted, count: bool = True) -> None:
        self.evictions += count
        n = len(ev.tokens)
        store = self.store
        if store is None or n < MIN_SAVE or (self.restore_up_to is not None and n > self.restore_up_to):
            return
        found, n_have = store.find(ev.tokens)
        if found is not None and n_have == n == found.n:
            store.take(found)  # already saved: only mark it used
            store.pin(found, ev.pin_until)
            return
        pos_min = self.engine.seq_pos_min(ev.seq)
        if pos_min < 0:  # no cells in (the window layers of) the cache: nothing a restore could continue
            return
        t0 = time.perf_counter()
        data = self.engine.state_seq_save(ev.seq)
        self.save_ms_max = max(self.save_ms_max, (time.perf_counter() - t0) * 1000.0)
        store.put(ev.tokens, data, session=ev.session, template=self.template_id, pin_until=ev.pin_until, pos_min=pos_min)

    # ---- explanations -------------------------------------------------------------------
    def _explain(self, session: str | None, prompt: list[int], n: int) -> str:
        if not session:
            return ""
        rec = self.sessions.get(session)
        if rec is None:  # not seen since this worker started: what the disk tier knows of it
            if self.store is None:
                return ""
            had = self.store.template_changed.pop(session, 0)
            if had and n < min(had, len(prompt) - 1):
                return "template-changed"
            return self.store.stale_sessions.pop(session, "")
        self.sessions.move_to_end(session)
        prev = rec.tokens
        best = min(len(prev), len(prompt) - 1)
        if n >= best:
            return ""
        d = common_prefix(prev, prompt)
        if n < min(d, best):
            return "evicted"
        if rec.template != self.template_id:
            return "template-changed"
        return f"diverged-at={d}"

    def stats(self) -> dict:
        out = {
            "hits": dict(self.hits), "reused_tokens": self.reused_tokens, "evaluated_tokens": self.evaluated_tokens,
            "evictions": self.evictions, "retained_tokens": self.pool.retained(), "max_retained_tokens": self.max_retained,
            "sessions": len(self.sessions), "save_ms_max": round(self.save_ms_max, 2),
            "restore_ms_max": round(self.restore_ms_max, 2),
        }  # fmt: skip
        if self.checkpoints:
            out["checkpoints"] = self.n_checkpoints
        if self.relayout:
            out["relayout_ms_max"] = round(self.relayout_ms_max, 2)
            out["relayouts_failed"] = self.relayouts_failed
        if self.store is not None:
            out["tiers"] = self.store.stats()
        return out

    def tier_figures(self) -> tuple[int, int, int, int]:
        if self.store is None:
            return 0, 0, 0, 0
        s = self.store.stats()
        return s["ram_bytes"], s["ram_entries"], s["disk_bytes"], s["disk_entries"]
