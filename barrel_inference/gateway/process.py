"""Worker processes: the options a model's worker starts with, its command line, and the process itself.

Precedence of a worker's engine options, lowest first: the built-in values
(config.BUILTIN_MODEL_SETTINGS), the manifest's `loader` (what the pull-time scan derived from the
GGUF), the operator's `[defaults]`, the manifest's `parameters` (num_ctx, num_batch, num_seq_max,
num_thread, ...), and last the operator's per-model section `[models."name"]`. n_ctx is capped by
the loader's n_ctx (the model's own context, clamped at pull time) whatever set it.
"""

from __future__ import annotations

import asyncio
import collections
import hashlib
import json
import os
import re
import signal
import sys
from pathlib import Path
from typing import Any, Sequence

import msgspec

from ..config import BUILTIN_MODEL_SETTINGS, ModelSettings, Settings

# manifest `parameters` key -> ModelSettings field
_PARAMETER_KEYS = {
    "num_ctx": "n_ctx", "num_batch": "n_batch", "num_seq_max": "n_seq_max", "num_thread": "threads",
    "n_gpu_layers": "n_gpu_layers", "num_gpu": "n_gpu_layers", "main_gpu": "main_gpu",
    "use_mmap": "use_mmap", "use_mlock": "use_mlock",
}  # fmt: skip
_LOADER_KEYS = ("n_batch", "n_ubatch", "n_seq_max", "threads", "prefill_chunk", "chat_template")
# signals that mean the engine itself crashed (bad kernel, bad weight layout), not a stop request
CRASH_SIGNALS = {signal.SIGSEGV: "SIGSEGV", signal.SIGILL: "SIGILL", signal.SIGBUS: "SIGBUS", signal.SIGABRT: "SIGABRT"}
_FLAGS = {
    "n_seq_max": "--n-seq-max",
    "n_ctx": "--n-ctx",
    "n_batch": "--n-batch",
    "n_ubatch": "--n-ubatch",
    "threads": "--threads",
    "prefill_chunk": "--prefill-chunk",
    "chat_template": "--chat-template",
    "n_gpu_layers": "--n-gpu-layers",
    "main_gpu": "--main-gpu",
    "use_mmap": "--use-mmap",
    "use_mlock": "--use-mlock",
    "content_special": "--content-special",
    "max_retained_tokens": "--max-retained-tokens",
    "idle_sequences": "--idle-sequences",
    "kv_ram_bytes": "--kv-ram-bytes",
    "kv_disk_bytes": "--kv-disk-bytes",
    "kv_restore": "--kv-restore",
    "extra_buffers": "--extra-buffers",
    "flash_attn": "--flash-attn",
    "swa_full": "--swa-full",
    "kv_unified": "--kv-unified",
}


def engine_options(settings: Settings, record: Any) -> ModelSettings:
    """The engine options of `record`'s worker (see the module doc for the precedence)."""
    opts = msgspec.structs.asdict(BUILTIN_MODEL_SETTINGS)
    loader = dict(getattr(record, "loader", None) or {})
    parameters = dict(getattr(record, "parameters", None) or {})
    for key in _LOADER_KEYS:
        if loader.get(key) is not None:
            opts[key] = loader[key]
    merged = msgspec.convert(opts, ModelSettings, strict=False).merged(settings.defaults)
    opts = msgspec.structs.asdict(merged)
    for key, field in _PARAMETER_KEYS.items():
        if parameters.get(key) is not None:
            opts[field] = parameters[key]
    merged = msgspec.convert(opts, ModelSettings, strict=False).merged(settings.models.get(record.name))
    if loader.get("n_ctx") and merged.n_ctx:
        merged = msgspec.structs.replace(merged, n_ctx=min(int(loader["n_ctx"]), merged.n_ctx))
    return merged


def worker_argv(command: Sequence[str], endpoint: str, record: Any, opts: ModelSettings, profile: str = "default") -> list[str]:
    argv = [*command, "--bind", endpoint, "--model-path", str(record.path), "--model-name", record.name]
    if profile != "default":
        argv += ["--engine-profile", profile]
    for field, flag in _FLAGS.items():
        value = getattr(opts, field)
        if value is not None:
            argv += [flag, str(value).lower() if isinstance(value, bool) else str(value)]
    return argv


TOOL_KEYS = ("tool_format", "thinking_start", "thinking_end")


