"""Replicas with real child processes (the scripted fake worker): N workers per model, requests routed
by cache affinity, sessions that stick, failover when one replica dies, round robin, per-replica
figures in /api/ps, /api/stats and /metrics."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

import httpx
import pytest

from barrel_inference.config import ModelSettings
from barrel_inference.gateway.app import create_app
from barrel_inference.gateway.metrics import GatewayMetrics
from barrel_inference.gateway.workers import ModelManager
from barrel_inference.protocol import ChatMessage, Done, ErrorCode, FinishReason, GetStats, Submit

from .conftest import MODEL, LogCapture, StubRecord, StubRegistry, make_settings
from .fake_worker import FakeWorker

REPO = Path(__file__).resolve().parents[2]
FAKE_CMD = [sys.executable, "-m", "tests.gateway.fake_worker"]
SYSTEM = "You answer questions about the sea and keep to these notes. " * 60  # ~3.6 kB


@pytest.fixture(autouse=True)
def _importable(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))


@pytest.fixture
def short_tmp():
    with tempfile.TemporaryDirectory(prefix="bi-rep-", dir="/tmp") as d:  # ipc:// paths stay short
        yield Path(d)


def manager(tmp: Path, *extra: str, replicas: int = 2, devices=None, routing=None, **kw) -> tuple[ModelManager, LogCapture]:
    ms = ModelSettings(replicas=replicas, devices=devices, routing=routing)
    kw.setdefault("worker_start_timeout", 30.0)  # several processes start at once on a busy machine
    settings = make_settings(tmp, None, models={MODEL: ms}, **kw)
    logs = LogCapture(settings)
    m = ModelManager(settings, StubRegistry(StubRecord(MODEL)), logger=logs.logger, worker_command=FAKE_CMD, extra_args=extra)
    m.metrics = GatewayMetrics()
    return m, logs


def conv(*turns: str, system: str | None = None, session: str | None = None, rid: str = "r") -> Submit:
    """A chat whose turns alternate user / assistant, the last one the user's."""
    messages = [ChatMessage(role="system", content=system)] if system else []
    messages += [ChatMessage(role="user" if i % 2 == 0 else "assistant", content=t) for i, t in enumerate(turns)]
    return Submit(id=rid, messages=messages, session=session)


async def run(handle, submit: Submit):
    """(text, done, the replica that served it, the routing reason)."""
    stream = handle.submit(submit)
    text = ""
    async for ev in stream:
        if isinstance(ev, Done):
            return text, ev, getattr(stream, "replica", None), getattr(stream, "route", None)
        text += ev.text
    raise AssertionError("no Done")


async def served_ids(handle, index: int) -> list[str]:
    """The request ids replica `index`'s worker process received (asked of that process)."""
    result = await handle.replicas[index].call(GetStats(id=""))
    return result.stats["submit_ids"]


async def wait_for(cond, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.02)


def long_question(k: int) -> str:
    return f"conversation {k}: " + " ".join(f"w{k}x{i}" for i in range(400))  # its own long first turn


async def test_replicas_are_processes_with_their_devices(short_tmp):
    env_file, argv_file = short_tmp / "env.jsonl", short_tmp / "argv.txt"
    m, logs = manager(short_tmp, "--env-file", str(env_file), "--argv-file", str(argv_file), devices=["cpu:0", "gpu:3"])
    try:
        h = await m.get(MODEL)
        assert len(h) == 2 and len(h.live()) == 2
        pids = [r.process.pid for r in h.replicas]
        assert len(set(pids)) == 2
        assert [r.link.endpoint for r in h.replicas] == [f"ipc://{short_tmp}/run/fake-latest.sock", f"ipc://{short_tmp}/run/fake-latest-r1.sock"]
        seen = {json.loads(line)["bind"]: json.loads(line) for line in env_file.read_text().splitlines()}
        first, second = seen[h.replicas[0].link.endpoint], seen[h.replicas[1].link.endpoint]
        assert first["cores"] == [0] and first["CUDA_VISIBLE_DEVICES"] is None  # pinned to core 0, no GPU env
        assert second["CUDA_VISIBLE_DEVICES"] == "3" and second["HIP_VISIBLE_DEVICES"] == "3"
        assert os.sched_getaffinity(pids[0]) == {0}
        argvs = sorted(argv_file.read_text().splitlines(), key=lambda a: "-r1" in a)
        kv_dirs = [a.split()[a.split().index("--kv-dir") + 1] for a in argvs]
        assert [Path(d).name for d in kv_dirs] == ["fake-latest", "fake-latest-r1"]  # a KV disk tier each
        assert "--cpu-affinity 0" in argvs[0] and "--cpu-affinity" not in argvs[1]
        assert h.hello.n_seq_max == 8  # the admission queue runs both replicas' sequences
        [info] = m.running()  # one entry for the model
        assert info.n_seq_max == 8 and info.size == 2 * 1234  # each replica a full copy
        assert [(r.replica, r.pid, r.device, r.alive) for r in info.replicas] == [(0, pids[0], "0", True), (1, pids[1], "3", True)]
        assert [e.get("replica") for e in logs.events("worker_ready")] in ([0, 1], [1, 0])
        text, done, _, _ = await run(h, conv("hello there"))
        assert text == "hello there" and done.finish_reason == FinishReason.STOP
    finally:
        await m.aclose()
    assert all(r.process.returncode is not None for r in h.replicas)


