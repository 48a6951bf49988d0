"""KV reuse on the tiny GGUF (real llama.cpp): every reused turn equals the same turn computed cold.

llama.cpp's numerics depend on how a prompt is split into batches, so "cold" here is a replay in a
fresh context of exactly the batches that built the reused prefix (each earlier turn's prompt
chunks, then its generated tokens one per step), then the turn itself. Reuse (a session's own
sequence, a prefix copied from another sequence, a saved state restored from RAM or from disk
after a restart) must give the same tokens bit for bit.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
import pytest

from barrel_inference.worker.kvreuse import KvReuse
from barrel_inference.worker.kvstore import KvStore

from .harness import Running, make_request

N_CTX = 1024
CHUNK = 64
MAX_TOKENS = 6
SYSTEM = "system: you are a terse assistant. answer in one short line, never more. " * 3


# the warm engines run in both KV layouts: a buffer per sequence (a prefix copy copies a buffer)
# and one unified buffer (the default; a prefix copy shares cells)
@pytest.fixture(scope="module", params=[False, True], ids=["split", "unified"])
def engine(tiny_gguf, request):
    from barrel_inference.worker.engine import LlamaEngine

    e = LlamaEngine(str(tiny_gguf), n_ctx=N_CTX, n_seq_max=2, n_batch=256, threads=2, kv_unified=request.param)
    yield e
    e.close()


@pytest.fixture(scope="module")
def cold_engine(tiny_gguf):
    from barrel_inference.worker.engine import LlamaEngine

    e = LlamaEngine(str(tiny_gguf), n_ctx=N_CTX, n_seq_max=1, n_batch=256, threads=2)
    yield e
    e.close()


def replay(e, turns: list[tuple[list[int], int, int]], relayout: bool = False) -> list[int]:
    """Greedy tokens of the last turn, computed in a fresh context with the batches of the warm run.

    turns: (prompt, n_cached, n_generated[, split]) of every turn of this sequence's history, the
    last being the one to compute (its n_generated tokens are sampled); split: where the turn's
    prefill stopped to save a checkpoint (kvreuse.py). relayout: the warm run relaid a sequence
    before continuing its whole cache or saving a checkpoint, and so does the replay (a restore
    lies as a relaid sequence does)."""
    import llama_cpp as L

    e.recreate_context()

    def argmax(row):
        return int(np.ctypeslib.as_array(L.llama_get_logits_ith(e.ctx, row), shape=(e.n_vocab,)).argmax())

    out: list[int] = []
    held = 0  # positions the sequence holds
    for k, (prompt, cached, n_gen, *split) in enumerate(turns):
        last = k == len(turns) - 1
        if cached and relayout and cached == held:
            assert e.seq_relayout(0)
        elif cached:
            assert e.seq_truncate(0, cached)  # what the warm run kept of the sequence
        else:
            e.seq_clear(0)
        stops = [b for b in split if cached < b < len(prompt)] + [len(prompt)]
        begin = cached
        for stop in stops:
            if begin > cached and relayout:
                assert e.seq_relayout(0)  # the checkpoint
            for start in range(begin, stop, CHUNK):
                part = prompt[start : min(stop, start + CHUNK)]
                end = start + len(part) == len(prompt)
                assert e.decode(part, list(range(start, start + len(part))), [0] * len(part), [False] * (len(part) - 1) + [end]) == 0
            begin = stop
        tok = argmax(-1)
        gen = [tok]
        pos = len(prompt)
        while len(gen) < n_gen:
            assert e.decode([tok], [pos], [0], [True]) == 0
            pos += 1
            tok = argmax(-1)
            gen.append(tok)
        if not last:  # the finished turn's last token entered the cache in a batch of its own
            assert e.decode([tok], [pos], [0], [False]) == 0
            held = pos + 1
        if last:
            out = gen
    return out


class Conversation:
    """Byte-token turns: each prompt is the previous prompt + its completion + a new user line."""

    def __init__(self, engine, name: str, session: str | None = None):
        self.e = engine
        self.name = name
        self.session = session
        self.history: list[tuple[list[int], int, int]] = []
        self.outputs: list[list[int]] = []
        self.kinds: list[str] = []
        self.misses: list[str] = []

    def next_prompt(self, user: str) -> list[int]:
        tok = lambda s: self.e.tokenize(s, add_special=False)  # noqa: E731
        if not self.history:
            return tok(SYSTEM + f"\nuser ({self.name}): {user}\nassistant:")
        prev_prompt = self.history[-1][0]
        return prev_prompt + self.outputs[-1] + tok(f"\nuser: {user}\nassistant:")

    def turn(self, sched, collector, user: str, *, session: str | None = "same") -> None:
        prompt = self.next_prompt(user)
        rid = f"{self.name}{len(self.history)}"
        sess = self.session if session == "same" else session
        sched.submit(make_request(self.e, rid, prompt, max_tokens=MAX_TOKENS, session=sess))
        collector.wait([rid])
        done = collector.done()[rid]
        toks = [t for _, _, tick in collector.ticks for d in tick.deltas if d.id == rid for t in d.tokens]
        assert len(toks) == MAX_TOKENS
        self.history.append((prompt, done.usage.cached_tokens, MAX_TOKENS))
        self.outputs.append(toks)
        self.kinds.append(done.cache.kind)
        self.misses.append(done.cache.miss)

    def check_against_cold(self, cold_engine, base=(), relayout: bool = False) -> None:
        """base: turns of another conversation whose batches built the prefix this one copied."""
        for k in range(len(self.history)):
            want = replay(cold_engine, [*base, *self.history[: k + 1]], relayout)
            assert self.outputs[k] == want, f"{self.name} turn {k + 1} ({self.kinds[k]})"

    def check_cached_grows(self) -> None:
        for k in range(1, len(self.history)):
            prev_prompt, _, n_gen = self.history[k - 1]
            # everything the previous turn committed: its prompt and every token it generated
            assert self.history[k][1] >= len(prev_prompt) + n_gen, (self.name, k, self.kinds[k])


def scheduler(engine, *, n_seq=None, store=None, max_retained=None, template="t", restore_up_to=None, log=None,
              relayout=False, n_ctx=N_CTX):  # fmt: skip
    engine.recreate_context()
    reuse = KvReuse(engine, n_seq=n_seq or engine.n_seq_total, store=store, max_retained_tokens=max_retained,
                    restore_up_to=restore_up_to, template_id=template, max_busy=engine.n_seq_max, log=log,
                    relayout=relayout)  # fmt: skip
    run = Running(engine, n_ctx=n_ctx, prefill_chunk=CHUNK, reuse=reuse)
    if store is not None:
        store.on_loaded = run.s.entry_loaded
    return run


def make_store(engine, tmp_path: Path | None, ram: int = 64 << 20, disk: int = 256 << 20, template="t", **ns) -> KvStore:
    namespace = {**engine.state_key(), "prefill_chunk": CHUNK, **ns}
    store = KvStore(namespace=namespace, ram_bytes=ram, disk_bytes=disk if tmp_path else 0, directory=tmp_path,
                    template=template)  # fmt: skip
    assert store.ready.wait(10)
    return store


def test_selftest_finds_restores_exact_on_the_tiny_model(engine):
    engine.recreate_context()
    result = engine.state_selftest()
    assert result["exact_up_to"] is None
    assert result["probes"] and all(p["exact"] and p["max_abs_diff"] == 0.0 for p in result["probes"])


@pytest.fixture(scope="module", params=[False, True], ids=["split", "unified"])
def idle_engine(tiny_gguf, request):
    """One running sequence and two more sequence ids that only hold idle caches."""
    from barrel_inference.worker.engine import LlamaEngine

    e = LlamaEngine(str(tiny_gguf), n_ctx=N_CTX, n_seq_max=1, n_batch=256, threads=2, n_seq_idle=2, idle_cells=2 * N_CTX,
                    kv_unified=request.param)  # fmt: skip
    yield e
    e.close()


def test_idle_sequences_keep_more_conversations_than_run_at_once_and_equal_cold(idle_engine, cold_engine):
    """Three conversations round robin, one running at a time: each keeps its cells under its own
    sequence id between turns, so every later turn continues them in place (sticky, no save or
    restore) and equals the cold replay."""
    e = idle_engine
    assert e.n_seq_total == 3
    convs = [Conversation(e, n, session=n) for n in ("x", "y", "z")]
    with scheduler(e, max_retained=10_000) as (s, c):
        assert s.stats()["n_seq_max"] == 1 and s.stats()["n_seq_idle"] == 2
        for i in range(3):
            for conv in convs:
                conv.turn(s, c, f"round {i}")
    x, y, z = convs
    assert [x.kinds[0], y.kinds[0], z.kinds[0]] == ["cold", "copy", "copy"]  # the system prompt is shared
    for conv in convs:
        assert conv.kinds[1:] == ["sticky", "sticky"], conv.kinds
        conv.check_cached_grows()
    x.check_against_cold(cold_engine)
    y.check_against_cold(cold_engine, base=x.history[:1])
    z.check_against_cold(cold_engine, base=x.history[:1])


def test_sticky_session_six_turns_equal_cold(engine, cold_engine):
    conv = Conversation(engine, "a", session="S")
    with scheduler(engine) as (s, c):
        for i in range(6):
            conv.turn(s, c, f"question number {i}")
    assert conv.kinds == ["cold"] + ["sticky"] * 5
    conv.check_cached_grows()
    conv.check_against_cold(cold_engine)


def test_the_pool_keeps_running_sequences_neighbours_only_with_a_buffer_per_sequence(engine):
    """(seqpool.py: each run of consecutive running ids is a decode pass of its own there)"""
    with scheduler(engine) as (s, _):
        assert s.pool.neighbours is not engine.kv_unified
        assert s.stats()["kv_unified"] is engine.kv_unified  # what /api/stats shows
        assert s.stats()["kv_layout"] == engine.kv_layout == "set"  # and why (the fixture sets it)


def test_two_conversations_a_b_a_without_sessions_keep_their_caches(engine, cold_engine):
    """The regression: B's first turn used to take A's sequence (they share BOS / the system prompt)."""
    a, b = Conversation(engine, "a"), Conversation(engine, "b")
    with scheduler(engine) as (s, c):
        a.turn(s, c, "first")
        b.turn(s, c, "first")
        a.turn(s, c, "second")
        b.turn(s, c, "second")
        a.turn(s, c, "third")
    assert b.kinds[0] == "copy"  # the shared system prompt came from A's sequence, A's cache stayed
    assert a.kinds[1:] == ["prefix", "prefix"] and b.kinds[1:] == ["prefix"]
    a.check_cached_grows()
    b.check_cached_grows()
    a.check_against_cold(cold_engine)
    b.check_against_cold(cold_engine, base=a.history[:1])  # B's first prefix came from A's first turn


def test_copied_prefix_six_turns_equal_cold(engine, cold_engine):
    """Each turn under a new session: its prefix is copied from the sequence of the turn before."""
    conv = Conversation(engine, "c")
    with scheduler(engine) as (s, c):
        for i in range(6):
            conv.turn(s, c, f"step {i}", session=f"new-{i}")
    assert conv.kinds[1:] == ["copy"] * 5
    conv.check_cached_grows()
    conv.check_against_cold(cold_engine)


def test_ram_restore_with_more_conversations_than_sequences_equals_cold(engine, cold_engine):
    store = make_store(engine, None)
    convs = [Conversation(engine, n, session=n) for n in ("x", "y", "z")]
    with scheduler(engine, store=store) as (s, c):
        for i in range(3):  # round robin over 2 sequences: every turn after the first round restores
            for conv in convs:
                conv.turn(s, c, f"round {i}")
    for conv in convs:
        assert all(k == "ram" for k in conv.kinds[1:]), conv.kinds
        assert not any(conv.misses)
        conv.check_cached_grows()
        # y's and z's first prompts found the shared system prompt in x's cache: x's first turn built it
        conv.check_against_cold(cold_engine, base=() if conv is convs[0] else convs[0].history[:1])
    assert store.stats()["ram_entries"] >= 3


def test_the_tiers_keep_no_state_longer_than_the_selftest_allows(engine):
    """The round robin above with the self-test's limit (kvselftest.restore_limit) below what the
    conversations hold: no state of theirs is saved, so no turn restores one (each recomputes what
    no sequence still holds), and a limit of 0 turns the tiers off."""
    store = make_store(engine, None)
    convs = [Conversation(engine, n, session=n) for n in ("x", "y", "z")]
    with scheduler(engine, store=store, restore_up_to=64) as (s, c):
        for i in range(3):
            for conv in convs:
                conv.turn(s, c, f"round {i}")
    assert all(len(conv.history[0][0]) > 64 for conv in convs)
    for conv in convs:
        assert not {"ram", "disk"} & set(conv.kinds), conv.kinds
    assert store.stats()["ram_entries"] == 0
    assert KvReuse(engine, n_seq=2, store=make_store(engine, None), restore_up_to=0, max_busy=2).store is None


def test_disk_restore_after_restart_equals_cold_and_survives_only_same_settings(engine, cold_engine, tmp_path):
    conv = Conversation(engine, "d", session="D")
    store = make_store(engine, tmp_path)
    with scheduler(engine, store=store) as (s, c):
        for i in range(3):
            conv.turn(s, c, f"before restart {i}")
    store.close()  # the scheduler saved its idle sequences at exit; the store wrote them
    assert list(tmp_path.glob("*.kv"))
    store = make_store(engine, tmp_path)  # a new worker: the index comes from the files
    with scheduler(engine, store=store) as (s, c):
        for i in range(3):
            conv.turn(s, c, f"after restart {i}")
    store.close()
    assert conv.kinds[3] == "disk" and conv.kinds[4:] == ["sticky", "sticky"]
    conv.check_cached_grows()
    conv.check_against_cold(cold_engine)
    # other settings: every file is deleted, never restored, and the session is told why
    store = make_store(engine, tmp_path, n_batch_changed=True)
    assert not list(tmp_path.glob("*.kv")) and store.stats()["invalidated"] >= 1
    with scheduler(engine, store=store) as (s, c):
        conv.turn(s, c, "after the settings changed")
    store.close()
    assert conv.kinds[-1] == "cold" and conv.misses[-1] == "model-reloaded"
    conv.check_against_cold(cold_engine)


@pytest.mark.parametrize("damage", ["flip", "truncate"])
def test_a_corrupt_or_torn_disk_entry_is_detected_and_recomputed(engine, cold_engine, tmp_path, damage):
    conv = Conversation(engine, "k", session="K")
    store = make_store(engine, tmp_path)
    with scheduler(engine, store=store) as (s, c):
        for i in range(2):
            conv.turn(s, c, f"turn {i}")
    store.close()
    files = list(tmp_path.glob("*.kv"))
    assert len(files) == 1
    raw = bytearray(files[0].read_bytes())
    if damage == "flip":
        raw[-100] ^= 0xFF
    else:
        raw = raw[: len(raw) - 1000]
    files[0].write_bytes(bytes(raw))
    (tmp_path / "leftover.kv.123.tmp").write_bytes(b"half a write")
    store = make_store(engine, tmp_path)
    assert not (tmp_path / "leftover.kv.123.tmp").exists()
    with scheduler(engine, store=store) as (s, c):
        conv.turn(s, c, "after the damage")
    store.close()
    assert conv.kinds[-1] == "cold" and conv.misses[-1] == ""  # recomputed, never restored
    assert store.stats()["corrupt"] == 1 and not files[0].exists()
    conv.check_against_cold(cold_engine)


def test_retention_bound_moves_idle_caches_to_ram_and_back(engine, cold_engine):
    """In one unified buffer; with a buffer per sequence retained caches slow nobody, so the bound
    does not apply and A's cache stays where it is."""
    store = make_store(engine, None)
    a, b = Conversation(engine, "ra", session="RA"), Conversation(engine, "rb", session="RB")
    with scheduler(engine, store=store, max_retained=300) as (s, c):
        a.turn(s, c, "one")
        b.turn(s, c, "one")
        deadline = time.monotonic() + 10
        while any(x.busy for x in s.pool.slots) and time.monotonic() < deadline:
            time.sleep(0.01)  # B's last token goes in after its grace
        # unified: A's cache was dropped (into RAM) when B's finished; split: both stay
        assert (s.pool.retained() <= 300) is engine.kv_unified
        a.turn(s, c, "two")
    assert a.kinds[1] == ("ram" if engine.kv_unified else "sticky")
    a.check_against_cold(cold_engine)


