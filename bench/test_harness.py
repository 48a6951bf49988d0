"""Checks of the harness's own arithmetic and SSE parsing (collected with the test suite: `bench` is in testpaths)."""

from __future__ import annotations

import asyncio
import json

import pytest
from aiohttp import web

from bench.__main__ import merge_passes
from bench.client import LoadClient, RequestSpec, StreamResult, percentile, summarize
from bench.report import profile_delta, ratios
from bench.workloads import _stall


def test_percentile_interpolates():
    assert percentile([], 50) is None
    assert percentile([7.0], 95) == 7.0
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == pytest.approx(2.5)
    assert percentile([0.0, 10.0], 95) == pytest.approx(9.5)


def test_stall_counts_only_streams_running_across_the_window():
    running = StreamResult(chunk_times=[0.0, 0.1, 0.2, 0.9, 1.0])  # a 0.7 s gap overlaps [0.25, 0.8]
    finished = StreamResult(chunk_times=[0.0, 0.05])  # ended before the window
    late = StreamResult(chunk_times=[0.5, 0.6])  # started inside the window
    worst, n = _stall([running, finished, late], 0.25, 0.8)
    assert n == 1
    assert worst == pytest.approx(0.7)


def test_summarize_prefers_usage_and_measures_gaps():
    a = StreamResult(ok=True, t_start=0.0, t_first=0.1, chunk_times=[0.1, 0.2, 0.4], n_chunks=3, usage_tokens=3)
    b = StreamResult(ok=True, t_start=0.0, t_first=0.3, chunk_times=[0.3, 0.5], n_chunks=2)
    s = summarize([a, b], wall=1.0)
    assert s["tokens"] == 5 and s["tok_s"] == 5.0
    assert s["ttft_ms_p50"] == pytest.approx(200.0)
    assert s["itl_ms_max"] == pytest.approx(200.0)
    assert s["tokens_from_usage"] is False


def test_profile_delta_subtracts_cumulative_snapshots():
    before = {"profile": {"ticks": 10, "batch_tokens": 20, "seconds": {"decode": 1.0, "sample": 0.1}}}
    after = {"profile": {"ticks": 20, "batch_tokens": 60, "seconds": {"decode": 2.0, "sample": 0.3}}}
    d = profile_delta(before, after)
    assert d["ticks"] == 10 and d["mean_batch"] == 4.0
    assert d["ms_per_tick"]["decode"] == pytest.approx(100.0)
    assert d["share"]["sample"] == pytest.approx(0.2 / 1.2)
    assert profile_delta(after, after) is None


def test_merge_passes_takes_medians_and_ratios_pair_passes():
    ours = [{"concurrency": {"4": {"tok_s": v, "ttft_ms_p50": 100.0}}} for v in (100.0, 130.0, 110.0)]
    peer = [{"concurrency": {"4": {"tok_s": v, "ttft_ms_p50": 50.0}}} for v in (100.0, 100.0, 100.0)]
    merged = merge_passes(ours)
    assert merged["concurrency"]["4"]["tok_s"] == 110.0
    assert merged["concurrency"]["4"]["passes_tok_s"] == [100.0, 130.0, 110.0]
    r = ratios({"systems": {"ours": merged, "llama-server": merge_passes(peer)}})
    assert r["llama-server"]["tok_s"]["4"] == pytest.approx(1.1)
    assert r["llama-server"]["tok_s_paired_passes"]["4"] == pytest.approx([1.0, 1.3, 1.1])
    assert r["llama-server"]["ttft_p50_speedup"]["4"] == pytest.approx(0.5)


