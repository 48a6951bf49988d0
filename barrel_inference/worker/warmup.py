"""Warm-up before ready: a short probe batch through the real decode path.

A worker decodes several sequences at once (one prefill batch, then a few decode steps) before it
says hello, so that an engine that crashes on this CPU (a bad kernel, a weight layout the build
gets wrong) crashes at load, where the gateway can fall back to the safe profile, and never on a
user's request.

Fault injection (tests only): BARREL_INFERENCE_FAULT_WARMUP=segv-extra makes the worker kill itself
with SIGSEGV during warm-up when extra buffers are on; =segv does it in every profile.
"""

from __future__ import annotations

import os
import signal
import time

from ..protocol import Sampling

FAULT_ENV = "BARREL_INFERENCE_FAULT_WARMUP"
_PROBE_TEXT = (
    "The sea is calm tonight. The tide is full, the moon lies fair upon the straits; "
    "on the French coast the light gleams and is gone. Count: one two three four five six seven."
)


def _inject_fault(extra_buffers: bool) -> None:
    fault = os.environ.get(FAULT_ENV, "")
    if fault == "segv" or (fault == "segv-extra" and extra_buffers):
        os.kill(os.getpid(), signal.SIGSEGV)


def warm_up(engine, *, extra_buffers: bool, n_seqs: int = 4, prompt_len: int = 24, steps: int = 4) -> dict:
    """Decode `n_seqs` distinct prompts in one batch, then `steps` decode steps; leave every sequence empty.

    Returns what ran (for the log). Raises RuntimeError when llama_decode reports a failure.
    """
    t0 = time.perf_counter()
    n_seqs = max(1, min(n_seqs, engine.n_seq_max))
    base = engine.tokenize(_PROBE_TEXT, add_special=False, parse_special=False) or [0]
    while len(base) < prompt_len + n_seqs:
        base = base + base
    per_seq = max(2, min(prompt_len, max(1, engine.n_batch // n_seqs), engine.n_ctx // 2))
    prompts = [base[i : i + per_seq] for i in range(n_seqs)]  # distinct prompts: different rows differ
    tokens, pos, seqs, logits = [], [], [], []
    for s, prompt in enumerate(prompts):
        for j, t in enumerate(prompt):
            tokens.append(t)
            pos.append(j)
            seqs.append(s)
            logits.append(j == len(prompt) - 1)
    _inject_fault(extra_buffers)
    samplers = [engine.make_sampler(Sampling(temperature=0.0)) for _ in prompts]
    try:
        if engine.decode(tokens, pos, seqs, logits) != 0:
            raise RuntimeError("llama_decode failed on the warm-up prefill")
        rows = [i for i, want in enumerate(logits) if want]
        lengths = [len(p) for p in prompts]
        for _ in range(steps):
            nxt = [engine.sample(samplers[s], rows[s]) for s in range(n_seqs)]
            if engine.decode(nxt, lengths, list(range(n_seqs)), [True] * n_seqs) != 0:
                raise RuntimeError("llama_decode failed on a warm-up decode step")
            rows = list(range(n_seqs))
            lengths = [n + 1 for n in lengths]
    finally:
        for sampler in samplers:
            if hasattr(sampler, "free"):
                sampler.free()
        for s in range(n_seqs):
            engine.seq_clear(s)
    return {"sequences": n_seqs, "prompt_tokens": per_seq, "steps": steps, "ms": round((time.perf_counter() - t0) * 1000, 1)}
