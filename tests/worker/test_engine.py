"""The llama.cpp engine wrapper on the tiny GGUF."""

import llama_cpp as L
import pytest

from barrel_inference.protocol import Sampling
from barrel_inference.worker.engine import LlamaEngine
from barrel_inference.worker.samplers import Sampler


@pytest.fixture(scope="module")
def engine(tiny_gguf):
    e = LlamaEngine(str(tiny_gguf), n_ctx=256, n_seq_max=2, n_batch=128, threads=1)
    yield e
    e.close()


def chain_greedy(engine, bias):
    chain = L.llama_sampler_chain_init(L.llama_sampler_chain_default_params())
    if bias:
        arr = (L.llama_logit_bias * len(bias))()
        for i, (t, b) in enumerate(bias.items()):
            arr[i].token, arr[i].bias = t, b
        L.llama_sampler_chain_add(chain, L.llama_sampler_init_logit_bias(engine.n_vocab, len(bias), arr))
    L.llama_sampler_chain_add(chain, L.llama_sampler_init_greedy())
    return Sampler(L, chain)


@pytest.mark.parametrize("bias", [{}, {266: -100.0}, {100: 5.0, 101: -3.0, 266: -100.0}])
def test_fast_greedy_picks_what_llama_cpp_greedy_picks(engine, bias):
    fast = engine.make_sampler(Sampling(temperature=0, logit_bias=bias))
    slow = chain_greedy(engine, bias)
    assert fast.chain is None  # the fast path is in use
    toks = engine.tokenize("the cat sat on", add_special=False)
    engine.seq_clear(0)
    n = len(toks)
    assert engine.decode(toks, list(range(n)), [0] * n, [False] * (n - 1) + [True]) == 0
    idx, got_fast, got_slow = n - 1, [], []
    for _ in range(24):
        a = engine.sample(slow, idx)  # the chain reads the logits first: the fast path edits them in place
        b = engine.sample(fast, idx)
        got_slow.append(a)
        got_fast.append(b)
        assert engine.decode([a], [n], [0], [True]) == 0
        n, idx = n + 1, 0
    slow.free()
    engine.seq_clear(0)
    assert got_fast == got_slow
    if 100 in bias:
        assert 100 in got_fast  # a positive bias shows


def test_penalties_or_grammar_use_the_chain(engine):
    assert engine.make_sampler(Sampling(temperature=0, repeat_penalty=1.2)).chain is not None
    assert engine.make_sampler(Sampling(temperature=0), grammar='root ::= "a"').grammar is not None  # checked in stages
    assert engine.make_sampler(Sampling(temperature=0.7)).chain is not None


def test_tokenize_specials_and_pieces(engine):
    assert len(engine.tokenize("<|im_start|>", add_special=False, parse_special=True)) == 1
    assert len(engine.tokenize("<|im_start|>", add_special=False, parse_special=False)) > 1
    toks = engine.tokenize("héllo wörld", add_special=False)
    assert engine.detokenize(toks) == "héllo wörld"
    assert engine.is_eog(engine.eos) and not engine.is_eog(toks[0])


def test_warm_up_decodes_distinct_sequences_and_leaves_them_empty(engine):
    from barrel_inference.worker.warmup import warm_up

    ran = warm_up(engine, extra_buffers=engine.extra_buffers, n_seqs=4, prompt_len=16, steps=3)
    assert ran["sequences"] == 2 and ran["steps"] == 3 and ran["prompt_tokens"] == 16  # capped at n_seq_max
    for seq in range(engine.n_seq_max):
        assert engine.seq_pos_min(seq) == -1  # nothing left behind for the first request
    assert engine.weight_buffers()  # llama.cpp's load log named where the weights live


def test_extra_buffers_off_keeps_weights_out_of_repacked_layouts(tiny_gguf):
    e = LlamaEngine(str(tiny_gguf), n_ctx=64, n_seq_max=1, n_batch=32, threads=1, extra_buffers=False)
    try:
        assert e.extra_buffers is False
        assert not any(b.endswith("_REPACK") or b == "AMX" for b in e.weight_buffers())
    finally:
        e.close()


def test_typical_p_joins_the_chain(engine):
    plain = engine.make_sampler(Sampling(temperature=0.7, seed=1))
    typical = engine.make_sampler(Sampling(temperature=0.7, seed=1, typical_p=0.5))
    assert L.llama_sampler_chain_n(typical.chain) == L.llama_sampler_chain_n(plain.chain) + 1
    names = [L.llama_sampler_name(L.llama_sampler_chain_get(typical.chain, i)) for i in range(L.llama_sampler_chain_n(typical.chain))]
    assert b"typical" in names
    plain.free()
    typical.free()


@pytest.mark.parametrize("kv_unified", [False, True], ids=["split", "unified"])
def test_a_copied_prefix_continues_like_its_source_and_a_queued_copy_is_never_overwritten(tiny_gguf, kv_unified):
    """seq_copy gives the destination the source's first n positions and nothing beyond. Between KV
    buffers llama.cpp only queues the copy (done at the next decode), so until then a state must
    not be saved from, or restored into, either buffer: the restored data would be overwritten, or
    carried off, by the copy."""
    e = LlamaEngine(str(tiny_gguf), n_ctx=128, n_seq_max=3, n_batch=64, threads=1, kv_unified=kv_unified)
    try:
        toks = e.tokenize("the cat sat on the mat and then the dog sat on the cat", add_special=False)
        n = len(toks)
        assert e.decode(toks, list(range(n)), [0] * n, [False] * n) == 0
        saved = e.state_seq_save(0)
        assert saved
        k = n - 4
        e.seq_copy(0, 1, k)
        assert (e.state_seq_save(1) == b"") is not kv_unified
        assert e.state_seq_save(0) == saved  # the source's data is all there
        assert e.state_seq_load(2, saved)  # a buffer the copy does not touch
        assert e.state_seq_load(1, saved) is kv_unified  # refused while the copy is queued
        e.seq_clear(1)
        e.seq_copy(0, 1, k)
        assert e.seq_pos_min(1) == 0
        # the next token at k: the copy (positions < k only) against the source cut to k
        assert e.decode([toks[k]], [k], [1], [True]) == 0
        got = e.logits(0).copy()
        assert e.state_seq_save(1)  # the copy is done
        assert e.seq_truncate(0, k)
        assert e.decode([toks[k]], [k], [0], [True]) == 0
        assert (e.logits(0) == got).all()
        e.seq_copy(0, 2, k)
        assert e.state_seq_load(0, saved) is kv_unified  # the source's buffer is read by the queued copy
    finally:
        e.close()
