"""Model residency with real child processes (the scripted fake worker): keep_alive expiry stops an idle
worker, never a busy one; keep_alive 0 unloads after the request; max_loaded_models / max_loaded_bytes make
room by stopping the least recently used idle model; /api/ps's expires_at follows the last request."""

from __future__ import annotations

import asyncio
import math
import os
import sys
import tempfile
import time
from pathlib import Path

import pytest

from barrel_inference.config import ModelSettings
from barrel_inference.gateway.errors import GatewayError
from barrel_inference.gateway.ollama.convert import ps_item
from barrel_inference.gateway.workers import ModelManager
from barrel_inference.protocol import ChatMessage, Done, ErrorCode, Submit

from .conftest import LogCapture, StubRecord, StubRegistry, make_settings

REPO = Path(__file__).resolve().parents[2]
FAKE_CMD = [sys.executable, "-m", "tests.gateway.fake_worker"]


@pytest.fixture(autouse=True)
def _importable(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))


@pytest.fixture
def short_tmp():
    with tempfile.TemporaryDirectory(prefix="bi-res-", dir="/tmp") as d:
        yield Path(d)


def manager(tmp: Path, *records: StubRecord, **settings_kw) -> tuple[ModelManager, LogCapture]:
    settings = make_settings(tmp, None, **settings_kw)
    logs = LogCapture(settings)
    registry = StubRegistry(*(records or (StubRecord("a:latest"),)))
    return ModelManager(settings, registry, logger=logs.logger, worker_command=FAKE_CMD), logs


async def run(m: ModelManager, model: str, rid: str, text: str, keep_alive: float | None = None) -> Done:
    handle = await m.get(model)
    m.residency.request_keep_alive(rid, keep_alive)
    async for ev in handle.submit(Submit(id=rid, messages=[ChatMessage(role="user", content=text)])):
        if isinstance(ev, Done):
            return ev
    raise AssertionError("no Done")


async def wait_for(cond, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.02)


async def test_idle_model_stops_when_its_keep_alive_expires(short_tmp):
    m, logs = manager(short_tmp)
    try:
        await run(m, "a", "r1", "hi", keep_alive=0.3)
        handle = m.current("a:latest")
        proc = handle.process
        assert handle.expires_at == pytest.approx(time.time() + 0.3, abs=0.2)
        await wait_for(lambda: proc.returncode is not None)
        assert proc.returncode == 0 and m.running() == []
        assert [e["model"] for e in logs.events("model_expired")] == ["a:latest"]
    finally:
        await m.aclose()


async def test_a_busy_model_is_never_stopped(short_tmp):
    m, _ = manager(short_tmp)
    try:
        handle = await m.get("a")
        stalled_rid = "s1"
        m.residency.request_keep_alive(stalled_rid, 0.2)
        stream = handle.submit(Submit(id=stalled_rid, messages=[ChatMessage(role="user", content="a STALL")]))
        await run(m, "a", "r2", "quick", keep_alive=0.05)  # ends while the other still runs
        await asyncio.sleep(0.5)  # ten times the short keep_alive
        assert handle.process.returncode is None and m.running()[0].in_flight == 1
        stream.abort()
        async for _ in stream:
            pass
        await wait_for(lambda: handle.process.returncode is not None)  # then the last request's 0.2 s runs out
    finally:
        await m.aclose()


async def test_keep_alive_zero_unloads_after_the_request(short_tmp):
    m, _ = manager(short_tmp)
    try:
        done = await run(m, "a", "r1", "one two", keep_alive=0)
        assert done.error is None
        proc = m.current("a:latest").process
        await wait_for(lambda: proc.returncode is not None)
    finally:
        await m.aclose()


async def test_negative_keep_alive_keeps_it_forever_and_ps_says_so(short_tmp):
    m, _ = manager(short_tmp)
    try:
        await run(m, "a", "r1", "x", keep_alive=math.inf)
        info = m.running()[0]
        assert info.expires_at is None and ps_item(info)["expires_at"] == "2318-01-01T00:00:00Z"
    finally:
        await m.aclose()


async def test_ps_expires_at_moves_with_each_request(short_tmp):
    m, _ = manager(short_tmp)
    try:
        await run(m, "a", "r1", "x", keep_alive=60)
        first = m.running()[0].expires_at
        await asyncio.sleep(0.05)
        await run(m, "a", "r2", "x", keep_alive=120)
        second = m.running()[0].expires_at
        assert second - first == pytest.approx(60, abs=1.0)
        assert ps_item(m.running()[0])["expires_at"].endswith("Z")
        await run(m, "a", "r3", "x")  # no keep_alive: the configured default (5m)
        assert m.running()[0].expires_at == pytest.approx(time.time() + 300, abs=2)
    finally:
        await m.aclose()