def _tool_flags(settings: Settings, record: Any) -> dict:
    """The tool format and thinking markers a worker is started with: the manifest's scan, under the
    operator's [defaults] / [models."name"]."""
    loader = dict(getattr(record, "loader", None) or {})
    mine = settings.defaults.merged(settings.models.get(record.name))  # the operator's hand beats the scan
    out = {key: loader.get(key) for key in TOOL_KEYS}
    for key in TOOL_KEYS:
        if getattr(mine, key) is not None:
            out[key] = getattr(mine, key)
    return out


def tool_settings(settings: Settings, record: Any) -> dict:
    """What a worker of `record` will use for tool calls and thinking ({tool_format, thinking_start,
    thinking_end}), worked out as the worker does: its flags (`_tool_flags`), and where they name none,
    what it detects in the chat template it renders with (an operator's or the manifest's chat_template
    override; without one the GGUF's own, which the scan already read). /api/show's capabilities and
    the think / tools checks read this, so they agree with the worker."""
    from ..toolcalls import detect
    from ..toolcalls.reasoning import detect_thinking

    out = _tool_flags(settings, record)
    override = go_template(settings, record) or engine_options(settings, record).chat_template
    if override:
        if not out["tool_format"]:
            out["tool_format"] = detect(override)["tool_format"]
        if not (out["thinking_start"] and out["thinking_end"]):
            out.update(detect_thinking(override))
    return out


def go_template(settings: Settings, record: Any) -> str | None:
    """The Modelfile TEMPLATE (Go text/template) the model's worker renders with: one /api/create or /api/edit
    set (template_format "go"), unless the operator configured a chat_template for the model, which wins."""
    base = getattr(record, "base", None) or record  # a variant renders as its model does
    text = getattr(base, "template", None)
    if not text or getattr(base, "template_format", "") != "go":
        return None
    mine = settings.defaults.merged(settings.models.get(base.name))
    return None if mine.chat_template else text


def template_argv(settings: Settings, record: Any) -> list[str]:
    text = go_template(settings, record)
    return ["--go-template", text] if text else []


def tool_argv(settings: Settings, record: Any) -> list[str]:
    """The worker's tool-call and thinking flags: the manifest's format and markers, the operator's
    format plugins, and the replay map's file under the model cache dir (or tool_replay_dir)."""
    loader = _tool_flags(settings, record)
    argv: list[str] = []
    if loader.get("tool_format"):
        argv += ["--tool-format", str(loader["tool_format"])]
    if loader.get("thinking_start") and loader.get("thinking_end"):
        argv += ["--thinking-start", str(loader["thinking_start"]), "--thinking-end", str(loader["thinking_end"])]
    if settings.tool_call_formats:
        argv += ["--tool-call-formats", json.dumps(settings.tool_call_formats)]
    base = Path(settings.tool_replay_dir).expanduser() if settings.tool_replay_dir else settings.cache_dir() / "tool-replay"
    argv += ["--tool-replay-path", str(base / f"{slug(record.name)}.sqlite"),
             "--tool-replay-ttl-ms", str(settings.tool_replay_ttl_ms),
             "--tool-replay-gc-interval-ms", str(settings.tool_replay_gc_interval_ms)]  # fmt: skip
    return argv


def slug(name: str) -> str:
    """A file-name-safe form of a model name ('hf.co/org/m:q4' -> 'hf.co-org-m-q4')."""
    return re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-") or "model"


IPC_PATH_MAX = 100  # sockaddr_un paths hold 107 bytes on Linux, 103 on macOS


def replica_slug(name: str, replica: int = 0) -> str:
    """The file-name stem of a model's worker: `slug`, with `-r{n}` for replicas after the first."""
    return slug(name) + (f"-r{replica}" if replica else "")


def ipc_endpoint(run_dir: "os.PathLike[str] | str", name: str, replica: int = 0) -> str:
    """`ipc://{run_dir}/{slug}.sock` (replica n > 0: `{slug}-r{n}.sock`), with the slug shortened (and
    hashed) where the path would be too long."""
    base = str(run_dir).rstrip("/")
    suffix = f"-r{replica}" if replica else ""
    path = f"{base}/{slug(name)}{suffix}.sock"
    if len(path.encode()) > IPC_PATH_MAX:
        digest = hashlib.sha256(name.encode()).hexdigest()[:12]
        room = max(0, IPC_PATH_MAX - len(base.encode()) - len(digest) - len(suffix) - 7)
        path = f"{base}/{slug(name)[:room]}-{digest}{suffix}.sock"
    return "ipc://" + path


def default_command() -> list[str]:
    return [sys.executable, "-m", "barrel_inference.worker", "--exit-with-parent"]