async def test_a_conversation_returns_to_the_replica_that_served_it(short_tmp):
    m, _ = manager(short_tmp)
    try:
        h = await m.get(MODEL)
        first: dict[int, int] = {}
        for k in range(3):  # turn 1 of three conversations: nothing cached yet, so they spread
            _, done, replica, reason = await run(h, conv(long_question(k), rid=f"c{k}t1"))
            assert done.finish_reason == FinishReason.STOP and reason == "least_loaded"
            first[k] = replica
        assert sorted(first.values()) == [0, 0, 1]
        for k in (2, 1, 0):  # turn 2, history fed back, in another order than the idle turn-taking would give
            reply = long_question(k)  # the fake worker echoes the question
            _, done, replica, reason = await run(h, conv(long_question(k), reply, "and then?", rid=f"c{k}t2"))
            assert (replica, reason) == (first[k], "affinity")
            assert done.finish_reason == FinishReason.STOP
        for k in range(3):  # and the worker processes say so
            assert f"c{k}t2" in await served_ids(h, first[k])
            assert f"c{k}t2" not in await served_ids(h, 1 - first[k])
        routed = m.metrics.routed.labels(MODEL, str(first[0]), "affinity")._value.get()
        assert routed >= 1
    finally:
        await m.aclose()


async def test_a_new_conversation_sharing_a_long_prefix_goes_where_it_is_cached(short_tmp):
    m, _ = manager(short_tmp)
    try:
        h = await m.get(MODEL)
        _, _, cached_on, reason = await run(h, conv("what is a tide?", system=SYSTEM, rid="a1"))
        assert reason == "least_loaded"
        # an unrelated short request takes the other replica in turn...
        _, _, other, reason = await run(h, conv("unrelated", rid="u1"))
        assert (other, reason) == (1 - cached_on, "least_loaded")
        # ...while a new conversation with the same long system prompt joins the cache
        _, _, replica, reason = await run(h, conv("why is the sea salty?", system=SYSTEM, rid="b1"))
        assert (replica, reason) == (cached_on, "affinity")
    finally:
        await m.aclose()


async def test_unrelated_requests_spread_by_load(short_tmp):
    m, _ = manager(short_tmp)
    try:
        h = await m.get(MODEL)
        streams = [h.submit(conv(f"job {i} STALL", rid=f"s{i}")) for i in range(4)]
        assert sorted(s.replica for s in streams) == [0, 0, 1, 1]
        assert [r.in_flight for r in h.replicas] == [2, 2]
        # one replica busier: the next goes to the other
        for s in streams:
            if s.replica == 0:
                s.abort()
        await wait_for(lambda: h.replicas[0].in_flight == 0)
        _, done, replica, reason = await run(h, conv("light work"))
        assert (replica, reason) == (0, "least_loaded") and done.finish_reason == FinishReason.STOP
        for s in streams:
            s.abort()
    finally:
        await m.aclose()


async def test_a_session_sticks_to_its_replica(short_tmp):
    m, _ = manager(short_tmp)
    try:
        h = await m.get(MODEL)
        _, _, home, _ = await run(h, conv("start", session="s1", rid="s1a"))
        busy = [h.replicas[home].submit(conv("STALL", rid=f"busy{i}")) for i in range(2)]  # load on its replica
        _, _, replica, reason = await run(h, conv("a different question entirely", session="s1", rid="s1b"))
        assert (replica, reason) == (home, "session")
        _, _, replica, reason = await run(h, conv("yet another question", rid="nosession"))
        assert (replica, reason) == (1 - home, "least_loaded")  # a request without the session: by load
        for s in busy:
            s.abort()
    finally:
        await m.aclose()