def test_misses_are_explained(engine):
    logged = []
    with scheduler(engine, n_seq=1, log=lambda event, **kw: logged.append((event, kw))) as (s, c):  # no tiers: an evicted cache is lost
        a, b = Conversation(engine, "ma", session="MA"), Conversation(engine, "mb", session="MB")
        a.turn(s, c, "one")
        b.turn(s, c, "one")
        a.turn(s, c, "two")
        assert a.kinds[1] == "prefix" and a.misses[1] == "evicted"  # only the shared system prompt was left
        a.history[-1] = (a.history[-1][0][:-5] + [ord("!")] * 5, 0, MAX_TOKENS)  # the client rewrote its last line
        a.turn(s, c, "three")
        prompt = a.history[-2][0]
        assert a.misses[2] == f"diverged-at={len(prompt) - 5}"
    misses = [(kw["session"], kw["reason"]) for event, kw in logged if event == "cache_miss"]
    assert misses == [("MA", "evicted"), ("MA", f"diverged-at={len(prompt) - 5}")]  # the worker's log says it too


def test_a_template_change_across_a_restart_is_explained(engine, tmp_path):
    conv = Conversation(engine, "tc", session="TC")
    store = make_store(engine, tmp_path)
    with scheduler(engine, store=store) as (s, c):
        conv.turn(s, c, "one")
    store.close()
    store = make_store(engine, tmp_path, template="t2")  # same model and settings, another chat template
    with scheduler(engine, store=store, template="t2") as (s, c):
        prompt = conv.next_prompt("two")
        prompt[0] = (prompt[0] + 1) % 256  # the new template renders the start otherwise
        s.submit(make_request(engine, "tc-2", prompt, max_tokens=MAX_TOKENS, session="TC"))
        c.wait(["tc-2"])
    store.close()
    assert c.done()["tc-2"].cache.miss == "template-changed"


