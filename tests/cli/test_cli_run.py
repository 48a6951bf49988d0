"""`bictl run` one-shot behaviour, `stop MODEL` / `shutdown`, `create`, `logs` and the errors a person can act on."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from click.testing import CliRunner

from barrel_inference.cli.create import parse_modelfile
from barrel_inference.cli.main import main
from barrel_inference.config import ModelSettings
from tinymodel import write_tiny_gguf

from .conftest import MODEL, free_port

BICTL = Path(sys.executable).parent / "bictl"


def bictl(daemon, *args, input=None, env=None):
    full = {"BARREL_INFERENCE_HOST": daemon.host} if daemon else {}
    full.update(env or {})
    return CliRunner().invoke(main, list(args), env=full, input=input, catch_exceptions=False)


def test_stdin_comes_before_the_prompt_argument(daemon):
    r = bictl(daemon, "run", "fake", "Summarize:", input="The cat sat on the mat.\n")
    assert r.exit_code == 0, r.output
    assert daemon.worker.submits[-1].messages[-1].content == "The cat sat on the mat.\n\nSummarize:"
    assert r.stdout == "The cat sat on the mat. Summarize:\n"  # the fake worker answers with the words it got


def test_answers_are_capped_by_default_from_the_config(daemon, tmp_path):
    r = bictl(daemon, "run", "fake", "a", "b")
    assert r.exit_code == 0 and daemon.worker.submits[-1].max_tokens == 1024  # the built-in run_num_predict
    cfg = tmp_path / "c.toml"
    cfg.write_text("run_num_predict = 3\n")
    r = bictl(daemon, "run", "fake", "one", "two", "three", "four", "five", env={"BARREL_INFERENCE_CONFIG": str(cfg)})
    assert daemon.worker.submits[-1].max_tokens == 3 and r.stdout == "one two three\n"
    r = bictl(daemon, "run", "fake", "--max-tokens", "2", "one", "two", "three", env={"BARREL_INFERENCE_CONFIG": str(cfg)})
    assert daemon.worker.submits[-1].max_tokens == 2 and r.stdout == "one two\n"
    cfg.write_text("run_num_predict = 0\n")
    bictl(daemon, "run", "fake", "uncapped", env={"BARREL_INFERENCE_CONFIG": str(cfg)})
    assert daemon.worker.submits[-1].max_tokens is None


def test_verbose_prints_counts_and_rates(daemon):
    r = bictl(daemon, "run", "fake", "--verbose", "four words right here")
    assert r.exit_code == 0 and r.stdout == "four words right here\n"
    lines = dict(line.split(":", 1) for line in r.stderr.splitlines() if ":" in line)
    assert lines["prompt eval count"].split()[0] == "4" and "(2 cached)" in lines["prompt eval count"]
    assert lines["eval count"].split()[0] == "4"
    assert lines["eval rate"].strip().endswith("tokens/s") and "total duration" in lines


def test_a_model_without_a_chat_template_runs_as_text_completion(daemon, tmp_path):
    base = write_tiny_gguf(tmp_path / "base.gguf", chat_template=None, seed=3)
    daemon.registry.register_local("base:latest", base)
    daemon.settings.models["base:latest"] = ModelSettings(endpoint=daemon.worker.endpoint, insecure=True)
    r = bictl(daemon, "run", "base", "Once upon a time")
    assert r.exit_code == 0, r.output
    s = daemon.worker.submits[-1]
    assert s.messages is None and s.prompt == "Once upon a time" and s.max_tokens == 1024
    assert r.stdout == "Once upon a time\n"
    assert r.stderr.count("has no chat template; running it as a text completion") == 1
    r = bictl(daemon, "run", "base", "now it is loaded")  # the worker runs a built-in template; still a base model
    assert daemon.worker.submits[-1].prompt == "now it is loaded" and "text completion" in r.stderr
    cfg = tmp_path / "c.toml"
    cfg.write_text("run_num_predict = 0\n")
    bictl(daemon, "run", "base", "no cap", env={"BARREL_INFERENCE_CONFIG": str(cfg)})
    assert daemon.worker.submits[-1].max_tokens == 2048  # not /v1/completions' 16: the model's context
    r = bictl(daemon, "run", "fake", "chat", "model")
    assert daemon.worker.submits[-1].messages is not None and "text completion" not in r.stderr


def test_unknown_models_get_a_did_you_mean(daemon):
    r = bictl(daemon, "run", "fakk", "hi")
    assert r.exit_code == 1
    assert r.stderr.strip() == "error: model 'fakk' not found — did you mean 'fake:latest'? (`bictl list` shows them all)"
    r = bictl(daemon, "show", "zzzz")
    assert r.stderr.strip() == "error: model 'zzzz' not found — see `bictl list`, or pull it with `bictl pull zzzz`"
    r = bictl(daemon, "rm", "fake:lates")
    assert "did you mean 'fake:latest'" in r.stderr


def test_stop_model_unloads_and_stop_without_one_still_stops_the_daemon(daemon, tmp_path):
    assert bictl(daemon, "run", "fake", "warm").exit_code == 0
    r = bictl(daemon, "stop", "fake")
    assert r.exit_code == 0 and r.stdout.strip() == f"unloaded '{MODEL}'"
    assert json.loads(bictl(daemon, "--json", "ps").stdout) == []
    # no model: the daemon, as before (with a hint); here no daemon was detached, so the pid file is missing
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'runtime_dir = "{tmp_path / "run"}"\n')
    r = bictl(daemon, "stop", "--config", str(cfg))
    assert r.exit_code == 1 and "`bictl shutdown` is its name now" in r.stderr and "no pid file at" in r.stderr
    r = bictl(daemon, "shutdown", "--config", str(cfg))
    assert r.exit_code == 1 and r.stderr.startswith("error: no pid file at") and "shutdown` is its name" not in r.stderr


class CreateStub(BaseHTTPRequestHandler):
    """Ollama's documented POST /api/create (streamed status lines), /api/show and /api/tags."""

    bodies: list = []

    def log_message(self, *args):
        pass

    def _send(self, status, body: bytes, ctype="application/json"):
        self.send_response(status)
        self.send_header("content-type", ctype)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        self._send(200, json.dumps({"models": [{"name": "base:latest"}]}).encode())

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["content-length"])))
        if self.path == "/api/show":
            self._send(200, json.dumps({"template": "{{ .Prompt }}", "details": {}}).encode())
            return
        assert self.path == "/api/create"
        type(self).bodies.append(body)
        if body.get("stream", True):
            lines = [{"status": "using existing layer sha256:abc"}, {"status": "writing manifest"}, {"status": "success"}]
            self._send(200, b"".join(json.dumps(x).encode() + b"\n" for x in lines), "application/x-ndjson")
        else:
            self._send(200, json.dumps({"status": "success"}).encode())


