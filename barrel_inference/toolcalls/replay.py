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
from pathlib import Path

RESULTS = ("hit", "miss", "no_format")


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
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("CREATE TABLE IF NOT EXISTS calls (id TEXT PRIMARY KEY, raw BLOB NOT NULL, created_ms INTEGER NOT NULL)")
        self.db.execute("CREATE INDEX IF NOT EXISTS calls_created ON calls (created_ms)")
        self.counts = dict.fromkeys(RESULTS, 0)
        self._last_gc = 0
        self.gc()

    def put(self, call_id: str, raw: bytes) -> None:
        with self._lock:
            self.db.execute("INSERT OR REPLACE INTO calls VALUES (?, ?, ?)", (neutral_id(call_id), raw, self.clock()))
            self._maybe_gc()

    def get(self, call_id: str | None) -> bytes | None:
        if not call_id:
            return None
        with self._lock:
            row = self.db.execute(
                "SELECT raw FROM calls WHERE id = ? AND created_ms >= ?", (neutral_id(call_id), self.clock() - self.ttl_ms)
            ).fetchone()
        return bytes(row[0]) if row else None

    def lookup_calls(self, ids: list[str | None], *, has_format: bool = True) -> tuple[str | None, str]:
        """(the exact text of an assistant turn's calls or None when any is unknown, the result counted).
        Calls that share one span (several calls in one marker block) give it once; separate spans
        are joined by a newline, as models write parallel calls."""
        with self._lock:
            self._maybe_gc()
        spans: list[bytes] = []
        for cid in ids:
            raw = self.get(cid)
            if raw is None:
                with self._lock:
                    self.counts["miss"] += 1
                return None, "miss"
            if not spans or spans[-1] != raw:
                spans.append(raw)
        result = "hit" if has_format else "no_format"
        with self._lock:
            self.counts[result] += 1
        return b"\n".join(spans).decode("utf-8", "replace"), result

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
