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


def test_configured_template_override_is_used_and_reported(tiny_gguf, tmp_path):
    extra = '[models."tiny:latest"]\nchat_template = "llama3"\n'
    with Daemon(tmp_path, {"tiny": tiny_gguf}, n_seq_max=1, n_ctx=256, threads=1, extra=extra) as d:
        before = httpx.post(d.url + "/api/show", json={"model": "tiny"}, timeout=30).json()
        r = httpx.post(d.url + "/v1/chat/completions", json={"model": "tiny", "max_tokens": 1,
                       "messages": [{"role": "user", "content": "hi"}]}, timeout=60)  # fmt: skip
        after = httpx.post(d.url + "/api/show", json={"model": "tiny"}, timeout=30).json()
    assert r.status_code == 200
    assert before["chat_template"] == "llama3"
    assert after["chat_template"] == "llama3" and "<|start_header_id|>" in after["template"]


def test_a_worker_on_another_host_is_reached_over_tcp(tiny_gguf, tmp_path):
    import subprocess
    import sys

    from .daemon import free_port

    endpoint = f"tcp://127.0.0.1:{free_port()}"
    worker = subprocess.Popen([sys.executable, "-m", "barrel_inference.worker", "--bind", endpoint, "--model-path", str(tiny_gguf),
                               "--model-name", "tiny:latest", "--n-ctx", "256", "--n-seq-max", "2", "--threads", "1", "--insecure"])  # fmt: skip
    extra = f'remote_connect_timeout = 2\n[models."tiny:latest"]\nendpoint = "{endpoint}"\ninsecure = true\n'
    try:
        with Daemon(tmp_path, {"tiny": tiny_gguf}, extra=extra) as d:
            r = httpx.post(d.url + "/v1/completions", json={"model": "tiny", "prompt": "hi", "max_tokens": 3}, timeout=60)
            assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3
            assert d.children() == []  # the gateway spawned no worker of its own
            ps = httpx.get(d.url + "/api/ps", timeout=10).json()["models"]
            assert ps[0]["endpoint"] == endpoint and ps[0]["pid"] == worker.pid
            worker.kill()
            worker.wait()
            r = httpx.post(d.url + "/v1/completions", json={"model": "tiny", "prompt": "hi", "max_tokens": 3}, timeout=60)
            assert r.status_code == 503 and r.json()["error"]["code"] == "worker_unavailable"
            assert httpx.get(d.url + "/health", timeout=10).status_code == 200
    finally:
        if worker.poll() is None:
            worker.kill()
        worker.wait()
