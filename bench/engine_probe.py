"""In-process engine figures, run as a child process so each gets a clean process and its own RSS.

  python -m bench.engine_probe raw --n N --gen G --model PATH [--threads T]
      llama.cpp's batched decode through llama-cpp-python's low-level API: one context, N sequences,
      one llama_decode per step holding the next token of every sequence, greedy sampler chains.
      This is the ceiling a continuously batching server can approach (no HTTP, no scheduling).
  python -m bench.engine_probe single --gen G --model PATH [--threads T]
      the high-level single-sequence `Llama` class generating G tokens in one process.

Prints one JSON object on stdout.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from .workloads import short_prompt

SUPPRESS = (1, 106)  # Gemma 3 <eos>, <end_of_turn>


def _peak_rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024.0
    return 0.0


def raw(n: int, gen: int, model_path: str, threads: int, n_ctx: int, total_ctx: int | None = None, sample: bool = True) -> dict:
    import llama_cpp as L

    L.llama_backend_init()
    mp = L.llama_model_default_params()
    model = L.llama_model_load_from_file(model_path.encode(), mp)
    if not model:
        raise SystemExit(f"cannot load {model_path}")
    vocab = L.llama_model_get_vocab(model)
    cp = L.llama_context_default_params()
    cp.n_ctx = total_ctx or n_ctx * n  # unified KV: every sequence can reach n_ctx
    cp.n_batch = cp.n_ubatch = 512
    cp.n_seq_max = n
    cp.n_threads = cp.n_threads_batch = threads
    cp.kv_unified = True
    ctx = L.llama_init_from_model(model, cp)

    prompts = []
    for s in range(n):
        text = short_prompt(s).encode()
        buf = (L.llama_token * 512)()
        k = L.llama_tokenize(vocab, text, len(text), buf, 512, True, False)
        prompts.append(list(buf[:k]))

    batch = L.llama_batch_init(max(512, sum(len(p) for p in prompts)), 0, n)

    def add(tok, pos, seq, logits):
        i = batch.n_tokens
        batch.token[i] = tok
        batch.pos[i] = pos
        batch.n_seq_id[i] = 1
        batch.seq_id[i][0] = seq
        batch.logits[i] = logits
        batch.n_tokens += 1

    samplers = []
    for _ in range(n):
        ch = L.llama_sampler_chain_init(L.llama_sampler_chain_default_params())
        bias = (L.llama_logit_bias * len(SUPPRESS))(*[L.llama_logit_bias(t, -100.0) for t in SUPPRESS])
        L.llama_sampler_chain_add(ch, L.llama_sampler_init_logit_bias(L.llama_vocab_n_tokens(vocab), len(SUPPRESS), bias))
        L.llama_sampler_chain_add(ch, L.llama_sampler_init_greedy())
        samplers.append(ch)

    t0 = time.perf_counter()
    batch.n_tokens = 0
    idx = {}
    for s, toks in enumerate(prompts):
        for i, t in enumerate(toks):
            add(t, i, s, i == len(toks) - 1)
        idx[s] = batch.n_tokens - 1
    if L.llama_decode(ctx, batch) != 0:
        raise SystemExit("prefill decode failed")
    t1 = time.perf_counter()
    pos = [len(p) for p in prompts]
    for _ in range(gen):
        # without sampling (like llama-batched-bench) every sequence is fed a fixed token: pure decode cost
        nxt = [L.llama_sampler_sample(samplers[s], ctx, idx[s]) if sample else 1000 for s in range(n)]
        batch.n_tokens = 0
        for s in range(n):
            add(nxt[s], pos[s], s, True)
            idx[s] = s
            pos[s] += 1
        if L.llama_decode(ctx, batch) != 0:
            raise SystemExit("decode failed")
    t2 = time.perf_counter()
    return {
        "mode": "raw",
        "sequences": n,
        "kv_cells": cp.n_ctx,
        "sampled": sample,
        "tokens": n * gen,
        "prefill_s": t1 - t0,
        "decode_s": t2 - t1,
        "tok_s": n * gen / (t2 - t1),
        "tok_s_with_prefill": n * gen / (t2 - t0),
        "peak_rss_mib": _peak_rss_mib(),
    }


def single(gen: int, model_path: str, threads: int, n_ctx: int) -> dict:
    from llama_cpp import Llama

    llm = Llama(model_path=model_path, n_ctx=n_ctx, n_threads=threads, n_threads_batch=threads, n_batch=512, verbose=False)
    tokens = llm.tokenize(short_prompt(0).encode(), add_bos=True)
    t0 = time.perf_counter()
    t_first = None
    n = 0
    # generate() itself never stops at EOS (create_completion does); stop after `gen` tokens
    for _tok in llm.generate(tokens, temp=0.0, top_k=1, top_p=1.0, min_p=0.0, repeat_penalty=1.0, reset=True):
        n += 1
        if t_first is None:
            t_first = time.perf_counter()
        if n >= gen:
            break
    t2 = time.perf_counter()
    return {
        "mode": "single",
        "sequences": 1,
        "tokens": n,
        "ttft_s": (t_first or t2) - t0,
        "tok_s": (n - 1) / (t2 - t_first) if t_first and n > 1 else 0.0,
        "tok_s_with_prefill": n / (t2 - t0),
        "peak_rss_mib": _peak_rss_mib(),
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="bench.engine_probe")
    p.add_argument("mode", choices=["raw", "single"])
    p.add_argument("--n", type=int, default=1)
    p.add_argument("--gen", type=int, default=128)
    p.add_argument("--model", required=True)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--ctx", type=int, default=4096, help="context per sequence")
    p.add_argument("--total-ctx", type=int, default=None, help="raw: KV cells in all (default ctx x n)")
    p.add_argument("--no-sample", dest="sample", action="store_false", help="raw: decode only, no sampler (as llama-batched-bench)")
    a = p.parse_args(argv)
    out = raw(a.n, a.gen, a.model, a.threads, a.ctx, a.total_ctx, a.sample) if a.mode == "raw" else single(a.gen, a.model, a.threads, a.ctx)
    sys.stdout.write(json.dumps(out) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