async def test_max_loaded_models_evicts_the_least_recently_used_idle_model(short_tmp):
    m, logs = manager(short_tmp, StubRecord("a:latest"), StubRecord("b:latest"), StubRecord("c:latest"), max_loaded_models=2)
    try:
        await run(m, "a", "r1", "x")
        await run(m, "b", "r2", "x")
        await run(m, "a", "r3", "x")  # a is now the most recently used
        pid_b = m.current("b:latest").process
        await run(m, "c", "r4", "x")
        assert sorted(i.name for i in m.running()) == ["a:latest", "c:latest"]
        assert pid_b.returncode == 0
        assert logs.events("model_evicted")[0]["model"] == "b:latest"
    finally:
        await m.aclose()


async def test_budget_full_of_busy_models_refuses_without_breaking_streams(short_tmp):
    m, _ = manager(short_tmp, StubRecord("a:latest"), StubRecord("b:latest"), max_loaded_models=1)
    try:
        handle = await m.get("a")
        stream = handle.submit(Submit(id="s", messages=[ChatMessage(role="user", content="a STALL")]))
        with pytest.raises(GatewayError) as e:
            await m.get("b")
        assert e.value.code == ErrorCode.OVERLOADED and "max_loaded_models=1" in e.value.info.message
        assert e.value.info.retryable
        assert handle.alive and handle.in_flight == 1  # the running stream is untouched
        stream.abort()
        async for _ in stream:
            pass
        await m.get("b")  # now a is idle and makes room
        assert [i.name for i in m.running()] == ["b:latest"]
    finally:
        await m.aclose()


async def test_max_loaded_bytes(short_tmp):
    m, _ = manager(short_tmp, StubRecord("a:latest", size=600), StubRecord("b:latest", size=600), max_loaded_bytes=1000)
    try:
        await run(m, "a", "r1", "x")
        await run(m, "b", "r2", "x")
        assert [i.name for i in m.running()] == ["b:latest"]
    finally:
        await m.aclose()


async def test_configured_keep_alive_applies_to_requests_that_do_not_say(short_tmp):
    m, _ = manager(short_tmp, defaults=ModelSettings(keep_alive="400ms"))
    try:
        await run(m, "a", "r1", "x")  # as an OpenAI request: no keep_alive of its own
        proc = m.current("a:latest").process
        assert m.running()[0].expires_at == pytest.approx(time.time() + 0.4, abs=0.3)
        await wait_for(lambda: proc.returncode is not None)
    finally:
        await m.aclose()


def test_invalid_configured_keep_alive_fails_at_start(short_tmp):
    with pytest.raises(ValueError, match="invalid keep_alive for defaults"):
        manager(short_tmp, defaults=ModelSettings(keep_alive="soon"))


async def test_an_admission_slot_held_by_a_helper_call_keeps_the_model(short_tmp):
    from barrel_inference.gateway.admission import Admission

    m, _ = manager(short_tmp, StubRecord("a:latest"), StubRecord("b:latest"), max_loaded_models=1)
    admission = Admission(m.settings)
    m.residency.admission = admission
    try:
        await run(m, "a", "r1", "x", keep_alive=0.2)
        handle = m.current("a:latest")
        slot = await admission.acquire(handle.name, 4)  # as an embedding holds one while it runs
        await asyncio.sleep(0.5)
        assert handle.process.returncode is None  # not expired while the slot is held
        with pytest.raises(GatewayError):  # nor evicted for another model
            await m.get("b")
        slot.release()
        await wait_for(lambda: handle.process.returncode is not None, timeout=10)
    finally:
        await m.aclose()


async def test_unload_request_waits_for_running_streams(short_tmp):
    m, _ = manager(short_tmp)
    try:
        handle = await m.get("a")
        stream = handle.submit(Submit(id="s", messages=[ChatMessage(role="user", content="a b STALL")]))
        await m.residency.unload_when_idle("a:latest")  # Ollama's generate with keep_alive 0 and no prompt
        await asyncio.sleep(0.3)
        assert handle.alive and handle.process.returncode is None and handle.in_flight == 1  # the stream goes on
        stream.abort()
        async for _ in stream:
            pass
        await wait_for(lambda: handle.process.returncode is not None)  # and then the model goes
    finally:
        await m.aclose()
