"""The system report: what `bictl doctor` prints and GET /api/system answers.

Everything a user pastes into a bug report: the llama.cpp build (version, ggml's feature string,
the CMAKE_ARGS it was built with), the CPU features, whether extra buffer types (repack / AMX
layouts) are in use for each loaded model and why, GPU devices, threads, the cache dir and its free
space, and the engine fallbacks remembered. The llama.cpp facts come from the worker entry point
(`python -m barrel_inference.worker --system-info`), so neither the gateway nor the CLI loads
llama.cpp itself.
"""

from __future__ import annotations

import asyncio
import json
import platform
import shutil
import sys
from pathlib import Path
from typing import Any, Sequence

from .hostinfo import cpu_count, cpu_flags, cpu_model, cpu_signature, has_amx, llama_build_id, recorded_build_flags

# the CPU features that decide which llama.cpp kernels run
NOTABLE_FLAGS = (
    "sse4_2", "avx", "avx2", "fma", "f16c", "avx_vnni", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16",
    "avx512_fp16", "amx_tile", "amx_int8", "amx_bf16", "asimd", "asimddp", "sve", "i8mm",
)  # fmt: skip


async def engine_facts(extra_buffers: str = "auto", *, python: str | None = None, timeout: float = 60.0,
                       command: Sequence[str] | None = None) -> dict:  # fmt: skip
    """The llama.cpp build's facts from a short-lived worker process ({"error": ...} if it fails)."""
    argv = list(command or [python or sys.executable, "-m", "barrel_inference.worker"])
    argv += ["--system-info", "--extra-buffers", extra_buffers]
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
        )
        out, err = await asyncio.wait_for(proc.communicate(), timeout)
    except (OSError, asyncio.TimeoutError) as exc:
        return {"error": f"could not run the worker for system info: {type(exc).__name__}: {exc}"}
    if proc.returncode != 0:
        how = f"signal {-proc.returncode}" if proc.returncode < 0 else f"exit code {proc.returncode}"
        return {"error": f"the worker's --system-info ended with {how}: {err.decode(errors='replace')[-300:].strip()}"}
    try:
        return json.loads(out.decode().strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {"error": "the worker's --system-info printed no JSON"}


def _disk(path: Path) -> dict:
    probe = path
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    try:
        usage = shutil.disk_usage(probe)
    except OSError as exc:
        return {"path": str(path), "error": str(exc)}
    return {"path": str(path), "exists": path.exists(), "free_bytes": usage.free, "total_bytes": usage.total}


def build_report(settings: Any, engine: dict, *, fallbacks: list[dict], models: list[dict], version: str) -> dict:
    flags = cpu_flags()
    defaults = settings.model_settings("")
    devices = engine.get("devices") or []
    return {
        "barrel_inference": version,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "llama_cpp": {
            "llama_cpp_python": engine.get("llama_cpp_python"),
            "build_id": llama_build_id(),
            "build_flags": recorded_build_flags() or "unknown (not installed by scripts/setup)",
            "system_info": engine.get("system_info"),
            "features": engine.get("features") or {},
            "supports_gpu_offload": engine.get("supports_gpu_offload"),
            **({"error": engine["error"]} if "error" in engine else {}),
        },
        "cpu": {
            "model": cpu_model(),
            "signature": cpu_signature(),
            "cores": cpu_count(),
            "amx": has_amx(flags),
            "flags": [f for f in NOTABLE_FLAGS if f in flags],
        },
        "gpu": {"devices": [d for d in devices if d.get("type") != "cpu"]},
        "devices": devices,
        "engine": {
            "extra_buffers_setting": defaults.extra_buffers,
            "extra_buffers": engine.get("extra_buffers"),  # what the setting resolves to on this CPU
            "threads": defaults.threads or cpu_count(),
            "n_seq_max": defaults.n_seq_max,
            "n_ctx": defaults.n_ctx,
        },
        "cache_dir": _disk(settings.cache_dir()),
        "runtime_dir": str(settings.run_dir()),
        "fallbacks": fallbacks,
        "models": models,
    }


def model_entry(info: Any) -> dict:
    """A loaded model's engine facts (gateway.workers.RunningModel)."""
    buffers = list(getattr(info, "weight_buffers", None) or [])
    return {
        "name": info.name,
        "pid": info.pid,
        "profile": info.engine_profile,
        "extra_buffers": info.extra_buffers,
        "reason": info.engine_reason,
        "weight_buffers": buffers,
        "amx_in_use": "AMX" in buffers,
        "repack_in_use": any(b.endswith("_REPACK") for b in buffers),
        "kv_selftest": getattr(info, "kv_selftest", None),
        "kv_unified": getattr(info, "kv_unified", None),
        "kv_layout": getattr(info, "kv_layout", ""),
    }


def kv_layout_text(unified: bool | None, why: str) -> str:
    """One line on the KV layout a model got (kvlayout.py)."""
    if unified is None:
        return "unknown (an older worker)"
    return ("one buffer for all sequences" if unified else "a buffer per sequence") + (f" ({why})" if why else "")


def kv_selftest_text(test: dict | None) -> str:
    """One line on the load-time KV save/restore check and what the tiers restore under kv_restore."""
    if not test:
        return "off (no RAM tier)"

    def probe(p: dict) -> str:
        if p["exact"]:
            return f"{p['tokens']} tokens exact"
        one = "; exact at one thread" if p.get("complete") else ""
        relaid = "; exact relaid" if p.get("relayout") else ""
        return f"{p['tokens']} tokens off by {p['max_abs_diff']:.3g}{one}{relaid}"

    probes = ", ".join(probe(p) for p in test.get("probes", []))
    policy = test.get("kv_restore", "exact")  # "exact" / "complete"; an older worker's test has none
    limit = test.get("restore_up_to", test.get("exact_up_to"))
    verdict = policy if limit is None else (f"not {policy}: tiers off" if limit == 0 else f"{policy} up to {limit} tokens (longer states recomputed)")
    if test.get("relayout"):  # kvselftest.py: what makes restores exact where they are not in place
        verdict += ", sequences relaid as their restores lie before they go on"
    fa = test.get("flash_attn")
    hint = f"; flash_attn {fa}" if fa else ""
    if policy == "exact" and limit is not None and test.get("complete_up_to", 0) is None:
        hint += ' (every state is complete: kv_restore = "complete" restores them at any length)'
    elif limit is not None and fa and fa != "off":
        hint += ' (flash_attn = "off" makes restores exact on sliding-window models, at some speed)'
    if policy == "complete" and test.get("exact_up_to") is not None and limit is None and not test.get("relayout"):
        hint += f"; bit for bit up to {test['exact_up_to']} tokens"
    return f"{verdict} ({probes}{hint})"


def render_text(report: dict) -> str:
    """The report for a terminal."""
    ll, cpu, eng, cache = report["llama_cpp"], report["cpu"], report["engine"], report["cache_dir"]
    lines = [
        f"barrel-inference {report['barrel_inference']}  (python {report['python']}, {report['platform']})",
        f"llama.cpp:      llama-cpp-python {ll.get('llama_cpp_python')}, build {ll.get('build_id')}",
        f"  build flags:  {ll.get('build_flags')}",
        f"  ggml:         {ll.get('system_info') or ll.get('error')}",
        f"CPU:            {cpu['model']} ({cpu['cores']} cores), signature {cpu['signature']}",
        f"  features:     {' '.join(cpu['flags']) or '-'}" + ("  [AMX]" if cpu["amx"] else ""),
    ]
    gpus = report["gpu"]["devices"]
    if gpus:
        for d in gpus:
            mem = d.get("memory_total") or 0
            lines.append(f"GPU:            {d.get('name')} ({d.get('description')}), {mem / 2**30:.1f} GiB")
    else:
        lines.append("GPU:            none seen by llama.cpp" + ("" if ll.get("supports_gpu_offload") else " (CPU-only build)"))
    chosen = eng.get("extra_buffers") or {}
    lines += [
        f"extra buffers:  setting {eng['extra_buffers_setting']!r} -> {'on' if chosen.get('extra_buffers') else 'off'}"
        + (f" ({chosen.get('reason')})" if chosen.get("reason") else ""),
        f"threads:        {eng['threads']}   sequences: {eng['n_seq_max']}   n_ctx: {eng['n_ctx']}",
        f"cache dir:      {cache['path']}"
        + (f"  ({cache['free_bytes'] / 2**30:.1f} GiB free of {cache['total_bytes'] / 2**30:.1f})" if "free_bytes" in cache else ""),
    ]
    if report["models"]:
        for m in report["models"]:
            lines.append(
                f"model {m['name']}: profile {m['profile']}, extra buffers {'on' if m['extra_buffers'] else 'off'}, "
                f"weights in {', '.join(m['weight_buffers']) or '?'} ({m['reason']})"
            )
            lines.append(f"  KV restore:   {kv_selftest_text(m.get('kv_selftest'))}")
            lines.append(f"  KV layout:    {kv_layout_text(m.get('kv_unified'), m.get('kv_layout', ''))}")
    else:
        lines.append("models:         none loaded")
    if report["fallbacks"]:
        for f in report["fallbacks"]:
            here = "applies here" if f.get("applies") else "other build/CPU"
            lines.append(f"fallback:       {f.get('model')}: {f.get('profile')} after {f.get('signal')} ({here}) - {f.get('reason')}")
    else:
        lines.append("fallbacks:      none remembered")
    return "\n".join(lines)
