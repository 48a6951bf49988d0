"""Remote workers over tcp:// authenticated with CURVE keys from `bictl worker keygen`: accepted with
the right keys both ways, refused with a wrong worker key or an unknown gateway key, and plain tcp
only when asked for."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from .daemon import Daemon, free_port

BICTL = Path(sys.executable).parent / "bictl"


def keygen(name: str, directory: Path) -> tuple[Path, Path]:
    r = subprocess.run([str(BICTL), "worker", "keygen", name, "--dir", str(directory)], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    assert (directory / f"{name}.key_secret").stat().st_mode & 0o077 == 0  # the secret is the owner's alone
    return directory / f"{name}.key", directory / f"{name}.key_secret"


@pytest.fixture
def keys(tmp_path):
    clients = tmp_path / "clients"
    clients.mkdir()
    worker_pub, worker_sec = keygen("worker1", tmp_path / "worker")
    gw_pub, gw_sec = keygen("gateway", tmp_path / "gateway")
    (clients / "gateway.key").write_bytes(gw_pub.read_bytes())
    other_pub, other_sec = keygen("other", tmp_path / "other")
    return {"clients": clients, "worker_pub": worker_pub, "worker_sec": worker_sec, "gw_sec": gw_sec,
            "other_pub": other_pub, "other_sec": other_sec}  # fmt: skip


def start_worker(tiny_gguf, endpoint, *extra):
    return subprocess.Popen(
        [sys.executable, "-m", "barrel_inference.worker", "--bind", endpoint, "--model-path", str(tiny_gguf),
         "--model-name", "tiny:latest", "--n-ctx", "256", "--n-seq-max", "2", "--threads", "1", *extra],
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def daemon_for(tmp_path, tiny_gguf, endpoint, gateway_secret, server_key):
    extra = (f'remote_connect_timeout = 3\ncurve_secret_key = "{gateway_secret}"\n'
             f'[models."tiny:latest"]\nendpoint = "{endpoint}"\nserver_key = "{server_key}"\n')  # fmt: skip
    root = tmp_path / f"d{time.monotonic_ns()}"
    root.mkdir()
    return Daemon(root, {"tiny": tiny_gguf}, extra=extra)


def ask(d):
    return httpx.post(d.url + "/v1/completions", json={"model": "tiny", "prompt": "hi", "max_tokens": 3}, timeout=60)


def test_curve_link_accepts_the_right_keys_and_refuses_wrong_ones(tiny_gguf, tmp_path, keys):
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    worker = start_worker(tiny_gguf, endpoint, "--curve-secret-key", str(keys["worker_sec"]), "--curve-clients", str(keys["clients"]))
    try:
        with daemon_for(tmp_path, tiny_gguf, endpoint, keys["gw_sec"], keys["worker_pub"]) as d:
            r = ask(d)
            assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3
        # the gateway expects another worker key: the worker cannot prove it, nothing is sent to it
        with daemon_for(tmp_path, tiny_gguf, endpoint, keys["gw_sec"], keys["other_pub"]) as d:
            r = ask(d)
            assert r.status_code == 503 and "did not answer" in r.json()["error"]["message"]
        # a gateway whose key the worker does not know is refused by the worker
        with daemon_for(tmp_path, tiny_gguf, endpoint, keys["other_sec"], keys["worker_pub"]) as d:
            r = ask(d)
            assert r.status_code == 503 and "refused this gateway's key" in r.json()["error"]["message"]
        assert worker.poll() is None  # refused handshakes never disturb the worker
    finally:
        worker.kill()
        worker.wait()


def test_plain_tcp_needs_insecure_on_both_sides(tiny_gguf, tmp_path):
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    worker = start_worker(tiny_gguf, endpoint)
    _, err = worker.communicate(timeout=60)
    assert worker.returncode == 2 and "without CURVE keys" in err and "--insecure" in err
    extra = f'remote_connect_timeout = 3\n[models."tiny:latest"]\nendpoint = "{endpoint}"\n'
    with Daemon(tmp_path, {"tiny": tiny_gguf}, extra=extra) as d:
        r = ask(d)
        assert r.status_code == 503 and "refusing the unauthenticated worker endpoint" in r.json()["error"]["message"]


def test_worker_refuses_a_public_key_as_its_secret(tiny_gguf, tmp_path, keys):
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    worker = start_worker(tiny_gguf, endpoint, "--curve-secret-key", str(keys["worker_pub"]), "--curve-clients", str(keys["clients"]))
    _, err = worker.communicate(timeout=60)
    assert worker.returncode == 2 and "holds no secret key" in err
