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
    # tool calls and reasoning, where the pull-time scan guessed wrong: a format name (built-in or
    # a [tool_call_formats] plugin) and the thinking markers; None: the manifest's (loader) values
    tool_format: str | None = None
    thinking_start: str | None = None
    thinking_end: str | None = None
    # true: control tokens are parsed inside message contents too (a user's "<start_of_turn>" opens a
    # turn); the default recognises them in the chat template's own text only
    content_special: bool | None = None
    # that worker's CURVE public key file (NAME.key from `bictl worker keygen`): the gateway talks
    # only to a worker holding the matching secret key, over an encrypted link
    server_key: str | None = None
    insecure: bool | None = None  # allow a tcp:// endpoint without server_key (plain, unauthenticated)
    # llama.cpp's extra buffer types (CPU weight repacking, AMX layouts): "auto" (off on CPUs with
    # AMX, whose layouts crash llama.cpp on common quantisations; on elsewhere), "on" or "off"
    extra_buffers: Literal["auto", "on", "off"] | None = None
    # llama.cpp's flash attention: "auto" (llama.cpp's choice: on where the device supports it),
    # "on" or "off". Off costs some speed, but saved KV states then restore bit-exactly at any
    # length on sliding-window models (Gemma 3), so the RAM / disk tiers keep long conversations
    # (or see kv_restore)
    flash_attn: Literal["auto", "on", "off"] | None = None
    # sliding-window models (Gemma 3): true keeps every position's cells in the window layers too
    # (KV memory of a full-attention model), so that a cached prefix can be cut or copied at any
    # length (a shared system prompt out of a longer conversation); false keeps only the window
    swa_full: bool | None = None
    # true: one KV buffer for all sequences (n_ctx cells per running sequence plus
    # max_retained_tokens for the idle ones); every row attends over the cells of all of them, and a
    # prefix copy shares cells. false: a buffer of n_ctx cells per sequence id (running and idle), so
    # no cache slows another sequence's prefill, but a prefix copy copies a whole buffer and each
    # run of consecutive running sequence ids costs a pass over the weights. "auto" (the default):
    # false where that KV cache takes at most 2 GiB (README, "KV layout", "Which layout")
    kv_unified: bool | Literal["auto"] | None = None
    # how long this model stays loaded after a request that does not say (over the top-level keep_alive)
    keep_alive: str | int | float | None = None
    # KV reuse: tokens idle sequences keep together (least recently used dropped first, into the
    # tiers; the unified KV layout only), and the budgets of the RAM and disk tiers of saved
    # sequence states (0 = off)
    max_retained_tokens: int | None = None
    # sequence ids beyond n_seq_max that only hold idle caches (a conversation between turns keeps
    # its cells and its next turn continues them: exact with any attention kernel); the KV cache
    # gets max_retained_tokens cells for them on top. None: as many as n_seq_max; 0: none
    idle_sequences: int | None = None
    kv_ram_bytes: int | None = None
    kv_disk_bytes: int | None = None
    # which saved states the tiers restore, by the load-time self-test (README, "Exactness"):
    # "exact" (the default): only those whose next-token logits match, bit for bit at the worker's
    # threads, the run that never left the cache. "complete": those that match at one thread, i.e.
    # hold every cell the model attends to; at more threads llama.cpp's flash attention sums a
    # restored window in other per-thread shares (Gemma 3 past 512 tokens: logits ~1 apart, as a
    # batch of other streams beside it moves them), and such a conversation restores instead of
    # being recomputed
    kv_restore: Literal["exact", "complete"] | None = None
    # admission (the gateway's per-model queue; not passed to the worker)
    max_queue: int | None = None  # requests waiting for a free sequence before 503 (None: the top-level max_queue)
    queue_timeout_ms: int | None = None  # how long one may wait before 504 queue_timeout
    # replicas: worker processes of this model, each a full copy of it in memory, among which its
    # requests are routed (gateway/routing.py); devices: one entry per replica (a GPU id for
    # CUDA_VISIBLE_DEVICES, or a CPU core set "0-7" / "cpu:0-7" the worker is pinned to; see devices.py);
    # endpoints: replicas that run elsewhere (tcp://...), one per entry, instead of spawned ones;
    # routing: "affinity" (the replica that holds the prompt's prefix or the session, else the least
    # loaded), "least_loaded" or "round_robin"
    replicas: int | None = None
    devices: list[str] | None = None
    endpoints: list[str] | None = None
    routing: Literal["affinity", "round_robin", "least_loaded"] | None = None

    def merged(self, over: "ModelSettings | None") -> "ModelSettings":
        if over is None:
            return self
        fields = {f: getattr(over, f) if getattr(over, f) is not None else getattr(self, f) for f in self.__struct_fields__}
        return ModelSettings(**fields)


