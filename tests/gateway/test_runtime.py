"""Two daemons never share a worker: a runtime dir per port with a lock, and the gateway only takes a
hello from the process it started (the probe: a second daemon's gateway used the first one's worker)."""

from __future__ import annotations

import asyncio
import sys

import pytest

from barrel_inference.config import Settings
from barrel_inference.gateway.errors import GatewayError
from barrel_inference.gateway.process import ipc_endpoint
from barrel_inference.gateway.runtime import RuntimeDirBusy, RuntimeLock
from barrel_inference.gateway.server import serve
from barrel_inference.protocol import ErrorCode

from .conftest import MODEL
from .fake_worker import FakeWorker
from .test_workers import _importable, manager, short_tmp  # noqa: F401 - fixtures


@pytest.mark.parametrize("xdg", [None, "/run/user/1000"])
def test_default_runtime_dir_is_per_port(monkeypatch, xdg):
    if xdg:
        monkeypatch.setenv("XDG_RUNTIME_DIR", xdg)
    else:
        monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    a, b = Settings(port=8080).run_dir(), Settings(port=8081).run_dir()
    assert a != b and a.name == "8080" and b.name == "8081"
    assert Settings(port=8080, runtime_dir="/srv/bi").run_dir().as_posix() == "/srv/bi"


def test_the_runtime_lock_is_held_by_one_daemon(tmp_path):
    with RuntimeLock(tmp_path):
        with pytest.raises(RuntimeDirBusy, match="pid"):
            RuntimeLock(tmp_path).acquire()
    RuntimeLock(tmp_path).acquire().release()  # free again once the first let go


async def test_a_second_daemon_on_the_same_runtime_dir_refuses_to_start(tmp_path):
    settings = Settings(runtime_dir=str(tmp_path), port=1, embed_default_model=False)
    with RuntimeLock(tmp_path):
        with pytest.raises(RuntimeDirBusy):
            await asyncio.wait_for(serve(settings, asyncio.Event()), 10)


async def test_the_gateway_refuses_a_worker_it_did_not_start(short_tmp):
    """Another process answers on the socket path; the spawned worker (here: one that never binds) is stopped."""
    sleeper = [sys.executable, "-c", "import time; time.sleep(60)"]
    m, logs = manager(short_tmp, command=sleeper, worker_start_timeout=5.0)
    run_dir = m.settings.run_dir()
    run_dir.mkdir(parents=True, exist_ok=True)
    foreign = FakeWorker(bind=ipc_endpoint(run_dir, MODEL), model=MODEL)
    await foreign.start()
    try:
        with pytest.raises(GatewayError) as err:
            await m.get(MODEL)
        assert err.value.code is ErrorCode.WORKER_UNAVAILABLE and "another process" in err.value.info.message
        assert [e["reason"] for e in logs.events("worker_start_failed")] == ["foreign_worker"]
        assert m.running() == []
    finally:
        await foreign.stop()
        await m.aclose()
