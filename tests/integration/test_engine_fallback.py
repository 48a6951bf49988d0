"""The real daemon on the tiny GGUF with an engine crash injected at warm-up (SIGSEGV, as llama.cpp's
AMX kernels do on some Xeons): the request is still served, in the safe profile, the reason is
logged and shown, the fallback survives a restart; a crash in both profiles is a clear 503 with backoff.
"""

from __future__ import annotations

import httpx
import pytest

from .daemon import Daemon

FAULT = "BARREL_INFERENCE_FAULT_WARMUP"


def chat(**kw):
    return {"model": "tiny", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4, "temperature": 0, **kw}


def test_crash_at_warmup_is_served_in_the_safe_profile_and_remembered(tiny_gguf, tmp_path):
    d = Daemon(tmp_path, {"tiny": tiny_gguf}, n_seq_max=2, threads=1, defaults='extra_buffers = "on"',
               env={FAULT: "segv-extra"})  # fmt: skip
    with d:
        r = httpx.post(d.url + "/v1/chat/completions", json=chat(), timeout=60)
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["completion_tokens"] == 4
        fallback = d.events("engine_fallback")
        assert len(fallback) == 1 and fallback[0]["signal"] == "SIGSEGV" and fallback[0]["model"] == "tiny:latest"
        ps = httpx.get(d.url + "/api/ps", timeout=10).json()["models"]
        assert ps[0]["engine"]["profile"] == "safe" and ps[0]["engine"]["extra_buffers"] is False
        stats = httpx.get(d.url + "/api/stats", params={"model": "tiny"}, timeout=10).json()
        assert stats["engine"]["profile"] == "safe" and stats["stats"]["engine_profile"] == "safe"
        system = httpx.get(d.url + "/api/system", timeout=90).json()
        (remembered,) = system["fallbacks"]
        assert remembered["model"] == "tiny:latest" and remembered["signal"] == "SIGSEGV" and remembered["applies"] is True
        (model,) = system["models"]
        assert model["profile"] == "safe" and model["extra_buffers"] is False
        assert system["llama_cpp"]["llama_cpp_python"] and "CPU" in system["llama_cpp"]["system_info"]
    # a new daemon on the same cache goes straight to the safe profile: no crash this time
    crashes_before = len(d.events("worker_start_failed"))
    with d:
        r = httpx.post(d.url + "/v1/chat/completions", json=chat(), timeout=60)
        assert r.status_code == 200, r.text
        assert len(d.events("engine_fallback_remembered")) == 1
        assert len(d.events("worker_start_failed")) == crashes_before


def test_crash_in_both_profiles_is_a_clear_503_with_backoff(tiny_gguf, tmp_path):
    d = Daemon(tmp_path, {"tiny": tiny_gguf}, n_seq_max=2, threads=1, defaults='extra_buffers = "on"',
               extra="worker_restart_backoff = 30.0", env={FAULT: "segv"})  # fmt: skip
    with d:
        r = httpx.post(d.url + "/v1/chat/completions", json=chat(), timeout=60)
        assert r.status_code == 503, r.text
        message = r.json()["error"]["message"]
        assert "tiny" in message and "SIGSEGV" in message
        assert len(d.events("worker_started")) == 2  # the default profile, then the safe one
        again = httpx.post(d.url + "/v1/chat/completions", json=chat(), timeout=60)
        assert again.status_code == 503 and "not started again" in again.json()["error"]["message"]
        assert 1 <= int(again.headers["retry-after"]) <= 30
        assert len(d.events("worker_started")) == 2  # no tight restart loop
        assert httpx.get(d.url + "/health", timeout=5).status_code == 200  # the gateway stays up


@pytest.mark.gemma
def test_gemma_with_extra_buffers_forced_on_is_served_on_this_cpu(gemma_gguf, tmp_path):
    """No injected fault: llama.cpp itself. On a CPU with AMX its AMX layouts crash on Gemma 3's
    Q4_K_M weights and the fallback must serve; elsewhere the default profile serves directly."""
    from barrel_inference.hostinfo import has_amx

    d = Daemon(tmp_path, {"gemma": gemma_gguf}, n_seq_max=2, threads=2, defaults='extra_buffers = "on"')
    with d:
        r = httpx.post(d.url + "/v1/completions", json={"model": "gemma", "prompt": "The sea is", "max_tokens": 8,
                                                         "temperature": 0}, timeout=120)  # fmt: skip
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["completion_tokens"] == 8
        engine = httpx.get(d.url + "/api/ps", timeout=10).json()["models"][0]["engine"]
        if has_amx():
            (fallback,) = d.events("engine_fallback")
            assert fallback["signal"] in ("SIGSEGV", "SIGBUS", "SIGILL", "SIGABRT")
            assert engine["profile"] == "safe" and "AMX" not in engine["weight_buffers"]
        else:
            assert d.events("engine_fallback") == [] and engine["profile"] == "default"
