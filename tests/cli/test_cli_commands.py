"""bictl commands through click's CliRunner against a live in-process daemon."""

from __future__ import annotations

import hashlib
import json

import pytest
from click.testing import CliRunner

from barrel_inference import __version__
from barrel_inference.cli.formatting import PullProgress, ago, human_size, until
from barrel_inference.cli.main import main
from tests.registry.registry_fakes import OLLAMA_SEARCH_PAGE

from .conftest import MODEL, free_port


def bictl(daemon, *args, input=None):
    runner = CliRunner()
    return runner.invoke(main, list(args), env={"BARREL_INFERENCE_HOST": daemon.host} if daemon else {}, input=input, catch_exceptions=False)


def test_no_daemon_says_what_to_do():
    port = free_port()
    r = CliRunner().invoke(main, ["--host", f"127.0.0.1:{port}", "list"])
    assert r.exit_code == 3
    assert r.stderr.strip() == f"error: no daemon at http://127.0.0.1:{port} — start it with `bictl serve`"
    r = CliRunner().invoke(main, ["version"], env={"BARREL_INFERENCE_HOST": f"http://127.0.0.1:{port}"})
    assert r.exit_code == 0 and f"bictl {__version__}" in r.stdout and "no daemon at" in r.stdout


def test_pull_list_show_copy_rm(daemon, tiny_bytes):
    data = tiny_bytes[0]
    url = daemon.cdn.add("files/Tiny-Q8_0.gguf", data)
    r = bictl(daemon, "pull", url, "--name", "tiny:1", "--sha256", hashlib.sha256(data).hexdigest())
    assert r.exit_code == 0, r.output
    assert r.stderr.splitlines()[0] == "pulling manifest"
    assert any(line.startswith(f"pulling {hashlib.sha256(data).hexdigest()[:12]} 100%") and "ETA" in line for line in r.stderr.splitlines())
    assert r.stderr.splitlines()[-1] == "success"

    r = bictl(daemon, "list")
    assert r.exit_code == 0
    lines = r.stdout.splitlines()
    assert lines[0].split() == ["NAME", "ID", "SIZE", "MODIFIED"]
    rows = {ln.split()[0]: ln for ln in lines[1:]}
    assert set(rows) == {MODEL, "tiny:1"} and human_size(len(data)) in rows["tiny:1"] and "just now" in rows["tiny:1"]
    assert rows["tiny:1"].split()[1] == hashlib.sha256(data).hexdigest()[:12]  # the ID column: the blob's digest

    r = bictl(daemon, "list", "--json")
    listed = json.loads(r.stdout)
    assert {m["name"] for m in listed} == {MODEL, "tiny:1"}

    r = bictl(daemon, "show", "tiny:1")
    assert r.exit_code == 0
    show = dict(line.strip().split(None, 1) if len(line.strip().split(None, 1)) == 2 else (line.strip(), "") for line in r.stdout.splitlines())
    assert show["architecture"] == "llama" and show["quantization"] == "F32" and show["n_ctx"] == "2048" and show["kind"] == "url"
    r = bictl(daemon, "--json", "show", "tiny:1")
    assert json.loads(r.stdout)["details"]["family"] == "llama"
    r = bictl(daemon, "show", "tiny:1", "--template")
    assert "<|im_start|>" in r.stdout

    r = bictl(daemon, "copy", "tiny:1", "tiny:backup")
    assert r.exit_code == 0 and r.stdout.strip() == "copied 'tiny:1' to 'tiny:backup'"
    r = bictl(daemon, "cp", "tiny:1", "tiny:third")  # Ollama's name for it
    assert r.exit_code == 0 and r.stdout.strip() == "copied 'tiny:1' to 'tiny:third'"
    assert bictl(daemon, "rm", "tiny:third").exit_code == 0
    blob = daemon.registry.resolve("tiny:1").path
    refs = daemon.registry.layout.refs
    assert [json.loads(p.read_text())["name"] for p in refs.glob("*.ref")] == ["tiny:1"]
    r = bictl(daemon, "rm", "tiny:1")
    assert r.exit_code == 0 and r.stdout.strip() == "deleted 'tiny:1'" and blob.exists()
    assert list(refs.glob("*.ref")) == []  # rm removes what the pull spec resolved to
    r = bictl(daemon, "rm", "tiny:backup")
    assert r.exit_code == 0 and not blob.exists()
    r = bictl(daemon, "rm", "tiny:backup")
    assert r.exit_code == 1 and "not found" in r.stderr


