"""The Responses store: TTL, least-recently-used eviction past a byte bound, delete, the plugin path;
the same rules for the in-process and the SQLite store."""

from __future__ import annotations

import time

import pytest

from barrel_inference.config import Settings
from barrel_inference.gateway.openai.responses_store import (
    MemoryResponseStore, SqliteResponseStore, StoredResponse, make_store,
)  # fmt: skip


def entry(n: int, size: int = 100) -> StoredResponse:
    return StoredResponse(response={"id": f"resp_{n}", "output": [{"type": "message", "x": "a" * size}]},
                          input_items=[{"type": "message", "role": "user", "content": "hi"}])  # fmt: skip


@pytest.fixture(params=["memory", "sqlite"])
def store_factory(request, tmp_path):
    def make(ttl_ms=60_000, max_bytes=10_000):
        if request.param == "memory":
            return MemoryResponseStore(ttl_ms, max_bytes)
        return SqliteResponseStore(tmp_path / f"r{time.monotonic_ns()}.sqlite3", ttl_ms, max_bytes)

    return make


def test_put_get_conversation_and_delete(store_factory):
    s = store_factory()
    s.put("resp_1", entry(1))
    got = s.get("resp_1")
    assert got.response["id"] == "resp_1" and [i["type"] for i in got.conversation()] == ["message", "message"]
    assert s.delete("resp_1") is True and s.get("resp_1") is None and s.delete("resp_1") is False


def test_entries_expire(store_factory):
    s = store_factory(ttl_ms=200)
    s.put("resp_1", entry(1))
    assert s.get("resp_1") is not None
    time.sleep(0.3)
    assert s.get("resp_1") is None


def test_least_recently_used_goes_first_past_the_byte_bound(store_factory):
    s = store_factory(max_bytes=1_500)
    for n in range(3):
        s.put(f"resp_{n}", entry(n, size=300))
    assert s.get("resp_0") is not None  # touched: now the most recently used
    s.put("resp_3", entry(3, size=300))  # over the bound: resp_1, the least recently used, goes
    assert s.get("resp_1") is None
    assert all(s.get(f"resp_{n}") is not None for n in (0, 2, 3))


def test_sqlite_store_persists(tmp_path):
    path = tmp_path / "r.sqlite3"
    SqliteResponseStore(path).put("resp_1", entry(1))
    assert SqliteResponseStore(path).get("resp_1").response["id"] == "resp_1"


class SharedStore(MemoryResponseStore):
    def __init__(self, settings):
        super().__init__()
        self.settings = settings


def test_make_store_kinds(tmp_path):
    base = dict(model_cache_dir=str(tmp_path / "models"))
    assert isinstance(make_store(Settings(**base, responses_store="memory")), MemoryResponseStore)
    sqlite = make_store(Settings(**base))
    assert isinstance(sqlite, SqliteResponseStore) and sqlite.path == tmp_path / "responses.sqlite3"
    plugin = make_store(Settings(**base, responses_store=f"{__name__}:SharedStore"))
    assert isinstance(plugin, SharedStore) and plugin.settings.model_cache_dir == base["model_cache_dir"]
    with pytest.raises(ValueError, match="responses_store"):
        make_store(Settings(**base, responses_store="redis"))
