"""The continuous-batching scheduler on the fake engine (deterministic text) and the tiny GGUF (real llama.cpp)."""

import time
from types import SimpleNamespace

import pytest

from barrel_inference.protocol import FinishReason
from barrel_inference.worker.fake import TEXT, FakeEngine
from barrel_inference.worker.request import Phase

from .harness import Running, make_request, settle_tails


class RecordingEngine(FakeEngine):
    """Fake engine that records every batch it decodes."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.batches = []
        self.fail_next = False

    def decode(self, tokens, pos, seqs, logits):
        self.batches.append((list(seqs), list(logits)))
        if self.fail_next:
            self.fail_next = False
            return -3
        return super().decode(tokens, pos, seqs, logits)


def test_stop_sequence_split_across_tokens_is_honoured_and_never_emitted():
    eng = FakeEngine(tps=0)
    with Running(eng) as (s, c):
        s.submit(make_request(eng, "a", "hi", max_tokens=200, stop=["own f"]))  # byte tokens: spans 5 tokens
        c.wait(["a"])
    done = c.done()["a"]
    assert done.finish_reason is FinishReason.STOP and done.stop_sequence == "own f"
    assert c.text("a") == "the quick br"


def test_max_tokens_gives_length_and_exact_count():
    eng = FakeEngine()
    with Running(eng) as (s, c):
        s.submit(make_request(eng, "a", "hi", max_tokens=7))
        c.wait(["a"])
    d = c.done()["a"]
    assert d.finish_reason is FinishReason.LENGTH and d.usage.completion_tokens == 7
    assert c.text("a") == TEXT[:7]


def test_context_full_gives_length():
    eng = FakeEngine(n_ctx=32)
    with Running(eng, n_ctx=32) as (s, c):
        s.submit(make_request(eng, "a", "x" * 20, max_tokens=None))
        c.wait(["a"])
    d = c.done()["a"]
    assert d.finish_reason is FinishReason.LENGTH
    assert d.usage.prompt_tokens + d.usage.completion_tokens == 32


def test_late_request_joins_running_batch_next_tick():
    eng = RecordingEngine(tps=200)  # 5 ms per tick
    with Running(eng) as (s, c):
        s.submit(make_request(eng, "a", "hi", max_tokens=100))
        c.wait_for(lambda: c.first_delta_time("a") is not None)
        s.submit(make_request(eng, "b", "hello", max_tokens=5))
        c.wait(["a", "b"])
    # b's first token arrived while a was still generating
    end_a = next(ts for ts, _, t in c.ticks if any(d.id == "a" for d in t.done))
    assert c.first_delta_time("b") < end_a
    # and at least one batch held both sequences together
    assert any(len(set(seqs)) == 2 for seqs, _ in eng.batches)


def test_abort_frees_the_sequence_within_one_tick():
    eng = RecordingEngine(n_seq_max=1, tps=100)
    with Running(eng) as (s, c):
        s.submit(make_request(eng, "a", "hi", max_tokens=10_000))
        s.submit(make_request(eng, "b", "xy", max_tokens=3))  # waits: only one sequence
        c.wait_for(lambda: c.first_delta_time("a") is not None)
        n_before = len(eng.batches)
        s.abort(["a"])
        c.wait(["a", "b"])
        assert c.done()["a"].finish_reason is FinishReason.ABORT
        assert c.done()["b"].finish_reason is FinishReason.LENGTH
        # b was admitted right after the abort: within two decodes of it
        first_b = next(i for i, (seqs, _) in enumerate(eng.batches) if i >= n_before and seqs and eng.batches[i][0] == [0] * len(seqs) and len(seqs) > 1)
        assert first_b - n_before <= 2
        s.abort(["a", "a", "zzz"])  # idempotent: no second done, no error
        s.submit(make_request(eng, "c", "z", max_tokens=1))  # handled after the aborts: its done marks them as seen
        c.wait(["c"])
        assert s.stats()["aborts_total"] == 1
    assert sum(1 for _, _, t in c.ticks for d in t.done if d.id == "a") == 1


def expected_text(offset: int, n: int) -> str:
    """What the fake model continues with after a prompt ending in TEXT[:offset]."""
    return (TEXT * (1 + (offset + n) // len(TEXT)))[offset : offset + n]


def test_each_request_reads_its_own_batch_row():
    """Streams at different points of the fake text share every batch, with prefill chunks of other
    prompts among and after their decode rows: a request that reads another row gets another
    sequence's token (or a row without logits) and its text goes wrong."""
    eng = RecordingEngine(n_seq_max=4, tps=500)
    offsets = {"a": 0, "b": 4, "c": 11, "d": 23}
    with Running(eng, prefill_chunk=8) as (s, c):
        for rid, k in offsets.items():
            s.submit(make_request(eng, rid, "#" * (1 + len(rid) * 5 + k % 3) + TEXT[:k], max_tokens=40 if rid != "b" else 6))
        c.wait(["b"])  # frees a sequence in the middle of the admission order
        s.submit(make_request(eng, "late", "@" * 30 + TEXT[:7], max_tokens=30))  # prefilled in 5 chunks beside a, c, d
        c.wait([*offsets, "late"])
    offsets["late"] = 7
    for rid, k in offsets.items():
        n = c.done()[rid].usage.completion_tokens
        assert c.done()[rid].finish_reason is FinishReason.LENGTH, (rid, c.done()[rid])
        assert c.text(rid) == expected_text(k, n), rid
    # the mapping was exercised: batches held several decode rows followed by another prompt's chunk
    mixed = [lg for seqs, lg in eng.batches if len(set(seqs)) >= 3 and lg.count(False) >= 4 and lg[0]]
    assert mixed, "no batch mixed decode rows with a prefill chunk"