def test_pull_errors_are_plain_sentences(daemon, tiny_bytes):
    r = bictl(daemon, "pull", "s3://bucket/x.gguf")
    assert r.exit_code == 1
    assert r.stderr.strip() == "error: 's3://bucket/x.gguf': the scheme 's3://' is not supported; use hf://, ollama://, https://, http:// or file://"
    url = daemon.cdn.add("files/m.gguf", tiny_bytes[1])
    r = bictl(daemon, "pull", url, "--sha256", "ab" * 32)
    assert r.exit_code == 1 and "sha256" in r.stderr and "was expected" in r.stderr
    r = bictl(daemon, "pull", "ollama://library/absent:1")
    assert r.exit_code == 1 and "HTTP 404" in r.stderr
    r = bictl(daemon, "--json", "pull", "hf://org/missing-repo")
    assert r.exit_code == 1 and "404" in r.stderr and json.loads(r.stdout.splitlines()[0]) == {"status": "pulling manifest"}


def test_pull_json_streams_events(daemon, tiny_bytes):
    daemon.hf.add_repo("org/tiny-GGUF", {"tiny.Q4_K_M.gguf": tiny_bytes[1], "tiny.Q8_0.gguf": tiny_bytes[0]})
    r = bictl(daemon, "pull", "hf://org/tiny-GGUF", "--json")
    assert r.exit_code == 0
    events = [json.loads(x) for x in r.stdout.splitlines()]
    assert events[0]["status"] == "pulling manifest" and events[-1]["status"] == "success"
    assert any(e.get("completed") == len(tiny_bytes[1]) for e in events)
    assert daemon.registry.resolve("hf.co/org/tiny-GGUF:Q4_K_M").size == len(tiny_bytes[1])


def test_run_streams_one_answer(daemon):
    r = bictl(daemon, "run", "fake", "the", "cat", "sat")
    assert r.exit_code == 0 and r.stdout == "the cat sat\n"
    assert daemon.worker.submits[-1].messages[-1].content == "the cat sat"
    r = bictl(daemon, "run", "fake", input="piped words here\n")
    assert r.stdout == "piped words here\n"
    r = bictl(daemon, "--json", "run", "fake", "json", "please")
    body = json.loads(r.stdout)
    assert body["choices"][0]["message"]["content"] == "json please" and body["model"] == "fake"  # the id the client asked for


def test_run_interactive_keeps_history(daemon):
    r = bictl(daemon, "run", "fake", "-i", "--system", "be brief", input="first question\nsecond one\n/clear\nthird\n/bye\n")
    assert r.exit_code == 0, r.output
    assert "first question" in r.stdout and "second one" in r.stdout
    subs = daemon.worker.submits[-3:]
    roles = [[(m.role, m.content) for m in s.messages] for s in subs]
    assert roles[0] == [("system", "be brief"), ("user", "first question")]
    assert roles[1] == [("system", "be brief"), ("user", "first question"), ("assistant", "first question"), ("user", "second one")]
    assert roles[2] == [("system", "be brief"), ("user", "third")]  # /clear forgot the conversation


def test_run_unknown_model_hints_at_pull(daemon):
    r = bictl(daemon, "run", "nosuch", "hi")
    assert r.exit_code == 1 and "nosuch" in r.stderr and "bictl pull" in r.stderr