async def serve(handler, *paths: str) -> tuple[web.AppRunner, str]:
    """A local aiohttp server answering POST on `paths` with `handler`: its runner and base URL."""
    app = web.Application()
    for path in paths:
        app.router.add_post(path, handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"


async def _sse_server(chunks: list[dict]):
    async def handler(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        assert body["logit_bias"] == {"1": -100, "106": -100} and body["stream"] is True
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for c in chunks:
            await resp.write(f"data: {json.dumps(c)}\n\n".encode())
            await asyncio.sleep(0.01)
        await resp.write(b"data: [DONE]\n\n")
        return resp

    return await serve(handler, "/v1/completions", "/v1/chat/completions")


async def test_client_parses_completion_stream_with_usage():
    chunks = [{"choices": [{"text": t, "finish_reason": None}]} for t in ("a", "b", "c")]
    chunks.append({"choices": [{"text": "", "finish_reason": "length"}]})
    chunks.append({"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 4}})
    runner, url = await _sse_server(chunks)
    try:
        async with LoadClient(url, "m") as c:
            r = await c.stream(RequestSpec(prompt="x", max_tokens=4))
    finally:
        await runner.cleanup()
    assert r.ok and r.text == "abc" and r.n_chunks == 3
    assert r.n_tokens == 4 and r.prompt_tokens == 7 and r.finish_reason == "length"
    assert r.t_start < r.t_first <= r.chunk_times[-1] <= r.t_end
    assert len(r.gaps()) == 2 and all(g > 0 for g in r.gaps())


async def test_client_counts_chat_chunks_without_usage():
    chunks = [{"choices": [{"delta": {"role": "assistant"}}]}]
    chunks += [{"choices": [{"delta": {"content": t}}]} for t in ("hi", " there")]
    runner, url = await _sse_server(chunks)
    try:
        async with LoadClient(url, "m") as c:
            r = await c.stream(RequestSpec(messages=[{"role": "user", "content": "x"}]))
    finally:
        await runner.cleanup()
    assert r.ok and r.text == "hi there"
    assert r.usage_tokens is None and r.n_tokens == 2


def test_ratios_split_the_gateway_cost_from_the_worker():
    fig = lambda v: {"concurrency": {"8": {"tok_s": v, "ttft_ms_p50": 100.0}}}  # noqa: E731
    r = ratios({"systems": {"ours": fig(90.0), "ours-worker": fig(100.0), "llama-server": fig(95.0)}})
    assert r["llama-server"]["tok_s"]["8"] == pytest.approx(90 / 95)
    assert r["ours-worker / llama-server"]["tok_s"]["8"] == pytest.approx(100 / 95)
    assert r["ours / ours-worker"]["tok_s"]["8"] == pytest.approx(0.9)
    assert "ours-worker / llama-server" not in ratios({"systems": {"ours-worker": fig(1.0), "llama-server": {"error": "x"}}})


def test_cpu_profiles_reports_a_crash_by_its_signal_and_reads_a_run(tmp_path):
    from bench.cpu_profiles import run_one

    crash = tmp_path / "crash"
    crash.write_text("#!/bin/sh\nkill -SEGV $$\n")
    ok = tmp_path / "ok"
    ok.write_text('#!/bin/sh\necho "llama.cpp noise"\necho "{\\"decode_tok_s\\": 40.5, \\"lib\\": \\"$LLAMA_CPP_LIB_PATH\\"}"\n')
    failing = tmp_path / "failing"
    failing.write_text("#!/bin/sh\necho 'ImportError: no llama_cpp' >&2\nexit 1\n")
    for f in (crash, ok, failing):
        f.chmod(0o755)
    assert run_one(str(crash), "m.gguf", True, 2, 30) == {"error": "crash (signal 11, SIGSEGV)"}
    assert run_one(str(ok), "m.gguf", False, 2, 30, {"LLAMA_CPP_LIB_PATH": "/opt/x"}) == {"decode_tok_s": 40.5, "lib": "/opt/x"}
    assert run_one(str(failing), "m.gguf", False, 2, 30) == {"error": "exit 1: ImportError: no llama_cpp"}


def test_gpu_layers_reach_every_system_and_only_when_asked(tmp_path):
    from pathlib import Path

    from bench import systems

    cpu = systems.Shape(model_path=Path("/m.gguf"))
    gpu = systems.Shape(model_path=Path("/m.gguf"), n_gpu_layers=-1)
    systems.ours(cpu, "m", tmp_path / "c", tmp_path / "a")
    assert "n_gpu_layers" not in (tmp_path / "a" / "ours.toml").read_text()
    systems.ours(gpu, "m", tmp_path / "c", tmp_path / "b")
    assert "n_gpu_layers = -1" in (tmp_path / "b" / "ours.toml").read_text()
    assert "-ngl" not in systems.llama_server(cpu, Path("/bin/llama-server"), tmp_path).argv
    argv = systems.llama_server(gpu, Path("/bin/llama-server"), tmp_path).argv
    assert argv[argv.index("-ngl") + 1] == "999"  # all layers: a count above any model's
    argv = systems.worker_alone(systems.Shape(model_path=Path("/m.gguf"), n_gpu_layers=12), "m", "tcp://127.0.0.1:1", tmp_path).argv
    assert argv[argv.index("--n-gpu-layers") + 1] == "12"


def test_run_options_parse():
    from bench.__main__ import parse_args

    a = parse_args(["run"])
    assert a.suppress == (1, 106) and a.n_gpu_layers is None and a.llama_server is None and a.level_timeout == 0.0
    a = parse_args(["run", "--suppress", "113,115", "--n-gpu-layers", "-1", "--llama-server", "/x/llama-server", "--level-timeout", "30"])
    assert a.suppress == (113, 115) and a.n_gpu_layers == -1 and a.llama_server == "/x/llama-server" and a.level_timeout == 30.0


async def test_levels_apply_the_suppress_ids_and_stop_at_a_level_past_its_time_box(tmp_path):
    from pathlib import Path

    from bench import systems
    from bench.__main__ import _levels, parse_args

    seen = []

    async def handler(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        seen.append(body["logit_bias"])
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for _ in range(body["max_tokens"]):
            await resp.write(f"data: {json.dumps({'choices': [{'text': 'a'}]})}\n\n".encode())
            await asyncio.sleep(0.05)
        await resp.write(b"data: [DONE]\n\n")
        return resp

    runner, url = await serve(handler, "/v1/completions")
    # 1 stream of 4 tokens fits in the box (~0.2 s); 2 streams of 40 tokens (~2 s) do not, so 8 is never run
    args = parse_args(["run", "--concurrency", "1", "--max-tokens", "4", "--rounds", "1", "--suppress", "113,115",
                       "--level-timeout", "1.5"])  # fmt: skip
    server = systems.Server(name="fake", argv=[], base_url=url, model_id="m", ready_path="/", log_path=tmp_path / "l")
    try:
        async with LoadClient(url, "m") as client:
            first = await _levels(client, server, args)
            args.max_tokens, args.concurrency = 40, [2, 8]
            second = await _levels(client, server, args)
    finally:
        await runner.cleanup()
    assert first["1"]["ok"] == 1 and first["1"]["tokens"] == 4 and "error" not in first["1"]
    assert "timed out" in second["2"]["error"] and "8" not in second
    assert seen and all(b == {"113": -100, "115": -100} for b in seen)


def test_kv_long_prompt_workload_gets_a_server_with_a_slot_for_every_request(monkeypatch):
    """(d) needs 3 retained + 4 streams + the long prompt: with fewer slots the long prompt would
    wait for a stream to end, and the figure would measure decode speed instead of prefill."""
    import asyncio as aio

    from bench import kv, systems

    args = kv.parse_args(["--workloads", "a,d", "--parallel", "4"])
    assert args.d_parallel == 8
    assert kv.parse_args(["--d-parallel", "12"]).d_parallel == 12
    started: list[tuple[int, list[str]]] = []

    async def fake_workloads(server, _args, _count, _system, which, out):
        started.append((server.parallel, list(which)))

    monkeypatch.setattr(kv, "_workloads", fake_workloads)
    shape = systems.Shape(model_path="m.gguf", parallel=4)
    aio.run(kv.measure("llama-server", lambda sh: sh, shape, args, None, "", None))
    assert started == [(4, ["a"]), (8, ["d"])]
    started.clear()
    args = kv.parse_args(["--workloads", "a,d", "--parallel", "8"])
    aio.run(kv.measure("llama-server", lambda sh: sh, systems.Shape(model_path="m.gguf", parallel=8), args, None, "", None))
    assert started == [(8, ["a", "d"])]


async def test_kv_agents_run_their_conversations_at_once_each_with_its_session():
    """(e): every conversation is in flight together, turn after turn, each under its own session id."""
    from bench import kv

    live, peak, sessions = [0], [0], {}

    async def handler(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        sid = request.headers["x-session-id"]
        sessions[sid] = sessions.get(sid, 0) + 1
        assert sum(m["role"] == "user" for m in body["messages"]) == sessions[sid]  # the conversation grows
        live[0] += 1
        peak[0] = max(peak[0], live[0])
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for _ in range(3):
            await resp.write(f"data: {json.dumps({'choices': [{'delta': {'content': 'a'}}]})}\n\n".encode())
            await asyncio.sleep(0.02)
        usage = {"completion_tokens": 3, "prompt_tokens": 10}
        await resp.write(f"data: {json.dumps({'choices': [], 'usage': usage})}\n\ndata: [DONE]\n\n".encode())
        live[0] -= 1
        return resp

    runner, url = await serve(handler, "/v1/chat/completions")
    try:
        async with LoadClient(url, "m") as client:
            fig = await kv.agents(client, "system", n_conv=4, turns=3, max_tokens=3)
    finally:
        await runner.cleanup()
    assert sessions == {f"agent-{k}": 3 for k in range(4)}
    assert peak[0] == 4
    assert fig["conversations"] == 4 and fig["tokens"] == 4 * 3 * 3 and fig["tok_s"] > 0
    assert fig["ttft_ms_later_p50"] is not None


def test_the_kv_layout_reaches_both_systems_only_when_asked(tmp_path):
    from pathlib import Path

    from bench import systems

    for value, ours_line, flag in ((None, None, None), (True, "kv_unified = true", "--kv-unified"),
                                   (False, "kv_unified = false", "--no-kv-unified")):  # fmt: skip
        shape = systems.Shape(model_path=Path("/m.gguf"), kv_unified=value)
        systems.ours(shape, "m", tmp_path / "c", tmp_path / str(value))
        text = (tmp_path / str(value) / "ours.toml").read_text()
        argv = systems.llama_server(shape, Path("/bin/llama-server"), tmp_path).argv
        if value is None:
            assert "kv_unified" not in text and not any("kv-unified" in a for a in argv)
        else:
            assert ours_line in text and flag in argv
    assert systems.truth(None) is None and systems.truth("true") is True and systems.truth("false") is False


async def test_kv_long_prompt_workload_takes_the_median_of_its_repeats(monkeypatch):
    """(d) with --d-repeats 3: three different long prompts, one after another, while the same four
    streams run (long enough for all three: 256 tokens per repeat); the figure is their median."""
    from bench import kv

    real_sleep = asyncio.sleep
    monkeypatch.setattr(asyncio, "sleep", lambda s: real_sleep(0))
    ttfts = iter([4.0, 2.0, 3.0])
    specs: list[RequestSpec] = []

    class Client:
        async def stream(self, spec, on_chunk=None):
            specs.append(spec)
            if spec.messages is not None:  # a retained conversation's turn
                return StreamResult(ok=True, text="ok", t_start=0.0, t_first=0.1, t_end=0.2)
            if spec.max_tokens != 8:  # a background stream: a chunk every 0.1 s from t=0 to 100
                on_chunk(None, 0.0)
                times = [0.1 * i for i in range(1001)]
                return StreamResult(ok=True, t_start=0.0, t_first=0.0, t_end=100.0, chunk_times=times)
            t0 = 10.0 * len([s for s in specs if s.max_tokens == 8])
            return StreamResult(ok=True, t_start=t0, t_first=t0 + next(ttfts), t_end=t0 + 5, prompt_tokens=2000)

    out = await kv.long_prompt_with_retained(Client(), lambda text: len(text.split()), long_tokens=50, repeats=3)
    long_specs = [s for s in specs if s.messages is None and s.max_tokens == 8]
    background = [s for s in specs if s.messages is None and s.max_tokens != 8]
    assert len({s.prompt for s in long_specs}) == 3
    assert len(background) == kv.D_STREAMS and all(s.max_tokens == 3 * 256 for s in background)
    assert out["long_ttft_ms_each"] == [4000.0, 2000.0, 3000.0]
    assert out["long_ttft_ms"] == 3000.0
