"""Gateway overhead, measured apart from the model (issue 4 item 3).

A worker with the fake engine (`python -m barrel_inference.worker --fake`) emits tokens as fast
as asked. The same workloads run twice against it:
  direct  - a protocol client: a ZeroMQ DEALER speaking barrel_inference.protocol to the worker
  gateway - the HTTP client of bench.client through our gateway (hypercorn + SSE + ZeroMQ hop),
            the gateway pointed at the worker by the model's `endpoint` setting
Figures: streamed tokens/s and requests/s at 64 concurrent streams, and the latency the gateway
adds per request (round trip of a 1-token request) and per token (service time at saturation).
"""

from __future__ import annotations

import asyncio
import itertools
import sys
import time
from pathlib import Path

import zmq
import zmq.asyncio

from barrel_inference.protocol import Connect, GatewayCodec, Hello, Sampling, Submit, Tick

from .client import LoadClient, RequestSpec, StreamResult, percentile, summarize
from .procs import cpu_seconds, peak_rss, process_tree
from .systems import Server, free_port

FAKE_MODEL = "fake:latest"


class DirectClient:
    """A minimal gateway-side protocol client: one DEALER, per-request results keyed by id."""

    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint
        self.codec = GatewayCodec()
        self.ctx = zmq.asyncio.Context()
        self.sock = None
        self.hello: Hello | None = None
        self._pending: dict[str, tuple[StreamResult, asyncio.Future]] = {}
        self._ids = itertools.count()
        self._recv_task: asyncio.Task | None = None

    async def __aenter__(self) -> "DirectClient":
        self.sock = self.ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.SNDHWM, 0)
        self.sock.setsockopt(zmq.RCVHWM, 0)
        self.sock.connect(self.endpoint)
        await self.sock.send(self.codec.encode(Connect(client="bench-direct")))
        deadline = time.monotonic() + 60
        while self.hello is None:
            if time.monotonic() > deadline:
                raise RuntimeError(f"no Hello from {self.endpoint}")
            if await self.sock.poll(1000):
                msg = self.codec.decode(await self.sock.recv())
                if isinstance(msg, Hello):
                    self.hello = msg
            else:
                await self.sock.send(self.codec.encode(Connect(client="bench-direct")))
        self._recv_task = asyncio.create_task(self._recv_loop())
        return self

    async def __aexit__(self, *exc) -> None:
        if self._recv_task:
            self._recv_task.cancel()
            await asyncio.gather(self._recv_task, return_exceptions=True)
        self.sock.close(0)
        self.ctx.term()

    async def _recv_loop(self) -> None:
        while True:
            body = await self.sock.recv()
            now = time.perf_counter()
            msg = self.codec.decode(body)
            if not isinstance(msg, Tick):
                continue
            for d in msg.deltas:
                entry = self._pending.get(d.id)
                if entry is None or (not d.n_tokens and not d.text):
                    continue
                res = entry[0]
                res.n_chunks += 1
                res.chunk_times.append(now)
                if res.t_first is None:
                    res.t_first = now
            for done in msg.done:
                entry = self._pending.pop(done.id, None)
                if entry is None:
                    continue
                res, fut = entry
                res.usage_tokens = done.usage.completion_tokens
                res.prompt_tokens = done.usage.prompt_tokens
                res.finish_reason = done.finish_reason.value
                if done.error is not None:
                    res.error = f"{done.error.code.value}: {done.error.message}"
                res.t_end = now
                res.ok = res.error is None and res.t_first is not None
                if not fut.done():
                    fut.set_result(res)

    async def stream(self, spec: RequestSpec, *, on_chunk=None) -> StreamResult:
        rid = f"b{next(self._ids)}"
        res = StreamResult(t_start=time.perf_counter())
        fut = asyncio.get_running_loop().create_future()
        self._pending[rid] = (res, fut)
        submit = Submit(
            id=rid, prompt=spec.prompt, max_tokens=spec.max_tokens,
            sampling=Sampling(temperature=spec.temperature, seed=spec.seed, logit_bias={t: -100.0 for t in spec.suppress}),
        )  # fmt: skip
        await self.sock.send(self.codec.encode(submit))
        return await fut


def fake_worker(endpoint: str, work: Path, *, tps: float, n_seq_max: int) -> Server:
    argv = [
        sys.executable, "-m", "barrel_inference.worker", "--fake", "--fake-tps", str(tps),
        "--bind", endpoint, "--model-name", FAKE_MODEL, "--n-seq-max", str(n_seq_max), "--n-ctx", "4096", "--insecure",
    ]  # fmt: skip
    return Server(name="fake-worker", argv=argv, base_url="", model_id=FAKE_MODEL, ready_path="",
                  log_path=work / "fake-worker.log")  # fmt: skip


