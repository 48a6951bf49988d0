"""KV reuse on the real Gemma 3 270M: reused turns against cold runs.

Gemma's logits move with the batch split (see tests/worker/test_kv_reuse.py), so a reused turn is
compared bit for bit with a cold replay of the same batches, and its agreement with a plain cold
run (the whole prompt in one pass of chunks from position 0) is printed.
"""

import pytest

from barrel_inference.worker.kvselftest import restore_limit
from barrel_inference.worker.seqpool import common_prefix

from .test_kv_reuse import CHUNK, MAX_TOKENS, N_CTX, SYSTEM, Conversation, make_store, replay, scheduler

pytestmark = pytest.mark.gemma


@pytest.fixture(scope="module")
def gemma(gemma_gguf):
    from barrel_inference.worker.engine import LlamaEngine

    e = LlamaEngine(str(gemma_gguf), n_ctx=N_CTX, n_seq_max=2, n_batch=256, threads=2, extra_buffers=False)  # AMX layouts crash on Gemma here
    yield e
    e.close()


@pytest.fixture(scope="module")
def gemma_cold(gemma_gguf):
    from barrel_inference.worker.engine import LlamaEngine

    e = LlamaEngine(str(gemma_gguf), n_ctx=N_CTX, n_seq_max=1, n_batch=256, threads=2, extra_buffers=False)  # AMX layouts crash on Gemma here
    yield e
    e.close()


def test_sticky_and_copied_turns_equal_the_same_split_and_agreement_with_plain_cold(gemma, gemma_cold):
    sticky = Conversation(gemma, "g", session="G")
    copied = Conversation(gemma, "h")
    with scheduler(gemma) as (s, c):
        for i in range(3):
            sticky.turn(s, c, f"tell me fact number {i} about the sea")
        for i in range(3):
            copied.turn(s, c, f"tell me fact number {i} about the sea", session=f"h{i}")  # a new session each turn
    assert sticky.kinds == ["cold", "sticky", "sticky"]
    assert copied.kinds[1:] == ["copy", "copy"]
    sticky.check_cached_grows()
    sticky.check_against_cold(gemma_cold)
    copied.check_against_cold(gemma_cold, base=sticky.history[:1])  # its system prompt came from g's first turn
    agree = total = 0
    for conv in (sticky, copied):
        for k, (prompt, _, n_gen) in enumerate(conv.history):
            plain = replay(gemma_cold, [(prompt, 0, n_gen)])
            agree += sum(a == b for a, b in zip(plain, conv.outputs[k]))
            total += n_gen
    print(f"\ngemma: reused turns agree with a plain cold run on {agree}/{total} greedy tokens")
    assert total == 6 * MAX_TOKENS and CHUNK > 0


class LongConversation(Conversation):
    """A system prompt of ~800 tokens: past the window (512) and past the ring of window cells a
    buffer of its own keeps (a window and a ubatch: 768), where flash attention's sums depend on
    where the cells lie."""

    def next_prompt(self, user: str) -> list[int]:
        if self.history:
            return super().next_prompt(user)
        return self.e.tokenize(SYSTEM * 16 + f"\nuser ({self.name}): {user}\nassistant:", add_special=False)


@pytest.fixture(scope="module")
def gemma_one(gemma_gguf):
    """One sequence id: every other conversation's turn takes it, so a returning one restores."""
    from barrel_inference.worker.engine import LlamaEngine

    e = LlamaEngine(str(gemma_gguf), n_ctx=N_CTX, n_seq_max=1, n_batch=256, threads=2, extra_buffers=False)  # AMX layouts crash on Gemma here
    yield e
    e.close()


