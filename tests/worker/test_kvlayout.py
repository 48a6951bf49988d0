"""Which KV layout a kv_unified setting gives (kvlayout.py), and the engine's use of it."""

import pytest

from barrel_inference.worker import kvlayout

GIB = 1 << 30


@pytest.mark.parametrize(
    "setting, split_bytes, unified, why",
    [
        (True, 100 * GIB, True, "set"),
        (False, 100 * GIB, False, "set"),
        ("auto", GIB // 2, False, "auto: a buffer per sequence takes 0.50 GiB of KV, within 2 GiB"),
        ("auto", 2 * GIB, False, "auto: a buffer per sequence takes 2.00 GiB of KV, within 2 GiB"),
        ("auto", 8 * GIB, True, "auto: a buffer per sequence would take 8.00 GiB of KV, over 2 GiB"),
    ],
)
def test_choose_takes_a_buffer_per_sequence_where_its_memory_is_small(setting, split_bytes, unified, why):
    assert kvlayout.choose(setting, split_bytes=split_bytes) == (unified, why)


@pytest.mark.parametrize("setting", ["maybe", 1, 0, None])
def test_choose_refuses_an_unknown_setting(setting):
    with pytest.raises(ValueError, match="kv_unified"):
        kvlayout.choose(setting, split_bytes=0)


def test_bytes_per_cell_counts_k_and_v_of_every_layer():
    # Llama 3.1 8B: 32 layers, 8 KV heads of 128: 128 KiB a cell in f16
    assert kvlayout.bytes_per_cell(32, 8, 128, 128) == 128 * 1024
    # Gemma 3 270M: 18 layers, one KV head of 256
    assert kvlayout.bytes_per_cell(18, 1, 256, 256) == 18 * 1024


def test_the_engine_resolves_auto_by_the_models_kv_size(tiny_gguf, monkeypatch):
    from barrel_inference.worker.engine import LlamaEngine

    small = LlamaEngine(str(tiny_gguf), n_ctx=128, n_seq_max=2, n_batch=64, threads=1)
    try:
        assert small.kv_unified is False and small.kv_layout.startswith("auto: a buffer per sequence takes")
        assert small._split_kv_bytes() > 0
    finally:
        small.close()
    monkeypatch.setattr(kvlayout, "AUTO_SPLIT_MAX_BYTES", 1)  # as if the model were large
    large = LlamaEngine(str(tiny_gguf), n_ctx=128, n_seq_max=2, n_batch=64, threads=1)
    try:
        assert large.kv_unified is True and "over" in large.kv_layout
    finally:
        large.close()
    told = LlamaEngine(str(tiny_gguf), n_ctx=128, n_seq_max=2, n_batch=64, threads=1, kv_unified=False)
    try:
        assert (told.kv_unified, told.kv_layout) == (False, "set")
    finally:
        told.close()