async def test_killing_a_replica_fails_only_its_requests(short_tmp):
    m, logs = manager(short_tmp, worker_restart_backoff=0.1)
    try:
        h = await m.get(MODEL)
        _, _, known, _ = await run(h, conv(long_question(7), rid="k1"))  # affinity learned on one replica
        assert h.router.affinity.entries(known) > 0
        victim, survivor = known, 1 - known
        doomed = h.replicas[victim].submit(conv("x STALL", rid="doomed"))
        lasting = h.replicas[survivor].submit(conv("w1 SLOW SLOW w2", rid="lasting"))
        old_pid = h.replicas[victim].process.pid
        await asyncio.sleep(0.1)
        os.kill(old_pid, signal.SIGKILL)
        done = [ev async for ev in doomed if isinstance(ev, Done)][0]
        assert done.finish_reason == FinishReason.ERROR and done.error.code == ErrorCode.WORKER_UNAVAILABLE
        assert h.router.affinity.entries(victim) == 0  # what it cached went with it
        text = ""
        async for ev in lasting:
            if isinstance(ev, Done):
                assert ev.finish_reason == FinishReason.STOP and ev.error is None
            else:
                text += ev.text
        assert text == "w1 w2"
        assert h.alive and (await m.get(MODEL)) is h  # the model stays up on its other replica
        # new requests succeed meanwhile; the conversation whose cache died goes by load
        results = await asyncio.gather(*(run(h, conv(f"during {i}", rid=f"d{i}")) for i in range(3)))
        assert all(d.finish_reason == FinishReason.STOP for _, d, _, _ in results)
        _, d, _, reason = await run(h, conv(long_question(7), "reply", "more", rid="k2"))
        assert d.finish_reason == FinishReason.STOP and reason == "least_loaded"
        await wait_for(lambda: h.replicas[victim].alive and h.replicas[victim].process.pid != old_pid)
        assert [e.get("replica") for e in logs.events("worker_died")] == [victim]
        assert [e["replica"] for e in logs.events("replica_restarted")] == [victim]
        [info] = m.running()
        assert info.replicas[victim].restarts == 1 and info.replicas[victim].alive
        text, d, _, _ = await run(h.replicas[victim], conv("back", rid="back"))  # the new process serves
        assert text == "back" and "back" in await served_ids(h, victim)
        exits = {(s.labels["replica"], s.labels["cause"]) for f in m.metrics.worker_exits.collect() for s in f.samples}
        assert (str(victim), "SIGKILL") in exits
        starts = {(s.labels["replica"], s.labels["kind"]): s.value for f in m.metrics.worker_starts.collect()
                  for s in f.samples if s.name.endswith("_total")}  # fmt: skip
        assert starts[(str(victim), "restart")] == 1 and starts[(str(survivor), "first")] == 1
    finally:
        await m.aclose()


async def test_a_replica_killed_mid_stream(short_tmp):
    m, _ = manager(short_tmp, worker_restart_backoff=0.1)
    try:
        h = await m.get(MODEL)
        crashing = h.submit(conv("a b CRASH c", rid="crash"))
        steady = h.submit(conv("p SLOW q", rid="steady"))
        assert crashing.replica != steady.replica
        text, done = "", None
        async for ev in crashing:
            if isinstance(ev, Done):
                done = ev
            else:
                text += ev.text
        assert text == "a b"  # what it streamed before its worker died
        assert done.error.code == ErrorCode.WORKER_UNAVAILABLE and "exited with code 3" in done.error.message
        events = [ev async for ev in steady]
        assert events[-1].finish_reason == FinishReason.STOP
        assert "".join(ev.text for ev in events[:-1]) == "p q"
        await wait_for(lambda: len(h.live()) == 2)
    finally:
        await m.aclose()


async def test_round_robin_alternates(short_tmp):
    m, _ = manager(short_tmp, routing="round_robin")
    try:
        h = await m.get(MODEL)
        picks = []
        history: list[str] = [long_question(1)]
        for turn in range(4):  # one conversation: affinity would keep it on one replica
            _, done, replica, reason = await run(h, conv(*history, session="rr", rid=f"rr{turn}"))
            picks.append((replica, reason))
            history += [done.finish_reason.value, f"turn {turn}"]
        assert [p[0] for p in picks] in ([0, 1, 0, 1], [1, 0, 1, 0]) and {p[1] for p in picks} == {"round_robin"}
        assert [len(await served_ids(h, 0)), len(await served_ids(h, 1))] == [2, 2]
    finally:
        await m.aclose()


async def test_helper_calls_go_to_the_least_loaded_replica(short_tmp):
    m, _ = manager(short_tmp)
    try:
        h = await m.get(MODEL)
        busy = h.replicas[0].submit(conv("STALL", rid="busy"))
        result = await h.call(GetStats(id=""))
        assert result.stats["pid"] == h.replicas[1].process.pid
        busy.abort()
    finally:
        await m.aclose()


async def test_unload_stops_every_replica(short_tmp):
    m, logs = manager(short_tmp, replicas=3)
    try:
        h = await m.get(MODEL)
        procs = [r.process for r in h.replicas]
        stalled = h.submit(conv("a STALL", rid="u1"))
        assert await m.unload(MODEL) is True
        done = [ev async for ev in stalled][-1]
        assert done.finish_reason == FinishReason.ABORT
        assert all(p.returncode == 0 for p in procs) and m.running() == []
        assert logs.events("worker_died") == []
    finally:
        await m.aclose()


