"""One typed settings object: a TOML file plus environment overrides, built once and passed in.

Environment (each overrides the file):
  BARREL_INFERENCE_CONFIG          path of the TOML file
  BARREL_INFERENCE_HOST            bind address, "host", "host:port" or "http://host:port"
  BARREL_INFERENCE_PORT            bind port
  BARREL_INFERENCE_MODEL_CACHE_DIR where manifests and blobs live
  BARREL_INFERENCE_RUNTIME_DIR     where worker ipc sockets live
  BARREL_INFERENCE_LOG_LEVEL / BARREL_INFERENCE_LOG_JSON
"""

from __future__ import annotations

import os
import tomllib
from typing import Literal
from pathlib import Path
from urllib.parse import urlsplit

import msgspec

ENV_PREFIX = "BARREL_INFERENCE_"
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8080


class ModelSettings(msgspec.Struct, omit_defaults=True, forbid_unknown_fields=True):
    """Per-model engine settings; None means "the loader's / model's value"."""

    n_seq_max: int | None = None
    n_ctx: int | None = None
    n_batch: int | None = None
    n_ubatch: int | None = None
    threads: int | None = None
    prefill_chunk: int | None = None
    chat_template: str | None = None  # a built-in template name or Jinja text
    n_gpu_layers: int | None = None  # layers offloaded to the GPU (-1 = all) where llama.cpp was built with one
    main_gpu: int | None = None
    use_mmap: bool | None = None
    use_mlock: bool | None = None
    endpoint: str | None = None  # tcp://host:port of a worker that runs elsewhere
    # that worker's CURVE public key file (NAME.key from `bictl worker keygen`): the gateway talks
    # only to a worker holding the matching secret key, over an encrypted link
    server_key: str | None = None
    insecure: bool | None = None  # allow a tcp:// endpoint without server_key (plain, unauthenticated)
    # llama.cpp's extra buffer types (CPU weight repacking, AMX layouts): "auto" (off on CPUs with
    # AMX, whose layouts crash llama.cpp on common quantisations; on elsewhere), "on" or "off"
    extra_buffers: Literal["auto", "on", "off"] | None = None
    # admission (the gateway's per-model queue; not passed to the worker)
    max_queue: int | None = None  # requests waiting for a free sequence before 503 (None: the top-level max_queue)
    queue_timeout_ms: int | None = None  # how long one may wait before 504 queue_timeout

    def merged(self, over: "ModelSettings | None") -> "ModelSettings":
        if over is None:
            return self
        fields = {f: getattr(over, f) if getattr(over, f) is not None else getattr(self, f) for f in self.__struct_fields__}
        return ModelSettings(**fields)


# settings a running daemon re-reads from its config file on SIGHUP
RELOADABLE = ("aliases", "anthropic_api_keys")

# what a model gets where neither the operator nor its manifest says otherwise
BUILTIN_MODEL_SETTINGS = ModelSettings(n_seq_max=4, n_ctx=8192, n_batch=512, prefill_chunk=256, extra_buffers="auto", queue_timeout_ms=60_000)


