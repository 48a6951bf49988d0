"""`bictl` on a pseudo-terminal against the live test daemon: the `run` session's commands, Ctrl-C during an
answer and during a pull, and the shell completion of model names."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest

from tests.registry.registry_fakes import Fault

from .conftest import MODEL, wait_for

pexpect = pytest.importorskip("pexpect", reason="pexpect is in the test extra (pip install -e .[test])")

BICTL = Path(sys.executable).parent / "bictl"
pytestmark = pytest.mark.skipif(not BICTL.exists(), reason="bictl is not installed in this environment (pip install -e .)")


def spawn(daemon, *args, tmp_path=None, timeout=20):
    env = {k: v for k, v in os.environ.items() if not k.startswith("BARREL_INFERENCE_")}
    env.update(BARREL_INFERENCE_HOST=daemon.host, TERM="dumb", NO_COLOR="1")
    if tmp_path is not None:
        env["BICTL_HISTORY"] = str(tmp_path / "history")
    child = pexpect.spawn(str(BICTL), list(args), env=env, encoding="utf-8", timeout=timeout, dimensions=(40, 200))
    return child


def submits(daemon):
    return list(daemon.worker.submits)


def test_session_commands_do_not_reach_the_model(daemon, tmp_path):
    child = spawn(daemon, "run", "fake", tmp_path=tmp_path)
    child.expect_exact(">>> ")
    before = len(submits(daemon))
    for line, shown in [
        ("/set parameter temperature 0", "Set parameter 'temperature' to '0'"),
        ("/set parameter num_predict 7", "Set parameter 'num_predict' to '7'"),
        ('/set system "answer in one word"', "Set system message."),
        ("/show parameters", "temperature"),
        ("/show info", "architecture"),
        ("/show template", "<|im_start|>"),
        ("/set parameter temprature 1", "unknown parameter 'temprature'"),
        ("/frobnicate", "Unknown command '/frobnicate'"),
        ("/?", "/set parameter NAME VALUE"),
    ]:
        child.sendline(line)
        child.expect_exact(shown)
        child.expect_exact(">>> ")
    assert len(submits(daemon)) == before  # none of them went to the model as a prompt
    child.sendline("hello there")
    child.expect_exact("hello there")
    child.expect_exact(">>> ")
    s = submits(daemon)[-1]
    assert s.sampling.temperature == 0 and s.max_tokens == 7
    assert [(m.role, m.content) for m in s.messages] == [("system", "answer in one word"), ("user", "hello there")]
    # """ multi-line input is one message
    child.sendline('"""')
    child.expect_exact("... ")
    child.sendline("first line")
    child.expect_exact("... ")
    child.sendline('second line"""')
    child.expect_exact(">>> ")
    s = submits(daemon)[-1]
    assert s.messages[-1].content == "first line\nsecond line"
    assert [m.role for m in s.messages] == ["system", "user", "assistant", "user"]  # the conversation goes on
    child.sendline("/clear")
    child.expect_exact("Cleared session context")
    child.expect_exact(">>> ")
    child.sendline("again")
    child.expect_exact("again")
    child.expect_exact(">>> ")
    assert [m.role for m in submits(daemon)[-1].messages] == ["system", "user"]
    child.sendline("/load fak")  # a typo: the session stays, with a did-you-mean
    child.expect_exact("did you mean 'fake:latest'")
    child.sendline("/bye")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0
    assert "hello there" in (tmp_path / "history").read_text()  # readline history kept across sessions


def test_ctrl_c_stops_an_answer_and_the_session_goes_on(daemon, tmp_path):
    child = spawn(daemon, "run", "fake", tmp_path=tmp_path)
    child.expect_exact(">>> ")
    child.sendline("counting one two STALL never")
    child.expect_exact("counting one two")
    rid = wait_for(lambda: daemon.worker._running) and next(iter(daemon.worker._running))
    child.sendintr()
    child.expect_exact("(stopped)")
    child.expect_exact(">>> ")
    assert wait_for(lambda: rid in daemon.worker.aborts, 15), "the daemon did not abort the generation"
    child.sendline("still here")
    child.expect_exact("still here")
    child.expect_exact(">>> ")
    # the stopped turn is not part of the conversation
    assert [(m.role, m.content) for m in submits(daemon)[-1].messages] == [("user", "still here")]
    child.sendintr()  # Ctrl-C at the prompt does not leave either
    child.expect_exact("Use Ctrl-D or /bye to exit.")
    child.sendeof()
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0


def test_ctrl_c_on_a_pull_cancels_it_in_the_daemon(daemon, tiny_bytes):
    data = tiny_bytes[0] * 8  # the daemon checks the magic only after the download
    url = daemon.cdn.add("files/slow.gguf", data, Fault(delay=0.05))
    child = spawn(daemon, "pull", url, "--name", "slow:1")
    child.expect(r"pulling [0-9a-f]{12} +\d+%")
    layout = daemon.registry.layout
    assert wait_for(lambda: any(layout.tmp.glob("*.part")), 15)
    child.sendintr()
    child.expect_exact("error: pull of")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 130
    assert wait_for(lambda: all(j["status"] == "error" for j in _jobs(daemon)), 15), _jobs(daemon)
    job = _jobs(daemon)[-1]
    assert job["error"]["code"] == "cancelled"
    time.sleep(0.3)  # a download that went on would write more now
    assert not daemon.registry.exists("slow:1")
    assert list(layout.tmp.glob("*.part")) == [] and list(layout.refs.glob("*.ref")) == []
    assert [p.name for p in layout.blobs.iterdir()] == []  # fake:latest is registered by path: no blobs at all


def _jobs(daemon) -> list[dict]:
    import json
    import urllib.request

    with urllib.request.urlopen(daemon.url + "/api/pulls", timeout=5) as resp:
        return json.loads(resp.read())["jobs"]


def test_shell_completion_names_models(daemon):
    env = {k: v for k, v in os.environ.items() if not k.startswith("BARREL_INFERENCE_")}
    env.update(BARREL_INFERENCE_HOST=daemon.host, _BICTL_COMPLETE="bash_complete", COMP_WORDS="bictl run fa", COMP_CWORD="2")
    import subprocess

    r = subprocess.run([str(BICTL)], env=env, capture_output=True, text=True, timeout=30)
    assert f"plain,{MODEL}" in r.stdout.splitlines()
    env.update(COMP_WORDS="bictl stop f")
    r = subprocess.run([str(BICTL)], env=env, capture_output=True, text=True, timeout=30)
    assert f"plain,{MODEL}" in r.stdout.splitlines()


def test_a_non_streaming_pull_whose_client_leaves_is_cancelled(daemon, tiny_bytes):
    import socket as socketlib

    data = tiny_bytes[1] * 8
    url = daemon.cdn.add("files/slow2.gguf", data, Fault(delay=0.05))
    body = json.dumps({"model": url, "destination": "slow:2", "stream": False}).encode()
    host, port = daemon.host.split(":")
    s = socketlib.create_connection((host, int(port)))
    s.sendall(b"POST /api/pull HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\ncontent-length: "
              + str(len(body)).encode() + b"\r\n\r\n" + body)  # fmt: skip
    layout = daemon.registry.layout
    assert wait_for(lambda: any(layout.tmp.glob("*.part")), 15)
    s.close()
    assert wait_for(lambda: _jobs(daemon) and _jobs(daemon)[-1]["status"] == "error", 15), _jobs(daemon)
    assert _jobs(daemon)[-1]["error"]["code"] == "cancelled"
    assert not daemon.registry.exists("slow:2") and list(layout.tmp.glob("*.part")) == []