def gateway_for(endpoint: str, cache_dir: Path, work: Path, n_seq_max: int) -> Server:
    port = free_port()
    run_dir = work / "run-fake"
    run_dir.mkdir(parents=True, exist_ok=True)
    config = work / "gateway-fake.toml"
    config.write_text(
        "\n".join([
            'host = "127.0.0.1"', f"port = {port}", f'model_cache_dir = "{cache_dir}"', f'runtime_dir = "{run_dir}"',
            f'default_model = "{FAKE_MODEL}"', "embed_default_model = false", 'log_level = "warning"', "max_queue = 4096",
            "", f'[models."{FAKE_MODEL}"]', f'endpoint = "{endpoint}"', "insecure = true", f"n_seq_max = {n_seq_max}", "",
        ])
    )  # fmt: skip
    return Server(
        name="gateway", argv=[sys.executable, "-m", "barrel_inference.cli", "serve", "--config", str(config)],
        base_url=f"http://127.0.0.1:{port}", model_id=FAKE_MODEL, ready_path="/health", log_path=work / "gateway-fake.log",
        env={"BARREL_INFERENCE_CONFIG": str(config)},
    )  # fmt: skip


async def _streams(client, n: int, tokens: int, rounds: int) -> dict:
    results, wall = [], 0.0
    for r in range(rounds):
        specs = [RequestSpec(prompt=f"stream {r}-{i} hello", max_tokens=tokens) for i in range(n)]
        t0 = time.perf_counter()
        results.extend(await asyncio.gather(*(client.stream(s) for s in specs)))
        wall += time.perf_counter() - t0
    return summarize(results, wall)


async def _closed_loop(client, workers: int, seconds: float, tokens: int) -> dict:
    """`workers` loops each sending `tokens`-token requests back to back for `seconds`."""
    done: list[StreamResult] = []
    stop_at = time.perf_counter() + seconds

    async def loop(w: int) -> None:
        k = 0
        while time.perf_counter() < stop_at:
            done.append(await client.stream(RequestSpec(prompt=f"req {w}-{k}", max_tokens=tokens)))
            k += 1

    t0 = time.perf_counter()
    await asyncio.gather(*(loop(w) for w in range(workers)))
    wall = time.perf_counter() - t0
    ok = [r for r in done if r.ok]
    lat = [(r.t_end - r.t_start) * 1000.0 for r in ok]
    return {
        "requests": len(done), "ok": len(ok), "wall_s": wall, "req_s": len(ok) / wall,
        "latency_ms_p50": percentile(lat, 50), "latency_ms_p95": percentile(lat, 95),
        "errors": sorted({r.error for r in done if r.error})[:3],
    }  # fmt: skip


async def _sequential_rtt(client, n: int) -> dict:
    """n one-token requests one after another: request round trip (ms)."""
    lat = []
    for k in range(n):
        r = await client.stream(RequestSpec(prompt=f"ping {k}", max_tokens=1))
        if r.ok:
            lat.append((r.t_end - r.t_start) * 1000.0)
    return {"requests": n, "ok": len(lat), "rtt_ms_p50": percentile(lat, 50), "rtt_ms_p95": percentile(lat, 95)}


async def _measure(client, pids: set[int], *, streams: int, tokens: int, rounds: int, seconds: float, rtt_n: int) -> dict:
    import os

    out = {}
    own = os.getpid()
    for key, coro_fn in (
        ("stream64", lambda: _streams(client, streams, tokens, rounds)),
        ("stream1", lambda: _streams(client, 1, tokens, 3)),
        ("requests64", lambda: _closed_loop(client, streams, seconds, 1)),
        ("rtt1", lambda: _sequential_rtt(client, rtt_n)),
    ):
        c0 = cpu_seconds(pids | {own})
        t0 = time.perf_counter()
        fig = await coro_fn()
        dt = time.perf_counter() - t0
        c1 = cpu_seconds(pids | {own})
        fig["cpu_share"] = {("client" if p == own else str(p)): round((c1[p] - c0.get(p, 0.0)) / dt, 3) for p in c1}
        out[key] = fig
    return out


