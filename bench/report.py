"""Turn a results dict into ratios, console tables and BENCHMARKS.md tables."""

from __future__ import annotations

from pathlib import Path

PEERS = ("llama-server", "llama-cpp-python")


def _f(v, fmt="{:.1f}", none="–"):
    return none if v is None else fmt.format(v)


def profile_delta(before: dict | None, after: dict | None) -> dict | None:
    """Where the worker's time went between two `stats` snapshots (its profile is cumulative)."""
    if not before or not after:
        return None
    pb, pa = before.get("profile") or {}, after.get("profile") or {}
    ticks = pa.get("ticks", 0) - pb.get("ticks", 0)
    if ticks <= 0:
        return None
    sb, sa = pb.get("seconds") or {}, pa.get("seconds") or {}
    secs = {k: sa.get(k, 0.0) - sb.get(k, 0.0) for k in sa}
    total = sum(secs.values())
    return {
        "ticks": ticks,
        "batch_tokens": pa.get("batch_tokens", 0) - pb.get("batch_tokens", 0),
        "decode_rows": pa.get("decode_rows", 0) - pb.get("decode_rows", 0),
        "prefill_rows": pa.get("prefill_rows", 0) - pb.get("prefill_rows", 0),
        "mean_batch": (pa.get("batch_tokens", 0) - pb.get("batch_tokens", 0)) / ticks,
        "ms_per_tick": {k: 1000.0 * v / ticks for k, v in secs.items()},
        "share": {k: (v / total if total else 0.0) for k, v in secs.items()},
        "seconds": secs,
        "max_tick_ms_so_far": pa.get("max_tick_ms"),
    }


def profile_line(p: dict | None) -> str:
    if not p:
        return "    (no worker profile)"
    ms = p["ms_per_tick"]
    parts = " ".join(f"{k} {ms[k]:.2f}ms ({100 * p['share'][k]:.0f}%)" for k in ms)
    return f"    worker profile: {p['ticks']} ticks, mean batch {p['mean_batch']:.1f} tokens; per tick: {parts}"


def _pair(mine: dict, peer: dict) -> dict:
    """mine / peer aggregate tok/s per level (and pass by pass), and TTFT p50 speed-up (peer / mine)."""
    r: dict = {"tok_s": {}, "ttft_p50_speedup": {}}
    for c, fig in mine.get("concurrency", {}).items():
        pf = peer.get("concurrency", {}).get(c)
        if pf and pf.get("tok_s") and fig.get("tok_s"):
            r["tok_s"][c] = fig["tok_s"] / pf["tok_s"]
            a, b = fig.get("passes_tok_s") or [], pf.get("passes_tok_s") or []
            if len(a) > 1 and len(a) == len(b):  # pass i of one against pass i of the other, run back to back
                r.setdefault("tok_s_paired_passes", {})[c] = [x / y for x, y in zip(a, b)]
        if pf and pf.get("ttft_ms_p50") and fig.get("ttft_ms_p50"):
            r["ttft_p50_speedup"][c] = pf["ttft_ms_p50"] / fig["ttft_ms_p50"]
    return r


def _good(s: dict | None) -> bool:
    return bool(s) and not s.get("error") and bool(s.get("concurrency"))


def ratios(results: dict) -> dict:
    """ours / peer (keyed by the peer's name), plus "ours-worker / llama-server" (our worker without the
    gateway) and "ours / ours-worker" (what the gateway hop costs), the raw ceiling and the single sequence."""
    systems = results.get("systems", {})
    ours = systems.get("ours")
    out: dict = {}
    for peer in PEERS:
        if _good(ours) and _good(systems.get(peer)):
            out[peer] = _pair(ours, systems[peer])
    worker = systems.get("ours-worker")
    if _good(worker):
        if _good(systems.get("llama-server")):
            out["ours-worker / llama-server"] = _pair(worker, systems["llama-server"])
        if _good(ours):
            out["ours / ours-worker"] = _pair(ours, worker)
    if not _good(ours):
        return out
    eng = results.get("engine", {})
    ceiling = {str(e["sequences"]): e["tok_s"] for e in eng.get("raw", []) if "tok_s" in e}
    if ceiling:
        out["raw_ceiling"] = {
            c: fig["tok_s"] / ceiling[c] for c, fig in ours.get("concurrency", {}).items() if c in ceiling and fig.get("tok_s")
        }
    single = (eng.get("single") or {}).get("tok_s")
    if single:
        out["single_llama"] = {c: fig["tok_s"] / single for c, fig in ours.get("concurrency", {}).items() if fig.get("tok_s")}
    return out


