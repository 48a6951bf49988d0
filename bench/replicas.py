"""Replicas and cache-aware routing: how much of the prompt each routing policy serves from cache.

    python -m bench.replicas [--model tiny|gemma|PATH] [--conversations 8] [--turns 6] [--policies affinity,round_robin]

For each policy it starts its own daemon (`bictl serve`, a temporary cache, runtime and KV dir,
127.0.0.1 only) with `replicas = 2` of the model (the tiny generated GGUF by default: fast, nonsense
text), each replica pinned to half of this process's cores where there are two or more. Then
`--conversations` conversations run at once, each its own system prompt and a chain of turns with
its history fed back, so their turns interleave on the two replicas. No session headers are sent:
affinity has only the prompts' prefixes to go by.

Printed per policy: the share of prompt tokens served from the KV cache (sum of
usage.prompt_tokens_details.cached_tokens over sum of usage.prompt_tokens), the TTFT medians (every
turn, and turns after the first), and each replica's requests by routing reason (from /api/ps).
Figures only: nothing here asserts a speed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .build import packaged_gemma
from .client import LoadClient, RequestSpec, percentile
from .procs import stop_group
from .workloads import QUESTIONS, SUBJECTS, filler_text

REPO = Path(__file__).resolve().parent.parent
TINY_EOS = 266  # the tiny model's <|im_end|>: suppressed so every answer runs to max_tokens
GEMMA_SUPPRESS = (1, 106)


def log(msg: str) -> None:
    print(msg, flush=True)


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def model_file(kind: str, root: Path) -> tuple[Path, tuple[int, ...]]:
    """(GGUF path, token ids to suppress) for --model."""
    if kind == "tiny":
        sys.path.insert(0, str(REPO / "tests"))
        from tinymodel import write_tiny_gguf

        return write_tiny_gguf(root / "tiny.gguf", context_length=8192), (TINY_EOS,)
    if kind == "gemma":
        return packaged_gemma(), GEMMA_SUPPRESS
    return Path(kind).expanduser().resolve(), GEMMA_SUPPRESS


def replica_cores(n: int = 2) -> list[str]:
    """Each replica's share of this process's cores ("cpu:0-3"), or [] with fewer cores than replicas."""
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    if len(cores) < n:
        return []
    per = len(cores) // n
    return ["cpu:" + ",".join(str(c) for c in cores[i * per : (i + 1) * per]) for i in range(n)]


class Daemon:
    """`bictl serve` with replicas = 2 of one model under `policy`, in a directory of its own."""

    def __init__(self, root: Path, gguf: Path, policy: str, args) -> None:
        from barrel_inference.config import load_settings
        from barrel_inference.registry import Registry

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        devices = replica_cores() if args.pin else []
        threads = args.threads or max(1, (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 2) // 2)
        config = root / "config.toml"
        config.write_text(
            f'host = "127.0.0.1"\nport = {self.port}\nmodel_cache_dir = "{root / "models"}"\nruntime_dir = "{root / "run"}"\n'
            f'kv_cache_dir = "{root / "kv"}"\nembed_default_model = false\nworker_start_timeout = 300.0\n'
            f'preload = ["bench:latest"]\nmax_queue = 1024\n'
            f"[defaults]\nreplicas = 2\nrouting = \"{policy}\"\nn_seq_max = {args.parallel}\nn_ctx = {args.ctx}\n"
            f"threads = {threads}\nprefill_chunk = 128\n" + (f"devices = {json.dumps(devices)}\n" if devices else "")
        )  # fmt: skip
        Registry(load_settings(config, env={})).register_local("bench", gguf)
        env = {k: v for k, v in os.environ.items() if not k.startswith("BARREL_INFERENCE_")}
        env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
        self.log_path = root / "daemon.log"
        self._log = open(self.log_path, "w")
        self.proc = subprocess.Popen([sys.executable, "-m", "barrel_inference.cli", "serve", "--config", str(config)],
                                     stdout=self._log, stderr=subprocess.STDOUT, env=env, start_new_session=True)  # fmt: skip
        self.devices, self.threads = devices, threads

    async def ready(self, client: LoadClient, timeout: float) -> None:
        """Until both replicas of the preloaded model are up."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the daemon exited with {self.proc.returncode}; see {self.log_path}")
            ps = await client.get_json("/api/ps")
            models = (ps or {}).get("models") or []
            if models and sum(r.get("alive", False) for r in models[0].get("replicas") or []) == 2:
                return
            await asyncio.sleep(0.2)
        raise RuntimeError(f"the replicas were not up after {timeout:.0f} s; see {self.log_path}")

    def stop(self) -> None:
        stop_group(self.proc, 30)
        self._log.close()


def system_prompt(k: int, words: int) -> str:
    return f"You are the assistant of {SUBJECTS[k % len(SUBJECTS)]} (conversation {k}). Keep to these notes: " + filler_text(k, words)


async def one_conversation(client: LoadClient, k: int, args, suppress: tuple[int, ...]) -> list[dict]:
    messages = [{"role": "system", "content": system_prompt(k, args.system_words)}]
    turns = []
    for t in range(args.turns):
        messages.append({"role": "user", "content": f"[{k}.{t}] " + QUESTIONS[(k + t) % len(QUESTIONS)]})
        res = await client.stream(RequestSpec(messages=list(messages), max_tokens=args.max_tokens, suppress=suppress))
        messages.append({"role": "assistant", "content": res.text})
        turns.append({"conversation": k, "turn": t + 1, "ok": res.ok, "error": res.error, "prompt_tokens": res.prompt_tokens,
                      "cached_tokens": res.cached_tokens, "ttft_ms": None if res.ttft is None else res.ttft * 1000.0})  # fmt: skip
    return turns


