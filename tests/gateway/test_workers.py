"""ModelManager with real child processes: the scripted fake worker and the real worker's --fake engine."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import pytest

from barrel_inference.config import ModelSettings, Settings
from barrel_inference.gateway.errors import GatewayError
from barrel_inference.gateway.process import engine_options, ipc_endpoint, slug, worker_argv
from barrel_inference.gateway.workers import ModelManager
from barrel_inference.protocol import ChatMessage, Done, ErrorCode, FinishReason, Submit

from .conftest import MODEL, LogCapture, StubRecord, StubRegistry, make_settings

REPO = Path(__file__).resolve().parents[2]
FAKE_CMD = [sys.executable, "-m", "tests.gateway.fake_worker"]


@pytest.fixture(autouse=True)
def _importable(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))


@pytest.fixture
def short_tmp(tmp_path_factory):
    # ipc:// paths must stay under ~100 bytes
    import tempfile

    with tempfile.TemporaryDirectory(prefix="bi-gw-", dir="/tmp") as d:
        yield Path(d)


def manager(tmp: Path, *extra: str, command=None, **settings_kw) -> tuple[ModelManager, LogCapture]:
    settings = make_settings(tmp, None, **settings_kw)
    logs = LogCapture(settings)
    m = ModelManager(settings, StubRegistry(StubRecord(MODEL)), logger=logs.logger,
                     worker_command=command or FAKE_CMD, extra_args=extra)  # fmt: skip
    return m, logs


def chat(rid: str, text: str, **kw) -> Submit:
    return Submit(id=rid, messages=[ChatMessage(role="user", content=text)], **kw)


async def run(handle, submit: Submit) -> tuple[str, Done]:
    text = ""
    async for ev in handle.submit(submit):
        if isinstance(ev, Done):
            return text, ev
        text += ev.text
    raise AssertionError("no Done")


# ---- pure parts --------------------------------------------------------------------------


def test_engine_options_precedence():
    settings = Settings(defaults=ModelSettings(n_batch=512, threads=2), models={"m:latest": ModelSettings(n_seq_max=8)})
    record = StubRecord("m:latest", loader={"n_ctx": 32768, "n_batch": 2048, "n_ubatch": 1024, "n_seq_max": 4, "chat_template": None},
                        parameters={"num_ctx": 4096, "num_thread": 3})  # fmt: skip
    opts = engine_options(settings, record)
    assert opts.n_ctx == 4096  # manifest parameters beat the loader
    assert opts.threads == 3  # and the operator's [defaults]
    assert opts.n_batch == 512  # the operator's [defaults] beat what the scan derived
    assert opts.n_ubatch == 1024  # which still fills what the operator left unset
    assert opts.n_seq_max == 8  # the operator's per-model section beats everything
    assert opts.prefill_chunk == 512  # built-in, set by nobody else
    # the loader's n_ctx (the model's own context) caps n_ctx whatever set it
    assert engine_options(Settings(), StubRecord("x:1", loader={"n_ctx": 2048})).n_ctx == 2048
    assert engine_options(Settings(), StubRecord("x:1", loader={"n_ctx": 32768})).n_ctx == 8192
    big = Settings(models={"x:1": ModelSettings(n_ctx=65536)})
    assert engine_options(big, StubRecord("x:1", loader={"n_ctx": 32768})).n_ctx == 32768
    assert engine_options(Settings(), StubRecord("x:1", loader={"n_batch": 2048})).n_batch == 2048  # nobody set it


def test_worker_argv_and_slug():
    opts = ModelSettings(n_seq_max=2, n_ctx=1024, chat_template="chatml")
    argv = worker_argv(["python", "-m", "w"], "ipc:///r/a.sock", StubRecord("a:b", path=Path("/m.gguf")), opts)
    assert argv == ["python", "-m", "w", "--bind", "ipc:///r/a.sock", "--model-path", "/m.gguf", "--model-name", "a:b",
                    "--n-seq-max", "2", "--n-ctx", "1024", "--chat-template", "chatml"]  # fmt: skip
    fa = worker_argv(["w"], "ipc:///r/a.sock", StubRecord("a:b", path=Path("/m.gguf")), ModelSettings(flash_attn="off"))
    assert fa[-2:] == ["--flash-attn", "off"]
    assert engine_options(Settings(), StubRecord("x:1")).flash_attn == "auto"
    sw = worker_argv(["w"], "ipc:///r/a.sock", StubRecord("a:b", path=Path("/m.gguf")), ModelSettings(swa_full=True))
    assert sw[-2:] == ["--swa-full", "true"]
    kv = worker_argv(["w"], "ipc:///r/a.sock", StubRecord("a:b", path=Path("/m.gguf")), ModelSettings(kv_unified=False))
    assert kv[-2:] == ["--kv-unified", "false"]
    from barrel_inference.worker.__main__ import parse_args

    assert parse_args(["--bind", "x", "--model-name", "g", *kv[-2:]]).kv_unified is False
    assert parse_args(["--bind", "x", "--model-name", "g"]).kv_unified == "auto"  # by the model's KV size unless told
    auto = worker_argv(["w"], "ipc:///r/a.sock", StubRecord("a:b", path=Path("/m.gguf")), ModelSettings(kv_unified="auto"))
    assert auto[-2:] == ["--kv-unified", "auto"] and parse_args(["--bind", "x", "--model-name", "g", *auto[-2:]]).kv_unified == "auto"
    assert engine_options(Settings(defaults=ModelSettings(flash_attn="off")), StubRecord("x:1")).flash_attn == "off"
    kr = worker_argv(["w"], "ipc:///r/a.sock", StubRecord("a:b", path=Path("/m.gguf")), ModelSettings(kv_restore="complete"))
    assert kr[-2:] == ["--kv-restore", "complete"] and parse_args(["--bind", "x", "--model-name", "g", *kr[-2:]]).kv_restore == "complete"
    assert engine_options(Settings(), StubRecord("x:1")).kv_restore == "exact"  # bit for bit unless told
    assert parse_args(["--bind", "x", "--model-name", "g"]).kv_restore == "exact"
    assert slug("hf.co/org/Model-GGUF:Q4_K_M") == "hf.co-org-Model-GGUF-Q4_K_M"
    assert ipc_endpoint("/run/x", "gemma3:270m") == "ipc:///run/x/gemma3-270m.sock"
    long_a, long_b = ipc_endpoint("/run/x", "hf.co/" + "a" * 200 + ":q4"), ipc_endpoint("/run/x", "hf.co/" + "a" * 200 + ":q5")
    assert long_a != long_b and all(len(e) - len("ipc://") <= 100 and e.startswith("ipc:///run/x/hf.co-aaa") for e in (long_a, long_b))


# ---- processes ----------------------------------------------------------------------------


async def test_concurrent_gets_share_one_start(short_tmp):
    argv_file = short_tmp / "argv.txt"
    m, logs = manager(short_tmp, "--start-delay", "0.5", "--argv-file", str(argv_file))
    try:
        h1, h2, h3 = await asyncio.gather(m.get(MODEL), m.get("fake"), m.get(MODEL))
        assert h1 is h2 is h3
        assert len(argv_file.read_text().splitlines()) == 1
        assert f"ipc://{short_tmp}/run/fake-latest.sock" in argv_file.read_text()
        [info] = m.running()
        assert info.name == MODEL and info.pid == h1.process.pid and not info.remote
        text, done = await run(h1, chat("p1", "hello from a child"))
        assert text == "hello from a child" and done.finish_reason == FinishReason.STOP
        assert any(e.get("event") == "fake_worker_ready" and e.get("source") == "worker" for e in logs.events())
    finally:
        await m.aclose()


async def test_crash_fails_in_flight_and_next_get_restarts(short_tmp):
    m, logs = manager(short_tmp)
    try:
        h = await m.get(MODEL)
        first_pid = h.process.pid
        stalled = asyncio.create_task(run(h, chat("s1", "x STALL")))
        text, done = await run(h, chat("c1", "a b CRASH"))
        assert text == "a b"
        assert done.finish_reason == FinishReason.ERROR and done.error.code == ErrorCode.WORKER_UNAVAILABLE
        assert "exited with code 3" in done.error.message
        _, other = await asyncio.wait_for(stalled, 5)
        assert other.error.code == ErrorCode.WORKER_UNAVAILABLE
        died = logs.events("worker_died")
        assert len(died) == 1 and died[0]["model"] == MODEL
        assert m.running() == []
        h2 = await m.get(MODEL)
        assert h2 is not h and h2.process.pid != first_pid
        text, done = await run(h2, chat("c2", "back again"))
        assert text == "back again" and done.finish_reason == FinishReason.STOP
    finally:
        await m.aclose()


async def test_start_failure_is_worker_unavailable(short_tmp):
    m, logs = manager(short_tmp, "--fail-start", worker_restart_backoff=0.0)
    try:
        with pytest.raises(GatewayError) as info:
            await m.get(MODEL)
        assert info.value.code == ErrorCode.WORKER_UNAVAILABLE
        message = info.value.info.message
        assert "exited with code 2" in message and "cannot load model" in message
        # the worker's free output stays in the server log: it may hold other clients' data
        assert "secret" not in message and "req-other" not in message
        failed = logs.events("worker_start_failed")
        assert any("secret text of another client" in line for line in failed[0]["worker_output"])
        assert m.running() == []
        with pytest.raises(GatewayError) as info:  # unknown names stay 404s, not start failures
            await m.get("nope")
        assert info.value.code == ErrorCode.MODEL_NOT_FOUND
    finally:
        await m.aclose()


async def test_start_timeout_kills_the_process(short_tmp):
    pid_file = short_tmp / "pid"
    m, _ = manager(short_tmp, "--start-delay", "30", "--pid-file", str(pid_file), worker_start_timeout=1.0)
    try:
        with pytest.raises(GatewayError) as info:
            await m.get(MODEL)
        assert info.value.code == ErrorCode.WORKER_UNAVAILABLE and "within 1s" in info.value.info.message
        with pytest.raises(ProcessLookupError):  # stopped and reaped
            os.kill(int(pid_file.read_text()), 0)
    finally:
        await m.aclose()


async def test_unload_aborts_and_stops_the_process(short_tmp):
    m, logs = manager(short_tmp)
    try:
        h = await m.get(MODEL)
        proc = h.process
        stalled = asyncio.create_task(run(h, chat("u1", "a STALL")))
        await asyncio.sleep(0.2)
        assert await m.unload("fake") is True
        _, done = await asyncio.wait_for(stalled, 5)
        assert done.finish_reason == FinishReason.ABORT
        assert proc.returncode == 0  # SIGTERM, clean exit
        assert m.running() == []
        assert logs.events("worker_died") == []  # an unload is not a crash
        assert await m.unload(MODEL) is False
    finally:
        await m.aclose()


async def test_unload_kills_a_worker_that_ignores_sigterm(short_tmp):
    m, logs = manager(short_tmp, "--ignore-term")
    m.stop_timeout = 0.5
    try:
        h = await m.get(MODEL)
        assert await m.unload(MODEL)
        assert h.process.returncode == -9
        assert [e["model"] for e in logs.events("worker_kill")] == [MODEL]
    finally:
        await m.aclose()


async def test_aclose_stops_every_worker(short_tmp):
    m, _ = manager(short_tmp)
    h = await m.get(MODEL)
    await m.aclose()
    assert h.process.returncode is not None
    with pytest.raises(GatewayError):
        await m.get(MODEL)


async def test_real_worker_fake_engine(short_tmp):
    """The lead's worker (`python -m barrel_inference.worker --fake`) behind the manager."""
    m, _ = manager(short_tmp, "--fake", command=[sys.executable, "-m", "barrel_inference.worker"])
    try:
        h = await m.get(MODEL)
        assert h.hello.model == MODEL and h.hello.architecture == "fake"
        text, done = await run(h, chat("r1", "hi", max_tokens=9))
        assert text == "the quick" and done.finish_reason == FinishReason.LENGTH
        assert done.usage.completion_tokens == 9
        assert await m.unload(MODEL)
        assert h.process.returncode == 0
    finally:
        await m.aclose()