class Settings(msgspec.Struct, forbid_unknown_fields=True):
    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    model_cache_dir: str | None = None
    runtime_dir: str | None = None
    aliases: dict[str, str] = {}
    # keys the Anthropic routes accept (x-api-key or Authorization: Bearer); empty: open to any key or none
    anthropic_api_keys: list[str] = []
    # the operator's settings for every model, then per-model ones keyed by registry name;
    # what neither sets comes from the model (its manifest) or, last, BUILTIN_MODEL_SETTINGS
    defaults: ModelSettings = msgspec.field(default_factory=ModelSettings)
    models: dict[str, ModelSettings] = {}
    preload: list[str] = []  # models to start with the daemon
    default_model: str = "gemma3:270m"
    embed_default_model: bool = True  # register the packaged Gemma 3 270M when no model exists
    max_queue: int = 256  # waiting requests per model before 503 overloaded, where [defaults] / [models] do not say
    max_request_body_bytes: int = 256 * 1024 * 1024  # larger request bodies get 413 (checked while reading)
    heartbeat_interval: float = 5.0  # seconds between pings to each worker
    heartbeat_timeout: float = 30.0  # a worker silent this long (no tick, reply or pong) is lost and restarted
    worker_start_timeout: float = 120.0
    remote_connect_timeout: float = 10.0  # a worker at a configured endpoint must answer within this
    curve_secret_key: str | None = None  # the gateway's CURVE secret key file, for workers with a server_key
    # a model whose worker fails to start (after the safe-profile fallback) is not started again for
    # this many seconds, doubling with each further failure up to worker_restart_backoff_max
    worker_restart_backoff: float = 2.0
    worker_restart_backoff_max: float = 120.0
    log_level: str = "info"
    log_json: bool = True
    # model registry and fetch
    max_context_size: int = 32768  # a model's n_ctx is its trained context clamped to this
    hf_endpoint: str | None = None  # None: $HF_ENDPOINT, else https://huggingface.co
    ollama_registry: str = "https://registry.ollama.ai"  # Ollama v2 registry (manifests and blobs)
    ollama_search_url: str = "https://ollama.com"  # where Ollama's model library search lives
    pull_retention: float = 300.0  # seconds a finished pull job still answers status queries

    # ---- reload ---------------------------------------------------------------------
    def apply_reload(self, fresh: "Settings") -> list[str]:
        """Take the keys that may change without a restart (RELOADABLE) from `fresh`; the names that changed.

        A request already in flight keeps what it read: a model name is resolved once, when it starts.
        """
        changed = []
        for key in RELOADABLE:
            value = getattr(fresh, key)
            if getattr(self, key) != value:
                setattr(self, key, value)
                changed.append(key)
        return changed

    # ---- derived --------------------------------------------------------------------
    def cache_dir(self) -> Path:
        if self.model_cache_dir:
            return Path(self.model_cache_dir).expanduser()
        xdg = os.environ.get("XDG_CACHE_HOME")
        if xdg:
            return Path(xdg) / "barrel_inference_server" / "models"
        import platformdirs

        return Path(platformdirs.user_cache_dir("barrel_inference_server")) / "models"

    def run_dir(self) -> Path:
        if self.runtime_dir:
            return Path(self.runtime_dir).expanduser()
        xdg = os.environ.get("XDG_RUNTIME_DIR")
        if xdg:
            return Path(xdg) / "barrel-inference"
        return Path(f"/tmp/barrel-inference-{os.getuid()}")

    def model_settings(self, name: str) -> ModelSettings:
        """The operator's settings for `name` over the built-in ones (the manifest not consulted)."""
        return BUILTIN_MODEL_SETTINGS.merged(self.defaults).merged(self.models.get(name))

    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"


def parse_host(value: str) -> tuple[str, int | None]:
    """'h', 'h:p', 'http://h:p', '[::1]:p' -> (host, port or None)."""
    value = value.strip()
    if "://" not in value:
        value = "http://" + value
    parts = urlsplit(value)
    return parts.hostname or DEFAULT_HOST, parts.port


def _bool(v: str) -> bool:
    return v.strip().lower() in ("1", "true", "yes", "on")


def load_settings(path: str | os.PathLike | None = None, env: dict[str, str] | None = None, **overrides) -> Settings:
    """Build the settings once: file (explicit path, else $BARREL_INFERENCE_CONFIG), then env, then overrides."""
    env = dict(os.environ if env is None else env)
    data: dict = {}
    path = path or env.get(ENV_PREFIX + "CONFIG")
    if path:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    if (v := env.get(ENV_PREFIX + "HOST")) is not None:
        host, port = parse_host(v)
        data["host"] = host
        if port is not None:
            data["port"] = port
    if (v := env.get(ENV_PREFIX + "PORT")) is not None:
        data["port"] = int(v)
    for key in ("model_cache_dir", "runtime_dir", "log_level", "default_model"):
        if (v := env.get(ENV_PREFIX + key.upper())) is not None:
            data[key] = v
    if (v := env.get(ENV_PREFIX + "LOG_JSON")) is not None:
        data["log_json"] = _bool(v)
    data.update({k: v for k, v in overrides.items() if v is not None})
    try:
        return msgspec.convert(data, Settings)
    except msgspec.ValidationError as exc:
        raise ValueError(f"invalid configuration: {exc}") from exc
