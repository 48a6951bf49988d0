"""The load-time KV restore self-test on Gemma 3 (sliding window 512): with llama.cpp's flash
attention a state restored into other cells reproduces the logits bit for bit only within the
window at two threads, but at any length at one thread (the state is complete; two threads sum
a moved window in other shares), and at any length against a sequence relaid as a restore lays
it out; without flash attention the restore is bit-exact beyond the window as it is. Either way
the tiers keep long conversations."""

from __future__ import annotations

import pytest

from barrel_inference.worker import engine as engine_mod
from barrel_inference.worker.engine_api import EngineError

pytestmark = pytest.mark.gemma


def selftest(gguf, flash_attn: str) -> dict:
    e = engine_mod.LlamaEngine(str(gguf), n_ctx=1024, n_seq_max=2, threads=2, extra_buffers=False, flash_attn=flash_attn)
    try:
        assert e.state_key()["flash_attn"] == flash_attn  # saved states of one setting never serve the other
        return e.state_selftest()
    finally:
        e.close()


def test_flash_attention_off_makes_gemma_restores_exact_beyond_the_window(gemma_gguf):
    off = selftest(gemma_gguf, "off")
    assert [p["tokens"] for p in off["probes"]] == [512, 576]
    assert off["exact_up_to"] is None and off["complete_up_to"] is None, off
    assert all(p["exact"] and p["complete"] and p["max_abs_diff"] == 0.0 for p in off["probes"])
    assert off["flash_attn"] == "off"
    assert off["relayout"] is False  # nothing to relay where restores are exact as they are


def test_flash_attention_on_limits_gemma_restores_to_the_window_yet_they_are_complete(gemma_gguf):
    on = selftest(gemma_gguf, "on")
    assert on["exact_up_to"] == 512, on
    assert on["probes"][1]["max_abs_diff"] > 0.0
    # at one thread the restored window gives the same logits bit for bit: nothing is missing
    assert on["complete_up_to"] is None, on
    assert [p["complete"] for p in on["probes"]] == [True, True]
    # a sequence relaid as a restore lays it out and then restored gives its logits bit for bit:
    # the worker relays its idle sequences and the tiers restore at any length
    assert on["relayout_up_to"] is None and on["relayout"] is True, on


def test_an_unknown_flash_attn_setting_is_refused(gemma_gguf):
    with pytest.raises(EngineError, match="flash_attn must be one of"):
        engine_mod.LlamaEngine(str(gemma_gguf), n_ctx=256, n_seq_max=1, flash_attn="maybe")


@pytest.mark.parametrize("swa_full", [False, True])
def test_swa_full_lets_a_prefix_be_copied_out_of_a_longer_sequence(gemma_gguf, swa_full):
    """A shared 1,200-token prefix copied out of a 3,200-token sequence: the window layers of the
    source hold only its latest positions unless swa_full keeps them all, so without it the copy has
    no cells at all in those layers (pos_min -1) and must not be continued (the prompt is
    recomputed); with it the copy continues at 1,200."""
    e = engine_mod.LlamaEngine(str(gemma_gguf), n_ctx=4096, n_seq_max=2, threads=2, extra_buffers=False, swa_full=swa_full)
    try:
        assert e.state_key()["swa_full"] is swa_full
        toks = [(7 * i) % 5000 + 300 for i in range(3200)]
        for start in range(0, 3200, e.n_batch):
            part = toks[start : start + e.n_batch]
            assert e.decode(part, list(range(start, start + len(part))), [0] * len(part), [False] * len(part)) == 0
        e.seq_copy(0, 1, 1200)
        assert (e.seq_pos_min(1) == 0) is swa_full  # without swa_full: -1, no cells in the window layers
        assert e.can_continue(1, 1200) is swa_full
    finally:
        e.close()


def test_a_state_holding_exactly_the_window_is_restored_and_continued_exactly(gemma_gguf):
    """The window layers overwrite a cell once the sequence's next token no longer sees it (n_past -
    pos >= 512), so under pressure a sequence of n tokens keeps positions n - 511 .. n - 1 there:
    exactly what its next token attends to. Such a state, saved and restored, must be continued
    (it was refused by an off-by-one, which sent every such conversation back to a cold prefill),
    and with flash attention off it continues bit-exactly; one token shorter, it lacks a cell.
    (The pressure comes from another sequence in one unified buffer: a buffer of its own keeps a
    window and a ubatch.)"""
    e = engine_mod.LlamaEngine(str(gemma_gguf), n_ctx=2048, n_seq_max=2, threads=2, extra_buffers=False, flash_attn="off",
                               kv_unified=True)  # fmt: skip
    try:
        n = 1000
        toks = [(11 * i) % 5000 + 300 for i in range(3000)]

        def feed(seq: int, start: int, end: int) -> None:
            for s in range(start, end, 64):
                part = toks[s : min(end, s + 64)]
                assert e.decode(part, list(range(s, s + len(part))), [seq] * len(part), [False] * len(part)) == 0

        feed(0, 0, n)
        # another sequence's tokens take over sequence 0's cells that its next token no longer sees
        done = 0
        while e.seq_pos_min(0) < e.window_start(n) and done < 2000:
            feed(1, done, done + 64)
            done += 64
        assert e.window_start(n) == n - 511
        assert e.seq_pos_min(0) == n - 511, "the window layers kept more than the window: nothing to test"
        state = e.state_seq_save(0)
        assert e.decode([toks[n]], [n], [0], [True]) == 0
        ref = e.logits(0).copy()
        e.seq_clear(1)
        assert e.state_seq_load(1, state)
        assert e.seq_pos_min(1) == n - 511
        assert e.can_continue(1, n)
        assert e.decode([toks[n]], [n], [1], [True]) == 0
        assert (e.logits(0) == ref).all()
        assert e.seq_truncate(1, n - 1)
        assert not e.can_continue(1, n - 1)  # position n - 512 is gone
    finally:
        e.close()