async def test_remote_replicas_at_endpoints(short_tmp):
    workers = [FakeWorker(model=MODEL), FakeWorker(model=MODEL)]
    endpoints = [await w.start() for w in workers]
    settings = make_settings(short_tmp, None, models={MODEL: ModelSettings(endpoints=endpoints, insecure=True)},
                             worker_restart_backoff=0.1, remote_connect_timeout=0.5)  # fmt: skip
    m = ModelManager(settings, StubRegistry(StubRecord(MODEL)), logger=LogCapture(settings).logger, heartbeat=(0.1, 2.0))
    try:
        h = await m.get(MODEL)
        assert len(h.live()) == 2 and h.remote
        [info] = m.running()
        assert info.expires_at is None and [r.endpoint for r in info.replicas] == endpoints
        doomed = h.replicas[0].submit(conv("x STALL", rid="doomed"))
        await asyncio.sleep(0.05)
        await workers[0].kill()
        done = [ev async for ev in doomed][-1]
        assert done.error.code == ErrorCode.WORKER_UNAVAILABLE
        text, d, replica, _ = await run(h, conv("still here", rid="s"))
        assert (text, replica) == ("still here", 1)
        await workers[0].restart()
        await wait_for(lambda: len(h.live()) == 2)  # reconnected in the background
        assert h.replicas[0].link.endpoint == endpoints[0]
    finally:
        await m.aclose()
        for w in workers:
            await w.stop()


async def test_app_shows_replicas_in_ps_stats_and_metrics(short_tmp):
    m, _ = manager(short_tmp)
    app = create_app(m.settings, registry=m.registry, models=m, logger=LogCapture(m.settings).logger)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gateway.test", timeout=10) as c:
        try:
            body = {"model": "fake", "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "tide"}]}
            for _ in range(2):
                r = await c.post("/v1/chat/completions", json=body)
                assert r.status_code == 200, r.text
            [entry] = (await c.get("/api/ps")).json()["models"]
            assert entry["name"] == MODEL and entry["n_seq_max"] == 8 and len(entry["replicas"]) == 2
            assert sum(sum(rep["routed"].values()) for rep in entry["replicas"]) == 2
            assert sorted(rep["routed"] for rep in entry["replicas"] if rep["routed"]) == [{"affinity": 1, "least_loaded": 1}]
            stats = (await c.get("/api/stats", params={"model": "fake"})).json()
            assert [rep["stats"]["pid"] for rep in stats["replicas"]] == [rep["pid"] for rep in entry["replicas"]]
            text = (await c.get("/metrics")).text
            for replica in ("0", "1"):
                assert f'barrel_inference_replica_in_flight{{model="fake:latest",replica="{replica}"}} 0.0' in text
                assert f'barrel_inference_replica_waiting{{model="fake:latest",replica="{replica}"}} 0.0' in text
                assert f'barrel_inference_worker_load_seconds{{model="fake:latest",replica="{replica}"}}' in text
            assert 'barrel_inference_routed_requests_total{model="fake:latest",reason="affinity",replica=' in text
        finally:
            await m.aclose()


async def test_routing_changes_on_reload_without_a_restart(short_tmp):
    import msgspec

    m, _ = manager(short_tmp)
    try:
        h = await m.get(MODEL)
        pids = [r.process.pid for r in h.replicas]
        m.settings.models[MODEL] = msgspec.structs.replace(m.settings.models[MODEL], routing="round_robin")
        assert m.reconfigure() == []
        assert h.router.policy == "round_robin" and (await m.get(MODEL)) is h
        assert [r.process.pid for r in h.replicas] == pids
        m.settings.models[MODEL] = msgspec.structs.replace(m.settings.models[MODEL], replicas=3)
        assert m.reconfigure() == [MODEL]  # a new replica count restarts the model (it is idle: at once)
        h3 = await m.get(MODEL)
        assert h3 is not h and len(h3.live()) == 3
    finally:
        await m.aclose()


async def test_the_memory_budget_counts_every_replica(short_tmp):
    settings = make_settings(short_tmp, None, models={"a:latest": ModelSettings(replicas=2)}, max_loaded_bytes=3000,
                             worker_start_timeout=30.0)  # fmt: skip
    m = ModelManager(settings, StubRegistry(StubRecord("a:latest"), StubRecord("b:latest")),
                     logger=LogCapture(settings).logger, worker_command=FAKE_CMD)  # fmt: skip
    try:
        a = await m.get("a")
        assert len(a.live()) == 2  # 2 x 1234 bytes fit in 3000
        await m.get("b")  # 1234 more do not: a goes, although one copy of each would fit
        assert [info.name for info in m.running()] == ["b:latest"]
    finally:
        await m.aclose()
