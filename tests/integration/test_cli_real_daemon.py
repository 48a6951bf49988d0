"""`bictl` on a pseudo-terminal against the real daemon (gateway + worker processes) on tiny GGUFs: a chat model
and a base model (no chat template), the session, --verbose, Ctrl-C during an answer, `stop MODEL`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tinymodel import write_tiny_gguf

from .daemon import Daemon

pexpect = pytest.importorskip("pexpect", reason="pexpect is in the test extra")
BICTL = Path(sys.executable).parent / "bictl"
pytestmark = pytest.mark.skipif(not BICTL.exists(), reason="bictl is not installed in this environment (pip install -e .)")


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    root = tmp_path_factory.mktemp("cli-daemon")
    # a long context: a greedy answer runs for many seconds, so Ctrl-C always lands mid-answer
    tiny = write_tiny_gguf(root / "tiny.gguf", context_length=32768)
    base = write_tiny_gguf(root / "base.gguf", chat_template=None, seed=4)
    d = Daemon(root, {"tiny": tiny, "base": base}, n_seq_max=1, n_ctx=32768, threads=1)
    with d:
        yield d


def env_of(daemon, tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("BARREL_INFERENCE_")}
    env.update(BARREL_INFERENCE_HOST=daemon.url, BICTL_HISTORY=str(tmp_path / "history"), TERM="dumb")
    return env


def bictl(daemon, tmp_path, *args, input=None):
    return subprocess.run([str(BICTL), *args], env=env_of(daemon, tmp_path), capture_output=True, text=True, timeout=120, input=input)


def test_one_answer_verbose_and_a_base_model(daemon, tmp_path):
    r = bictl(daemon, tmp_path, "run", "tiny", "--verbose", "--max-tokens", "6", "hello")
    assert r.returncode == 0, r.stderr
    figures = dict(line.split(":", 1) for line in r.stderr.splitlines() if ":" in line)
    assert 1 <= int(figures["eval count"].split()[0]) <= 6 and int(figures["prompt eval count"].split()[0]) > 1
    r = bictl(daemon, tmp_path, "run", "base", "--max-tokens", "4", "Once upon a time")
    assert r.returncode == 0, r.stderr
    assert "base has no chat template; running it as a text completion" in r.stderr
    requests = [e for e in daemon.events("request") if e.get("model") == "base:latest"]
    assert requests[-1]["api"] == "openai.completions"


def test_session_ctrl_c_and_stop_model(daemon, tmp_path):
    child = pexpect.spawn(str(BICTL), ["run", "tiny"], env=env_of(daemon, tmp_path), encoding="utf-8", timeout=60)
    child.expect_exact(">>> ")
    child.sendline("/set parameter num_predict 3")
    child.expect_exact("Set parameter 'num_predict' to '3'")
    child.expect_exact(">>> ")
    child.sendline("hi")
    child.expect_exact(">>> ")
    child.sendline("/set parameter num_predict 100000")
    child.expect_exact(">>> ")
    child.sendline("/set parameter temperature 0")  # greedy: this prompt runs to the end of the context, no EOS
    child.expect_exact(">>> ")
    child.sendline("/clear")  # the same prompt every time (the answer to "hi" was sampled)
    child.expect_exact(">>> ")
    child.sendline("tell me everything")
    child.expect_exact("tell me everything")  # the terminal's echo

    def in_flight():
        return {m["name"]: m["in_flight"] for m in httpx.get(daemon.url + "/api/ps", timeout=5).json()["models"]}.get("tiny:latest")

    deadline = time.monotonic() + 15
    while in_flight() != 1 and time.monotonic() < deadline:  # the answer is being generated
        time.sleep(0.02)
    assert in_flight() == 1
    child.sendintr()
    child.expect_exact("(stopped)")
    child.expect_exact(">>> ")
    child.sendline("/bye")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0
    def ends():
        return [e for e in daemon.events("request") if e.get("model") == "tiny:latest"]

    deadline = time.monotonic() + 15
    while len(ends()) < 3 and time.monotonic() < deadline:  # the stopped answer's line comes when it ends
        time.sleep(0.05)
    last = ends()[-1]
    assert last["status"] == "client_disconnected", [(e["status"], e.get("completion_tokens")) for e in ends()]
    ps = json.loads(bictl(daemon, tmp_path, "--json", "ps").stdout)
    assert {m["name"]: m["in_flight"] for m in ps}["tiny:latest"] == 0
    r = bictl(daemon, tmp_path, "stop", "tiny")
    assert r.returncode == 0 and r.stdout.strip() == "unloaded 'tiny:latest'"
    assert "tiny:latest" not in [m["name"] for m in json.loads(bictl(daemon, tmp_path, "--json", "ps").stdout)]