def _label(key: str) -> str:
    return key if "/" in key else {"raw_ceiling": "ours / raw batched decode", "single_llama": "ours / single-sequence Llama"}.get(key, f"ours / {key}")


def targets(results: dict) -> list[tuple[str, bool | None, str]]:
    """Issue 2 and 4 targets: (what, met?, figures)."""
    r = results.get("ratios", {})
    out = []
    ls = r.get("llama-server", {}).get("tok_s", {})
    for c, need in (("1", 0.95), ("4", 1.0), ("8", 1.0), ("16", 1.0)):
        v = ls.get(c)
        out.append((f"tok/s at {c} vs llama-server >= {need:.2f}x", None if v is None else v >= need, _f(v, "{:.3f}x")))
    sp = r.get("llama-server", {}).get("ttft_p50_speedup", {}).get("8")
    sysd = results.get("systems", {})
    ms = [((sysd.get(k) or {}).get("concurrency", {}).get("8") or {}).get("ttft_ms_p50") for k in ("ours", "llama-server")]
    out.append(("TTFT p50 at 8 no worse than llama-server", None if sp is None else sp >= 1.0,
                _f(sp, "{:.3f}x") + (f" ({ms[0]:.1f} vs {ms[1]:.1f} ms)" if None not in ms else "")))  # fmt: skip
    single = r.get("single_llama", {}).get("8")
    out.append(("tok/s at 8 >= 2x single-sequence Llama", None if single is None else single >= 2.0, _f(single, "{:.3f}x")))
    for c, v in sorted(r.get("raw_ceiling", {}).items(), key=lambda kv: int(kv[0])):
        out.append((f"tok/s at {c} within 15% of raw batched ceiling", v >= 0.85, f"{v:.2f}x"))
    ours = results.get("systems", {}).get("ours", {})
    lp = ours.get("long_prompt") or {}
    chunk_ms = lp.get("one_chunk_ms")
    if lp.get("max_gap_ms") is not None and chunk_ms:
        # one prefill chunk = the long prompt's TTFT over its chunk count (mean prefill tick); 1.5x for jitter
        n_long = (results.get("meta", {}).get("long_prompt_tokens") or ["?"])[0]
        out.append((f"max gap of running streams during a {n_long}-token prefill <= 1.5x one prefill-chunk tick",
                    lp["max_gap_ms"] <= 1.5 * chunk_ms, f"{lp['max_gap_ms']:.0f} ms vs {chunk_ms:.0f} ms per chunk"))  # fmt: skip
    return out


