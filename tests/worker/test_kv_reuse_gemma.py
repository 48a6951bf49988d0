"""KV reuse on the real Gemma 3 270M: reused turns against cold runs.

Gemma's logits move with the batch split (see tests/worker/test_kv_reuse.py), so a reused turn is
compared bit for bit with a cold replay of the same batches, and its agreement with a plain cold
run (the whole prompt in one pass of chunks from position 0) is printed.
"""

import pytest

from .harness import Running
from .test_kv_reuse import CHUNK, MAX_TOKENS, N_CTX, Conversation, replay, scheduler

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