def test_ps_and_unload(daemon):
    assert bictl(daemon, "run", "fake", "warm", "up").exit_code == 0
    r = bictl(daemon, "ps")
    header = r.stdout.splitlines()[0].split()
    assert r.exit_code == 0 and header == ["NAME", "ID", "SIZE", "PROCESSOR", "CONTEXT", "SEQS", "IN", "FLIGHT", "PID", "UNTIL"]
    row = r.stdout.splitlines()[1]
    assert row.startswith(MODEL) and "100% CPU" in row and row.endswith(("Forever", "minutes from now"))
    ps = json.loads(bictl(daemon, "ps", "--json").stdout)
    assert [m["name"] for m in ps] == [MODEL] and ps[0]["context_length"] == 512
    r = bictl(daemon, "unload", "fake")
    assert r.exit_code == 0 and r.stdout.strip() == f"unloaded '{MODEL}'"
    assert json.loads(bictl(daemon, "--json", "ps").stdout) == []
    r = bictl(daemon, "unload", "fake")
    assert r.exit_code == 0 and "was not loaded" in r.stderr
    r = bictl(daemon, "unload", "ghost")
    assert r.exit_code == 1 and "not found" in r.stderr


@pytest.fixture
def embed_stub():
    """A daemon stand-in whose POST /v1/embeddings answers like OpenAI's; everything else is 404."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    seen = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            seen.append((self.path, body))
            if self.path != "/v1/embeddings" or body["model"] == "nosuch":
                msg = {"error": {"message": f"model '{body['model']}' not found", "code": "model_not_found"}} if self.path == "/v1/embeddings" else {"error": "not found"}
                data, status = json.dumps(msg).encode(), 404
            else:
                vecs = [{"object": "embedding", "index": i, "embedding": [0.5, -0.25, float(len(t))]} for i, t in enumerate(body["input"])]
                data, status = json.dumps({"object": "list", "data": vecs, "model": body["model"]}).encode(), 200
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *a):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    yield f"127.0.0.1:{server.server_address[1]}", seen
    server.shutdown()


def test_embed(embed_stub):
    host, seen = embed_stub
    r = CliRunner().invoke(main, ["--host", host, "embed", "m", "hello", "hi"])
    assert r.exit_code == 0
    assert r.stdout.splitlines() == ["'hello': dim=3 [0.5000, -0.2500, 5.0000]", "'hi': dim=3 [0.5000, -0.2500, 2.0000]"]
    assert seen[-1] == ("/v1/embeddings", {"model": "m", "input": ["hello", "hi"]})
    r = CliRunner().invoke(main, ["--host", host, "--json", "embed", "m", "x"])
    assert json.loads(r.stdout)["data"][0]["embedding"] == [0.5, -0.25, 1.0]
    r = CliRunner().invoke(main, ["--host", host, "embed", "nosuch", "x"])
    assert r.exit_code == 1 and "model 'nosuch' not found" in r.stderr and "bictl pull nosuch" in r.stderr


def test_embed_reports_the_workers_error(daemon):
    # the scripted fake worker refuses this input: its typed error reaches the user as a sentence
    r = bictl(daemon, "embed", "fake", "NOEMBED")
    assert r.exit_code == 1
    assert r.stderr.strip() == "error: this model cannot embed"


def test_embed_unknown_model_gets_a_did_you_mean(daemon):
    r = bictl(daemon, "embed", "fakee", "x")
    assert r.exit_code == 1 and "did you mean 'fake:latest'" in r.stderr


def test_search(daemon):
    daemon.hf.add_repo("org/granite-GGUF", {"g.Q4_K_M.gguf": b"GGUF"}, downloads=7)
    daemon.ollama.search_html = OLLAMA_SEARCH_PAGE
    r = bictl(daemon, "search", "granite")
    assert r.exit_code == 0
    lines = r.stdout.splitlines()
    assert lines[0].split() == ["ID", "DOWNLOADS", "UPDATED", "DESCRIPTION"]
    assert [ln.split()[0] for ln in lines[1:]] == ["ollama://library/qwen3", "ollama://library/granite3.2-vision", "hf://org/granite-GGUF"]
    assert "3,100,000" in lines[1]
    r = bictl(daemon, "search", "granite", "--source", "hf", "--json")
    assert [h["id"] for h in json.loads(r.stdout)["hits"]] == ["hf://org/granite-GGUF"]


def test_version_talks_to_the_daemon(daemon):
    r = bictl(daemon, "version")
    assert r.stdout.splitlines() == [f"bictl {__version__}", f"daemon {__version__} at {daemon.url}"]
    assert json.loads(bictl(daemon, "version", "--json").stdout)["daemon"] == __version__


def test_stop_without_pid_file(tmp_path):
    r = CliRunner().invoke(main, ["stop", "--pid-file", str(tmp_path / "none.pid")])
    assert r.exit_code == 1 and "no pid file" in r.stderr and "serve --detach" in r.stderr


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def test_progress_bar_shows_bytes_speed_and_eta():
    import io

    out = io.StringIO()
    clock = Clock()
    bar = PullProgress(out, interactive=True, clock=clock)
    bar.update({"status": "pulling manifest"})
    for t, done in [(0.0, 0), (1.0, 10_000_000), (2.0, 20_000_000)]:
        clock.t = t
        bar.update({"status": "pulling 0123456789ab", "digest": "sha256:0123456789ab", "total": 100_000_000, "completed": done})
    line = out.getvalue().split("\r")[-1]
    assert line.startswith("pulling 0123456789ab  20%") and "20 MB/100 MB" in line and "10 MB/s" in line and "ETA 0:08" in line
    bar.update({"status": "success"})
    assert out.getvalue().endswith("\nsuccess\n")


@pytest.mark.parametrize("n, text", [(0, "0 B"), (999, "999 B"), (1500, "1.5 KB"), (253_113_024, "253 MB"), (4_700_000_000, "4.7 GB")])
def test_human_size(n, text):
    assert human_size(n) == text


def test_ago():
    import datetime as dt

    now = dt.datetime(2025, 3, 1, 12, tzinfo=dt.timezone.utc)
    assert ago("2025-03-01T11:57:00+00:00", now) == "3 minutes ago"
    assert ago("2025-02-27T12:00:00Z", now) == "2 days ago"
    assert ago("3 weeks ago", now) == "3 weeks ago"


def test_api_key_is_sent_and_a_refusal_says_how_to_give_one(tmp_path, tiny_gguf):
    """A daemon with api_keys: bictl without a key is refused with a hint; with the admin key (option or
    environment) management commands work; a non-admin key is refused for them."""
    from barrel_inference.config import ApiKey

    from .conftest import DaemonThread

    t = DaemonThread(tmp_path, tiny_gguf, api_keys=[ApiKey(key="admin-key", admin=True), ApiKey(key="user-key")])
    d = t.start()
    try:
        env = {"BARREL_INFERENCE_HOST": d.host}
        runner = CliRunner()
        r = runner.invoke(main, ["list"], env=env)
        assert r.exit_code == 1 and "--api-key or BARREL_INFERENCE_API_KEY" in r.stderr
        r = runner.invoke(main, ["--api-key", "admin-key", "list"], env=env)
        assert r.exit_code == 0 and MODEL in r.stdout
        r = runner.invoke(main, ["cp", "fake", "copy:one"], env={**env, "BARREL_INFERENCE_API_KEY": "admin-key"})
        assert r.exit_code == 0, r.stderr
        r = runner.invoke(main, ["cp", "fake", "copy:two"], env={**env, "BARREL_INFERENCE_API_KEY": "user-key"})
        assert r.exit_code == 1 and "is not enough" in r.stderr and "admin key" in r.stderr
        r = runner.invoke(main, ["--api-key", "admin-key", "--json", "list"], env=env)
        assert sorted(m["name"] for m in json.loads(r.stdout)) == ["copy:one", MODEL]
    finally:
        t.stop()