def test_long_prompt_is_chunked_and_never_stalls_running_streams():
    eng = RecordingEngine(tps=1000)
    with Running(eng, prefill_chunk=64) as (s, c):
        s.submit(make_request(eng, "run", "go", max_tokens=200))
        c.wait_for(lambda: c.first_delta_time("run") is not None)
        s.submit(make_request(eng, "long", "y" * 1000, max_tokens=2))
        c.wait(["run", "long"])
    # every batch that carried part of the long prompt also carried the running stream's token,
    # and no batch carried more than one chunk of it
    seq_long = None
    for seqs, logits in eng.batches:
        counts = {q: seqs.count(q) for q in set(seqs)}
        big = [q for q, n in counts.items() if n > 2]
        if big:
            seq_long = big[0]
            assert counts[seq_long] <= 64
            assert len(counts) == 2, "a prefill chunk ran without the decoding stream"
    assert seq_long is not None
    assert c.done()["long"].usage.prompt_tokens == 1000


def test_failed_decode_fails_only_requests_in_flight_and_recovers():
    eng = RecordingEngine(n_seq_max=1, tps=100)
    with Running(eng) as (s, c):
        s.submit(make_request(eng, "a", "hi", max_tokens=1000))
        c.wait_for(lambda: c.first_delta_time("a") is not None)
        eng.fail_next = True
        c.wait(["a"])
        s.submit(make_request(eng, "b", "hi", max_tokens=3))
        c.wait(["b"])
    a, b = c.done()["a"], c.done()["b"]
    assert a.finish_reason is FinishReason.ERROR and a.error.code.value == "decode_failed" and a.error.retryable
    assert b.finish_reason is FinishReason.LENGTH and c.text("b") == TEXT[:3]


def test_a_sampler_that_cannot_be_built_fails_only_its_request():
    class Flaky(FakeEngine):
        def make_sampler(self, sampling, grammar=None):
            if sampling.seed == 13:
                raise RuntimeError("boom")
            return super().make_sampler(sampling, grammar)

    eng = Flaky()
    with Running(eng) as (s, c):
        s.submit(make_request(eng, "bad", "hi", max_tokens=3, seed=13))
        s.submit(make_request(eng, "good", "hi", max_tokens=3))
        c.wait(["bad", "good"])
    bad, good = c.done()["bad"], c.done()["good"]
    assert bad.finish_reason is FinishReason.ERROR and bad.error.code.value == "internal" and "boom" in bad.error.message
    assert good.finish_reason is FinishReason.LENGTH and c.text("good") == TEXT[:3]
    assert s.pool.n_busy == 0


def test_stats_profile_counts_ticks():
    eng = FakeEngine()
    with Running(eng) as (s, c):
        s.submit(make_request(eng, "a", "hi", max_tokens=5))
        c.wait(["a"])
        deadline = time.monotonic() + 5
        while s.pool.n_busy and time.monotonic() < deadline:  # the last token's tick follows the done
            time.sleep(0.005)
        st = s.stats()
    # 5 ticks for 5 tokens, then one that puts the last sampled token into the cache
    assert st["profile"]["ticks"] == 6 and st["requests_total"] == 1
    assert set(st["profile"]["ms_per_tick"]) == {"build", "decode", "sample", "detokenize", "send", "total"}


