"""Issue 3's end-to-end case: a tiny model pulled over HTTP through the daemon then serves a chat — the real
gateway spawning the real llama.cpp worker process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from .conftest import free_port

BICTL = Path(sys.executable).parent / "bictl"
pytestmark = pytest.mark.skipif(not BICTL.exists(), reason="bictl is not installed in this environment (pip install -e .)")


@pytest.fixture
def file_server(tmp_path, tiny_gguf):
    """A plain HTTP file server (stdlib) with the tiny GGUF."""
    import functools
    from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

    root = tmp_path / "www"
    root.mkdir()
    (root / "tiny-chat.gguf").write_bytes(tiny_gguf.read_bytes())
    handler = functools.partial(SimpleHTTPRequestHandler, directory=str(root))
    handler.log_message = lambda *a: None
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_pull_then_chat_through_the_daemon(tmp_path, file_server):
    port = free_port()
    cfg = tmp_path / "bi.toml"
    cfg.write_text(
        f'host = "127.0.0.1"\nport = {port}\nmodel_cache_dir = "{tmp_path / "cache"}"\nruntime_dir = "{tmp_path / "run"}"\n'
        "embed_default_model = false\npull_allow_private = true\n[defaults]\nn_ctx = 512\nn_seq_max = 2\n"
    )
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "BARREL_INFERENCE_CONFIG": str(cfg), "BARREL_INFERENCE_HOST": f"127.0.0.1:{port}",
           "PYTHONPATH": os.environ.get("PYTHONPATH", "")}  # the tree under test, in the daemon too

    def bictl(*args, timeout=120):
        return subprocess.run([str(BICTL), *args], env=env, capture_output=True, text=True, timeout=timeout)

    r = bictl("serve", "--detach", "--wait", "60")
    assert r.returncode == 0, r.stderr
    try:
        r = bictl("pull", f"{file_server}/tiny-chat.gguf")
        assert r.returncode == 0 and r.stderr.splitlines()[-1] == "success", r.stderr
        r = bictl("--json", "run", "tiny-chat", "hello", "there", "--max-tokens", "8", "--temperature", "0")
        assert r.returncode == 0, r.stderr
        body = json.loads(r.stdout)
        assert body["choices"][0]["finish_reason"] in ("stop", "length")
        assert body["usage"]["prompt_tokens"] > 0 and body["usage"]["completion_tokens"] >= 1
        r = bictl("run", "tiny-chat", "hi", "--max-tokens", "4")  # streamed over SSE
        assert r.returncode == 0, r.stderr
        ps = json.loads(bictl("--json", "ps").stdout)
        assert [m["name"] for m in ps] == ["tiny-chat:latest"] and ps[0]["pid"]
    finally:
        stop = bictl("stop")
    assert stop.returncode == 0, stop.stderr