@pytest.mark.parametrize("layout", ["unified", "unified-no-headroom", "split"])
def test_window_layers_have_room_for_a_prefix_that_idle_sequences_share(gemma_gguf, monkeypatch, layout):
    """Four conversations share a copied 1,200-token system prompt and then grow 500 tokens each,
    one running sequence and three idle ones. In one unified buffer the window cells of the shared
    prompt stay in the window layers while all four hold them (llama.cpp reuses a window cell only
    when one sequence holds it), so a window cache sized one window per sequence id overflows (a
    decode finds no KV slot); with the headroom the engine asks for, every decode fits. With a
    buffer per sequence each copy has window cells of its own: no headroom is asked for or needed."""
    headroom = layout != "unified-no-headroom"
    if not headroom:
        monkeypatch.setattr(engine_mod.LlamaEngine, "_swa_headroom", lambda self: 0)
    e = engine_mod.LlamaEngine(str(gemma_gguf), n_ctx=2048, n_seq_max=1, n_seq_idle=3, idle_cells=6144, threads=2,
                               extra_buffers=False, kv_unified=layout != "split")  # fmt: skip
    try:
        assert e.n_seq_total == 4
        toks = [(13 * i) % 5000 + 300 for i in range(4000)]

        def feed(seq: int, start: int, end: int, step: int) -> int:
            for s in range(start, end, step):
                part = toks[s : min(end, s + step)]
                rc = e.decode(part, list(range(s, s + len(part))), [seq] * len(part), [False] * len(part))
                if rc != 0:
                    return rc
            return 0

        assert feed(0, 0, 1200, 256) == 0
        for seq in (1, 2, 3):
            e.seq_copy(0, seq, 1200)
        statuses = [feed(seq, 1200, 1700, 64) for seq in range(4)]
        if headroom:
            assert statuses == [0, 0, 0, 0]
        else:
            assert 1 in statuses, "the window cache did not overflow: the test no longer shows the headroom is needed"
    finally:
        e.close()


def test_a_relaid_sequence_continues_as_its_restored_state_bit_for_bit_over_turns(gemma_gguf):
    """Three turns (1,100 tokens, then 80, then 300, each with 4 one-token decodes) in a buffer per
    sequence with flash attention on: the conversation kept in place and the one whose state was
    saved and restored into another sequence before its last turn give the same logits at every
    step of that turn, bit for bit, when both were relaid at each turn's end (what the worker does,
    kvselftest.py), and other logits when neither was (the restore lays out its cells anew)."""
    e = engine_mod.LlamaEngine(str(gemma_gguf), n_ctx=2048, n_seq_max=2, threads=2, extra_buffers=False, flash_attn="on")
    toks = [(17 * i) % 5000 + 300 for i in range(1600)]
    turns = [(1100, 4), (80, 4), (300, 4)]

    def run(relay: bool, restore: bool) -> list:
        e.seq_clear(0)
        e.seq_clear(1)
        seq, pos, out = 0, 0, []
        for k, (n_prompt, n_decode) in enumerate(turns):
            if k == len(turns) - 1 and restore:
                state = e.state_seq_save(seq)
                e.seq_clear(seq)
                assert e.state_seq_load(1, state)
                seq = 1
            for start in range(pos, pos + n_prompt, 256):
                part = toks[start : min(pos + n_prompt, start + 256)]
                assert e.decode(part, list(range(start, start + len(part))), [seq] * len(part), [False] * len(part)) == 0
            pos += n_prompt
            for _ in range(n_decode):
                assert e.decode([toks[pos]], [pos], [seq], [True]) == 0
                out.append(e.logits(0).copy())
                pos += 1
            if relay and k < len(turns) - 1:
                assert e.seq_relayout(seq)
        return out[-4:]

    try:
        assert not e.kv_unified and e.n_swa == 512
        for relay in (True, False):
            kept, restored = run(relay, restore=False), run(relay, restore=True)
            same = all((a == b).all() for a, b in zip(kept, restored))
            assert same is relay, f"relay={relay}: {max(float(abs(a - b).max()) for a, b in zip(kept, restored))}"
    finally:
        e.close()


def test_the_selftest_finds_a_relayout_that_lays_out_nothing(gemma_gguf, monkeypatch):
    """Fault injection: were seq_relayout to leave the cells where they lie, the self-test's
    relayout question fails past the window and the worker neither relays nor restores beyond it."""
    monkeypatch.setattr(engine_mod.LlamaEngine, "seq_relayout", lambda self, seq: True)
    on = selftest(gemma_gguf, "on")
    assert on["relayout_up_to"] == 512 and on["relayout"] is False, on
