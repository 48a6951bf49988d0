"""Tool calls through the real daemon on a tiny GGUF whose markers are control tokens (Qwen 2.5
vocabulary and template): forced tool_choice on OpenAI chat, streamed and not, and a second turn
whose history carries the call built from the captured bytes (replay hit), also after a restart."""

from __future__ import annotations

import json

import httpx
import pytest

from tinymodel import write_tiny_gguf

from .daemon import Daemon

CITY = {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"]}}, "required": ["city"]}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": CITY}}]
USER = {"role": "user", "content": "Weather in Paris?"}


def forced(**kw):
    return {"model": "qwen", "messages": [USER], "tools": TOOLS, "tool_choice": "required", "parallel_tool_calls": False,
            "temperature": 0, "max_tokens": 80, **kw}  # fmt: skip


@pytest.fixture(scope="module")
def qwen(tmp_path_factory):
    return write_tiny_gguf(tmp_path_factory.mktemp("qwen") / "qwen.gguf", flavour="qwen2.5", context_length=8192)


def replay_counts(d: Daemon) -> dict:
    stats = httpx.get(d.url + "/api/stats", params={"model": "qwen"}, timeout=30).json()
    return stats.get("tool_replay_lookups") or stats.get("stats", {}).get("tool_replay_lookups")


def test_forced_call_then_replayed_history_across_a_restart(qwen, tmp_path):
    with Daemon(tmp_path, {"qwen": qwen}, n_seq_max=2, n_ctx=4096, threads=1) as d:
        r = httpx.post(d.url + "/v1/chat/completions", json=forced(), timeout=120)
        assert r.status_code == 200, r.text
        first = r.json()
        choice = first["choices"][0]
        assert choice["finish_reason"] == "tool_calls", choice
        [call] = choice["message"]["tool_calls"]
        assert call["id"].startswith("call_") and call["function"]["name"] == "get_weather"
        assert json.loads(call["function"]["arguments"])["city"] in ("Paris", "Rome")
        assert not choice["message"]["content"]

        with httpx.stream("POST", d.url + "/v1/chat/completions", json=forced(stream=True), timeout=120) as s:
            lines = [json.loads(x[6:]) for x in s.iter_lines() if x.startswith("data: {")]
        deltas = [c["choices"][0]["delta"] for c in lines if c["choices"]]
        starts = [d["tool_calls"][0] for d in deltas if "tool_calls" in d and "id" in d["tool_calls"][0]]
        assert [s["function"]["name"] for s in starts] == ["get_weather"]
        assert lines[-1]["choices"][0]["finish_reason"] == "tool_calls"
        assert not any("<tool_call>" in (d.get("content") or "") for d in deltas)

        second = {"model": "qwen", "tools": TOOLS, "temperature": 0, "max_tokens": 2, "messages": [
            USER, {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": call["id"], "content": "sunny"}]}  # fmt: skip
        r2 = httpx.post(d.url + "/v1/chat/completions", json=second, timeout=120)
        assert r2.status_code == 200, r2.text
        assert replay_counts(d)["hit"] == 1
        metrics = httpx.get(d.url + "/metrics", timeout=30).text
        assert 'barrel_inference_tool_replay_lookups_total{model="qwen:latest",result="hit"} 1.0' in metrics
        # the history holds the bytes the model wrote, so the first turn's cache is reused past its prompt
        # (all but the last generated token, the end of the call, which was sampled, never decoded)
        cached = r2.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
        assert cached >= first["usage"]["prompt_tokens"] + first["usage"]["completion_tokens"] - 1, (cached, first["usage"])

        cut = httpx.post(d.url + "/v1/chat/completions", json=forced(max_tokens=5), timeout=120).json()["choices"][0]
        assert cut["finish_reason"] == "length" and "tool_calls" not in cut["message"]  # a cut call is no call
        assert "<tool_call>" not in (cut["message"]["content"] or "")

    with Daemon(tmp_path, {"qwen": qwen}, n_seq_max=2, n_ctx=4096, threads=1) as d2:  # the same cache dir
        r3 = httpx.post(d2.url + "/v1/chat/completions", json=second, timeout=120)
        assert r3.status_code == 200, r3.text
        assert replay_counts(d2) == {"hit": 1, "miss": 0, "no_format": 0}


def test_thinking_markers_set_by_hand_give_reasoning_content(qwen, tmp_path):
    """Markers from the operator's config reach the worker; a budget closes the thinking span."""
    from tinymodel import real_template

    template = real_template("qwen2.5") + "{% if add_generation_prompt %}<think>\n{% endif %}"
    extra = (f"[models.\"qwen:latest\"]\nthinking_start = \"<think>\"\nthinking_end = \"</think>\"\n"
             f"chat_template = '''{template}'''\n")  # fmt: skip
    with Daemon(tmp_path, {"qwen": qwen}, n_seq_max=1, n_ctx=4096, threads=1, extra=extra) as d:
        body = {"model": "qwen", "messages": [USER], "temperature": 0, "max_tokens": 8, "thinking_budget": 3}
        msg = httpx.post(d.url + "/v1/chat/completions", json=body, timeout=120).json()["choices"][0]["message"]
        assert msg["reasoning_content"] and "<think>" not in (msg["content"] or "") and "</think>" not in msg["reasoning_content"]
        with httpx.stream("POST", d.url + "/v1/chat/completions", json={**body, "stream": True}, timeout=120) as s:
            deltas = [json.loads(x[6:])["choices"][0]["delta"] for x in s.iter_lines() if x.startswith("data: {")]
        assert "".join(d.get("reasoning_content", "") for d in deltas) == msg["reasoning_content"]
        assert "".join(d.get("content") or "" for d in deltas) == (msg["content"] or "")
