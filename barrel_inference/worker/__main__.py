"""Entry point: python -m barrel_inference.worker --bind ENDPOINT --model-path PATH --model-name NAME ..."""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time

import msgspec


def _layout(value: str) -> bool | str:
    return "auto" if value.strip().lower() == "auto" else _truth(value)


def _truth(value: str) -> bool:
    v = value.strip().lower()
    if v in ("1", "true", "yes", "on"):
        return True
    if v in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {value!r}")


def parse_args(argv=None) -> argparse.Namespace:
    from .kvselftest import RESTORE_POLICIES

    p = argparse.ArgumentParser(prog="barrel_inference.worker", description="barrel-inference model worker")
    p.add_argument("--system-info", action="store_true", help="print the llama.cpp build's facts as JSON and exit")
    p.add_argument("--bind", default="", help="ipc:///path/to.sock or tcp://host:port")
    p.add_argument("--model-path", default="")
    p.add_argument("--model-name", default="")
    p.add_argument("--n-seq-max", type=int, default=4)
    p.add_argument("--n-ctx", type=int, default=8192, help="context of one sequence (prompt + output)")
    p.add_argument("--n-batch", type=int, default=512)
    p.add_argument("--n-ubatch", type=int, default=None)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--prefill-chunk", type=int, default=512)
    p.add_argument("--chat-template", default=None, help="a built-in template name or Jinja text")
    p.add_argument("--go-template", default=None,
                   help="an Ollama (Go text/template) model template, a Modelfile's TEMPLATE: rendered instead of --chat-template")
    p.add_argument("--n-gpu-layers", type=int, default=None, help="layers to offload (-1 = all); needs a GPU build")
    p.add_argument("--main-gpu", type=int, default=None)
    p.add_argument("--use-mmap", type=_truth, default=None, metavar="true|false")
    p.add_argument("--use-mlock", type=_truth, default=None, metavar="true|false")
    p.add_argument("--content-special", type=_truth, default=False, metavar="true|false",
                   help="parse control tokens inside message contents too (the old, injectable behaviour)")
    p.add_argument("--max-retained-tokens", type=int, default=None,
                   help="tokens idle sequences keep in the KV cache together (least recently used dropped first)")
    p.add_argument("--idle-sequences", type=int, default=None,
                   help="sequence ids beyond --n-seq-max that only hold idle caches, with --max-retained-tokens "
                        "cells of their own (default: as many as --n-seq-max; 0: none)")
    p.add_argument("--tail-grace-ms", type=float, default=30.0,
                   help="how long a finished request's last token waits to join other work in the cache (0: "
                        "decoded at once; the next turn of its conversation arriving meanwhile takes it instead)")
    p.add_argument("--kv-ram-bytes", type=int, default=0, help="RAM tier of saved sequence states (0 = off)")
    p.add_argument("--kv-disk-bytes", type=int, default=0, help="disk tier of saved sequence states (0 = off)")
    p.add_argument("--kv-dir", default=None, help="directory of the disk tier")
    p.add_argument("--kv-restore", choices=RESTORE_POLICIES, default="exact",
                   help="saved states the tiers restore: exact (bit for bit at these threads) or complete (at one "
                        "thread: every attended cell; flash attention may sum them in other shares)")
    p.add_argument("--engine-profile", choices=("default", "safe"), default="default",
                   help="safe: llama.cpp's extra buffer types off whatever --extra-buffers says")
    p.add_argument("--extra-buffers", choices=("auto", "on", "off"), default="auto",
                   help="llama.cpp's extra buffer types (CPU repack, AMX); auto = off on CPUs with AMX")
    p.add_argument("--flash-attn", choices=("auto", "on", "off"), default="auto",
                   help="llama.cpp's flash attention (off: KV states restore exactly on sliding-window models)")
    p.add_argument("--swa-full", type=_truth, default=False, metavar="true|false",
                   help="sliding-window layers keep every position (prefixes can be cut or copied at any length)")
    p.add_argument("--kv-unified", type=_layout, default="auto", metavar="auto|true|false",
                   help="one KV buffer for all sequences (false: a buffer of n_ctx cells per sequence id; "
                        "auto: that where its memory is small)")
    p.add_argument("--no-warmup", action="store_true", help="skip the warm-up decode before ready")
    p.add_argument("--curve-secret-key", default=None, metavar="FILE",
                   help="this worker's CURVE secret key (NAME.key_secret from `bictl worker keygen`); needs --curve-clients")
    p.add_argument("--curve-clients", default=None, metavar="DIR", help="directory of the gateways' public keys (*.key) admitted")
    p.add_argument("--insecure", action="store_true", help="allow a tcp:// bind without CURVE keys")
    p.add_argument("--cpu-affinity", default=None, metavar="CORES",
                   help="pin the worker to these CPU cores (0-7, 0-3,8-11) before the model loads; its default "
                        "thread count is then their number")
    p.add_argument("--exit-with-parent", action="store_true", help="exit when the spawning process (the gateway) dies")
    p.add_argument("--fake", action="store_true", help="fake engine: no model, tokens as fast as asked")
    p.add_argument("--fake-tps", type=float, default=0.0, help="fake engine ticks per second (0 = unthrottled)")
    from .toolhook import add_arguments

    add_arguments(p)
    args = p.parse_args(argv)
    if not args.system_info and (not args.bind or not args.model_name):
        p.error("--bind and --model-name are required")
    if bool(args.curve_secret_key) != bool(args.curve_clients):
        p.error("--curve-secret-key and --curve-clients go together")
    if args.bind.startswith("tcp://") and not args.curve_secret_key and not args.insecure:
        p.error(f"refusing to serve {args.bind} without CURVE keys (anyone who reaches the port could drive the model): "
                "give --curve-secret-key and --curve-clients (bictl worker keygen), or --insecure")
    return args