# settings a running daemon re-reads from its config file on SIGHUP
# keys SIGHUP re-reads; a running model whose engine settings (defaults / models) changed restarts
# with them once idle; queue limits apply to the next request
RELOADABLE = ("aliases", "anthropic_api_keys", "api_keys", "metrics_require_key", "defaults", "models", "max_queue")

# what a model gets where neither the operator nor its manifest says otherwise
BUILTIN_MODEL_SETTINGS = ModelSettings(
    n_seq_max=4, n_ctx=8192, n_batch=512, prefill_chunk=512, extra_buffers="auto", flash_attn="auto",
    queue_timeout_ms=60_000,
    max_retained_tokens=4096, kv_ram_bytes=1 << 30, kv_disk_bytes=4 << 30, kv_restore="exact", replicas=1,
    routing="affinity",
)  # fmt: skip

# Claude Code's per-request attribution line: a system-prompt line whose hash changes every request
CLAUDE_CODE_ATTRIBUTION = r"(?m)^x-anthropic-billing-header:[^\n]*(\n|$)"


class ApiKey(msgspec.Struct, forbid_unknown_fields=True):
    """A key clients present (OpenAI and Ollama: Authorization: Bearer; Anthropic: x-api-key or Bearer)."""

    key: str
    families: list[str] = []  # the API families it may use ("openai", "anthropic", "ollama"); empty: all
    admin: bool = False  # management routes (pull, delete, create, copy, edit, unload) need an admin key
    name: str = ""  # for the operator (logs); never compared
    # the models it may use: registry names, aliases or fnmatch patterns ("qwen*"); a name without a
    # tag also allows its ":latest"; empty: every model. Another model gets 403 (Anthropic: permission_error)
    models: list[str] = []


class AnthropicKey(msgspec.Struct, forbid_unknown_fields=True):
    """An `anthropic_api_keys` entry in table form, to restrict the models the key may use."""

    key: str
    models: list[str] = []
    name: str = ""