async def run_overhead(cache_dir: Path, work: Path, *, quick: bool, log=print) -> dict:
    """Start a fake worker (unthrottled), measure direct, then through a gateway; stop both."""
    streams, tokens = 64, 128
    rounds = 2 if quick else 5
    seconds = 3.0 if quick else 8.0
    rtt_n = 100 if quick else 300
    port = free_port()
    endpoint = f"tcp://127.0.0.1:{port}"
    worker = fake_worker(endpoint, work, tps=0.0, n_seq_max=streams)
    worker.start()
    result: dict = {"streams": streams, "tokens_per_stream": tokens, "fake_tps": 0.0}
    try:
        async with DirectClient(endpoint) as direct:
            log(f"  fake worker up (pid {worker.proc.pid}); direct protocol client ...")
            result["direct"] = await _measure(direct, worker.pids(), streams=streams, tokens=tokens, rounds=rounds,
                                              seconds=seconds, rtt_n=rtt_n)  # fmt: skip
        gw = gateway_for(endpoint, cache_dir, work, streams)
        gw.start()
        try:
            await gw.wait_ready(120)
            async with LoadClient(gw.base_url, FAKE_MODEL) as client:
                warm = await client.stream(RequestSpec(prompt="warm up", max_tokens=4))
                if not warm.ok:
                    raise RuntimeError(f"gateway warm-up failed: {warm.error}")
                log(f"  gateway up (pid {gw.proc.pid}); HTTP client through the gateway ...")
                result["gateway"] = await _measure(client, gw.pids() | worker.pids(), streams=streams, tokens=tokens,
                                                   rounds=rounds, seconds=seconds, rtt_n=rtt_n)  # fmt: skip
            result["gateway_rss"] = gw.sample_rss()
        finally:
            gw.stop()
        result["worker_rss"] = worker.sample_rss()
    finally:
        worker.stop()
    result["paced"] = []
    for tps in (100.0, 400.0) if quick else (50.0, 100.0, 200.0, 400.0, 800.0):
        result["paced"].append(await _paced(cache_dir, work, tps=tps, streams=streams, tokens=tokens, log=log))
    per_token = [p for p in result["paced"] if p.get("gateway") and (p["gateway"].get("tokens_per_chunk") or 99) <= 1.2]
    d, g = result["direct"], result["gateway"]
    result["derived"] = {
        # the highest rate the gateway streamed with (about) one token per SSE event
        "gateway_tok_s_64_one_per_chunk": max((p["gateway"]["tok_s"] for p in per_token), default=None),
        "gateway_tok_s_64": g["stream64"]["tok_s"],
        "gateway_req_s_64": g["requests64"]["req_s"],
        "direct_tok_s_64": d["stream64"]["tok_s"],
        "direct_req_s_64": d["requests64"]["req_s"],
        "added_ms_per_request": _sub(g["rtt1"]["rtt_ms_p50"], d["rtt1"]["rtt_ms_p50"]),
        "added_us_per_token_64": _sub(_inv_us(g["stream64"]["tok_s"]), _inv_us(d["stream64"]["tok_s"])),
        "added_us_per_token_1": _sub(_inv_us(g["stream1"]["tok_s"]), _inv_us(d["stream1"]["tok_s"])),
    }
    return result


def _inv_us(tok_s: float | None) -> float | None:
    return 1e6 / tok_s if tok_s else None


def _sub(a, b):
    return None if a is None or b is None else a - b


async def _paced(cache_dir: Path, work: Path, *, tps: float, streams: int, tokens: int, log=print) -> dict:
    """A fake worker ticking `tps` times a second (one token per stream per tick): offered load
    streams*tps tokens/s. Measured direct, then through a fresh gateway (one SSE event per token
    while the gateway keeps up; merged events once it falls behind)."""
    port = free_port()
    endpoint = f"tcp://127.0.0.1:{port}"
    worker = fake_worker(endpoint, work, tps=tps, n_seq_max=streams)
    worker.start()
    out: dict = {"tps": tps, "offered_tok_s": tps * streams}
    try:
        async with DirectClient(endpoint) as direct:
            out["direct"] = await _streams(direct, streams, tokens, 1)
        gw = gateway_for(endpoint, cache_dir, work, streams)
        gw.start()
        try:
            await gw.wait_ready(120)
            async with LoadClient(gw.base_url, FAKE_MODEL) as client:
                await client.stream(RequestSpec(prompt="warm up", max_tokens=4))
                out["gateway"] = await _streams(client, streams, tokens, 1)
        finally:
            gw.stop()
    finally:
        worker.stop()
    d, g = out["direct"], out["gateway"]
    f = lambda v, spec="{:.1f}": "–" if v is None else spec.format(v)  # noqa: E731
    log(f"  paced {tps:5.0f} ticks/s (offered {out['offered_tok_s']:6.0f} tok/s): direct {d['tok_s']:7.0f} tok/s "
        f"ITL p50/p95 {f(d['itl_ms_p50'])}/{f(d['itl_ms_p95'])} ms | gateway {g['tok_s']:7.0f} tok/s "
        f"ITL p50/p95 {f(g['itl_ms_p50'])}/{f(g['itl_ms_p95'])} ms, {f(g['tokens_per_chunk'], '{:.2f}')} tok/event")  # fmt: skip
    return out