def _log(event: str, **fields) -> None:
    """One JSON line per event on stderr; the gateway forwards it into its own log."""
    rec = {"event": event, "ts": round(time.time(), 3), "component": "worker", **fields}
    try:
        sys.stderr.write(json.dumps(rec, default=str) + "\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass


def pin_cores(spec: str) -> set[int]:
    """Pin this process (and the threads it starts later) to the cores of `spec` ("0-3,8")."""
    from ..devices import parse_cores

    cores = set(parse_cores(spec))
    if not hasattr(os, "sched_setaffinity"):
        raise OSError("this platform cannot pin a process to cores (no sched_setaffinity)")
    os.sched_setaffinity(0, cores)
    return cores


def build_engine(args, extra_buffers: bool):
    if args.fake:
        from .fake import FakeEngine

        return FakeEngine(n_ctx=args.n_ctx, n_seq_max=args.n_seq_max, n_batch=args.n_batch, tps=args.fake_tps,
                          n_seq_idle=idle_room(args)["n_seq_idle"])  # fmt: skip
    from .engine import LlamaEngine

    return LlamaEngine(
        args.model_path, n_ctx=args.n_ctx, n_seq_max=args.n_seq_max, n_batch=args.n_batch,
        n_ubatch=args.n_ubatch, threads=args.threads, n_gpu_layers=args.n_gpu_layers, main_gpu=args.main_gpu,
        use_mmap=args.use_mmap, use_mlock=args.use_mlock, extra_buffers=extra_buffers,
        flash_attn=args.flash_attn, swa_full=args.swa_full, kv_unified=args.kv_unified, **idle_room(args),
    )  # fmt: skip


def idle_room(args) -> dict:
    """Sequence ids and KV cells for idle caches: as many ids as running sequences unless told,
    and room for max_retained_tokens (unbounded: n_ctx for each)."""
    n = args.n_seq_max if args.idle_sequences is None else max(0, args.idle_sequences)
    cells = args.max_retained_tokens if args.max_retained_tokens is not None else n * args.n_ctx
    return {"n_seq_idle": n, "idle_cells": max(0, cells) if n else 0}


def system_info(fake: bool = False, extra_buffers: str = "auto") -> dict:
    """The engine build's facts (llama.cpp version, ggml features, devices) and what `extra_buffers`
    resolves to on this CPU: what `bictl doctor` and GET /api/system show."""
    from .engine_profile import resolve

    profile = resolve("default", extra_buffers)
    chosen = {"setting": extra_buffers, "extra_buffers": profile.extra_buffers, "reason": profile.reason}
    if fake:
        return {"llama_cpp_python": "fake", "system_info": "", "features": {}, "devices": [], "extra_buffers": chosen}
    from .engine import system_info as engine_system_info

    return {**engine_system_info(), "extra_buffers": chosen}


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.system_info:
        sys.stdout.write(json.dumps(system_info(args.fake, args.extra_buffers)) + "\n")
        return 0
    from ..protocol import EngineInfo
    from .engine_api import EngineError
    from .engine_profile import resolve
    from .templates import ChatTemplate, TemplateError
    from .toolhook import from_args as tools_from_args
    from ..toolcalls import UnknownFormat

    t0 = time.perf_counter()
    if args.cpu_affinity:
        try:
            pin_cores(args.cpu_affinity)
        except (ValueError, OSError) as exc:
            _log("worker_failed", error=f"--cpu-affinity {args.cpu_affinity}: {exc}", model=args.model_name)
            return 2
        _log("cpu_affinity", model=args.model_name, cores=args.cpu_affinity)
    profile = resolve(args.engine_profile, args.extra_buffers)
    _log("engine_profile", model=args.model_name, profile=profile.name, extra_buffers=profile.extra_buffers,
         reason=profile.reason)  # fmt: skip
    try:
        engine = build_engine(args, profile.extra_buffers)
        bos = engine.token_text(getattr(engine, "bos", -1)) if hasattr(engine, "bos") else ""
        eos = engine.token_text(getattr(engine, "eos", -1)) if hasattr(engine, "eos") else ""
        template = ChatTemplate.choose(args.chat_template, engine.chat_template, engine.architecture, bos, eos,
                                       go_template=args.go_template)  # fmt: skip
        tools = tools_from_args(args, engine, template, _log)
    except (EngineError, TemplateError, UnknownFormat) as exc:
        _log("worker_failed", error=str(exc), model=args.model_name)
        return 2
    _log("kv_layout", model=args.model_name, kv_unified=engine.kv_unified, why=engine.kv_layout)
    info = EngineInfo(
        profile=profile.name, extra_buffers=profile.extra_buffers, reason=profile.reason,
        weight_buffers=engine.weight_buffers() if hasattr(engine, "weight_buffers") else [],
        kv_unified=engine.kv_unified, kv_layout=engine.kv_layout,
    )  # fmt: skip
    held: dict = {}

    def serve() -> None:
        held["rc"] = serve_engine(args, engine, template, tools, info, profile, t0, held)

    def _term(signum, frame):
        held["stop"] = True
        if "server" in held:
            held["server"].stop()

    signal.signal(signal.SIGTERM, _term)
    signal.signal(signal.SIGINT, _term)
    try:
        engine_thread(serve)  # the main thread only takes signals
    finally:
        engine.close()
    rc = held.get("rc", 1)  # 1: the engine thread died of an exception
    if rc != 0:
        return rc
    _log("worker_exit", model=args.model_name, pid=os.getpid())
    return 0


def engine_thread(work) -> None:
    """Run `work` (everything that decodes: warm-up, the KV self-test, the scheduler loop) on one
    thread of its own, and wait for it. llama.cpp's OpenMP builds give the first thread that
    computes a graph a fast thread team; a graph computed on any thread after that ran ~60 % slower
    here (22 against 36 ms a token on 2 cores, BENCHMARKS.md), so no decode may come first on
    another thread. (Embeddings compute on a thread of their own, which ends when it has no work:
    while it lives it throttles this one, see server.Embedder.)"""
    thread = threading.Thread(target=work, name="scheduler", daemon=True)
    thread.start()
    while thread.is_alive():
        thread.join(0.5)


def serve_engine(args, engine, template, tools, info, profile, t0: float, held: dict) -> int:
    """On the engine thread: warm up, build the server (its KV self-test), serve until stopped."""
    from ..protocol.curve import CurveError
    from .server import WorkerServer
    from .warmup import warm_up

    if not args.no_warmup:
        # an engine that crashes on this CPU crashes here, before hello, where the gateway can fall back
        try:
            ran = warm_up(engine, extra_buffers=profile.extra_buffers)
        except RuntimeError as exc:
            _log("worker_failed", error=f"warm-up failed: {exc}", model=args.model_name)
            return 3
        info = msgspec.structs.replace(info, warmup_ms=ran["ms"])
        _log("warmup_done", model=args.model_name, **ran)
    if not args.fake:
        facts = system_info()
        info = msgspec.structs.replace(info, system_info=facts["system_info"], llama_cpp_version=facts["llama_cpp_python"])
    n_ctx = min(args.n_ctx, engine.n_ctx)
    try:
        server = WorkerServer(
            engine, template, model=args.model_name, bind=args.bind, n_ctx=n_ctx, prefill_chunk=args.prefill_chunk,
            log=_log, tools=tools, engine_info=info, insecure=args.insecure, content_special=args.content_special,
            max_retained_tokens=args.max_retained_tokens, kv_ram_bytes=args.kv_ram_bytes, kv_disk_bytes=args.kv_disk_bytes,
            kv_dir=args.kv_dir, tail_grace_ms=args.tail_grace_ms, kv_restore=args.kv_restore,
            curve=(args.curve_secret_key, args.curve_clients) if args.curve_secret_key else None,
        )  # fmt: skip
    except CurveError as exc:
        _log("worker_failed", error=str(exc), model=args.model_name)
        return 2
    if args.exit_with_parent:
        server.watch_parent = os.getppid()
    held["server"] = server
    if held.get("stop"):
        return 0
    _log("model_loaded", model=args.model_name, architecture=engine.architecture, n_ctx=n_ctx, profile=profile.name,
         extra_buffers=profile.extra_buffers, weight_buffers=info.weight_buffers,
         n_seq_max=engine.n_seq_max, template=template.name, load_ms=round((time.perf_counter() - t0) * 1000, 1))  # fmt: skip
    server.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
