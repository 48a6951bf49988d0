"""What a grammar costs per sampled token on a real vocabulary, with the staged check and without.

    python -m bench.grammar_cost [--model tiny|gemma] [--tokens 12]

Prints, per schema, the median and worst milliseconds of one constrained sampling step (the time
every other stream of the worker waits for it), staged (the grammar checks the best candidates
first) and over the whole vocabulary (what llama.cpp's sampler chain does).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

from .build import packaged_gemma

REPO = Path(__file__).resolve().parent.parent

SCHEMAS = {
    "any JSON": {},
    "object": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 40}, "rank": {"type": "integer"}}},
    "enum of 128": {"enum": [f"value number {i}" for i in range(128)]},
    "string maxLength 1000": {"type": "string", "maxLength": 1000},
    "array maxItems 1000": {"type": "array", "items": {"type": "string"}, "maxItems": 1000},
}


def model_path(kind: str) -> Path:
    if kind == "gemma":
        return packaged_gemma()
    sys.path.insert(0, str(REPO / "tests"))
    from tinymodel import write_tiny_gguf

    return write_tiny_gguf(Path(tempfile.mkdtemp()) / "tiny.gguf")


def steps(engine, grammar: str, n: int) -> list[float]:
    from barrel_inference.protocol import Sampling

    sampler = engine.make_sampler(Sampling(temperature=0), grammar)
    engine.seq_clear(0)
    prompt = engine.tokenize("Answer in JSON: ", True, True)
    engine.decode(prompt, list(range(len(prompt))), [0] * len(prompt), [False] * (len(prompt) - 1) + [True])
    pos, idx, out = len(prompt), len(prompt) - 1, []
    try:
        for _ in range(n):
            t0 = time.perf_counter()
            tok = engine.sample(sampler, idx)
            out.append(time.perf_counter() - t0)
            if engine.is_eog(tok) or engine.decode([tok], [pos], [0], [True]) != 0:
                break
            pos, idx = pos + 1, 0
    finally:
        sampler.free()
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.grammar_cost")
    p.add_argument("--model", choices=("tiny", "gemma"), default="gemma")
    p.add_argument("--tokens", type=int, default=12)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args(argv)
    import barrel_inference.worker.engine as engine_mod
    import barrel_inference.worker.samplers as samplers_mod

    engine = engine_mod.LlamaEngine(str(model_path(args.model)), n_ctx=512, n_seq_max=1, threads=args.threads, extra_buffers=False)
    print(f"model {args.model}, vocabulary {engine.n_vocab}, greedy, {args.tokens} tokens; ms per sampling step (median / worst)")
    print(f"{'schema':24s} {'staged':>16s} {'whole vocabulary':>20s}")
    stages = samplers_mod.GRAMMAR_STAGES
    for name, schema in SCHEMAS.items():
        grammar = engine.grammar_from_schema(schema)
        samplers_mod.GRAMMAR_STAGES = stages
        staged = steps(engine, grammar, args.tokens)
        samplers_mod.GRAMMAR_STAGES = ()
        whole = steps(engine, grammar, args.tokens)
        fmt = lambda xs: f"{statistics.median(xs) * 1000:7.1f} / {max(xs) * 1000:7.1f}"  # noqa: E731
        print(f"{name:24s} {fmt(staged):>16s} {fmt(whole):>20s}")
    samplers_mod.GRAMMAR_STAGES = stages
    engine.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