def console(results: dict) -> str:
    lines = []
    meta = results.get("meta", {})
    lines.append(f"host {meta.get('host')}  {meta.get('cpu')}  {meta.get('cores')} cores  model {meta.get('model_name')} ({meta.get('model')})")
    for name, sysres in results.get("systems", {}).items():
        lines.append(f"\n== {name} ==")
        if sysres.get("error"):
            lines.append(f"  FAILED: {sysres['error']}")
            continue
        lines.append(f"  {'streams':>7} {'tok/s':>8} {'TTFT p50':>9} {'p95':>8} {'ITL p50':>8} {'p95':>7} {'ok':>5}  load")
        for c, f in sorted(sysres.get("concurrency", {}).items(), key=lambda kv: int(kv[0])):
            if "tok_s" not in f:  # a level that did not finish (its time box)
                lines.append(f"  {c:>7}  {f.get('error', 'no figures')}")
                continue
            lines.append(
                f"  {c:>7} {f['tok_s']:8.1f} {_f(f['ttft_ms_p50'], '{:9.0f}'):>9} {_f(f['ttft_ms_p95'], '{:8.0f}'):>8} "
                f"{_f(f['itl_ms_p50'], '{:8.1f}'):>8} {_f(f['itl_ms_p95'], '{:7.1f}'):>7} {f['ok']:>2}/{f['streams']:<2}  "
                f"{f.get('loadavg', [''])[0]}"
            )
            if f.get("noisy"):
                lines.append(f"          NOISY: other processes competed for the cores in {int(f['noisy'])} pass(es): "
                             f"passes {[round(x, 1) for x in f.get('passes_tok_s', [f['tok_s']])]} tok/s")  # fmt: skip
            if f.get("errors"):
                lines.append(f"          errors: {f['errors']}")
            if f.get("cpu_cores"):
                lines.append("    cores used: " + ", ".join(f"{k} {v:.2f}" for k, v in f["cpu_cores"].items()))
            if f.get("profile"):
                lines.append(profile_line(f["profile"]))
        lp = sysres.get("long_prompt")
        if lp:
            lines.append(
                f"  long prompt: {len(lp['arrivals'])} x ~{_f((meta.get('long_prompt_tokens') or [None])[0], '{:.0f}')}"
                f" tokens while {lp['background_streams']} stream(s) decode: max gap of running streams "
                f"{_f(lp['max_gap_ms'], '{:.0f}')} ms (their usual ITL p50 {_f(lp['baseline_itl_ms_p50'])} ms), "
                f"long prompt TTFT p50 {_f(lp['long_ttft_ms_p50'], '{:.0f}')} ms"
            )
            for a in lp["arrivals"]:
                lines.append(f"      arrival: running {a['running_streams']}, max gap {_f(a['max_gap_ms'], '{:.0f}')} ms, "
                             f"TTFT {_f(a['ttft_ms'], '{:.0f}')} ms {a.get('error') or ''}")  # fmt: skip
            if lp.get("profile"):
                lines.append(profile_line(lp["profile"]))
        cv = sysres.get("conversation")
        if cv:
            ttfts = " ".join(_f(t["ttft_ms"], "{:.0f}") for t in cv["turns"])
            lines.append(f"  conversation TTFT per turn (ms): {ttfts}")
        for row in sysres.get("rss", []):
            lines.append(f"  peak RSS {row['peak_rss_mib']:8.1f} MiB  pid {row['pid']} {row['name']}: {row['cmd'][:90]}")
    eng = results.get("engine")
    if eng:
        lines.append("\n== engine, in process (no server) ==")
        for e in eng.get("raw", []):
            if "error" in e:
                lines.append(f"  raw batched decode: {e['error']}")
            else:
                lines.append(f"  raw batched decode, {e['sequences']:>2} seqs: {e['tok_s']:7.1f} tok/s decode "
                             f"({e['tok_s_with_prefill']:.1f} with prefill)")  # fmt: skip
        for e in eng.get("raw_nosample", []):
            if "tok_s" in e:
                lines.append(f"  raw batched decode, no sampling, {e['sequences']:>2} seqs: {e['tok_s']:7.1f} tok/s decode")
        for e in eng.get("llama_cpp_batched_bench", []):
            if "tok_s" in e:
                lines.append(f"  llama.cpp batched-bench (llama-server's engine), {e['sequences']:>2} seqs: {e['tok_s']:7.1f} tok/s decode")
            else:
                lines.append(f"  llama.cpp batched-bench: {e.get('error')}")
        s = eng.get("single")
        if s and "tok_s" in s:
            lines.append(f"  single-sequence Llama:       {s['tok_s']:7.1f} tok/s decode ({s['tok_s_with_prefill']:.1f} with prefill)")
    ov = results.get("overhead")
    if ov:
        lines.append("\n== gateway overhead (fake engine) ==")
        if ov.get("error"):
            lines.append(f"  FAILED: {ov['error']}")
        else:
            for side in ("direct", "gateway"):
                d = ov[side]
                lines.append(
                    f"  {side:8} 64 streams {d['stream64']['tok_s']:9.0f} tok/s ({_f(d['stream64']['tokens_per_chunk'], '{:.1f}')} tok/chunk)"
                    f" | 1 stream {d['stream1']['tok_s']:8.0f} tok/s | 64 loops {d['requests64']['req_s']:7.0f} req/s"
                    f" | 1-token RTT p50 {_f(d['rtt1']['rtt_ms_p50'], '{:.2f}')} ms  cpu {d['stream64']['cpu_share']}"
                )
            for pc in ov.get("paced", []):
                d, g = pc["direct"], pc["gateway"]
                lines.append(f"  paced {pc['tps']:5.0f} ticks/s x 64 (offered {pc['offered_tok_s']:6.0f} tok/s): direct {d['tok_s']:7.0f} tok/s"
                             f" ITL p50/p95 {_f(d['itl_ms_p50'])}/{_f(d['itl_ms_p95'])} ms | gateway {g['tok_s']:7.0f} tok/s"
                             f" ITL p50/p95 {_f(g['itl_ms_p50'])}/{_f(g['itl_ms_p95'])} ms, {_f(g['tokens_per_chunk'], '{:.2f}')} tok/event")  # fmt: skip
            dv = ov["derived"]
            lines.append(f"  gateway sustains {_f(dv.get('gateway_tok_s_64_one_per_chunk'), '{:.0f}')} tok/s at 64 streams with one token per SSE event")
            lines.append(f"  added per request {_f(dv['added_ms_per_request'], '{:.2f}')} ms; per token at 64 streams "
                         f"{_f(dv['added_us_per_token_64'], '{:.1f}')} us, at 1 stream {_f(dv['added_us_per_token_1'], '{:.1f}')} us")  # fmt: skip
    r = results.get("ratios")
    if r:
        lines.append("\n== ratios (ours / peer, aggregate tok/s) ==")
        for peer, v in r.items():
            if isinstance(v, dict) and "tok_s" in v:
                lines.append(f"  {_label(peer)}: " + "  ".join(f"{c}: {x:.2f}x" for c, x in sorted(v["tok_s"].items(), key=lambda kv: int(kv[0])))
                             + "   TTFT p50 speed-up: " + "  ".join(f"{c}: {x:.2f}x" for c, x in sorted(v["ttft_p50_speedup"].items(), key=lambda kv: int(kv[0]))))  # fmt: skip
                for c, xs in sorted(v.get("tok_s_paired_passes", {}).items(), key=lambda kv: int(kv[0])):
                    lines.append(f"      {c} streams, pass by pass: " + " ".join(f"{x:.2f}x" for x in xs))
            else:
                lines.append(f"  {_label(peer)}: " + "  ".join(f"{c}: {x:.2f}x" for c, x in sorted(v.items(), key=lambda kv: int(kv[0]))))
    t = results.get("targets")
    if t:
        lines.append("\n== targets ==")
        for what, met, figs in t:
            mark = "n/a " if met is None else ("MET " if met else "MISS")
            lines.append(f"  [{mark}] {what}: {figs}")
    return "\n".join(lines)