def test_manifest_gpu_and_mmap_parameters_reach_the_worker_command():
    record = StubRecord("g:1", path=Path("/m.gguf"), parameters={"n_gpu_layers": -1, "main_gpu": 1, "use_mmap": False, "use_mlock": True})
    opts = engine_options(Settings(), record)
    argv = worker_argv(["w"], "ipc:///r/g.sock", record, opts)
    for flag, value in (("--n-gpu-layers", "-1"), ("--main-gpu", "1"), ("--use-mmap", "false"), ("--use-mlock", "true")):
        assert argv[argv.index(flag) + 1] == value
    from barrel_inference.worker.__main__ import parse_args

    args = parse_args(["--bind", "x", "--model-name", "g", *argv[argv.index("--n-gpu-layers"):]])
    assert (args.n_gpu_layers, args.main_gpu, args.use_mmap, args.use_mlock) == (-1, 1, False, True)


async def test_a_worker_that_stops_answering_fails_its_requests_and_is_restarted(short_tmp):
    """No tick, reply or pong within the heartbeat timeout: typed error for what was in flight, the hung
    process is killed and a fresh worker started, without waiting for the next request."""
    settings = make_settings(short_tmp, None)
    logs = LogCapture(settings)
    m = ModelManager(settings, StubRegistry(StubRecord(MODEL)), logger=logs.logger, worker_command=FAKE_CMD, heartbeat=(0.1, 1.0))
    try:
        h = await m.get(MODEL)
        first = h.process
        text, done = await asyncio.wait_for(run(h, chat("f1", "a b FREEZE c")), 10)
        assert text == "a b"
        assert done.finish_reason == FinishReason.ERROR and done.error.code == ErrorCode.WORKER_UNAVAILABLE
        assert done.error.retryable and "stopped answering" in done.error.message
        for _ in range(200):
            if m.running() and m.running()[0].pid != first.pid:
                break
            await asyncio.sleep(0.05)
        assert first.returncode is not None  # the hung process was killed
        [info] = m.running()
        assert info.pid != first.pid
        h2 = await m.get(MODEL)
        text, done = await run(h2, chat("f2", "alive again"))
        assert text == "alive again" and done.finish_reason == FinishReason.STOP
        assert [e["model"] for e in logs.events("worker_restart")] == [MODEL]
    finally:
        await m.aclose()


