"""The replay map: exact bytes by call id, any family prefix, TTL and GC, and it survives reopening."""

from __future__ import annotations

from barrel_inference.toolcalls.replay import ReplayMap

SPAN = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'.encode()


class Clock:
    def __init__(self):
        self.now = 1_000_000

    def __call__(self):
        return self.now


def test_lookup_by_any_family_prefix_and_reopen(tmp_path):
    path = tmp_path / "replay.sqlite"
    m = ReplayMap(path)
    m.put("abc123", SPAN)
    assert m.get("call_abc123") == SPAN and m.get("toolu_abc123") == SPAN and m.get("abc123") == SPAN
    m.close()
    again = ReplayMap(path)
    assert again.lookup_calls(["call_abc123"]) == (SPAN.decode(), None, "hit")
    assert again.counts == {"hit": 1, "miss": 0, "no_format": 0}


def test_a_turn_with_an_unknown_call_is_a_miss(tmp_path):
    m = ReplayMap(tmp_path / "r.sqlite")
    m.put("a", SPAN)
    assert m.lookup_calls(["call_a", "call_b"]) == (None, None, "miss")
    assert m.lookup_calls(["call_a"], has_format=False) == (SPAN.decode(), None, "no_format")
    assert m.counts == {"hit": 0, "miss": 1, "no_format": 1}


def test_shared_spans_once_separate_spans_joined(tmp_path):
    m = ReplayMap(tmp_path / "r.sqlite")
    m.put("a", b"[TOOL_CALLS] [1, 2]")
    m.put("b", b"[TOOL_CALLS] [1, 2]")
    m.put("c", b"<tool_call>x</tool_call>")
    m.put("d", b"<tool_call>y</tool_call>")
    assert m.lookup_calls(["a", "b"])[0] == "[TOOL_CALLS] [1, 2]"
    assert m.lookup_calls(["c", "d"])[0] == "<tool_call>x</tool_call>\n<tool_call>y</tool_call>"


def test_entries_expire_and_gc_runs_on_its_interval(tmp_path):
    clock = Clock()
    m = ReplayMap(tmp_path / "r.sqlite", ttl_ms=1000, gc_interval_ms=500, clock=clock)
    m.put("a", SPAN)
    clock.now += 999
    assert m.get("a") == SPAN
    clock.now += 2
    assert m.get("a") is None  # expired, even before the GC deletes it
    assert m.db.execute("SELECT COUNT(*) FROM calls").fetchone()[0] == 1
    m.put("b", SPAN)  # a put after the interval runs the GC
    assert m.db.execute("SELECT id FROM calls").fetchall() == [("b",)]


def test_tokens_are_kept_beside_the_bytes(tmp_path):
    m = ReplayMap(tmp_path / "r.sqlite")
    m.put("a", SPAN, [267, 90000, 5, 268])
    m.put("b", SPAN)
    assert m.entry("call_a") == (SPAN, [267, 90000, 5, 268])
    assert m.lookup_calls(["a"]) == (SPAN.decode(), [267, 90000, 5, 268], "hit")
    assert m.lookup_calls(["b"])[1] is None


def test_replicas_open_one_file_at_once(tmp_path):
    """A model's replicas start together and share the map: opening a file that another process is
    creating waits for it instead of failing ("database is locked")."""
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    for k in range(3):
        path = tmp_path / f"r{k}.sqlite"
        with ctx.Pool(4) as pool:
            assert pool.map(_open_and_put, [(str(path), f"call_{i}") for i in range(4)]) == [True] * 4
        shared = ReplayMap(path)
        assert all(shared.get(f"call_{i}") == f"raw {i}".encode() for i in range(4))


def _open_and_put(args) -> bool:
    path, call_id = args
    m = ReplayMap(path)
    m.put(call_id, f"raw {call_id[-1]}".encode())
    return True
