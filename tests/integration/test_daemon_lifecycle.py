"""Process lifecycle of the real daemon: workers never outlive their gateway."""

import os
import signal
import time

import httpx

from .daemon import Daemon


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie waiting for its reaper counts as gone
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_workers_exit_when_the_gateway_is_killed(tiny_gguf, tmp_path):
    d = Daemon(tmp_path, {"tiny": tiny_gguf}, n_seq_max=1, n_ctx=256, threads=1).start()
    try:
        r = httpx.post(d.url + "/v1/completions", json={"model": "tiny", "prompt": "hi", "max_tokens": 2}, timeout=60)
        assert r.status_code == 200
        workers = d.children()
        assert workers
        os.kill(d.proc.pid, signal.SIGKILL)
        d.proc.wait()
        deadline = time.monotonic() + 10
        while any(alive(p) for p in workers) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not any(alive(p) for p in workers), "a worker outlived its gateway"
    finally:
        d.stop()


def test_sigterm_stops_gateway_and_workers(tiny_gguf, tmp_path):
    d = Daemon(tmp_path, {"tiny": tiny_gguf}, n_seq_max=1, n_ctx=256, threads=1).start()
    r = httpx.post(d.url + "/v1/completions", json={"model": "tiny", "prompt": "hi", "max_tokens": 2}, timeout=60)
    assert r.status_code == 200
    workers = d.children()
    d.stop()
    assert d.proc.returncode == 0
    assert not any(alive(p) for p in workers)