def markdown(results: dict) -> str:
    """Tables for BENCHMARKS.md."""
    meta = results.get("meta", {})
    out = [f"Run {meta.get('date')} on `{meta.get('host')}` ({meta.get('cpu')}, {meta.get('cores')} cores), "
           f"model `{meta.get('model_name')}` (`{Path(str(meta.get('model'))).name}`), {meta.get('threads')} threads each, {meta.get('ctx_per_seq')} tokens of context "
           f"per sequence, n_batch {meta.get('n_batch', '?')}, {meta.get('max_tokens')} new tokens per stream, greedy, "
           f"{meta.get('rounds')} wave(s) per level x {meta.get('repeat', 1)} interleaved pass(es) (medians). "
           f"Load average before the run: {meta.get('loadavg_start')}.", ""]  # fmt: skip
    systems = results.get("systems", {})
    levels = sorted({c for s in systems.values() for c in s.get("concurrency", {})}, key=int)
    out.append("| system | " + " | ".join(f"{c} streams tok/s" for c in levels) + " | TTFT p50 / p95 at 8 (ms) | ITL p50 / p95 at 8 (ms) |")
    out.append("|---|" + "---:|" * len(levels) + "---:|---:|")
    for name, s in systems.items():
        if s.get("error"):
            out.append(f"| {name} | failed: {s['error'][:60]} |")
            continue
        cc = s.get("concurrency", {})
        eight = cc.get("8", {})
        out.append(
            f"| {name} | " + " | ".join(_f(cc.get(c, {}).get("tok_s")) + ("*" if cc.get(c, {}).get("noisy") else "") for c in levels)
            + f" | {_f(eight.get('ttft_ms_p50'), '{:.0f}')} / {_f(eight.get('ttft_ms_p95'), '{:.0f}')}"
            + f" | {_f(eight.get('itl_ms_p50'))} / {_f(eight.get('itl_ms_p95'))} |"
        )
    if any(f.get("noisy") for s in systems.values() for f in s.get("concurrency", {}).values()):
        out.append("")
        out.append("\\* other processes used more than 0.1 of a core during at least one pass of this figure (noisy).")
        out.append("")
    eng = results.get("engine", {})
    if eng.get("raw"):
        by = {str(e["sequences"]): e.get("tok_s") for e in eng["raw"]}
        out.append("| raw batched decode (in process, no server) | " + " | ".join(_f(by.get(c)) for c in levels) + " | | |")
    if eng.get("raw_nosample") and "tok_s" in eng["raw_nosample"][0]:
        by = {str(e["sequences"]): e.get("tok_s") for e in eng["raw_nosample"]}
        out.append("| raw batched decode without sampling (ours' llama.cpp) | " + " | ".join(_f(by.get(c)) for c in levels) + " | | |")
    if eng.get("llama_cpp_batched_bench") and "tok_s" in eng["llama_cpp_batched_bench"][0]:
        by = {str(e["sequences"]): e.get("tok_s") for e in eng["llama_cpp_batched_bench"]}
        out.append("| llama-batched-bench (llama-server's llama.cpp, no server) | " + " | ".join(_f(by.get(c)) for c in levels) + " | | |")
    if (eng.get("single") or {}).get("tok_s"):
        out.append(f"| single-sequence `Llama` (in process) | {eng['single']['tok_s']:.1f} |" + " |" * (len(levels) - 1) + " | |")
    r = results.get("ratios", {})
    if r:
        out += ["", "| aggregate tok/s ratio | " + " | ".join(f"{c} streams" for c in levels) + " |", "|---|" + "---:|" * len(levels)]
        for peer, v in r.items():
            vals = v["tok_s"] if isinstance(v, dict) and "tok_s" in v else v
            out.append(f"| {_label(peer)} | " + " | ".join(_f(vals.get(c), "{:.2f}x") for c in levels) + " |")
    out += ["", "| system | long prompt: max gap of running streams (ms) | their usual ITL p50 (ms) | long prompt TTFT p50 (ms) "
            "| conversation TTFT turn 1 / 10 (ms) | peak RSS (MiB, per process) |", "|---|---:|---:|---:|---:|---|"]  # fmt: skip
    for name, s in systems.items():
        if s.get("error"):
            continue
        lp, cv = s.get("long_prompt") or {}, s.get("conversation") or {}
        rss = ", ".join(f"{row['name']} {row['peak_rss_mib']:.0f}" for row in s.get("rss", []))
        out.append(f"| {name} | {_f(lp.get('max_gap_ms'), '{:.0f}')} | {_f(lp.get('baseline_itl_ms_p50'))} | "
                   f"{_f(lp.get('long_ttft_ms_p50'), '{:.0f}')} | {_f(cv.get('ttft_ms_first'), '{:.0f}')} / "
                   f"{_f(cv.get('ttft_ms_last'), '{:.0f}')} | {rss} |")  # fmt: skip
    ov = results.get("overhead")
    if ov and not ov.get("error"):
        d, g, dv = ov["direct"], ov["gateway"], ov["derived"]
        out += ["", "| fake engine, 64 streams | streamed tok/s | req/s (1-token requests) | 1-token round trip p50 (ms) |",
                "|---|---:|---:|---:|",
                f"| worker alone (protocol client over ZeroMQ) | {d['stream64']['tok_s']:.0f} | {d['requests64']['req_s']:.0f} | {_f(d['rtt1']['rtt_ms_p50'], '{:.2f}')} |",
                f"| through the gateway (HTTP + SSE + ZeroMQ) | {g['stream64']['tok_s']:.0f} | {g['requests64']['req_s']:.0f} | {_f(g['rtt1']['rtt_ms_p50'], '{:.2f}')} |",
                "", "| fake engine paced, 64 streams | offered tok/s | worker alone tok/s, ITL p50 / p95 (ms) | through the gateway tok/s, ITL p50 / p95 (ms) | tokens per SSE event |",
                "|---|---:|---:|---:|---:|"]
        for pc in ov.get("paced", []):
            pd, pg = pc["direct"], pc["gateway"]
            out.append(f"| {pc['tps']:.0f} ticks/s | {pc['offered_tok_s']:.0f} | {pd['tok_s']:.0f}, {_f(pd['itl_ms_p50'])} / {_f(pd['itl_ms_p95'])} "
                       f"| {pg['tok_s']:.0f}, {_f(pg['itl_ms_p50'])} / {_f(pg['itl_ms_p95'])} | {_f(pg['tokens_per_chunk'], '{:.2f}')} |")  # fmt: skip
        out += ["", f"Gateway adds {_f(dv['added_ms_per_request'], '{:.2f}')} ms per request and "
                f"{_f(dv['added_us_per_token_64'], '{:.1f}')} µs of service time per streamed token at 64 streams."]  # fmt: skip
    t = results.get("targets")
    if t:
        out += ["", "| target | met | figure |", "|---|---|---|"]
        for what, met, figs in t:
            out.append(f"| {what} | {'n/a' if met is None else ('yes' if met else 'no')} | {figs} |")
    return "\n".join(out)