def test_store_spills_ram_to_disk_and_trims_disk(engine, tmp_path):
    store = KvStore(namespace={"m": 1}, ram_bytes=1000, disk_bytes=2000, directory=tmp_path)
    assert store.ready.wait(5)
    for i in range(5):
        store.put([i] * 10, bytes([i]) * 600, session=f"s{i}")
    store.flush()
    st = store.stats()
    assert st["ram_bytes"] <= 1000 and st["disk_bytes"] <= 2500 and st["disk_evictions"] >= 1
    entry, n = store.find([4] * 10 + [9])
    assert n == 10 and store.take(entry) == bytes([4]) * 600
    oldest, n_old = store.find([0] * 10)
    assert oldest is None or n_old == 0  # least recently used first out
    store.close()
    assert len(list(tmp_path.glob("*.kv"))) == st["disk_entries"]
    assert os.path.getsize(next(tmp_path.glob("*.kv"))) > 600


def test_disk_entries_of_a_model_file_whose_contents_changed_are_deleted(tmp_path):
    """A model re-pulled under the same name and path (other weights): its fingerprint in the
    namespace changes, so the old entries are deleted at the next start, never restored."""
    from barrel_inference.worker.kvstore import model_fingerprint

    weights = tmp_path / "model.gguf"
    rng = np.random.default_rng(5)
    body = rng.integers(0, 256, 3 << 20, dtype=np.uint8).tobytes()
    weights.write_bytes(body)
    before = model_fingerprint(str(weights))
    assert model_fingerprint(str(weights)) == before  # the same file, the same identity
    kv = tmp_path / "kv"
    store = KvStore(namespace={"model": before}, ram_bytes=1000, disk_bytes=10_000, directory=kv)
    assert store.ready.wait(5)
    for i in range(3):
        store.put([i] * 10, bytes([i]) * 600, session=f"s{i}")
    store.flush()
    store.close()
    assert list(kv.glob("*.kv"))
    weights.write_bytes(body[:-1] + bytes([(body[-1] + 1) % 256]))  # its last byte differs, not its size
    after = model_fingerprint(str(weights))
    assert after != before
    store = KvStore(namespace={"model": after}, ram_bytes=1000, disk_bytes=10_000, directory=kv)
    assert store.ready.wait(5)
    assert store.stats()["disk_entries"] == 0 and store.stats()["invalidated"] >= 1 and not list(kv.glob("*.kv"))
    store.close()