# ---- the real engine on the tiny GGUF ------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_engine(tiny_gguf):
    from barrel_inference.worker.engine import LlamaEngine

    e = LlamaEngine(str(tiny_gguf), n_ctx=512, n_seq_max=4, n_batch=256, threads=2)
    yield e
    e.close()


def test_identical_greedy_requests_batched_together_agree(tiny_engine):
    with Running(tiny_engine) as (s, c):
        for i in range(4):
            s.submit(make_request(tiny_engine, f"r{i}", "the cat sat", max_tokens=24))
        c.wait([f"r{i}" for i in range(4)])
    texts = {c.text(f"r{i}") for i in range(4)}
    assert len(texts) == 1 and all(c.done()[f"r{i}"].usage.completion_tokens == 24 for i in range(4))


def test_session_reuses_its_kv_prefix(tiny_engine):
    with Running(tiny_engine) as (s, c):
        s.submit(make_request(tiny_engine, "t1", "hello there, general", max_tokens=8, session="S"))
        c.wait(["t1"])
        s.submit(make_request(tiny_engine, "t2", "hello there, general kenobi", max_tokens=8, session="S"))
        s.submit(make_request(tiny_engine, "t3", "a different start entirely", max_tokens=8))
        c.wait(["t2", "t3"])
    d = c.done()
    assert d["t1"].usage.cached_tokens == 0
    n1 = len(tiny_engine.tokenize("hello there, general", add_special=False))
    assert d["t2"].usage.cached_tokens == n1  # the whole first prompt was already in the seq's KV
    assert d["t3"].usage.cached_tokens == 0


def test_a_follow_up_turn_reuses_the_kv_of_the_previous_one_without_a_session(tiny_engine):
    first = "user: tell me a story about a lighthouse keeper\nassistant:"
    with Running(tiny_engine) as (s, c):
        s.submit(make_request(tiny_engine, "turn1", first, max_tokens=10))
        c.wait(["turn1"])
        answer = [t for _, _, tk in c.ticks for d in tk.deltas if d.id == "turn1" for t in d.tokens]
        follow = tiny_engine.tokenize(first, add_special=False) + answer + tiny_engine.tokenize("\nuser: and then?", add_special=False)
        s.submit(make_request(tiny_engine, "turn2", follow, max_tokens=4))
        c.wait(["turn2"])
    turn1 = c.done()["turn1"]
    cached = c.done()["turn2"].usage.cached_tokens
    # the prompt and the whole answer (its last sampled token joined one more batch) are reused
    assert cached == turn1.usage.prompt_tokens + turn1.usage.completion_tokens


def test_a_reused_prefix_continues_exactly_like_a_fresh_split_of_the_same_work(tiny_engine):
    """Warm == cold bitwise only against a cold run that splits the work the same way: here the
    cold run decodes the prompt minus its last token, then the last token alone."""
    prompt = tiny_engine.tokenize("the quick brown fox", add_special=False)
    with Running(tiny_engine) as (s, c):
        s.submit(make_request(tiny_engine, "warmup", prompt[:-1], max_tokens=1))
        c.wait(["warmup"])
        s.submit(make_request(tiny_engine, "warm", prompt, max_tokens=12))
        c.wait(["warm"])
    assert c.done()["warm"].usage.cached_tokens == len(prompt) - 1
    from barrel_inference.protocol import Sampling

    e = tiny_engine
    seq = 3
    e.seq_clear(seq)
    n = len(prompt)
    assert e.decode(prompt[:-1], list(range(n - 1)), [seq] * (n - 1), [False] * (n - 1)) == 0
    sampler = e.make_sampler(Sampling(temperature=0))
    out, tok, pos = [], prompt[-1], n - 1
    for _ in range(12):
        assert e.decode([tok], [pos], [seq], [True]) == 0
        tok = e.sample(sampler, 0)
        out.append(tok)
        pos += 1
    e.seq_clear(seq)
    warm = [t for _, _, tk in c.ticks for d in tk.deltas if d.id == "warm" for t in d.tokens]
    assert warm == out


