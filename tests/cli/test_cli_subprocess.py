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


def test_doctor_against_the_daemon_and_without_one(daemon, tmp_path):
    r = bictl("--json", "doctor", env={"BARREL_INFERENCE_HOST": daemon.url}, timeout=120)
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert report["source"] == daemon.url
    assert "CPU" in report["llama_cpp"]["system_info"] and report["llama_cpp"]["llama_cpp_python"]
    assert report["cpu"]["signature"] and report["cpu"]["cores"] >= 1
    assert report["cache_dir"]["path"] == str(daemon.settings.cache_dir()) and report["cache_dir"]["free_bytes"] > 0
    assert report["engine"]["extra_buffers_setting"] == "auto"
    assert isinstance(report["engine"]["extra_buffers"]["extra_buffers"], bool) and report["engine"]["extra_buffers"]["reason"]

    # no daemon: the same report computed here, remembered fallbacks included
    from barrel_inference.gateway.fallbacks import FallbackStore

    cache = tmp_path / "doctor-cache"
    FallbackStore.in_cache_dir(cache).remember(
        type("R", (), {"name": "m:latest", "digest": "sha256:" + "ab" * 32})(), profile="safe",
        reason="worker for m:latest was killed by SIGSEGV", signal="SIGSEGV",
    )  # fmt: skip
    cfg = tmp_path / "doctor.toml"
    cfg.write_text(f'model_cache_dir = "{cache}"\n[defaults]\nextra_buffers = "off"\n')
    port = free_port()
    r = bictl("doctor", "--config", str(cfg), env={"BARREL_INFERENCE_HOST": f"127.0.0.1:{port}"}, timeout=120)
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert f"no daemon answered at http://127.0.0.1:{port}" in out
    assert "extra buffers:  setting 'off' -> off" in out
    assert "fallback:       m:latest: safe after SIGSEGV (applies here)" in out
    assert "llama-cpp-python" in out and "ggml:" in out


def test_detached_with_its_own_pid_file_then_logs_and_shutdown(tmp_path):
    port = free_port()
    cfg = tmp_path / "bi.toml"
    cfg.write_text(
        f'host = "127.0.0.1"\nport = {port}\nmodel_cache_dir = "{tmp_path / "cache"}"\nruntime_dir = "{tmp_path / "run"}"\n'
        "embed_default_model = false\n"
    )
    env = {"BARREL_INFERENCE_CONFIG": str(cfg), "BARREL_INFERENCE_HOST": f"127.0.0.1:{port}"}
    pid_file = tmp_path / "elsewhere" / "d.pid"
    log_file = tmp_path / "elsewhere" / "d.log"
    r = bictl("serve", "--detach", "--pid-file", str(pid_file), "--log-file", str(log_file), "--wait", "60", env=env, timeout=90)
    try:
        assert r.returncode == 0, r.stderr
        assert f"stop it with `bictl shutdown --pid-file {pid_file}`" in r.stdout
        pid = int(pid_file.read_text())
        r2 = bictl("logs", "--no-follow", "-n", "50", env=env)
        assert r2.returncode == 0
        events = [json.loads(line) for line in r2.stdout.splitlines()]
        assert any(e["event"] == "gateway_listening" for e in events)
        assert any(e.get("logger_name") == "hypercorn.error" and "Running on" in e["message"] for e in events)
    finally:
        r3 = bictl("shutdown", env=env, timeout=60)  # finds the pid file `serve --detach` was given
    assert r3.returncode == 0 and r3.stdout.strip() == f"stopped the daemon (pid {pid})", r3.stderr
    assert not pid_file.exists()