def test_a_write_that_dies_midway_leaves_no_entry_under_its_name(tmp_path, monkeypatch):
    """A disk entry is written to a temporary name and renamed once whole: a write that fails after
    its bytes went out (a crash, a full disk) leaves nothing that a restart would read as an entry,
    and the restart removes the leftover."""
    from barrel_inference.worker import kvstore

    logged = []
    store = KvStore(namespace={"m": 1}, ram_bytes=1000, disk_bytes=10_000, directory=tmp_path,
                    log=lambda event, **kw: logged.append(event))  # fmt: skip
    assert store.ready.wait(5)

    def die(fd):
        raise OSError("the disk went away before the write was whole")

    monkeypatch.setattr(kvstore.os, "fsync", die)
    for i in range(3):  # over the RAM tier: the older ones spill to disk, and every write dies
        store.put([i] * 10, bytes([i]) * 600, session=f"s{i}")
    store.flush()
    assert "kv_io_error" in logged and store.stats()["disk_entries"] == 0
    assert not list(tmp_path.glob("*.kv")) and list(tmp_path.glob("*.tmp"))  # written, never renamed
    monkeypatch.undo()
    store.close()
    again = KvStore(namespace={"m": 1}, ram_bytes=1000, disk_bytes=10_000, directory=tmp_path)
    assert again.ready.wait(5)
    assert again.stats()["disk_entries"] == 0 and not list(tmp_path.glob("*.tmp"))
    again.close()


def test_two_requests_of_one_session_at_once_share_the_prefix(engine):
    """The second request of a session whose sequence is busy copies the committed prefix from it."""
    tok = lambda s: engine.tokenize(s, add_special=False)  # noqa: E731
    first = tok(SYSTEM + "\nuser: write a long story\nassistant:")
    second = tok(SYSTEM + "\nuser: and a short poem\nassistant:")
    shared = next(i for i, (a, b) in enumerate(zip(first, second)) if a != b)
    with scheduler(engine) as (s, c):
        s.submit(make_request(engine, "long", first, max_tokens=700, session="S"))
        c.wait_for(lambda: c.first_delta_time("long") is not None)
        s.submit(make_request(engine, "short", second, max_tokens=4, session="S"))
        c.wait(["short"])
        s.abort(["long"])
        c.wait(["long"])
    done = c.done()["short"]
    assert done.cache.kind == "copy" and done.usage.cached_tokens == shared
    assert c.done()["long"].finish_reason.value == "abort"
