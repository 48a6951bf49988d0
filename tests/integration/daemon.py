"""Start the real daemon (gateway process + worker processes) for integration tests."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

from barrel_inference.config import load_settings
from barrel_inference.registry import Registry


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Daemon:
    """`bictl serve` in a subprocess with its own cache and runtime dirs."""

    def __init__(self, root: Path, models: dict[str, Path], *, n_seq_max: int = 4, n_ctx: int = 1024,
                 threads: int = 2, extra: str = "", embed_default: bool = False, defaults: str = "",
                 env: dict[str, str] | None = None):  # fmt: skip
        self.root = Path(root)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.config = self.root / "config.toml"
        self.log_path = self.root / "daemon.log"
        self.config.write_text(
            f'host = "127.0.0.1"\nport = {self.port}\nmodel_cache_dir = "{self.root / "models"}"\n'
            f'runtime_dir = "{self.root / "run"}"\nembed_default_model = {str(embed_default).lower()}\n{extra}\n'
            f"[defaults]\nn_seq_max = {n_seq_max}\nn_ctx = {n_ctx}\nthreads = {threads}\nprefill_chunk = 128\n{defaults}\n"
        )
        self.env = dict(env or {})  # extra environment of the daemon (fault injection)
        settings = load_settings(self.config, env={})
        registry = Registry(settings)
        for name, path in models.items():
            registry.register_local(name, path)
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 60.0) -> "Daemon":
        if self.proc is not None and self.proc.poll() is None:
            raise RuntimeError("this daemon is running already")
        env = {k: v for k, v in os.environ.items() if not k.startswith("BARREL_INFERENCE_")} | self.env
        self._log = open(self.log_path, "a")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "barrel_inference.cli", "serve", "--config", str(self.config)],
            stdout=self._log, stderr=subprocess.STDOUT, env=env, start_new_session=True,
        )  # fmt: skip
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"daemon exited with {self.proc.returncode}:\n{self.log()}")
            try:
                if httpx.get(self.url + "/health", timeout=1.0).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise TimeoutError(f"daemon did not answer within {timeout}s:\n{self.log()}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def children(self) -> list[int]:
        """pids of the daemon's child processes (its workers)."""
        out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(self.proc.pid)], capture_output=True, text=True)
        return [int(p) for p in out.stdout.split()]

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self._log.close()

    def events(self, name: str) -> list[dict]:
        """The daemon's JSON log records named `name`, in order."""
        import json

        out = []
        for line in self.log().splitlines():
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if isinstance(rec, dict) and rec.get("event") == name:
                out.append(rec)
        return out

    def __enter__(self) -> "Daemon":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