def test_sampling_with_seed_is_reproducible(tiny_engine):
    with Running(tiny_engine) as (s, c):
        s.submit(make_request(tiny_engine, "x", "abc", max_tokens=16, temperature=1.0, seed=42, top_k=0, top_p=1.0, min_p=0.0))
        c.wait(["x"])
        s.submit(make_request(tiny_engine, "y", "abc", max_tokens=16, temperature=1.0, seed=42, top_k=0, top_p=1.0, min_p=0.0))
        s.submit(make_request(tiny_engine, "z", "abc", max_tokens=16, temperature=1.0, seed=7, top_k=0, top_p=1.0, min_p=0.0))
        c.wait(["y", "z"])
    assert c.text("x") == c.text("y")
    assert c.text("x") != c.text("z")


def test_logit_bias_forces_a_token(tiny_engine):
    target = tiny_engine.tokenize("Q", add_special=False)[0]
    with Running(tiny_engine) as (s, c):
        s.submit(make_request(tiny_engine, "b", "the cat", max_tokens=6, logit_bias={target: 100.0}))
        c.wait(["b"])
    assert c.text("b") == "Q" * 6


def test_penalties_reduce_repetition(tiny_engine):
    with Running(tiny_engine) as (s, c):
        s.submit(make_request(tiny_engine, "plain", "the cat", max_tokens=48))
        s.submit(make_request(tiny_engine, "rep", "the cat", max_tokens=48, repeat_penalty=3.0, repeat_last_n=64))
        s.submit(make_request(tiny_engine, "pres", "the cat", max_tokens=48, presence_penalty=5.0))
        c.wait(["plain", "rep", "pres"])
    toks = {rid: [t for _, _, tk in c.ticks for d in tk.deltas if d.id == rid for t in d.tokens] for rid in ("plain", "rep", "pres")}
    assert len(set(toks["rep"])) > len(set(toks["plain"]))
    assert len(set(toks["pres"])) > len(set(toks["plain"]))


@pytest.mark.parametrize("unified, rows, chunk", [(True, 16, 13), (False, 19, 16)])
def test_a_prefill_chunk_fills_the_batch_to_a_whole_chunk_of_rows(unified, rows, chunk):
    """With streams decoding in one KV buffer, the long prompt's chunk gives way to their rows:
    every batch that is not its last holds exactly prefill_chunk rows (not prefill_chunk + the
    decode rows). With a buffer per sequence the prompt's own rows are a whole chunk."""
    eng = RecordingEngine(n_seq_max=4, tps=1000)
    eng.kv_unified = unified
    with Running(eng, prefill_chunk=16) as (s, c):
        for k in range(3):
            s.submit(make_request(eng, f"run{k}", "go" + "!" * k, max_tokens=120))
        c.wait_for(lambda: all(c.first_delta_time(f"run{k}") is not None for k in range(3)))
        s.submit(make_request(eng, "long", "y" * 200, max_tokens=2))
        c.wait(["long"])
    shapes = []
    for seqs, _ in eng.batches:
        counts = {q: seqs.count(q) for q in set(seqs)}
        prompt = [n for n in counts.values() if n > 1]
        if prompt and len(counts) == 4:  # three decode rows beside a chunk of the long prompt
            shapes.append((len(seqs), prompt[0]))
    assert len(shapes) >= 10
    assert all(shape == (rows, chunk) for shape in shapes[:-1]), shapes
    assert c.done()["long"].usage.prompt_tokens == 200


