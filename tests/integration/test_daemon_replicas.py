"""The real daemon with `replicas = 2` of the tiny generated GGUF: two worker processes (each pinned to
its own core where the machine has two), both serving; a conversation's next turn goes back to the
replica that holds its prefix and reuses it; a killed replica is replaced while the other serves."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import httpx
import pytest

from .daemon import Daemon

# the tiny model's end-of-generation tokens, <|endoftext|> and <|im_end|>: suppressed so lengths are exact
EOS_BIAS = {"264": -100, "266": -100}


def cores() -> list[int]:
    return sorted(os.sched_getaffinity(0))[:2] if hasattr(os, "sched_getaffinity") else []


@pytest.fixture(scope="module")
def daemon(tiny_gguf, tmp_path_factory):
    pinned = cores()
    devices = f'devices = ["cpu:{pinned[0]}", "cpu:{pinned[1]}"]\n' if len(pinned) == 2 else ""
    d = Daemon(tmp_path_factory.mktemp("replicas"), {"tiny": tiny_gguf}, n_seq_max=2, n_ctx=2048, threads=1,
               defaults=f"replicas = 2\n{devices}", extra="worker_restart_backoff = 0.2")  # fmt: skip
    with d:
        yield d


def chat(messages, **kw):
    return {"model": "tiny", "messages": messages, "temperature": 0, "logit_bias": EOS_BIAS, "max_tokens": 8, **kw}


async def replicas(c) -> list[dict]:
    [entry] = (await c.get("/api/ps")).json()["models"]
    assert entry["name"] == "tiny:latest"
    return entry["replicas"]


async def turn(c, messages) -> dict:
    r = await c.post("/v1/chat/completions", json=chat(messages))
    assert r.status_code == 200, r.text
    body = r.json()
    messages.append({"role": "assistant", "content": body["choices"][0]["message"]["content"]})
    return body["usage"]


async def test_two_replica_processes_serve_and_a_conversation_sticks(daemon):
    async with httpx.AsyncClient(base_url=daemon.url, timeout=120) as c:
        a = [{"role": "user", "content": "the first conversation asks about tides and the moon " * 12}]
        b = [{"role": "user", "content": "the second conversation is about ships and harbours " * 12}]
        await turn(c, a)
        await turn(c, b)
        reps = await replicas(c)
        assert len(reps) == 2 and all(r["alive"] for r in reps)
        pids = [r["pid"] for r in reps]
        assert len(set(pids)) == 2 and set(pids) <= set(daemon.children())  # two worker processes of the daemon
        assert [r["routed"] for r in reps] == [{"least_loaded": 1}, {"least_loaded": 1}]  # both served
        pinned = cores()
        if len(pinned) == 2:
            assert [os.sched_getaffinity(p) for p in pids] == [{pinned[0]}, {pinned[1]}]
            assert [r["device"] for r in reps] == [str(pinned[0]), str(pinned[1])]
        stats = (await c.get("/api/stats", params={"model": "tiny"})).json()
        assert [s["stats"]["requests_total"] for s in stats["replicas"]] == [1, 1]
        # turn 2 of each conversation, history fed back: each returns to its replica and reuses its prefix
        for messages, question in ((b, "and the lighthouses?"), (a, "and the spring tides?")):
            messages.append({"role": "user", "content": question})
            usage = await turn(c, messages)
            assert usage["prompt_tokens_details"]["cached_tokens"] >= 500
        reps = await replicas(c)
        assert [r["routed"] for r in reps] == [{"least_loaded": 1, "affinity": 1}] * 2
        assert all(r["cached_tokens"] >= 500 for r in reps)
        text = (await c.get("/metrics")).text
        for replica in ("0", "1"):
            assert f'barrel_inference_routed_requests_total{{model="tiny:latest",reason="affinity",replica="{replica}"}} 1.0' in text
            assert f'barrel_inference_sequences{{model="tiny:latest",replica="{replica}",state="free"}} 2.0' in text
    routed = [e for e in daemon.events("request") if e.get("route")]
    assert [e["route"] for e in routed[-2:]] == ["affinity", "affinity"]
    assert sorted(e["replica"] for e in routed[-2:]) == [0, 1]  # the log line names the replica that served it


async def test_a_killed_replica_is_replaced_while_the_other_serves(daemon):
    async with httpx.AsyncClient(base_url=daemon.url, timeout=120) as c:
        await turn(c, [{"role": "user", "content": "warm"}])
        reps = await replicas(c)
        victim = reps[0]["pid"]
        os.kill(victim, signal.SIGKILL)
        for i in range(3):  # served by the other replica meanwhile
            await turn(c, [{"role": "user", "content": f"while one is down {i}"}])
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            reps = await replicas(c)
            if reps[0]["alive"] and reps[0]["pid"] != victim:
                break
            await asyncio.sleep(0.2)
        assert reps[0]["alive"] and reps[0]["pid"] not in (victim, reps[1]["pid"]) and reps[0]["restarts"] == 1
        assert reps[1]["restarts"] == 0
    assert [e.get("replica") for e in daemon.events("worker_died")] == [0]


def test_bictl_ps_shows_the_replicas(daemon):
    from click.testing import CliRunner

    from barrel_inference.cli.main import main

    r = CliRunner().invoke(main, ["ps"], env={"BARREL_INFERENCE_HOST": daemon.url}, catch_exceptions=False)
    assert r.exit_code == 0, r.output
    lines = r.stdout.splitlines()
    assert lines[1].startswith("tiny:latest") and lines[1].split()[6:8] == ["2048", "4"]  # SEQS: 2 sequences x 2 replicas
    at = lines.index("") + 1
    assert lines[at].split() == ["NAME", "REPLICA", "STATE", "PID", "DEVICE", "IN", "FLIGHT", "ROUTED", "CACHED"]
    rows = [line.split() for line in lines[at + 1 :]]
    assert [row[:3] for row in rows] == [["tiny:latest", "0", "up"], ["tiny:latest", "1", "up"]]
    assert all(row[3].isdigit() for row in rows)
    import ollama  # the Ollama client still reads /api/ps: one entry per model

    assert [m.model for m in ollama.Client(host=daemon.url).ps().models] == ["tiny:latest"]
