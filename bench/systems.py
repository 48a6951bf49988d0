"""The systems under test, each an OpenAI-compatible HTTP server started as a child process.

- ours: `python -m barrel_inference.cli serve --config <bench TOML>` (gateway + one worker process)
- llama-server: llama.cpp's own server, built by bench.build, `--parallel N --cont-batching`
- llama-cpp-python: its bundled server (`python -m llama_cpp.server`, `--interrupt_requests False`)

Same model file, same threads, same context per sequence. Run one after another, never at once.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from barrel_inference.config import BUILTIN_MODEL_SETTINGS
from barrel_inference.hostinfo import has_amx

import aiohttp

from .procs import peak_rss


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def truth(value: str | None) -> bool | None:
    """A "true" / "false" option; None stays None (each system's default)."""
    return None if value is None else value == "true"


@dataclass
class Shape:
    """What every system gets: the same model, threads, per-sequence context and parallelism."""

    model_path: Path
    threads: int = 2
    ctx_per_seq: int = 4096
    parallel: int = 16
    n_batch: int = 512
    prefill_chunk: int = BUILTIN_MODEL_SETTINGS.prefill_chunk  # ours only: tokens of a new prompt per scheduler tick
    n_gpu_layers: int | None = None  # layers on the GPU (-1 = all); None: each system's default (CPU builds: none)
    flash_attn: str = "auto"  # llama.cpp's flash attention: auto / on / off (ours and llama-server)
    max_retained_tokens: int | None = None  # ours only: tokens idle sequences keep (None: the daemon's default)
    swa_full: bool = False  # sliding-window models keep every position (ours: swa_full; llama-server: --swa-full)
    idle_sequences: int | None = None  # ours only: sequence ids that hold idle caches (None: the daemon's default)
    # one KV buffer for all sequences or one per sequence (ours: kv_unified; llama-server: --kv-unified);
    # None: each system's default (ours "auto", llama-server one per sequence)
    kv_unified: bool | None = None
    kv_restore: str | None = None  # ours only: "exact" / "complete" (None: the daemon's default, exact)


@dataclass
class Server:
    name: str
    argv: list[str]
    base_url: str
    model_id: str  # the "model" field of requests
    ready_path: str
    log_path: Path
    env: dict[str, str] = field(default_factory=dict)
    stats_path: str | None = None  # ours: GET /api/stats?model=NAME
    proc: subprocess.Popen | None = None
    rss_rows: list[dict] = field(default_factory=list)

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")
        env = {**os.environ, **self.env}
        self.proc = subprocess.Popen(
            self.argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True,
        )  # fmt: skip
        log.close()

    async def wait_ready(self, timeout: float = 300.0) -> None:
        deadline = time.monotonic() + timeout
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as s:
            while time.monotonic() < deadline:
                if self.proc is not None and self.proc.poll() is not None:
                    raise RuntimeError(f"{self.name} exited with {self.proc.returncode}; see {self.log_path}")
                try:
                    async with s.get(self.base_url + self.ready_path) as r:
                        if r.status == 200:
                            return
                except (aiohttp.ClientError, asyncio.TimeoutError):
                    pass
                await asyncio.sleep(0.5)
        raise RuntimeError(f"{self.name} not ready after {timeout:.0f}s; see {self.log_path}")

    def sample_rss(self) -> list[dict]:
        """Peak RSS of the server and its children (read before stopping: the processes must be alive)."""
        if self.proc is not None and self.proc.poll() is None:
            rows = peak_rss(self.proc.pid)
            for row in rows:
                if "barrel_inference.worker" in row["cmd"]:
                    row["name"] = "worker"
                elif "barrel_inference.cli" in row["cmd"]:
                    row["name"] = "gateway"
            self.rss_rows = rows
        return self.rss_rows

    def pids(self) -> set[int]:
        from .procs import process_tree

        return set(process_tree(self.proc.pid)) if self.proc and self.proc.poll() is None else set()

    def stop(self, timeout: float = 20.0) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        pgid = self.proc.pid  # start_new_session: the server leads its own process group
        try:
            os.killpg(pgid, signal.SIGTERM)
        except ProcessLookupError:
            return
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(pgid, signal.SIGKILL)
            self.proc.wait(10)
        # children of our group that outlived the leader
        try:
            os.killpg(pgid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def ours(shape: Shape, model_name: str, cache_dir: Path, work: Path) -> Server:
    port = free_port()
    run_dir = work / "run"
    run_dir.mkdir(parents=True, exist_ok=True)
    config = work / "ours.toml"
    config.write_text(
        "\n".join([
            'host = "127.0.0.1"',
            f"port = {port}",
            f'model_cache_dir = "{cache_dir}"',
            f'runtime_dir = "{run_dir}"',
            f'default_model = "{model_name}"',
            "embed_default_model = false",
            f'preload = ["{model_name}"]',
            'log_level = "warning"',
            "max_queue = 1024",
            "",
            # per-model settings win over what the registry read from the GGUF (its n_batch, n_ctx)
            f'[models."{model_name}"]',
            f"n_seq_max = {shape.parallel}",
            f"n_ctx = {shape.ctx_per_seq}",
            f"n_batch = {shape.n_batch}",
            f"n_ubatch = {shape.n_batch}",
            f"threads = {shape.threads}",
            f"prefill_chunk = {shape.prefill_chunk}",
            *([f"n_gpu_layers = {shape.n_gpu_layers}"] if shape.n_gpu_layers is not None else []),
            f'flash_attn = "{shape.flash_attn}"',
            *([f"max_retained_tokens = {shape.max_retained_tokens}"] if shape.max_retained_tokens is not None else []),
            *(["swa_full = true"] if shape.swa_full else []),
            *([f"idle_sequences = {shape.idle_sequences}"] if shape.idle_sequences is not None else []),
            *([f"kv_unified = {str(shape.kv_unified).lower()}"] if shape.kv_unified is not None else []),
            *([f'kv_restore = "{shape.kv_restore}"'] if shape.kv_restore is not None else []),
            "",
        ])
    )  # fmt: skip
    return Server(
        name="ours",
        argv=[sys.executable, "-m", "barrel_inference.cli", "serve", "--config", str(config)],
        base_url=f"http://127.0.0.1:{port}",
        model_id=model_name,
        ready_path="/health",
        log_path=work / "ours.log",
        env={"BARREL_INFERENCE_CONFIG": str(config)},
        stats_path=f"/api/stats?model={model_name}",
    )


def llama_server(shape: Shape, binary: Path, work: Path) -> Server:
    port = free_port()
    argv = [
        str(binary), "-m", str(shape.model_path), "--host", "127.0.0.1", "--port", str(port),
        "-t", str(shape.threads), "-tb", str(shape.threads),
        # llama-server divides -c among its slots: give each slot the same context as ours
        "-c", str(shape.ctx_per_seq * shape.parallel), "--parallel", str(shape.parallel), "--cont-batching",
        "-b", str(shape.n_batch), "-ub", str(shape.n_batch), "--flash-attn", shape.flash_attn,
        *(["--swa-full"] if shape.swa_full else []),
        *(["--kv-unified"] if shape.kv_unified else ["--no-kv-unified"] if shape.kv_unified is False else []),
        # built-in gemma template (with jinja on, --chat-template would be read as Jinja text)
        "--no-jinja", "--chat-template", "gemma", "--no-webui", "--alias", "bench",
        # on CPUs with AMX llama.cpp's repacked (AMX) weight layouts crash it: the same choice as our
        # extra_buffers = "auto" (no repack there), so both run the same kernels
        *(["--no-repack"] if has_amx() else []),
        *(["-ngl", str(_ngl(shape.n_gpu_layers))] if shape.n_gpu_layers is not None else []),
    ]  # fmt: skip
    return Server(
        name="llama-server",
        argv=argv,
        base_url=f"http://127.0.0.1:{port}",
        model_id="bench",
        ready_path="/health",
        log_path=work / "llama-server.log",
    )


def _ngl(n: int) -> int:
    """llama.cpp's -ngl for our n_gpu_layers: -1 (all) is a count above any model's layers."""
    return n if n >= 0 else 999


def llama_cpp_python(shape: Shape, work: Path) -> Server:
    port = free_port()
    argv = [
        sys.executable, "-m", "llama_cpp.server", "--model", str(shape.model_path), "--model_alias", "bench",
        "--host", "127.0.0.1", "--port", str(port),
        "--n_threads", str(shape.threads), "--n_threads_batch", str(shape.threads),
        "--n_ctx", str(shape.ctx_per_seq), "--n_batch", str(shape.n_batch),
        "--chat_format", "gemma", "--interrupt_requests", "False", "--verbose", "False",
        *(["--n_gpu_layers", str(shape.n_gpu_layers)] if shape.n_gpu_layers is not None else []),
    ]  # fmt: skip
    return Server(
        name="llama-cpp-python",
        argv=argv,
        base_url=f"http://127.0.0.1:{port}",
        model_id="bench",
        ready_path="/v1/models",
        log_path=work / "llama-cpp-python.log",
    )


def worker_alone(shape: Shape, model_name: str, endpoint: str, work: Path) -> Server:
    """Our worker process by itself (no gateway), bound at a tcp:// endpoint for the protocol client."""
    argv = [
        sys.executable, "-m", "barrel_inference.worker", "--bind", endpoint, "--model-path", str(shape.model_path),
        "--model-name", model_name, "--n-seq-max", str(shape.parallel), "--n-ctx", str(shape.ctx_per_seq),
        "--n-batch", str(shape.n_batch), "--n-ubatch", str(shape.n_batch), "--threads", str(shape.threads),
        "--prefill-chunk", str(shape.prefill_chunk), "--insecure",
        *(["--n-gpu-layers", str(shape.n_gpu_layers)] if shape.n_gpu_layers is not None else []),
    ]  # fmt: skip
    return Server(name="ours-worker", argv=argv, base_url="", model_id=model_name, ready_path="",
                  log_path=work / "ours-worker.log")  # fmt: skip