@pytest.mark.parametrize("unified", [False, True])
def test_a_finished_turns_last_token_stays_out_of_another_prompts_batch_with_a_buffer_per_sequence(unified):
    """A's last token waits (a grace) when B arrives. With a KV buffer per sequence it would be a
    pass of its own in B's prompt batch, before B's first token: it waits for B's decode rows
    instead, and still enters A's cache, so A's next turn reuses prompt and completion. With one
    buffer it rides in B's first batch (one row more in the same pass)."""
    eng = RecordingEngine(n_seq_max=4, tps=1000)
    eng.kv_unified = unified
    with Running(eng, prefill_chunk=64) as (s, c):
        s.tail_grace_s = 1.0  # A's tail would wait this long for work to ride along with
        first = "alpha asks a question"
        s.submit(make_request(eng, "a1", first, max_tokens=4, session="A"))
        c.wait(["a1"])
        a_seq = eng.batches[0][0][0]
        assert s.stats()["tails_pending"] == 1
        n_before = len(eng.batches)
        s.submit(make_request(eng, "b1", "bravo has a longer question of its own", max_tokens=6, session="B"))
        c.wait(["b1"])
        settle_tails(s)
        n_after = len(eng.batches)
        s.submit(make_request(eng, "a2", first + c.text("a1") + " and then", max_tokens=2, session="A"))
        c.wait(["a2"])
    b_batches = [seqs for seqs, _ in eng.batches[n_before:n_after]]
    prompt = [seqs for seqs in b_batches if len(seqs) > 2]  # B's prompt batch, with A's tail or not
    assert len(prompt) == 1
    assert (a_seq in prompt[0]) is unified, prompt
    assert sum(seqs.count(a_seq) for seqs in b_batches) == 1  # the tail went in once, with B's rows
    assert c.done()["a2"].usage.cached_tokens == len(first) + 4  # prompt and every generated token
    assert s.n_tails_folded == 0


def test_a_conversation_stays_on_its_sequence_while_another_ones_last_token_waits():
    """With a buffer per sequence a cache away from the running sequences is copied next to them.
    A sequence whose request only has its last token to put in the cache is not running: A's next
    turn stays on its own sequence (no copy of the whole conversation) while B's token waits."""
    eng = RecordingEngine(n_seq_max=3, n_seq_idle=2, tps=1000)
    eng.kv_unified = False
    with Running(eng, prefill_chunk=64) as (s, c):
        s.tail_grace_s = 1.0

        def turn(rid, session, prompt, settle=True):
            s.submit(make_request(eng, rid, prompt, max_tokens=4, session=session))
            c.wait([rid])
            if settle:
                settle_tails(s)

        first = "alpha asks a question"
        turn("a1", "A", first)
        turn("c1", "C", "charlie says something else")
        turn("d1", "D", "delta says something different")
        turn("b1", "B", "bravo has a question too", settle=False)  # its last token waits (the grace)
        assert s.stats()["tails_pending"] == 1
        turn("a2", "A", first + c.text("a1") + " and then")
    assert c.done()["a2"].cache.kind == "sticky", c.done()["a2"].cache
    assert s.pool.session_seq("A") == 0  # where its first turn went
    assert c.done()["a2"].usage.cached_tokens == len(first) + 4


def test_split_layout_sorts_rows_by_sequence_and_gives_prompts_equal_chunks():
    """With a KV buffer per sequence llama.cpp decodes a run of consecutive sequence ids with
    equally many rows each in one pass: every batch comes in sequence order, the prompts that
    prefill together take equal chunks, and each request still reads its own row (a late request
    takes a sequence freed below running ones, so admission order and id order differ)."""
    eng = RecordingEngine(n_seq_max=4, tps=500)
    eng.kv_unified = False
    offsets = {"a": 0, "b": 4, "c": 11, "d": 23}
    with Running(eng, prefill_chunk=8) as (s, c):
        for rid, k in offsets.items():
            s.submit(make_request(eng, rid, "#" * (30 + 9 * "abcd".index(rid)) + TEXT[:k], max_tokens=40 if rid != "b" else 6))
        c.wait(["b"])
        s.submit(make_request(eng, "late", "@" * 30 + TEXT[:7], max_tokens=30))
        c.wait([*offsets, "late"])
    offsets["late"] = 7
    for rid, k in offsets.items():
        n = c.done()[rid].usage.completion_tokens
        assert c.text(rid) == expected_text(k, n), rid
    for seqs, _ in eng.batches:  # two groups (one row a sequence, several), each in id order, no run joining them
        groups = [[q for q in dict.fromkeys(seqs) if (seqs.count(q) > 1) is many] for many in (False, True)]
        order = list(dict.fromkeys(seqs))
        assert all(g == sorted(g) for g in groups), seqs
        assert order in (groups[0] + groups[1], groups[1] + groups[0]), seqs
        if all(groups):
            first, second = groups if order[0] in groups[0] else groups[::-1]
            assert first[-1] + 1 != second[0], seqs
    together = []
    for seqs, _ in eng.batches:
        chunks = [n for n in (seqs.count(q) for q in set(seqs)) if n > 1]
        if len(chunks) >= 2:
            together.append(chunks)
    assert together, "no batch held two prompts' chunks"
    assert all(len(set(chunks)) == 1 for chunks in together), together


