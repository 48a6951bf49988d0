"""Engine crashes at load: the safe-profile fallback, remembering it, and the restart backoff.

The real worker (`python -m barrel_inference.worker --fake`) runs its warm-up through the same code
as on a model; BARREL_INFERENCE_FAULT_WARMUP makes it kill itself with SIGSEGV there, as llama.cpp's
AMX kernels do on some Xeons, so the path is proven on any machine.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import pytest

from barrel_inference.config import ModelSettings
from barrel_inference.gateway.errors import GatewayError
from barrel_inference.gateway.fallbacks import FallbackStore
from barrel_inference.gateway.workers import ModelManager
from barrel_inference.protocol import ChatMessage, Done, ErrorCode, FinishReason, Submit

from .conftest import MODEL, LogCapture, StubRecord, StubRegistry, make_settings

REPO = Path(__file__).resolve().parents[2]
WORKER = [sys.executable, "-m", "barrel_inference.worker", "--fake"]


@pytest.fixture(autouse=True)
def _importable(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))


@pytest.fixture
def short_tmp():
    with tempfile.TemporaryDirectory(prefix="bi-fb-", dir="/tmp") as d:
        yield Path(d)


def manager(tmp: Path, extra_buffers: str = "on", **kw) -> tuple[ModelManager, LogCapture]:
    settings = make_settings(tmp, defaults=ModelSettings(extra_buffers=extra_buffers), worker_start_timeout=30.0, **kw)
    logs = LogCapture(settings)
    store = FallbackStore.in_cache_dir(settings.cache_dir(), build_id="build-a", cpu="cpu-a")
    m = ModelManager(settings, StubRegistry(StubRecord(MODEL)), logger=logs.logger, worker_command=WORKER,
                     fallbacks=store)  # fmt: skip
    return m, logs


async def one_request(handle) -> tuple[str, Done]:
    text = ""
    async for ev in handle.submit(Submit(id="r1", messages=[ChatMessage(role="user", content="hi")], max_tokens=8)):
        if isinstance(ev, Done):
            return text, ev
        text += ev.text
    raise AssertionError("no Done")


async def test_crash_in_warmup_falls_back_to_safe_profile_and_serves(short_tmp, monkeypatch):
    monkeypatch.setenv("BARREL_INFERENCE_FAULT_WARMUP", "segv-extra")
    m, logs = manager(short_tmp)
    try:
        h = await m.get(MODEL)
        text, done = await one_request(h)
        assert done.finish_reason == FinishReason.LENGTH and len(text) == 8
        info = h.info()
        assert info.engine_profile == "safe" and info.extra_buffers is False
        fallback = logs.events("engine_fallback")
        assert len(fallback) == 1 and fallback[0]["signal"] == "SIGSEGV" and "safe engine profile" in fallback[0]["reason"]
        started = logs.events("worker_started")
        assert len(started) == 2  # default (crashed), then safe
        failed = logs.events("worker_start_failed")
        assert len(failed) == 1 and "signal 11 (SIGSEGV)" in failed[0]["reason"] and failed[0]["profile"] == "default"
    finally:
        await m.aclose()
    # remembered: keyed by model digest + build + CPU, in the cache dir
    saved = json.loads((short_tmp / "cache" / "engine-fallbacks.json").read_text())
    (entry,) = saved.values()
    assert entry["model"] == MODEL and entry["signal"] == "SIGSEGV" and entry["build"] == "build-a" and entry["cpu"] == "cpu-a"

    # the next gateway goes straight to the safe profile: one start, no crash
    m2, logs2 = manager(short_tmp)
    try:
        h2 = await m2.get(MODEL)
        assert h2.info().engine_profile == "safe"
        assert len(logs2.events("worker_started")) == 1 and logs2.events("engine_fallback") == []
        assert len(logs2.events("engine_fallback_remembered")) == 1
    finally:
        await m2.aclose()

    # another build (or CPU) tries the default profile again
    settings = make_settings(short_tmp, defaults=ModelSettings(extra_buffers="on"))
    logs3 = LogCapture(settings)
    other = FallbackStore.in_cache_dir(settings.cache_dir(), build_id="build-b", cpu="cpu-a")
    assert other.get(StubRecord(MODEL)) is None
    m3 = ModelManager(settings, StubRegistry(StubRecord(MODEL)), logger=logs3.logger, worker_command=WORKER, fallbacks=other)
    try:
        monkeypatch.delenv("BARREL_INFERENCE_FAULT_WARMUP")
        h3 = await m3.get(MODEL)
        assert h3.info().engine_profile == "default" and h3.info().extra_buffers is True
    finally:
        await m3.aclose()


async def test_no_fallback_when_extra_buffers_are_off(short_tmp, monkeypatch):
    """The fault only fires with extra buffers on: with them off the default profile just works."""
    monkeypatch.setenv("BARREL_INFERENCE_FAULT_WARMUP", "segv-extra")
    m, logs = manager(short_tmp, extra_buffers="off")
    try:
        h = await m.get(MODEL)
        assert h.info().engine_profile == "default" and h.info().extra_buffers is False
        assert "operator setting" in h.info().engine_reason
        assert logs.events("engine_fallback") == [] and len(logs.events("worker_started")) == 1
    finally:
        await m.aclose()


async def test_crash_in_both_profiles_fails_clearly_with_backoff(short_tmp, monkeypatch):
    monkeypatch.setenv("BARREL_INFERENCE_FAULT_WARMUP", "segv")
    m, logs = manager(short_tmp, worker_restart_backoff=1.0, worker_restart_backoff_max=8.0)
    try:
        with pytest.raises(GatewayError) as info:
            await m.get(MODEL)
        msg = info.value.info.message
        assert info.value.code == ErrorCode.WORKER_UNAVAILABLE
        assert MODEL in msg and "SIGSEGV" in msg
        assert len(logs.events("worker_started")) == 2  # default, then the safe fallback; no loop
        # within the backoff: refused at once, nothing started, retry-after says how long
        t0 = time.monotonic()
        with pytest.raises(GatewayError) as again:
            await m.get(MODEL)
        assert time.monotonic() - t0 < 0.5
        assert "SIGSEGV" in again.value.info.message and "not started again" in again.value.info.message
        assert 0 < again.value.retry_after <= 1.0
        assert len(logs.events("worker_started")) == 2
        backoff = logs.events("worker_start_backoff")
        assert [b["failures"] for b in backoff] == [1]
        # after it: one more try (safe profile remembered now: a single start), then a doubled backoff
        await asyncio.sleep(again.value.retry_after + 0.05)
        with pytest.raises(GatewayError):
            await m.get(MODEL)
        assert len(logs.events("worker_started")) == 3
        backoff = logs.events("worker_start_backoff")
        assert [b["failures"] for b in backoff] == [1, 2] and backoff[1]["backoff_s"] == 2.0
    finally:
        await m.aclose()


async def test_crash_while_serving_with_extra_buffers_makes_the_next_start_safe(short_tmp):
    import signal

    m, logs = manager(short_tmp)
    try:
        h = await m.get(MODEL)
        assert h.info().engine_profile == "default" and h.info().extra_buffers is True
        os.kill(h.process.pid, signal.SIGSEGV)
        deadline = time.monotonic() + 10
        while not logs.events("engine_fallback") and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        (fallback,) = logs.events("engine_fallback")
        assert fallback["signal"] == "SIGSEGV" and "while serving" in fallback["reason"]
        h2 = await m.get(MODEL)
        assert h2 is not h and h2.info().engine_profile == "safe"
        text, done = await one_request(h2)
        assert done.finish_reason == FinishReason.LENGTH and text
    finally:
        await m.aclose()
