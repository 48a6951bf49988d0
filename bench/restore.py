"""The engine alone: how far a restored KV state's next-token logits lie from the never-evicted run's.

    python -m bench.restore [--lengths 400,576,800,1100,1399] [--flash-attn on|off] [--unified true|false]

For each length: a fresh sequence of random tokens is prefilled in chunks of 256, its state saved;
the next token's logits are taken in place at one thread and at --threads, then the sequence is
cleared, the state restored and the same taken again. Then as the worker does where its self-test
asks for it: the sequence is relaid in place as a restore lays it out (engine.seq_relayout), its
logits taken, its state restored into another sequence and the logits taken there. Prints, per length, whether each pair is bit
for bit equal and their largest difference. For scale it prints too how far a sequence's logits
move when 1 or 3 other sequences decode in its batch (nothing restored): what any request meets
under load. Gemma 3 270M unless --model.
"""

from __future__ import annotations

import argparse

import numpy as np

from .build import packaged_gemma


def _engine(args, n_seq_max: int):
    from barrel_inference.worker.engine import LlamaEngine
    from barrel_inference.worker.engine_profile import resolve

    extra = resolve("default", args.extra_buffers).extra_buffers
    return LlamaEngine(str(args.model), n_ctx=4096, n_seq_max=n_seq_max, n_batch=512, extra_buffers=extra, threads=args.threads,
                       kv_unified=args.unified == "true", flash_attn=args.flash_attn)  # fmt: skip


def _prefill(e, seq: int, toks: list[int], n: int) -> None:
    e.seq_clear(seq)
    for s in range(0, n, 256):
        part = toks[s : min(n, s + 256)]
        if e.decode(part, list(range(s, s + len(part))), [seq] * len(part), [False] * len(part)) != 0:
            raise SystemExit("decode failed")


def _next(e, toks: list[int], n: int, threads: int | None, seqs=(0,)) -> np.ndarray:
    """Sequence 0's logits for token n (decoded beside seqs' own token n), at `threads`; cut back to n."""
    e.set_threads(threads)
    try:
        if e.decode([toks[s][n] for s in seqs], [n] * len(seqs), list(seqs), [True] * len(seqs)) != 0:
            raise SystemExit("decode failed")
        return e.logits(0).copy()
    finally:
        e.set_threads(None)
        for s in seqs:
            e.seq_truncate(s, n)


def _diff(a: np.ndarray, b: np.ndarray) -> str:
    return "equal" if np.array_equal(a, b) else f"{float(np.max(np.abs(a - b))):.3f} apart"


def restore(args) -> None:
    lengths = [int(x) for x in args.lengths.split(",")]
    e = _engine(args, 4)
    rng = np.random.default_rng(1234)
    toks = [[int(t) for t in rng.integers(1000, 20000, max(lengths) + 1)] for _ in range(4)]
    for n in lengths:
        _prefill(e, 0, toks[0], n)
        state = e.state_seq_save(0)
        ref_one, ref = _next(e, toks, n, 1), _next(e, toks, n, None)
        e.seq_clear(0)
        if not e.state_seq_load(0, state):
            raise SystemExit("restore refused")
        got_one, got = _next(e, toks, n, 1), _next(e, toks, n, None)
        # the worker's way where the self-test asks for it: relaid in place (as a restore lays it
        # out), then saved and restored into another sequence
        _prefill(e, 0, toks[0], n)
        relaid = "refused"
        if e.seq_relayout(0):
            kept = _next(e, toks, n, None)
            e.seq_clear(1)
            relaid = "not restored"
            if e.state_seq_load(1, e.state_seq_save(0)):
                toks[1], mine = toks[0], toks[1]  # sequence 1 now holds sequence 0's tokens
                try:
                    relaid = _diff(_next(e, toks, n, None, seqs=(1,)), kept)
                finally:
                    toks[1] = mine
            e.seq_clear(1)
        print(f"{n} tokens: restored vs in place: one thread {_diff(got_one, ref_one)}, {e.threads} threads {_diff(got, ref)}; "
              f"relaid in place vs restored elsewhere: {relaid}", flush=True)  # fmt: skip
    for n in lengths:
        for s in range(4):
            _prefill(e, s, toks[s], n)
        alone = _next(e, toks, n, None)
        beside = {k: _next(e, toks, n, None, seqs=tuple(range(k + 1))) for k in (1, 3)}
        print(f"{n} tokens: alone vs beside 1 other {_diff(beside[1], alone)}, beside 3 others {_diff(beside[3], alone)}",
              flush=True)  # fmt: skip


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.restore", description=__doc__.split("\n")[0])
    p.add_argument("--model", default=None, help="a GGUF path (default: the packaged gemma3:270m)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--extra-buffers", choices=("auto", "on", "off"), default="auto", help="as the model setting")
    p.add_argument("--flash-attn", choices=("auto", "on", "off"), default="on")
    p.add_argument("--unified", choices=("true", "false"), default="false")
    p.add_argument("--lengths", default="400,576,800,1100,1399")
    args = p.parse_args(argv)
    args.model = args.model or packaged_gemma()
    return args


def main(argv=None) -> None:
    restore(parse_args(argv))


if __name__ == "__main__":
    main()
