"""The replay map: call id -> the exact text the model wrote for that call, in SQLite.

When a later request carries the call in its history, the prompt is built with these bytes
instead of the template's re-rendering of the call, so the prompt stays byte-stable from turn to
turn (and the KV cache of the earlier turn is reused). Entries live `ttl_ms`; expired ones are
deleted at most every `gc_interval_ms`. Ids are family-neutral; a family's prefixed form
(call_…, toolu_…) finds the same entry.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from array import array
from pathlib import Path

RESULTS = ("hit", "miss", "no_format")


OPEN_ATTEMPTS = 100  # times 50 ms: how long opening waits for another process creating the file


def neutral_id(call_id: str) -> str:
    """'call_abc' / 'toolu_abc' / 'abc' -> 'abc'."""
    return call_id.rsplit("_", 1)[-1] if call_id else call_id


class ReplayMap:
    def __init__(self, path: str | Path, *, ttl_ms: int = 30 * 24 * 3600 * 1000, gc_interval_ms: int = 3600 * 1000,
                 clock=lambda: int(time.time() * 1000)):  # fmt: skip
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        self.ttl_ms = ttl_ms
        self.gc_interval_ms = gc_interval_ms
        self.clock = clock
        self._lock = threading.RLock()  # one connection, used from the scheduler and preparation threads
        self.db = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
        # the replicas of a model share the file: one may be creating it while another opens it
        # (switching to WAL takes a lock the busy timeout does not wait for)
        for attempt in range(OPEN_ATTEMPTS):
            try:
                self._create()
                break
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) or attempt == OPEN_ATTEMPTS - 1:
                    raise
                time.sleep(0.05)
        self.counts = dict.fromkeys(RESULTS, 0)
        self._last_gc = 0
        self.gc()

    def _create(self) -> None:
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("CREATE TABLE IF NOT EXISTS calls (id TEXT PRIMARY KEY, raw BLOB NOT NULL, created_ms INTEGER NOT NULL)")
        self.db.execute("CREATE INDEX IF NOT EXISTS calls_created ON calls (created_ms)")
        if "tokens" not in {row[1] for row in self.db.execute("PRAGMA table_info(calls)")}:
            try:
                self.db.execute("ALTER TABLE calls ADD COLUMN tokens BLOB")  # int32 token ids, where they spell raw exactly
            except sqlite3.OperationalError as exc:
                if "duplicate column" not in str(exc):  # another process added it just now
                    raise

    def put(self, call_id: str, raw: bytes, tokens: list[int] | None = None) -> None:
        """raw: the span's exact bytes; tokens: the model's tokens that spell them, where known."""
        blob = array("i", tokens).tobytes() if tokens else None
        with self._lock:
            self.db.execute("INSERT OR REPLACE INTO calls (id, raw, created_ms, tokens) VALUES (?, ?, ?, ?)",
                            (neutral_id(call_id), raw, self.clock(), blob))  # fmt: skip
            self._maybe_gc()

    def get(self, call_id: str | None) -> bytes | None:
        entry = self.entry(call_id)
        return entry[0] if entry else None

    def entry(self, call_id: str | None) -> tuple[bytes, list[int] | None] | None:
        """(raw bytes, tokens or None) of a live entry."""
        if not call_id:
            return None
        with self._lock:
            row = self.db.execute(
                "SELECT raw, tokens FROM calls WHERE id = ? AND created_ms >= ?", (neutral_id(call_id), self.clock() - self.ttl_ms)
            ).fetchone()
        if not row:
            return None
        return bytes(row[0]), (array("i", bytes(row[1])).tolist() if row[1] else None)

    def lookup_calls(self, ids: list[str | None], *, has_format: bool = True) -> tuple[str | None, list[int] | None, str]:
        """(the exact text of an assistant turn's calls or None when any is unknown, the model's tokens
        of that text where known (one span only), the result counted). Calls that share one span
        (several calls in one marker block) give it once; separate spans are joined by a newline,
        as models write parallel calls."""
        with self._lock:
            self._maybe_gc()
        spans: list[tuple[bytes, list[int] | None]] = []
        for cid in ids:
            entry = self.entry(cid)
            if entry is None:
                with self._lock:
                    self.counts["miss"] += 1
                return None, None, "miss"
            if not spans or spans[-1][0] != entry[0]:
                spans.append(entry)
        result = "hit" if has_format else "no_format"
        with self._lock:
            self.counts[result] += 1
        tokens = spans[0][1] if len(spans) == 1 else None
        return b"\n".join(raw for raw, _ in spans).decode("utf-8", "replace"), tokens, result

    def gc(self) -> int:
        with self._lock:
            now = self.clock()
            self._last_gc = now
            return self.db.execute("DELETE FROM calls WHERE created_ms < ?", (now - self.ttl_ms,)).rowcount

    def _maybe_gc(self) -> None:
        if self.clock() - self._last_gc >= self.gc_interval_ms:
            self.gc()

    def close(self) -> None:
        with self._lock:
            self.db.close()
