"""The installed `bictl` as a real subprocess: against the live test daemon, and `serve --detach` / `stop` of a
real daemon process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from .conftest import MODEL, free_port

BICTL = Path(sys.executable).parent / "bictl"


def bictl(*args, env=None, timeout=60, input=None):
    full = {k: v for k, v in os.environ.items() if not k.startswith("BARREL_INFERENCE_")}
    full.update(env or {})
    return subprocess.run([str(BICTL), *args], env=full, capture_output=True, text=True, timeout=timeout, input=input)


pytestmark = pytest.mark.skipif(not BICTL.exists(), reason="bictl is not installed in this environment (pip install -e .)")


def test_bictl_against_the_live_daemon(daemon, tiny_bytes):
    env = {"BARREL_INFERENCE_HOST": daemon.url}
    r = bictl("--json", "list", env=env)
    assert r.returncode == 0, r.stderr
    assert [m["name"] for m in json.loads(r.stdout)] == [MODEL]
    url = daemon.cdn.add("files/sub.gguf", tiny_bytes[0])
    r = bictl("pull", url, env=env)
    assert r.returncode == 0 and r.stderr.splitlines()[-1] == "success"
    r = bictl("run", "fake", "over", "a", "real", "socket", env=env)
    assert r.returncode == 0 and r.stdout == "over a real socket\n"
    r = bictl("show", "nosuch", env=env)
    assert r.returncode == 1 and r.stderr.startswith("error: model 'nosuch' not found")


def test_bictl_without_a_daemon_exits_3():
    port = free_port()
    r = bictl("list", env={"BARREL_INFERENCE_HOST": f"127.0.0.1:{port}"})
    assert r.returncode == 3 and r.stderr.strip() == f"error: no daemon at http://127.0.0.1:{port} — start it with `bictl serve`"


def test_serve_detach_then_stop(tmp_path, tiny_gguf):
    port = free_port()
    cfg = tmp_path / "bi.toml"
    cfg.write_text(
        f'host = "127.0.0.1"\nport = {port}\nmodel_cache_dir = "{tmp_path / "cache"}"\nruntime_dir = "{tmp_path / "run"}"\n'
        "embed_default_model = false\n"
    )
    env = {"BARREL_INFERENCE_CONFIG": str(cfg), "BARREL_INFERENCE_HOST": f"127.0.0.1:{port}"}
    pid_file = tmp_path / "run" / "gateway.pid"
    r = bictl("serve", "--detach", "--wait", "60", env=env, timeout=90)
    try:
        assert r.returncode == 0, r.stderr
        assert r.stdout.startswith("barrel-inference daemon started (pid ") and f"http://127.0.0.1:{port}" in r.stdout
        pid = int(pid_file.read_text())
        os.kill(pid, 0)
        r2 = bictl("serve", "--detach", env=env)
        assert r2.returncode == 1 and f"already running (pid {pid}" in r2.stderr
        r3 = bictl("pull", str(tiny_gguf), "--name", "local-tiny", env=env)
        assert r3.returncode == 0, r3.stderr
        names = [m["name"] for m in json.loads(bictl("list", "--json", env=env).stdout)]
        assert names == ["local-tiny:latest"]
        r4 = bictl("version", env=env)
        assert r4.stdout.splitlines()[1].startswith("daemon 0.1.0 at")
    finally:
        r5 = bictl("stop", env=env, timeout=60)
    assert r5.returncode == 0 and r5.stdout.strip() == f"stopped the daemon (pid {pid})"
    for _ in range(50):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        raise AssertionError("the daemon is still running")
    assert not pid_file.exists()
    r6 = bictl("list", env=env)
    assert r6.returncode == 3
    r7 = bictl("stop", env=env)
    assert r7.returncode == 1 and "no pid file" in r7.stderr
