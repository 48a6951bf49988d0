"""The engine alone (no daemon): what a batch's shape and the KV cells' history cost llama.cpp.

    python -m bench.rows sizes [--rows 128,129,256,257,...] [--decode]
        one prompt's chunk of N rows at positions 1,024.. (each size timed --reps times, the
        fastest kept); --decode: N sequences' next tokens instead (one row each, at position 100)
    python -m bench.rows churn [--unified true|false] [--keep K] [--prompts P]
        P 2,000-token prompts one after another, each prefilled in chunks of 256 rows beside 4
        decoding streams (the scheduler's default shape) and followed by 20 decode steps; the
        K most recent stay in the cache (their sequences idle), older ones are cleared

Random tokens from the model's vocabulary; Gemma 3 270M unless --model. Prints one line per figure.
"""

from __future__ import annotations

import argparse
import random
import time

from .build import packaged_gemma

STREAMS = 4


def _engine(args, **kw):
    from barrel_inference.worker.engine import LlamaEngine
    from barrel_inference.worker.engine_profile import resolve

    extra = resolve("default", args.extra_buffers).extra_buffers  # as the worker resolves the setting
    return LlamaEngine(str(args.model), n_ctx=4096, n_batch=512, extra_buffers=extra, threads=args.threads, **kw)


def _tokens(rng: random.Random, n: int) -> list[int]:
    return [2] + [rng.randrange(1000, 20000) for _ in range(n - 1)]


def _prefill(e, seq: int, toks: list[int], chunk: int = 256) -> None:
    for i in range(0, len(toks), chunk):
        part = toks[i : i + chunk]
        if e.decode(part, list(range(i, i + len(part))), [seq] * len(part), [False] * (len(part) - 1) + [True]) != 0:
            raise SystemExit("decode failed")


def sizes(args) -> None:
    rows = [int(x) for x in args.rows.split(",")]
    e = _engine(args, n_seq_max=max(8, max(rows) if args.decode else 8))
    rng = random.Random(1)
    if args.decode:
        for s in range(max(rows)):
            _prefill(e, s, _tokens(rng, 100))
    else:
        long = _tokens(rng, 1024 + max(rows))
        _prefill(e, 7, long[:1024], 512)
    best: dict[int, float] = {}
    for _ in range(args.reps):
        for n in rows:
            if args.decode:
                tokens, pos, seqs, logits = [100] * n, [100] * n, list(range(n)), [True] * n
            else:
                tokens, pos, seqs = long[1024 : 1024 + n], list(range(1024, 1024 + n)), [7] * n
                logits = [False] * (n - 1) + [True]
            t0 = time.perf_counter()
            if e.decode(tokens, pos, seqs, logits) != 0:
                raise SystemExit("decode failed")
            dt = time.perf_counter() - t0
            for s in set(seqs):
                e.seq_truncate(s, 100 if args.decode else 1024)
            best[n] = min(dt, best.get(n, dt))
    for n in rows:
        print(f"rows {n:4d}: {best[n] * 1000:7.1f} ms  ({best[n] * 1000 / n:.3f} ms a row)", flush=True)


def churn(args) -> None:
    n_seq = STREAMS + args.keep + 2
    e = _engine(args, n_seq_max=n_seq, kv_unified=args.unified == "true")
    rng = random.Random(1)
    kept: list[int] = []
    free = list(range(STREAMS, n_seq))
    for _ in range(args.keep):  # conversations that left their caches behind
        seq = free.pop(0)
        _prefill(e, seq, _tokens(rng, 2000))
        kept.append(seq)
    n = {}
    for s in range(STREAMS):
        _prefill(e, s, _tokens(rng, 60))
        n[s] = 60
    from barrel_inference.worker.scheduler import first_chunk

    step = first_chunk(256, STREAMS, args.unified == "true")  # the scheduler's shape
    out = []
    for _ in range(args.prompts):
        seq = free.pop(0)
        long = _tokens(rng, 2000)
        t0 = time.perf_counter()
        i = 0
        while i < len(long):
            part = long[i : i + step]
            tokens = [100] * STREAMS + part
            pos = [n[s] for s in range(STREAMS)] + list(range(i, i + len(part)))
            seqs = list(range(STREAMS)) + [seq] * len(part)
            if e.decode(tokens, pos, seqs, [True] * STREAMS + [False] * (len(part) - 1) + [True]) != 0:
                raise SystemExit("decode failed")
            for s in range(STREAMS):
                n[s] += 1
            i += len(part)
        prefill = time.perf_counter() - t0
        for _ in range(20):
            if e.decode([100] * STREAMS, [n[s] for s in range(STREAMS)], list(range(STREAMS)), [True] * STREAMS) != 0:
                raise SystemExit("decode failed")
            for s in range(STREAMS):
                n[s] += 1
        out.append((prefill, time.perf_counter() - t0))
        kept.append(seq)
        while len(kept) > args.keep:
            old = kept.pop(0)
            e.seq_clear(old)
            free.append(old)
    print(f"unified={args.unified} keep={args.keep}: prefill " + " ".join(f"{p * 1000:.0f}" for p, _ in out)
          + " ms; with the 20 decode steps " + " ".join(f"{t * 1000:.0f}" for _, t in out) + " ms", flush=True)  # fmt: skip


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.rows", description=__doc__.split("\n")[0])
    p.add_argument("what", choices=("sizes", "churn"))
    p.add_argument("--model", default=None, help="a GGUF path (default: the packaged gemma3:270m)")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--extra-buffers", choices=("auto", "on", "off"), default="auto", help="as the model setting")
    p.add_argument("--rows", default="128,129,254,255,256,257,260,384,385,508,511,512")
    p.add_argument("--decode", action="store_true")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--unified", choices=("true", "false"), default="true")
    p.add_argument("--keep", type=int, default=2)
    p.add_argument("--prompts", type=int, default=4)
    args = p.parse_args(argv)
    args.model = args.model or packaged_gemma()
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    (sizes if args.what == "sizes" else churn)(args)


if __name__ == "__main__":
    main()