def test_relaid_sequences_restore_from_ram_and_disk_bit_for_bit_beyond_the_window(gemma_one, gemma_cold, tmp_path):
    """At the defaults (flash attention on, a buffer per sequence) a restored Gemma state lies in
    other cells than the run that made it, so the self-test finds restores exact only up to the
    window; relaying a sequence before it continues its whole cache, as a restore of it would lie,
    makes them exact at any length, and the tiers then keep long conversations. Two ~850-token
    conversations over one sequence, then a restart: x's second turn restores from RAM and its
    third continues in place (relaid), y's first reuses x's system prompt by cutting x's cache back
    (not relaid: a relaid cache holds just the window), its second restores from RAM and its third
    from disk. Each turn equals a cold replay of the same batches with the same relayouts, bit
    for bit."""
    e = gemma_one
    e.recreate_context()
    test = e.state_selftest()
    assert test["exact_up_to"] == 512 and test["relayout"] and test["relayout_up_to"] is None, test
    limit = restore_limit(test, "exact")
    assert limit is None
    x, y = LongConversation(e, "x", session="X"), LongConversation(e, "y", session="Y")
    store = make_store(e, tmp_path)
    with scheduler(e, store=store, restore_up_to=limit, relayout=True) as (s, c):
        x.turn(s, c, "tell me fact number 0 about the sea")
        y.turn(s, c, "tell me fact number 0 about the sky")
        x.turn(s, c, "tell me fact number 1 about the sea")
        x.turn(s, c, "tell me fact number 2 about the sea")
        y.turn(s, c, "tell me fact number 1 about the sky")
        stats = s.stats()["cache"]
    store.close()
    store = make_store(e, tmp_path)  # a new worker: y's last state is on disk
    with scheduler(e, store=store, restore_up_to=limit, relayout=True) as (s, c):
        y.turn(s, c, "and one more about the sky")
    store.close()
    assert len(x.history[0][0]) > 768
    assert x.kinds == ["cold", "ram", "sticky"] and y.kinds == ["prefix", "ram", "disk"], (x.kinds, y.kinds)
    assert y.history[0][1] > 768  # cut back past the window's ring: the cache in place kept its slack
    assert stats["relayouts_failed"] == 0 and stats["relayout_ms_max"] > 0
    x.check_cached_grows()
    y.check_cached_grows()
    x.check_against_cold(gemma_cold, relayout=True)
    # y's first turn kept the shared system prompt of x's first turn's cache
    y.check_against_cold(gemma_cold, base=x.history[:1], relayout=True)


@pytest.fixture(scope="module")
def gemma_long(gemma_gguf):
    from barrel_inference.worker.engine import LlamaEngine

    e = LlamaEngine(str(gemma_gguf), n_ctx=2048, n_seq_max=2, n_batch=256, threads=2, extra_buffers=False)  # AMX layouts crash on Gemma here
    yield e
    e.close()


@pytest.fixture(scope="module")
def gemma_cold_long(gemma_gguf):
    from barrel_inference.worker.engine import LlamaEngine

    e = LlamaEngine(str(gemma_gguf), n_ctx=2048, n_seq_max=1, n_batch=256, threads=2, extra_buffers=False)  # AMX layouts crash on Gemma here
    yield e
    e.close()


def test_a_shared_system_prompt_past_the_window_is_checkpointed_for_newcomers(gemma_long, gemma_cold_long):
    """x's conversation has gone ~300 tokens past the ~830-token system prompt it shares with the
    newcomers, so its window layers no longer hold what a copy at the shared length needs (and a
    saved state of it could not be cut back there). The first newcomer, y, recomputes the prompt
    but stops its prefill at the shared length, is relaid there and saves a checkpoint, and goes on
    ~300 tokens past it too; the next, z, restores the checkpoint. Both equal a cold replay of the
    same batches and relayouts, bit for bit."""
    e = gemma_long
    e.recreate_context()
    test = e.state_selftest()
    assert test["relayout"], test
    x, y, z = (LongConversation(e, n, session=n.upper()) for n in ("x", "y", "z"))
    store = make_store(e, None)
    with scheduler(e, store=store, restore_up_to=restore_limit(test, "exact"), relayout=True, n_ctx=2048) as (s, c):
        for i in range(3):
            x.turn(s, c, f"tell me fact number {i} about the sea, in detail. " * 12)
        y.turn(s, c, "tell me a fact about the sky, in detail. " * 30)  # y too goes on well past it
        z.turn(s, c, "tell me a fact about the moon")
        stats = s.stats()["cache"]
    held_by_x = x.history[-1][0] + x.outputs[-1]
    b = common_prefix(y.history[0][0], held_by_x)
    assert len(held_by_x) > b + 257 and b > 768  # x is past the shared prompt by more than its ring keeps
    assert y.kinds == ["cold"] and z.kinds == ["ram"] and z.history[0][1] == b, (y.kinds, z.kinds, z.history[0][1], b)
    assert stats["checkpoints"] == 1
    (y_prompt, _, y_gen), (z_prompt, _, z_gen) = y.history[0], z.history[0]
    assert y.outputs[0] == replay(gemma_cold_long, [(y_prompt, 0, y_gen, b)], relayout=True)
    assert z.outputs[0] == replay(gemma_cold_long, [(y_prompt, 0, y_gen, b), (z_prompt, b, z_gen)], relayout=True)
