"""Entry point: python -m barrel_inference.worker --bind ENDPOINT --model-path PATH --model-name NAME ..."""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time


def _truth(value: str) -> bool:
    v = value.strip().lower()
    if v in ("1", "true", "yes", "on"):
        return True
    if v in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {value!r}")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="barrel_inference.worker", description="barrel-inference model worker")
    p.add_argument("--bind", required=True, help="ipc:///path/to.sock or tcp://host:port")
    p.add_argument("--model-path", default="")
    p.add_argument("--model-name", required=True)
    p.add_argument("--n-seq-max", type=int, default=4)
    p.add_argument("--n-ctx", type=int, default=8192, help="context of one sequence (prompt + output)")
    p.add_argument("--n-batch", type=int, default=512)
    p.add_argument("--n-ubatch", type=int, default=None)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--prefill-chunk", type=int, default=256)
    p.add_argument("--chat-template", default=None, help="a built-in template name or Jinja text")
    p.add_argument("--n-gpu-layers", type=int, default=None, help="layers to offload (-1 = all); needs a GPU build")
    p.add_argument("--main-gpu", type=int, default=None)
    p.add_argument("--use-mmap", type=_truth, default=None, metavar="true|false")
    p.add_argument("--use-mlock", type=_truth, default=None, metavar="true|false")
    p.add_argument("--max-retained-tokens", type=int, default=None,
                   help="tokens idle sequences keep in the KV cache together (least recently used dropped first)")
    p.add_argument("--kv-ram-bytes", type=int, default=0, help="RAM tier of saved sequence states (0 = off)")
    p.add_argument("--kv-disk-bytes", type=int, default=0, help="disk tier of saved sequence states (0 = off)")
    p.add_argument("--kv-dir", default=None, help="directory of the disk tier")
    p.add_argument("--exit-with-parent", action="store_true", help="exit when the spawning process (the gateway) dies")
    p.add_argument("--fake", action="store_true", help="fake engine: no model, tokens as fast as asked")
    p.add_argument("--fake-tps", type=float, default=0.0, help="fake engine ticks per second (0 = unthrottled)")
    return p.parse_args(argv)


def _log(event: str, **fields) -> None:
    """One JSON line per event on stderr; the gateway forwards it into its own log."""
    rec = {"event": event, "ts": round(time.time(), 3), "component": "worker", **fields}
    try:
        sys.stderr.write(json.dumps(rec, default=str) + "\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass


def build_engine(args):
    if args.fake:
        from .fake import FakeEngine

        return FakeEngine(n_ctx=args.n_ctx, n_seq_max=args.n_seq_max, n_batch=args.n_batch, tps=args.fake_tps)
    from .engine import LlamaEngine

    return LlamaEngine(
        args.model_path, n_ctx=args.n_ctx, n_seq_max=args.n_seq_max, n_batch=args.n_batch,
        n_ubatch=args.n_ubatch, threads=args.threads, n_gpu_layers=args.n_gpu_layers, main_gpu=args.main_gpu,
        use_mmap=args.use_mmap, use_mlock=args.use_mlock,
    )  # fmt: skip


def main(argv=None) -> int:
    args = parse_args(argv)
    from .engine_api import EngineError
    from .server import WorkerServer
    from .templates import ChatTemplate, TemplateError

    t0 = time.perf_counter()
    try:
        engine = build_engine(args)
        bos = engine.token_text(getattr(engine, "bos", -1)) if hasattr(engine, "bos") else ""
        eos = engine.token_text(getattr(engine, "eos", -1)) if hasattr(engine, "eos") else ""
        template = ChatTemplate.choose(args.chat_template, engine.chat_template, engine.architecture, bos, eos)
    except (EngineError, TemplateError) as exc:
        _log("worker_failed", error=str(exc), model=args.model_name)
        return 2
    n_ctx = min(args.n_ctx, engine.n_ctx)
    server = WorkerServer(engine, template, model=args.model_name, bind=args.bind, n_ctx=n_ctx,
                          prefill_chunk=args.prefill_chunk, log=_log, max_retained_tokens=args.max_retained_tokens,
                          kv_ram_bytes=args.kv_ram_bytes, kv_disk_bytes=args.kv_disk_bytes, kv_dir=args.kv_dir)  # fmt: skip
    if args.exit_with_parent:
        server.watch_parent = os.getppid()
    _log("model_loaded", model=args.model_name, architecture=engine.architecture, n_ctx=n_ctx,
         n_seq_max=engine.n_seq_max, template=template.name, load_ms=round((time.perf_counter() - t0) * 1000, 1))  # fmt: skip

    def _term(signum, frame):
        server.stop()

    signal.signal(signal.SIGTERM, _term)
    signal.signal(signal.SIGINT, _term)
    try:
        server.serve()
    finally:
        engine.close()
    _log("worker_exit", model=args.model_name, pid=os.getpid())
    return 0


if __name__ == "__main__":
    sys.exit(main())