def test_tool_flags_from_the_manifest_and_the_operators_hand(tmp_path):
    from barrel_inference.gateway.process import tool_argv

    record = StubRecord("q:1", loader={"tool_format": "qwen-xml", "thinking_start": "<think>", "thinking_end": "</think>"})
    settings = Settings(model_cache_dir=str(tmp_path), tool_call_formats={"angle": "my.mod"})
    argv = tool_argv(settings, record)
    flags = dict(zip(argv[::2], argv[1::2]))
    assert flags["--tool-format"] == "qwen-xml" and flags["--thinking-start"] == "<think>"
    assert flags["--tool-call-formats"] == '{"angle": "my.mod"}'
    assert flags["--tool-replay-path"] == str(tmp_path / "tool-replay" / "q-1.sqlite")
    assert flags["--tool-replay-ttl-ms"] == str(30 * 24 * 3600 * 1000)
    by_hand = Settings(model_cache_dir=str(tmp_path), tool_replay_dir=str(tmp_path / "r"),
                       models={"q:1": ModelSettings(tool_format="angle", thinking_start="<t>", thinking_end="</t>")})  # fmt: skip
    flags = dict(zip(*[iter(tool_argv(by_hand, record))] * 2))
    assert (flags["--tool-format"], flags["--thinking-start"], flags["--thinking-end"]) == ("angle", "<t>", "</t>")
    assert flags["--tool-replay-path"] == str(tmp_path / "r" / "q-1.sqlite")


def test_a_modelfile_template_goes_to_the_worker_unless_the_operator_set_a_chat_template(tmp_path):
    from dataclasses import dataclass

    from barrel_inference.gateway.process import template_argv, tool_settings

    @dataclass
    class Created(StubRecord):
        template: str | None = None
        template_format: str = ""

    go = "{{ range .Messages }}<tool_call>{{ .Content }}{{ end }}"
    settings = Settings(model_cache_dir=str(tmp_path))
    assert template_argv(settings, Created("m:1", template=go, template_format="go")) == ["--go-template", go]
    assert template_argv(settings, Created("m:1", template=go)) == []  # a pulled model's template: shown, not rendered
    assert tool_settings(settings, Created("m:1", template=go, template_format="go"))["tool_format"] == "qwen-xml"
    mine = Settings(model_cache_dir=str(tmp_path), models={"m:1": ModelSettings(chat_template="chatml")})
    assert template_argv(mine, Created("m:1", template=go, template_format="go")) == []  # the operator's wins
