"""SIGTERM drains the real daemon: new requests get 503 with retry-after, /health says draining, a
stream shorter than drain_timeout finishes, a longer one ends with an error event (never a cut
connection), and the daemon exits. SIGHUP with changed engine settings restarts an idle model with them."""

from __future__ import annotations

import json
import signal
import threading
import time

import httpx

from .daemon import Daemon

# the tiny model's end-of-generation tokens, <|endoftext|> and <|im_end|>
NO_EOS = {"264": -100, "266": -100}


def stream(url: str, max_tokens: int, out: dict, started: threading.Event) -> None:
    body = {"model": "tiny", "messages": [{"role": "user", "content": "go"}], "max_tokens": max_tokens,
            "temperature": 0, "logit_bias": NO_EOS, "stream": True}  # fmt: skip
    lines = []
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=60) as r:
        for line in r.iter_lines():
            if line.startswith("data: "):
                lines.append(line[6:])
                started.set()
    out["lines"] = lines


def test_sigterm_drains(tiny_gguf, tmp_path):
    d = Daemon(tmp_path, {"tiny": tiny_gguf}, n_seq_max=2, n_ctx=2048, threads=1, extra="drain_timeout = 0.5")
    d.start()
    try:
        httpx.post(d.url + "/v1/chat/completions", json={"model": "tiny", "messages": [{"role": "user", "content": "warm"}],
                                                          "max_tokens": 2}, timeout=60)  # fmt: skip
        short, long = {}, {}
        s_started, l_started = threading.Event(), threading.Event()
        t_long = threading.Thread(target=stream, args=(d.url, 2000, long, l_started))
        t_long.start()
        assert l_started.wait(30)
        t_short = threading.Thread(target=stream, args=(d.url, 12, short, s_started))
        t_short.start()
        assert s_started.wait(30)
        t0 = time.monotonic()
        d.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 10
        while True:  # the gate closes at once; wait for it without assuming when the signal lands
            r = httpx.post(d.url + "/v1/chat/completions", json={"model": "tiny", "messages": [{"role": "user", "content": "x"}],
                                                              "max_tokens": 2}, timeout=10)  # fmt: skip
            if r.status_code == 503 or time.monotonic() > deadline:
                break
        assert r.status_code == 503 and r.headers["retry-after"] and "shutting down" in r.json()["error"]["message"]
        health = httpx.get(d.url + "/health", timeout=10)
        assert health.status_code == 503 and health.json()["status"] == "draining"
        t_short.join(30)
        t_long.join(30)
        assert short["lines"][-1] == "[DONE]"
        finish = [json.loads(x)["choices"][0]["finish_reason"] for x in short["lines"][:-1] if json.loads(x).get("choices")]
        assert finish[-1] == "length"  # the short stream finished normally during the drain
        events = [json.loads(x) for x in long["lines"] if x != "[DONE]"]
        assert "error" in events[-1], (len(events), events[-1])  # the long one was ended with an error event, not cut
        assert d.proc.wait(30) == 0 and time.monotonic() - t0 < 25
        assert len(d.events("drain_started")) == 1 and d.events("drain_timeout")[0]["in_flight"] >= 1
    finally:
        d.stop()


def test_sighup_restarts_an_idle_model_with_changed_engine_settings(tiny_gguf, tmp_path):
    d = Daemon(tmp_path, {"tiny": tiny_gguf}, n_seq_max=2, n_ctx=1024, threads=1)
    with d:
        ask = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        assert httpx.post(d.url + "/v1/chat/completions", json=ask, timeout=60).status_code == 200
        before = httpx.get(d.url + "/api/ps", timeout=10).json()["models"][0]
        assert before["context_length"] == 1024
        d.config.write_text(d.config.read_text().replace("n_ctx = 1024", "n_ctx = 512"))
        d.proc.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 20
        while not d.events("worker_retired") and time.monotonic() < deadline:
            time.sleep(0.05)
        assert d.events("worker_retired")[0]["model"] == "tiny:latest"
        assert httpx.post(d.url + "/v1/chat/completions", json=ask, timeout=60).status_code == 200
        after = httpx.get(d.url + "/api/ps", timeout=10).json()["models"][0]
        assert after["context_length"] == 512 and after["pid"] != before["pid"]
