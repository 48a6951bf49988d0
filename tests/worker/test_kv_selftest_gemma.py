"""The load-time KV restore self-test on Gemma 3 (sliding window 512): with llama.cpp's flash
attention a state restored into other cells reproduces the logits only within the window; without
it the restore is bit-exact beyond it, so the tiers can keep long conversations."""

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
    assert off["exact_up_to"] is None, off
    assert all(p["exact"] and p["max_abs_diff"] == 0.0 for p in off["probes"])
    assert off["flash_attn"] == "off"


def test_flash_attention_on_limits_gemma_restores_to_the_window(gemma_gguf):
    on = selftest(gemma_gguf, "on")
    assert on["exact_up_to"] == 512, on
    assert on["probes"][1]["max_abs_diff"] > 0.0


def test_an_unknown_flash_attn_setting_is_refused(gemma_gguf):
    with pytest.raises(EngineError, match="flash_attn must be one of"):
        engine_mod.LlamaEngine(str(gemma_gguf), n_ctx=256, n_seq_max=1, flash_attn="maybe")
