"""Soak: many concurrent streams for a while, with random client disconnects, worker kills and
malformed requests mixed in. Prints how every request ended, by kind, and the daemon's own counts.

    python -m bench.soak [--duration 300] [--streams 64] [--model tiny|gemma] [--kill-every 20]

It starts its own daemon (`bictl serve`, a temporary cache and runtime dir, 127.0.0.1 only) on the
tiny generated GGUF (fast, nonsense text) or the packaged Gemma 3 270M. What it checks, as figures:
each request ends (done, an error event, an HTTP status, our own disconnect) and none hangs; a
malformed request never gets a 5xx; the daemon survives; the worker comes back after each kill.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

from .build import packaged_gemma
from .procs import stop_group

REPO = Path(__file__).resolve().parent.parent
REQUEST_LIMIT_S = 120.0  # a request still open after this long counts as hung


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def model_file(kind: str, root: Path) -> Path:
    if kind == "gemma":
        return packaged_gemma()
    sys.path.insert(0, str(REPO / "tests"))
    from tinymodel import write_tiny_gguf

    return write_tiny_gguf(root / "tiny.gguf")


class Daemon:
    def __init__(self, root: Path, gguf: Path, n_seq_max: int, threads: int) -> None:
        from barrel_inference.config import load_settings
        from barrel_inference.registry import Registry

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = root / "config.toml"
        config.write_text(
            f'host = "127.0.0.1"\nport = {self.port}\nmodel_cache_dir = "{root / "models"}"\nruntime_dir = "{root / "run"}"\n'
            f"embed_default_model = false\nworker_start_timeout = 120.0\n"
            f"[defaults]\nn_seq_max = {n_seq_max}\nn_ctx = 1024\nthreads = {threads}\nprefill_chunk = 128\n"
        )
        Registry(load_settings(config, env={})).register_local("soak", gguf)
        env = {k: v for k, v in os.environ.items() if not k.startswith("BARREL_INFERENCE_")}
        env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
        self.log = open(root / "daemon.log", "w")
        self.proc = subprocess.Popen([sys.executable, "-m", "barrel_inference.cli", "serve", "--config", str(config)],
                                     stdout=self.log, stderr=subprocess.STDOUT, env=env, start_new_session=True)  # fmt: skip

    def workers(self) -> list[int]:
        out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(self.proc.pid)], capture_output=True, text=True)
        return [int(p) for p in out.stdout.split()]

    def stop(self) -> None:
        stop_group(self.proc, 20)
        self.log.close()


def malformed_requests(model: str) -> list[tuple[str, dict, bytes]]:
    """(name, headers, body) for /v1/chat/completions: each must get a 4xx, quickly."""
    chat = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    j = {"content-type": "application/json"}

    def body(extra: dict) -> bytes:
        return json.dumps({**chat, **extra}).encode()

    return [
        ("grammar_bomb", j, body({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "string", "maxLength": 20000}}}})),
        ("enum_bomb", j, body({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"enum": [f"v{i}" for i in range(20000)]}}}})),
        ("huge_int", j, body({"max_tokens": 2**64})),
        ("huge_seed", j, body({"seed": 2**64})),
        ("deep_nesting", j, b'{"model": "%s", "messages": [{"role": "user", "content": "x"}], "tools": [{"a": %s}]}' % (model.encode(), b"[" * 10000 + b"]" * 10000)),
        ("not_json", j, b"{this is not json"),
        ("text_plain", {"content-type": "text/plain"}, body({})),
        ("evil_origin", {**j, "origin": "http://evil.example"}, body({})),
        ("rebound_host", {**j, "host": "evil.example"}, body({})),
        ("huge_prompt", j, body({"messages": [{"role": "user", "content": "word " * 400_000}]})),
        ("bad_role", j, body({"messages": [{"role": "wizard", "content": "x"}]})),
        ("unknown_model", j, body({"model": "no-such-model"})),
    ]  # fmt: skip


class Soak:
    def __init__(self, args, url: str, daemon: Daemon) -> None:
        self.args = args
        self.url = url
        self.daemon = daemon
        self.rng = random.Random(args.seed)
        self.deadline = 0.0
        self.outcomes: collections.Counter[str] = collections.Counter()
        self.malformed: collections.Counter[str] = collections.Counter()
        self.malformed_5xx: list[str] = []
        self.ttft: list[float] = []
        self.tokens = 0
        self.kills: list[float] = []
        self.ok_times: list[float] = []
        self.hung = 0
        self.started = 0
        self.ended = 0
        self.bad = malformed_requests(args.model_name)

    async def stream_once(self, session: aiohttp.ClientSession) -> str:
        body = {"model": self.args.model_name, "messages": [{"role": "user", "content": f"Tell me about the sea, part {self.rng.randint(1, 1000)}."}],
                "max_tokens": self.args.max_tokens, "stream": True, "temperature": 0.7}  # fmt: skip
        disconnect_after = self.rng.randint(1, self.args.max_tokens) if self.rng.random() < self.args.disconnect_rate else None
        t0 = time.perf_counter()
        chunks = 0
        async with session.post(self.url + "/v1/chat/completions", json=body) as resp:
            if resp.status != 200:
                await resp.read()
                return f"http_{resp.status}"
            async for raw in resp.content:
                line = raw.decode(errors="replace").strip()
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    self.ok_times.append(time.monotonic())
                    return "done"
                event = json.loads(data)
                if "error" in event:
                    return "error_event:" + str(event["error"].get("code"))
                if chunks == 0:
                    self.ttft.append(time.perf_counter() - t0)
                chunks += 1
                self.tokens += 1
                if disconnect_after is not None and chunks >= disconnect_after:
                    return "client_disconnect"  # leaving the `async with` closes the connection mid-stream
        return "eof_without_done"

    async def malformed_once(self, session: aiohttp.ClientSession) -> str:
        name, headers, body = self.rng.choice(self.bad)
        async with session.post(self.url + "/v1/chat/completions", data=body, headers=headers) as resp:
            raw = await resp.read()
            code = ""
            if resp.status >= 500:
                try:
                    code = json.loads(raw)["error"]["code"]
                except (ValueError, KeyError, TypeError):
                    code = "?"
            self.malformed[f"{name}:{resp.status}{':' + code if code else ''}"] += 1
            if resp.status >= 500 and code != "worker_unavailable":  # a worker killed under it is not the input's fault
                self.malformed_5xx.append(f"{name}:{resp.status}:{code}")
            return f"malformed_{resp.status // 100}xx"

    async def client(self, session: aiohttp.ClientSession) -> None:
        while time.monotonic() < self.deadline:
            self.started += 1
            try:
                if self.rng.random() < self.args.malformed_rate:
                    kind = await asyncio.wait_for(self.malformed_once(session), REQUEST_LIMIT_S)
                else:
                    kind = await asyncio.wait_for(self.stream_once(session), REQUEST_LIMIT_S)
            except asyncio.TimeoutError:
                kind = "hung"
                self.hung += 1
            except (aiohttp.ClientError, ConnectionError) as exc:
                kind = f"connection_error:{type(exc).__name__}"
            self.ended += 1
            self.outcomes[kind] += 1

    async def killer(self) -> None:
        while True:
            await asyncio.sleep(self.args.kill_every)
            if time.monotonic() > self.deadline - 2:
                return
            pids = self.daemon.workers()
            if pids:
                os.kill(self.rng.choice(pids), signal.SIGKILL)
                self.kills.append(time.monotonic())

    async def run(self) -> None:
        self.deadline = time.monotonic() + self.args.duration
        conn = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=None)) as session:
            tasks = [asyncio.create_task(self.client(session)) for _ in range(self.args.streams)]
            if self.args.kill_every > 0:
                tasks.append(asyncio.create_task(self.killer()))
            await asyncio.gather(*tasks)
            async with session.get(self.url + "/metrics") as resp:
                self.metrics = await resp.text()

    def recovery(self) -> list[float]:
        out = []
        for k in self.kills:
            after = [t for t in self.ok_times if t > k]
            if after:
                out.append(min(after) - k)
        return out


def metric_sum(text: str, name: str, **labels: str) -> dict[str, float]:
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, float] = collections.defaultdict(float)
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                key = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()) if k not in labels and k != "model")
                out[key] += s.value
    return dict(out)


def pct(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(p / 100 * len(values)))]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.soak")
    p.add_argument("--duration", type=float, default=300.0, help="seconds of load")
    p.add_argument("--streams", type=int, default=64, help="concurrent clients")
    p.add_argument("--model", choices=("tiny", "gemma"), default="tiny")
    p.add_argument("--n-seq-max", type=int, default=8)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--kill-every", type=float, default=20.0, help="SIGKILL a worker every this many seconds (0: never)")
    p.add_argument("--disconnect-rate", type=float, default=0.15)
    p.add_argument("--malformed-rate", type=float, default=0.10)
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args(argv)
    args.model_name = "soak"
    root = Path(tempfile.mkdtemp(prefix="bi-soak-"))
    daemon = Daemon(root, model_file(args.model, root), args.n_seq_max, args.threads)
    try:
        deadline = time.monotonic() + 120
        import httpx

        while True:
            try:
                if httpx.get(daemon.url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if daemon.proc.poll() is not None or time.monotonic() > deadline:
                print((root / "daemon.log").read_text()[-3000:])
                return 2
            time.sleep(0.2)
        httpx.post(daemon.url + "/v1/chat/completions", json={"model": "soak", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}, timeout=120)
        soak = Soak(args, daemon.url, daemon)
        t0 = time.monotonic()
        asyncio.run(soak.run())
        wall = time.monotonic() - t0
        alive = daemon.proc.poll() is None
    finally:
        daemon.stop()
    print(f"soak: {args.streams} streams, {args.duration:.0f} s, model {args.model}, n_seq_max {args.n_seq_max}, "
          f"kill every {args.kill_every:g} s, disconnect {args.disconnect_rate:.0%}, malformed {args.malformed_rate:.0%} (wall {wall:.1f} s)")  # fmt: skip
    print(f"requests: {soak.started} started, {soak.ended} ended, {soak.hung} hung (open > {REQUEST_LIMIT_S:.0f} s)")
    print("how each request ended:")
    for kind, n in sorted(soak.outcomes.items(), key=lambda kv: -kv[1]):
        print(f"  {kind:40s} {n:7d}")
    print("malformed requests (kind:status):")
    for kind, n in sorted(soak.malformed.items()):
        print(f"  {kind:40s} {n:7d}")
    print(f"malformed requests answered 5xx: {len(soak.malformed_5xx)}")
    print(f"streamed tokens: {soak.tokens} ({soak.tokens / wall:.1f} tok/s aggregate); TTFT p50 {pct(soak.ttft, 50) * 1000:.0f} ms, "
          f"p95 {pct(soak.ttft, 95) * 1000:.0f} ms")  # fmt: skip
    rec = soak.recovery()
    print(f"worker kills: {len(soak.kills)}; next successful stream after a kill: "
          + (f"p50 {statistics.median(rec):.2f} s, max {max(rec):.2f} s" if rec else "none"))
    m = soak.metrics
    print(f"daemon /metrics: worker_starts {metric_sum(m, 'barrel_inference_worker_starts_total')}, "
          f"worker_exits {metric_sum(m, 'barrel_inference_worker_exits_total')}")
    statuses = metric_sum(m, "barrel_inference_http_responses_total", route="/v1/chat/completions")
    print(f"daemon /metrics: chat answers by status {dict(sorted(statuses.items()))}")
    print(f"daemon alive at the end: {alive}")
    return 0 if alive and soak.hung == 0 and not soak.malformed_5xx else 1


if __name__ == "__main__":
    sys.exit(main())