@pytest.fixture
def create_stub():
    CreateStub.bodies = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), CreateStub)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"127.0.0.1:{server.server_address[1]}", CreateStub.bodies
    server.shutdown()


MODELFILE = '''# a comment
FROM base:latest
PARAMETER temperature 0.2
PARAMETER num_ctx 4096
PARAMETER stop "<|end|>"
PARAMETER stop "User:"
SYSTEM """You are
a pirate."""
TEMPLATE {{ .System }} {{ .Prompt }}
MESSAGE user Ahoy?
MESSAGE assistant Arr.
LICENSE "MIT"
'''


def test_create_sends_ollamas_create_body(create_stub, tmp_path):
    host, bodies = create_stub
    mf = tmp_path / "Modelfile"
    mf.write_text(MODELFILE)
    r = CliRunner().invoke(main, ["--host", host, "create", "pirate", "-f", str(mf)], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    assert r.stdout.strip() == "created 'pirate'" and r.stderr.splitlines()[-1] == "success"
    assert bodies == [{
        "model": "pirate", "from": "base:latest", "stream": True, "system": "You are\na pirate.",
        "template": "{{ .System }} {{ .Prompt }}", "license": "MIT",
        "parameters": {"temperature": 0.2, "num_ctx": 4096, "stop": ["<|end|>", "User:"]},
        "messages": [{"role": "user", "content": "Ahoy?"}, {"role": "assistant", "content": "Arr."}],
    }]  # fmt: skip
    gguf = write_tiny_gguf(tmp_path / "w.gguf")
    assert parse_modelfile("FROM ./w.gguf\n", tmp_path) == {"from": str(gguf)}
    r = CliRunner().invoke(main, ["--host", host, "create", "x", "-f", str(tmp_path / "nope")])
    assert r.exit_code == 1 and r.stderr.startswith("error: cannot read the Modelfile")
    mf.write_text("PARAMETER temperature 1\n")
    r = CliRunner().invoke(main, ["--host", host, "create", "x", "-f", str(mf)])
    assert r.exit_code == 1 and r.stderr.strip() == "error: the Modelfile has no FROM line"


def test_save_in_the_session_creates_a_model(create_stub):
    host, bodies = create_stub
    r = CliRunner().invoke(main, ["--host", host, "run", "base", "-i"], input='/set system "be kind"\n/set parameter seed 5\n/save kind-base\n/bye\n',
                           catch_exceptions=False)  # fmt: skip
    assert r.exit_code == 0, r.output
    assert "Created new model 'kind-base'" in r.stdout
    assert bodies[-1]["model"] == "kind-base" and bodies[-1]["from"] == "base" and bodies[-1]["system"] == "be kind"
    assert bodies[-1]["parameters"]["seed"] == 5


def test_logs_prints_the_end_and_follows(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    log = tmp_path / "elsewhere.log"
    log.write_text("".join(f'{{"event":"e{i}"}}\n' for i in range(30)))
    (run / "daemon.json").write_text(json.dumps({"pid": 1, "pid_file": str(run / "x.pid"), "log_file": str(log)}))
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'runtime_dir = "{run}"\n')
    r = CliRunner().invoke(main, ["logs", "--config", str(cfg), "--no-follow", "-n", "2"])
    assert r.exit_code == 0 and r.stdout.splitlines() == ['{"event":"e28"}', '{"event":"e29"}']
    if not BICTL.exists():
        pytest.skip("bictl is not installed in this environment")
    pexpect = pytest.importorskip("pexpect")
    child = pexpect.spawn(str(BICTL), ["logs", "--config", str(cfg), "-n", "1"], encoding="utf-8", timeout=10)
    child.expect_exact('{"event":"e29"}')
    with open(log, "a") as f:
        f.write('{"event":"later"}\n')
    child.expect_exact('{"event":"later"}')  # followed
    child.sendintr()
    child.expect(pexpect.EOF)
    cfg.write_text(f'runtime_dir = "{tmp_path / "empty"}"\n')
    r = CliRunner().invoke(main, ["logs", "--config", str(cfg), "--no-follow"])
    assert r.exit_code == 1 and r.stderr.startswith("error: no daemon log at")


def test_a_busy_port_is_one_line_naming_its_holder(tmp_path):
    if not BICTL.exists():
        pytest.skip("bictl is not installed in this environment")
    port = free_port()
    holder = socket.socket()
    holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    holder.bind(("127.0.0.1", port))
    holder.listen()
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'host = "127.0.0.1"\nport = {port}\nmodel_cache_dir = "{tmp_path / "m"}"\nruntime_dir = "{tmp_path / "r"}"\n'
                   "embed_default_model = false\n")  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith("BARREL_INFERENCE_")}
    try:
        for extra in ([], ["--detach"]):
            r = subprocess.run([str(BICTL), "serve", "--config", str(cfg), *extra], env=env, capture_output=True, text=True, timeout=60)
            assert r.returncode == 1, r.stderr
            lines = r.stderr.splitlines()
            assert lines[-1].startswith(f"error: port {port} is in use by pid {os.getpid()} (")
            assert lines[-1].endswith("); use --port or stop it")
            assert "Traceback" not in r.stderr and "gateway_listening" not in r.stderr and len(lines) == 1
    finally:
        holder.close()