class Settings(msgspec.Struct, forbid_unknown_fields=True):
    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    model_cache_dir: str | None = None
    runtime_dir: str | None = None
    kv_cache_dir: str | None = None  # disk tier of saved KV states; default: "kv" beside the model cache
    # regexes whose matches are removed from system messages before rendering, so that a line that
    # changes every request does not defeat prefix reuse (default: Claude Code's attribution line)
    prompt_normalizers: list[str] = msgspec.field(default_factory=lambda: [CLAUDE_CODE_ATTRIBUTION])
    aliases: dict[str, str] = {}
    # API keys for every family: empty (and no anthropic_api_keys): open, the local default. A family
    # any key names (or a key with no families) is protected: a missing or unknown key gets 401 in
    # that family's envelope; management routes then need an admin key; /health stays open
    api_keys: list[ApiKey] = []
    metrics_require_key: bool = False  # true: GET /metrics needs a key too (once any key is configured)
    # shorthand: keys for the Anthropic routes only (x-api-key or Authorization: Bearer): a string, or
    # { key = "...", models = ["claude-*", "qwen:7b"] } for a key that may use those models only
    anthropic_api_keys: list[str | AnthropicKey] = []
    # the operator's settings for every model, then per-model ones keyed by registry name;
    # what neither sets comes from the model (its manifest) or, last, BUILTIN_MODEL_SETTINGS
    defaults: ModelSettings = msgspec.field(default_factory=ModelSettings)
    models: dict[str, ModelSettings] = {}
    preload: list[str] = []  # models to start with the daemon
    default_model: str = "gemma3:270m"
    embed_default_model: bool = True  # register the packaged Gemma 3 270M when no model exists
    # residency: how long an idle model stays loaded after a request that did not say (a duration such as
    # "5m" / "1h30m", or seconds; 0 = unload at once, negative = forever), and how many / how many bytes of
    # models may be loaded together (0 = no limit; the least recently used idle model makes room)
    keep_alive: str | int | float = "5m"
    max_loaded_models: int = 0
    max_loaded_bytes: int = 0
    max_queue: int = 256  # waiting requests per model before 503 overloaded, where [defaults] / [models] do not say
    max_request_body_bytes: int = 256 * 1024 * 1024  # larger request bodies get 413 (checked while reading)
    # the Responses API's store (previous_response_id, GET/DELETE /v1/responses/{id}): "sqlite" (a file
    # under the cache dir, kept across restarts), "memory", or "package.module:Class" (a shared store)
    responses_store: str = "sqlite"
    responses_store_path: str | None = None  # default: responses.sqlite3 beside the model cache dir
    responses_store_ttl_ms: int = 3_600_000  # a stored response expires an hour after it was made
    responses_store_max_bytes: int = 256 * 1024 * 1024  # least recently used out first past this
    heartbeat_interval: float = 5.0  # seconds between pings to each worker
    heartbeat_timeout: float = 30.0  # a worker silent this long (no tick, reply or pong) is lost and restarted
    drain_timeout: float = 30.0  # on SIGTERM: seconds running requests may take to finish before they are ended
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
    # tool calls: operator formats (name -> importable module with a FORMAT), and the replay map
    tool_call_formats: dict[str, str] = {}
    tool_replay_dir: str | None = None  # default: <model_cache_dir>/tool-replay
    tool_replay_ttl_ms: int = 30 * 24 * 3600 * 1000
    tool_replay_gc_interval_ms: int = 3600 * 1000
    pull_allow_private: bool = False  # pulls of URLs on loopback, private or link-local addresses
    # browser safety: Host names answered besides loopback names, IP literals and this machine's name
    # ("*": any), and web origins allowed besides localhost ones ("*": any)
    allowed_hosts: list[str] = []
    allowed_origins: list[str] = []
    # HTTP server: seconds an idle connection, or one still sending its request head, stays open;
    # open connections at most (beyond it: 503 and close); bytes of a request head at most
    keep_alive_timeout: float = 30.0
    max_connections: int = 1024
    max_header_bytes: int = 65536
    run_num_predict: int = 1024  # `bictl run`: tokens per answer unless --max-tokens (0: no cap)

    def __post_init__(self) -> None:
        for where, ms in [("defaults", self.defaults), *((f'models."{n}"', m) for n, m in self.models.items())]:
            check_replicas(where, ms if where == "defaults" else self.defaults.merged(ms), ms)

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
    def all_api_keys(self) -> list[ApiKey]:
        """api_keys, then anthropic_api_keys as keys for the Anthropic family."""
        return [*self.api_keys, *(
            ApiKey(key=k, families=["anthropic"]) if isinstance(k, str)
            else ApiKey(key=k.key, families=["anthropic"], models=list(k.models), name=k.name)
            for k in self.anthropic_api_keys
        )]  # fmt: skip

    def cache_dir(self) -> Path:
        if self.model_cache_dir:
            return Path(self.model_cache_dir).expanduser()
        xdg = os.environ.get("XDG_CACHE_HOME")
        if xdg:
            return Path(xdg) / "barrel_inference_server" / "models"
        import platformdirs

        return Path(platformdirs.user_cache_dir("barrel_inference_server")) / "models"

    def kv_dir(self) -> Path:
        if self.kv_cache_dir:
            return Path(self.kv_cache_dir).expanduser()
        return self.cache_dir().parent / "kv"

    def run_dir(self) -> Path:
        """Worker sockets, the pid file and the daemon's lock. The default is per port, so that two
        daemons on one machine never share worker sockets; an explicit runtime_dir is used as given."""
        if self.runtime_dir:
            return Path(self.runtime_dir).expanduser()
        xdg = os.environ.get("XDG_RUNTIME_DIR")
        if xdg:
            return Path(xdg) / "barrel-inference" / str(self.port)
        return Path(f"/tmp/barrel-inference-{os.getuid()}") / str(self.port)

    def model_settings(self, name: str) -> ModelSettings:
        """The operator's settings for `name` over the built-in ones (the manifest not consulted)."""
        return BUILTIN_MODEL_SETTINGS.merged(self.defaults).merged(self.models.get(name))

    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"


def check_replicas(where: str, merged: ModelSettings, own: ModelSettings) -> None:
    """ValueError naming the key when a section's replicas / devices / endpoints do not fit together
    (`merged`: the section over [defaults], as a worker would get it; `own`: what the section says)."""
    from .devices import parse_device

    replicas = merged.replicas
    if replicas is not None and replicas < 1:
        raise ValueError(f"{where}.replicas must be at least 1 (got {replicas})")
    n = replicas or 1
    for i, device in enumerate(own.devices or []):
        try:
            parse_device(device)
        except ValueError as exc:
            raise ValueError(f"{where}.devices[{i}]: {exc}") from None
    if merged.endpoints is not None:
        if not merged.endpoints or not all(isinstance(e, str) and "://" in e for e in merged.endpoints):
            raise ValueError(f"{where}.endpoints must list worker endpoints such as \"tcp://host:7601\", one per replica")
        if merged.endpoint:
            raise ValueError(f"{where}: set endpoint (one worker) or endpoints (replicas), not both")
        if merged.devices:
            raise ValueError(f"{where}.devices apply to workers the gateway starts; replicas at endpoints choose their own")
        if replicas is not None and own.replicas is not None and replicas != len(merged.endpoints):
            raise ValueError(f"{where}.replicas = {replicas} but endpoints lists {len(merged.endpoints)}: one endpoint per replica")
        return
    if merged.endpoint and n > 1:
        raise ValueError(f"{where}.replicas = {n} with a single endpoint: list the replicas' workers in endpoints = [...]")
    if merged.devices and len(merged.devices) != n:
        raise ValueError(
            f"{where}.devices has {len(merged.devices)} entries but replicas = {n}: give one device per replica, "
            f"or none"
        )


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
