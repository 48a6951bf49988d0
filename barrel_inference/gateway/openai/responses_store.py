"""Where responses live for previous_response_id, GET and DELETE /v1/responses/{id}.

An interface with two implementations: `MemoryResponseStore` (one process, least recently used out
first past a byte bound, entries expire after a TTL) and the default `SqliteResponseStore` (the same
rules, in an SQLite file under the model cache dir, so a conversation continues after a restart).
A deployment with several gateways plugs in a shared one: `responses_store = "pkg.module:Class"`,
a class taking the settings and implementing get / put / delete.

What is kept per response: the response object as returned, and the conversation's input items up
to it (the previous responses' items, then this request's input); a later request that names it
continues from those items plus its output.
"""

from __future__ import annotations

import collections
import importlib
import json
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any, Protocol

DEFAULT_TTL_MS = 3_600_000
DEFAULT_MAX_BYTES = 256 * 1024 * 1024


class StoredResponse(dict):
    """{"response": {...}, "input_items": [...]}"""

    @property
    def response(self) -> dict:
        return self["response"]

    @property
    def input_items(self) -> list[dict]:
        return self["input_items"]

    def conversation(self) -> list[dict]:
        """What a follow-up continues: this response's input items, then its output."""
        return [*self.input_items, *self.response.get("output", [])]


class ResponseStore(Protocol):
    def get(self, rid: str) -> StoredResponse | None: ...
    def put(self, rid: str, stored: StoredResponse) -> None: ...
    def delete(self, rid: str) -> bool: ...


class MemoryResponseStore:
    def __init__(self, ttl_ms: int = DEFAULT_TTL_MS, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        self.ttl = ttl_ms / 1000
        self.max_bytes = max_bytes
        self._items: collections.OrderedDict[str, tuple[float, int, bytes]] = collections.OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def get(self, rid: str) -> StoredResponse | None:
        with self._lock:
            entry = self._items.get(rid)
            if entry is None:
                return None
            if entry[0] + self.ttl < time.time():
                self._drop(rid)
                return None
            self._items.move_to_end(rid)
            return StoredResponse(json.loads(entry[2]))

    def put(self, rid: str, stored: StoredResponse) -> None:
        blob = json.dumps(stored, separators=(",", ":")).encode()
        with self._lock:
            if rid in self._items:
                self._drop(rid)
            self._items[rid] = (time.time(), len(blob), blob)
            self._bytes += len(blob)
            while self._bytes > self.max_bytes and len(self._items) > 1:
                self._drop(next(iter(self._items)))

    def delete(self, rid: str) -> bool:
        with self._lock:
            return self._drop(rid)

    def _drop(self, rid: str) -> bool:
        entry = self._items.pop(rid, None)
        if entry is None:
            return False
        self._bytes -= entry[1]
        return True


class SqliteResponseStore:
    def __init__(self, path: str | Path, ttl_ms: int = DEFAULT_TTL_MS, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.ttl = ttl_ms / 1000
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        self._db = sqlite3.connect(str(self.path), check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute(
            "CREATE TABLE IF NOT EXISTS responses (id TEXT PRIMARY KEY, created REAL, accessed REAL, size INTEGER, body BLOB)"
        )
        self._db.execute("CREATE INDEX IF NOT EXISTS responses_accessed ON responses(accessed)")

    def get(self, rid: str) -> StoredResponse | None:
        now = time.time()
        with self._lock:
            row = self._db.execute("SELECT created, body FROM responses WHERE id = ?", (rid,)).fetchone()
            if row is None:
                return None
            if row[0] + self.ttl < now:
                self._db.execute("DELETE FROM responses WHERE id = ?", (rid,))
                return None
            self._db.execute("UPDATE responses SET accessed = ? WHERE id = ?", (now, rid))
        return StoredResponse(json.loads(row[1]))

    def put(self, rid: str, stored: StoredResponse) -> None:
        blob = json.dumps(stored, separators=(",", ":")).encode()
        now = time.time()
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                self._db.execute("DELETE FROM responses WHERE created < ?", (now - self.ttl,))
                self._db.execute("INSERT OR REPLACE INTO responses VALUES (?, ?, ?, ?, ?)", (rid, now, now, len(blob), blob))
                total = self._db.execute("SELECT COALESCE(SUM(size), 0) FROM responses").fetchone()[0]
                while total > self.max_bytes:
                    row = self._db.execute("SELECT id, size FROM responses WHERE id != ? ORDER BY accessed LIMIT 1", (rid,)).fetchone()
                    if row is None:
                        break
                    self._db.execute("DELETE FROM responses WHERE id = ?", (row[0],))
                    total -= row[1]
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise

    def delete(self, rid: str) -> bool:
        with self._lock:
            return self._db.execute("DELETE FROM responses WHERE id = ?", (rid,)).rowcount > 0

    def close(self) -> None:
        with self._lock:
            self._db.close()


def make_store(settings: Any) -> ResponseStore:
    """The store the settings name: "sqlite" (default), "memory", or "pkg.module:Class"."""
    kind = getattr(settings, "responses_store", "sqlite") or "sqlite"
    ttl = getattr(settings, "responses_store_ttl_ms", DEFAULT_TTL_MS)
    max_bytes = getattr(settings, "responses_store_max_bytes", DEFAULT_MAX_BYTES)
    if kind == "memory":
        return MemoryResponseStore(ttl, max_bytes)
    if kind == "sqlite":
        path = getattr(settings, "responses_store_path", None) or Path(settings.cache_dir()).parent / "responses.sqlite3"
        return SqliteResponseStore(path, ttl, max_bytes)
    module, _, name = kind.partition(":")
    if not name:
        raise ValueError(f"responses_store must be 'sqlite', 'memory' or 'package.module:Class', not {kind!r}")
    return getattr(importlib.import_module(module), name)(settings)