async def measure(policy: str, gguf: Path, suppress: tuple[int, ...], args) -> dict:
    with tempfile.TemporaryDirectory(prefix="bi-bench-replicas-") as tmp:
        daemon = Daemon(Path(tmp), gguf, policy, args)
        try:
            async with LoadClient(daemon.url, "bench") as client:
                await daemon.ready(client, args.start_timeout)
                t0 = time.perf_counter()
                per_conv = await asyncio.gather(*(one_conversation(client, k, args, suppress) for k in range(args.conversations)))
                wall = time.perf_counter() - t0
                ps = await client.get_json("/api/ps")
        finally:
            daemon.stop()
    turns = [t for conv in per_conv for t in conv]
    ok = [t for t in turns if t["ok"]]
    prompt = sum(t["prompt_tokens"] or 0 for t in ok)
    cached = sum(t["cached_tokens"] or 0 for t in ok)
    ttft = [t["ttft_ms"] for t in ok if t["ttft_ms"] is not None]
    later = [t["ttft_ms"] for t in ok if t["ttft_ms"] is not None and t["turn"] > 1]
    replicas = ((ps or {}).get("models") or [{}])[0].get("replicas") or []
    return {
        "policy": policy, "requests": len(turns), "ok": len(ok), "errors": sorted({t["error"] for t in turns if t["error"]})[:3],
        "prompt_tokens": prompt, "cached_tokens": cached, "cached_share": cached / prompt if prompt else None,
        "ttft_ms_p50": percentile(ttft, 50), "ttft_ms_p50_later_turns": percentile(later, 50), "wall_s": wall,
        "replicas": [{"replica": r.get("replica"), "device": r.get("device"), "routed": r.get("routed"),
                      "prompt_tokens": r.get("prompt_tokens"), "cached_tokens": r.get("cached_tokens")} for r in replicas],
        "devices": daemon.devices, "threads_per_replica": daemon.threads,
    }  # fmt: skip


def show(result: dict) -> str:
    share = result["cached_share"]
    fmt = lambda v: "-" if v is None else f"{v:.1f}"  # noqa: E731
    routed = "; ".join(f"r{r['replica']}: " + ", ".join(f"{k} {v}" for k, v in sorted((r["routed"] or {}).items())) for r in result["replicas"])
    return (f"{result['policy']:<13} {result['ok']:>3}/{result['requests']:<3} prompt {result['prompt_tokens']:>7}  cached "
            f"{result['cached_tokens']:>7}  share {'-' if share is None else f'{100 * share:.1f}%':>6}  TTFT p50 "
            f"{fmt(result['ttft_ms_p50']):>7} ms  later turns {fmt(result['ttft_ms_p50_later_turns']):>7} ms  "
            f"wall {result['wall_s']:.1f} s  [{routed}]")  # fmt: skip


async def run(args) -> dict:
    model_dir = Path(tempfile.mkdtemp(prefix="bi-bench-model-"))
    try:
        gguf, suppress = model_file(args.model, model_dir)
        log(f"bench.replicas: {args.conversations} conversations x {args.turns} turns at once, 2 replicas of "
            f"{args.model}, n_seq_max {args.parallel} each, max_tokens {args.max_tokens}")  # fmt: skip
        results = {"meta": {"command": "python -m bench.replicas " + " ".join(args.argv), "model": args.model,
                            "conversations": args.conversations, "turns": args.turns}, "policies": {}}  # fmt: skip
        for policy in args.policies:
            result = await measure(policy, gguf, suppress, args)
            results["policies"][policy] = result
            log(show(result))
    finally:
        shutil.rmtree(model_dir, ignore_errors=True)
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1))
        log(f"results in {args.out}")
    return results


def parse_args(argv=None) -> argparse.Namespace:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(prog="python -m bench.replicas", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="tiny", help="tiny (generated), gemma (the packaged Gemma 3 270M) or a GGUF path")
    p.add_argument("--policies", default="affinity,round_robin", help="routing policies to compare, comma-separated")
    p.add_argument("--conversations", type=int, default=8)
    p.add_argument("--turns", type=int, default=6)
    p.add_argument("--system-words", type=int, default=120, help="words of each conversation's own system prompt")
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--parallel", type=int, default=4, help="n_seq_max of each replica")
    p.add_argument("--ctx", type=int, default=4096, help="n_ctx of one sequence")
    p.add_argument("--threads", type=int, default=0, help="threads per replica (default: its share of the cores)")
    p.add_argument("--no-pin", dest="pin", action="store_false", help="do not pin each replica to half of the cores")
    p.add_argument("--start-timeout", type=float, default=300.0)
    p.add_argument("--out", default=None, help="write the figures here as JSON")
    args = p.parse_args(argv)
    args.policies = [x for x in args.policies.split(",") if x]
    args.argv = argv
    return args


def main(argv=None) -> int:
    asyncio.run(run(parse_args(argv)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