class WorkerProcess:
    """One spawned worker: its output goes to the gateway's log; `wait` ends when it exits."""

    def __init__(self, name: str, argv: list[str], logger: Any, env: dict[str, str] | None = None, replica: int | None = None) -> None:
        self.name = name
        self.argv = argv
        self.env = dict(env or {})  # set over the gateway's environment (a replica's device)
        self.replica = replica  # its index among the model's replicas (None: the model's only worker)
        self._log = logger
        self._proc: asyncio.subprocess.Process | None = None
        self._pump: asyncio.Task | None = None
        self.tail: collections.deque[str] = collections.deque(maxlen=20)
        self.engine_profile: dict = {}  # the worker's "engine_profile" event: profile, extra_buffers, reason
        self.failure: str | None = None  # the worker's own "worker_failed" reason (about the model, not clients)

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    @property
    def returncode(self) -> int | None:
        return self._proc.returncode if self._proc else None

    async def start(self) -> None:
        self._proc = await asyncio.create_subprocess_exec(
            *self.argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **self.env},
            start_new_session=True,  # a Ctrl-C at the terminal reaches the gateway, which stops workers in order
        )
        self._pump = asyncio.create_task(self._pump_output(), name=f"worker-output-{self.name}")
        self._log.info("worker_started", model=self.name, pid=self._proc.pid, **self._replica_field())

    async def wait(self) -> int:
        assert self._proc is not None
        rc = await self._proc.wait()
        if self._pump is not None:
            try:
                await asyncio.wait_for(asyncio.shield(self._pump), 2.0)
            except (asyncio.TimeoutError, Exception):
                pass
        return rc

    @property
    def crash_signal(self) -> str | None:
        """The name of the signal that killed the worker where it means an engine crash (SIGSEGV, ...)."""
        rc = self.returncode
        if rc is None or rc >= 0:
            return None
        try:
            return CRASH_SIGNALS.get(signal.Signals(-rc))
        except ValueError:
            return None

    def describe_exit(self, when: str = "") -> str:
        """How the worker ended, for clients: no worker output (it may hold other clients' data)."""
        rc = self.returncode
        if rc is not None and rc < 0:
            try:
                name = signal.Signals(-rc).name
            except ValueError:
                name = "?"
            how = f"was killed by signal {-rc} ({name})"
        else:
            how = f"exited with code {rc}"
        return f"worker for {self.name} {how}{when}" + (f": {self.failure}" if self.failure else "")

    def _replica_field(self) -> dict:
        return {"replica": self.replica} if self.replica is not None else {}

    def last_output(self, n: int = 5) -> list[str]:
        """The worker's last lines of output, for the server log only."""
        return list(self.tail)[-n:]

    async def stop(self, timeout: float = 10.0) -> int | None:
        """SIGTERM, wait up to `timeout`, then SIGKILL."""
        proc = self._proc
        if proc is None or proc.returncode is not None:
            return proc.returncode if proc else None
        try:
            proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(proc.wait(), timeout)
            except asyncio.TimeoutError:
                self._log.warning("worker_kill", model=self.name, pid=proc.pid, after_s=timeout)
                proc.kill()
                await proc.wait()
        except ProcessLookupError:
            pass
        if self._pump is not None:
            self._pump.cancel()
        return proc.returncode

    async def _pump_output(self) -> None:
        assert self._proc is not None and self._proc.stdout is not None
        stream = self._proc.stdout
        while True:
            try:
                raw = await stream.readline()
            except (ValueError, asyncio.LimitOverrunError):  # an overlong line: skip what is buffered
                raw = await stream.read(65536)
            if not raw:
                return
            line = raw.decode("utf-8", "replace").rstrip()
            if not line:
                continue
            self.tail.append(line)
            self._forward(line)

    def _forward(self, line: str) -> None:
        try:
            rec = json.loads(line)
        except ValueError:
            rec = None
        if isinstance(rec, dict):
            event = str(rec.pop("event", "worker_log"))
            if event == "engine_profile":
                self.engine_profile = dict(rec)
            elif event == "worker_failed" and isinstance(rec.get("error"), str):
                self.failure = rec["error"][:500]
            level = str(rec.pop("level", "error" if "error" in rec else "info")).lower()
            rec.pop("model", None)
            fields = {k if k not in ("pid",) else "worker_pid": v for k, v in rec.items()}
            fields.update(self._replica_field())
            getattr(self._log, level if level in ("debug", "info", "warning", "error") else "info")(
                event, model=self.name, source="worker", **fields
            )
        else:
            self._log.info("worker_output", model=self.name, source="worker", line=line, **self._replica_field())
