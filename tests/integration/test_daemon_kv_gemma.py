"""Tiered KV through the real daemon on the real Gemma 3 270M at the defaults (flash attention
on, a buffer per sequence): the self-test finds restores exact only up to the window in place,
the worker relays a sequence before continuing it whole, and a ~1,000-token conversation comes
back from disk after a restart (kv_restore = "exact", the default)."""

import httpx
import pytest

from .daemon import Daemon

pytestmark = pytest.mark.gemma
MODEL = "gemma3:270m"
SYSTEM = "You are a careful assistant who answers every question in one short line. " * 75


def chat(c, messages):
    r = c.post("/v1/chat/completions", json={"model": MODEL, "messages": messages, "temperature": 0, "max_tokens": 8},
               headers={"x-session-id": "long"})  # fmt: skip
    assert r.status_code == 200, r.text
    return r


def stats(c):
    r = c.get("/api/stats", params={"model": MODEL})
    assert r.status_code == 200
    return r.json()["stats"]


def test_a_long_gemma_conversation_is_restored_from_disk_after_a_restart(tmp_path):
    first = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Name a colour."}]
    with Daemon(tmp_path, {}, n_seq_max=1, n_ctx=2048, threads=2, embed_default=True) as d, httpx.Client(base_url=d.url, timeout=120) as c:
        r1 = chat(c, first)
        second = first + [r1.json()["choices"][0]["message"], {"role": "user", "content": "Name another."}]
        r2 = chat(c, second)  # continues turn one's cache in place: relaid first
        assert r2.json()["usage"]["prompt_tokens_details"]["cached_tokens"] >= r1.json()["usage"]["prompt_tokens"]
        s = stats(c)
        test = s["kv_selftest"]
        assert (test["exact_up_to"], test["relayout"], test["relayout_up_to"]) == (512, True, None), test
        assert (test["kv_restore"], test["restore_up_to"]) == ("exact", None)
        assert s["kv_unified"] is False
        assert s["cache"]["hits"]["sticky"] == 1
        assert s["cache"]["relayouts_failed"] == 0 and s["cache"]["relayout_ms_max"] > 0
        (model,) = [m for m in c.get("/api/system").json()["models"] if m["name"] == f"{MODEL}"]
        assert model["kv_selftest"]["relayout"] is True  # what `bictl doctor` shows
    u2 = r2.json()["usage"]
    assert u2["prompt_tokens"] > 1000
    third = second + [r2.json()["choices"][0]["message"], {"role": "user", "content": "And one more."}]
    with Daemon(tmp_path, {}, n_seq_max=1, n_ctx=2048, threads=2, embed_default=True) as d, httpx.Client(base_url=d.url, timeout=120) as c:
        r3 = chat(c, third)
        assert "x-cache-miss" not in r3.headers
        assert r3.json()["usage"]["prompt_tokens_details"]["cached_tokens"] >= u2["prompt_tokens"]
        assert stats(c)["cache"]["hits"]["disk"] == 1


def test_a_shared_system_prompt_outlives_the_conversations_that_hold_it(tmp_path):
    """x and y share a ~1,000-token system prompt (y copies it from x's cache, and the worker keeps
    the copy as a checkpoint); both then go on far past it, so neither cache reaches back to it.
    A newcomer z restores the checkpoint instead of recomputing the prompt."""

    def session(c, name, messages):
        r = c.post("/v1/chat/completions", json={"model": MODEL, "messages": messages, "temperature": 0, "max_tokens": 8},
                   headers={"x-session-id": name})  # fmt: skip
        assert r.status_code == 200, r.text
        return r

    def first(name):
        return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": f"I am {name}. Name a colour."}]

    with Daemon(tmp_path, {}, n_seq_max=2, n_ctx=4096, threads=2, embed_default=True) as d, httpx.Client(base_url=d.url, timeout=120) as c:
        convs = {}
        for name in ("x", "y"):
            convs[name] = first(name)
            r = session(c, name, convs[name])
            convs[name] += [r.json()["choices"][0]["message"], {"role": "user", "content": "Tell me more. " * 150}]
        assert stats(c)["cache"]["hits"]["copy"] == 1 and stats(c)["cache"]["checkpoints"] == 1
        for name in ("x", "y"):
            session(c, name, convs[name])  # both go ~600 tokens past the shared prompt
        r = session(c, "z", first("z"))
        s = stats(c)
    shared = r.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert shared > 1000 and s["cache"]["hits"]["ram"] == 1, (shared, s["cache"]["hits"])
    assert s["cache"]["checkpoints"] == 1
