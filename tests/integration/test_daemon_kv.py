"""Sessions and tiered KV through the real daemon on the tiny GGUF: session headers, explained
misses, and a session's state restored from disk after the daemon restarts."""

import httpx
import pytest

from .daemon import Daemon

# the tiny model's end-of-generation tokens, <|endoftext|> and <|im_end|>: suppressed so lengths are exact
EOS_BIAS = {"264": -100, "266": -100}
SYSTEM = "You are a careful assistant who answers in one line. " * 12


def body(messages, **kw):
    return {"model": "tiny", "messages": messages, "temperature": 0, "logit_bias": EOS_BIAS, "max_tokens": 8, **kw}


def stats(client):
    r = client.get("/api/stats", params={"model": "tiny"})
    assert r.status_code == 200
    return r.json()["stats"]


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return tmp_path_factory.mktemp("kvdaemon")


def test_idle_sequences_keep_a_conversation_while_another_runs(tiny_gguf, tmp_path):
    """By default a worker has as many idle sequence ids as running ones: with one sequence, A's
    cache stays in the KV cache while B runs, and A's next turn continues it in place."""
    first = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "turn one"}]
    with Daemon(tmp_path, {"tiny": tiny_gguf}, n_seq_max=1, n_ctx=2048, threads=1) as d, httpx.Client(base_url=d.url, timeout=60) as c:
        r1 = c.post("/v1/chat/completions", json=body(first), headers={"x-session-id": "A"})
        rb = c.post("/v1/chat/completions", json=body([{"role": "user", "content": "other"}]), headers={"x-session-id": "B"})
        assert r1.status_code == rb.status_code == 200
        second = first + [r1.json()["choices"][0]["message"], {"role": "user", "content": "turn two"}]
        r2 = c.post("/v1/chat/completions", json=body(second), headers={"x-session-id": "A"})
        assert r2.status_code == 200
        assert r2.json()["usage"]["prompt_tokens_details"]["cached_tokens"] >= r1.json()["usage"]["prompt_tokens"]
        if "x-cache-miss" in r2.headers:  # the reply re-tokenised otherwise than it was generated: said so
            assert int(r2.headers["x-cache-miss"].removeprefix("diverged-at=")) >= r1.json()["usage"]["prompt_tokens"]
        s = stats(c)
        assert s["n_seq_max"] == 1 and s["n_seq_idle"] == 1
        assert s["cache"]["hits"]["sticky"] == 1 and s["cache"]["hits"]["ram"] == 0


def test_sessions_misses_and_disk_restore_after_restart(tiny_gguf, root):
    first = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "turn one"}]
    # no idle sequences: the one sequence's cache goes to the tiers whenever another conversation runs
    with Daemon(root, {"tiny": tiny_gguf}, n_seq_max=1, n_ctx=2048, threads=1, defaults="idle_sequences = 0") as d, httpx.Client(base_url=d.url, timeout=60) as c:
        r1 = c.post("/v1/chat/completions", json=body(first), headers={"x-session-id": "A"})
        assert r1.status_code == 200 and "x-cache-miss" not in r1.headers
        u1 = r1.json()["usage"]
        second = first + [r1.json()["choices"][0]["message"], {"role": "user", "content": "turn two"}]
        # another conversation takes the only sequence: A's state goes to the RAM tier
        rb = c.post("/v1/chat/completions", json=body([{"role": "user", "content": "other"}]), headers={"x-session-id": "B"})
        assert rb.status_code == 200
        r2 = c.post("/v1/chat/completions", json=body(second), headers={"x-session-id": "A"})
        assert r2.status_code == 200
        u2 = r2.json()["usage"]
        assert u2["prompt_tokens_details"]["cached_tokens"] >= u1["prompt_tokens"]
        if "x-cache-miss" in r2.headers:  # the reply re-tokenised otherwise than it was generated: said so
            assert int(r2.headers["x-cache-miss"].removeprefix("diverged-at=")) >= u1["prompt_tokens"]
        # the client rewrote its first message: the header says where the prompt diverged
        changed = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "turn ONE"}]
        r3 = c.post("/v1/chat/completions", json=body(changed), headers={"x-session-id": "A"})
        assert r3.headers["x-cache-miss"].startswith("diverged-at=")
        at = int(r3.headers["x-cache-miss"].split("=")[1])
        assert 0 < at < u1["prompt_tokens"]
        # streamed: the header comes with the response head, before any output
        again = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "turn uno"}]
        with c.stream("POST", "/v1/chat/completions", json=body(again, stream=True), headers={"x-session-id": "A"}) as rs:
            assert rs.status_code == 200 and rs.headers["x-cache-miss"].startswith("diverged-at=")
            rs.read()
        s = stats(c)
        assert s["kv_selftest"]["probes"] and s["kv_selftest"]["exact_up_to"] is None
        assert s["kv_selftest"]["complete_up_to"] is None and all(p["complete"] for p in s["kv_selftest"]["probes"])
        assert (s["kv_selftest"]["kv_restore"], s["kv_selftest"]["restore_up_to"]) == ("exact", None)  # the default policy
        assert s["kv_selftest"]["relayout"] is False and "relayout_ms_max" not in s["cache"]  # no window: nothing to relay
        assert s["cache"]["hits"]["ram"] >= 1
        system = c.get("/api/system").json()  # what `bictl doctor` shows
        (model,) = [m for m in system["models"] if m["name"] == "tiny:latest"]
        assert model["kv_selftest"] == s["kv_selftest"]
        assert (model["kv_unified"], model["kv_layout"]) == (s["kv_unified"], s["kv_layout"])  # the layout and why
        assert model["kv_layout"].startswith("auto:")  # nothing set it: "auto" weighed the tiny model's KV size
        metrics = c.get("/metrics").text
        assert 'barrel_inference_cache_hits_total{kind="ram",model="tiny:latest"}' in metrics
        assert 'barrel_inference_cache_misses_total{model="tiny:latest",reason="diverged-at"}' in metrics
        # back to the original conversation before the restart: its state is the latest of A
        r4 = c.post("/v1/chat/completions", json=body(second), headers={"x-session-id": "A"})
        assert r4.status_code == 200
    assert list((root / "kv").rglob("*.kv")), "the worker saved its sequences at exit"
    third = second + [r4.json()["choices"][0]["message"], {"role": "user", "content": "turn three"}]
    with Daemon(root, {"tiny": tiny_gguf}, n_seq_max=1, n_ctx=2048, threads=1, defaults="idle_sequences = 0") as d, httpx.Client(base_url=d.url, timeout=60) as c:
        r5 = c.post("/v1/chat/completions", json=body(third), headers={"x-session-id": "A"})
        assert r5.status_code == 200
        u5 = r5.json()["usage"]
        assert u5["prompt_tokens_details"]["cached_tokens"] >= r4.json()["usage"]["prompt_tokens"]
        assert stats(c)["cache"]["hits"]["disk"] == 1