def test_even_chunk_is_the_shortest_remainder_within_the_chunk_and_budget_unless_twice_as_short():
    eng = FakeEngine()
    eng.kv_unified = False
    with Running(eng, prefill_chunk=64) as (s, _):
        pass

    def prompt(n, done):
        return SimpleNamespace(phase=Phase.PREFILL, prompt=[0] * n, n_past=done)

    long, short, other = prompt(300, 0), prompt(120, 80), prompt(90, 0)
    s.active = [long]
    assert s.even_chunk(512) is None  # one prompt: its own chunk
    s.active = [long, short, other]
    assert s.even_chunk(512) == 40  # 120 - 80 left of the second; 64 of this tick's chunk for the others
    s.active = [long, prompt(120, 90)]
    assert s.even_chunk(512) is None  # 30 against 64: the long one would wait for the short one
    s.active = [long, other]
    assert s.even_chunk(512) == 64 and s.even_chunk(100) == 50 and s.even_chunk(1) == 1


def test_in_sequence_order_moves_each_requests_row_with_it():
    with Running(FakeEngine()) as (s, _):
        pass
    decoding, done_prompt, other = SimpleNamespace(row=0), SimpleNamespace(row=2), SimpleNamespace(row=-1)
    s.active = [decoding, done_prompt, other]
    # decode rows of 3 and 2, a prompt chunk of 1: the decode group (2, 3) first, then the prompt
    out = s._in_sequence_order([10, 11, 12, 13], [5, 0, 1, 7], [3, 1, 1, 2], [True, False, True, True])
    assert out == ([13, 10, 11, 12], [7, 5, 0, 1], [2, 3, 1, 1], [True, True, False, True])
    assert (decoding.row, done_prompt.row, other.row) == (1, 3, -1)
    # decode rows of 3..6 and a prompt chunk of 7: 6 + 1 would join them in one run, so the prompt goes first
    decoding.row, done_prompt.row = 1, 6
    out = s._in_sequence_order([1, 2, 3, 4, 10, 11, 12], [9] * 4 + [0, 1, 2], [6, 5, 4, 3, 7, 7, 7], [True] * 4 + [False, False, True])
    assert out[2] == [7, 7, 7, 3, 4, 5, 6] and out[1] == [0, 1, 2, 9, 9, 9, 9]
    assert (decoding.row, done_prompt.row) == (5, 2)


@pytest.mark.parametrize(
    "chunk, n_decode, first",
    [(256, 0, 256), (256, 4, 252), (256, 128, 128), (256, 129, 256), (256, 260, 252), (8, 3, 5), (1, 5, 1)],
)
def test_first_chunk_counts_decode_rows_unless_the_prompt_would_get_under_half_a_chunk(chunk, n_decode, first):
    with Running(FakeEngine(), prefill_chunk=chunk) as (s, _):
        assert s.first_chunk(n_decode) == first
        s.engine.kv_unified = False
        assert s.first_chunk(n_decode) == chunk


def test_accepted_comes_at_admission_before_any_output_with_cached_tokens():
    """Accepted is sent in the tick that gives the request a sequence, ahead of its first token:
    with a prompt longer than one prefill chunk it arrives while the prompt is still being read."""
    eng = RecordingEngine()
    with Running(eng, prefill_chunk=4) as (s, c):
        s.submit(make_request(eng, "a", "x" * 20, max_tokens=3, session="S"))
        c.wait(["a"])
        s.submit(make_request(eng, "b", "x" * 20 + "yy", max_tokens=2, session="S"))
        c.wait(["b"])
    ticks = [t for _, _, t in c.ticks]
    first_acc = next(i for i, t in enumerate(ticks) if any(a.id == "a" for a in t.accepted))
    first_out = next(i for i, t in enumerate(ticks) if any(d.id == "a" and d.parts for d in t.deltas))
    assert first_acc < first_out  # 20 prompt tokens at 4 per tick: accepted ticks before the first token
    [acc_a] = [a for t in ticks for a in t.accepted if a.id == "a"]
    [acc_b] = [a for t in ticks for a in t.accepted if a.id == "b"]
    assert (acc_a.prompt_tokens, acc_a.cached_tokens, acc_a.n_ctx) == (20, 0, eng.n_ctx)
    assert acc_b.prompt_tokens == 22 and acc_b.cached_tokens == c.done()["b"].usage.cached_tokens > 0
