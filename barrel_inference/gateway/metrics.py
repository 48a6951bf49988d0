"""Prometheus figures of one app, in a CollectorRegistry of its own (no process globals)."""

from __future__ import annotations

import signal
from importlib import metadata
from typing import Iterable

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics, generate_latest


def llama_cpp_version() -> str:
    """llama-cpp-python's version from its package metadata (the gateway never imports llama_cpp)."""
    for dist in ("llama_cpp_python", "llama-cpp-python"):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return ""


P = "barrel_inference_"


def build_labels(settings) -> dict:
    """The build_info labels for an app built from `settings`."""
    from .. import __version__

    return {"version": __version__, "llama_cpp_version": llama_cpp_version(),
            "engine_profile": f"extra_buffers={settings.model_settings('').extra_buffers or 'auto'}"}  # fmt: skip


_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0, 320.0)
_ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.5)


class GatewayMetrics:
    content_type = CONTENT_TYPE_LATEST

    def __init__(self, *, version: str = "", llama_cpp_version: str = "", engine_profile: str = "") -> None:
        disable_created_metrics()  # no `_created` series next to every counter and histogram
        r = self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter(P + "requests", "Generation requests by outcome (finish reason or error code)", ["model", "api", "status"], registry=r)
        self.prompt_tokens = Counter(P + "prompt_tokens", "Prompt tokens processed", ["model"], registry=r)
        self.completion_tokens = Counter(P + "completion_tokens", "Tokens generated", ["model"], registry=r)
        self.cached_tokens = Counter(P + "cached_tokens", "Prompt tokens served from the KV cache", ["model"], registry=r)
        self.active_streams = Gauge(P + "active_streams", "Generations in progress (streamed or not)", ["model"], registry=r)
        self.waiting = Gauge(P + "requests_waiting", "Requests waiting in the model's admission queue (queue depth)", ["model"], registry=r)
        self.queue_wait = Histogram(P + "queue_wait_seconds", "Time a request waited in the gateway's admission queue", ["model"], buckets=_LATENCY_BUCKETS, registry=r)  # fmt: skip
        self.tool_replay = Counter(P + "tool_replay_lookups", "Tool calls in a request's history looked up in the replay map", ["model", "result"], registry=r)  # fmt: skip
        self.rejections = Counter(P + "queue_rejections", "Requests refused by admission: full, timeout, disconnected", ["model", "reason"], registry=r)  # fmt: skip
        self.ttft = Histogram(P + "time_to_first_token_seconds", "Submit to first generated token", ["model"], buckets=_LATENCY_BUCKETS, registry=r)
        self.itl = Histogram(P + "inter_token_latency_seconds", "Time between generated tokens", ["model"], buckets=_ITL_BUCKETS, registry=r)
        self.e2e = Histogram(P + "e2e_request_latency_seconds", "Request start to end", ["model"], buckets=_LATENCY_BUCKETS, registry=r)
        self.evaluated_tokens = Counter(P + "prompt_tokens_evaluated", "Prompt tokens computed (not reused)", ["model"], registry=r)
        self.cache_hits = Counter(P + "cache_hits", "Requests by how their prompt prefix was found: sticky (the session's sequence), prefix (an idle cache), copy (from another sequence), ram / disk (a saved state), cold", ["model", "kind"], registry=r)
        self.cache_misses = Counter(P + "cache_misses", "Session turns that reused less than the previous turn committed, by reason", ["model", "reason"], registry=r)
        self.kv_tier_bytes = Gauge(P + "kv_tier_bytes", "Bytes of saved sequence states per tier", ["model", "tier"], registry=r)
        self.kv_tier_entries = Gauge(P + "kv_tier_entries", "Saved sequence states per tier", ["model", "tier"], registry=r)
        self.kv_evictions = Counter(P + "kv_evictions", "Caches taken out of sequences (saved to a tier or dropped)", ["model"], registry=r)
        self._evictions_seen: dict[str, int] = {}
        self.queue_time = Histogram(P + "request_queue_time_seconds", "Time a request waited in the worker before its prefill", ["model"], buckets=_LATENCY_BUCKETS, registry=r)  # fmt: skip
        self.http_responses = Counter(P + "http_responses", "HTTP answers of every route by status (refusals and 500s included)", ["route", "method", "status"], registry=r)  # fmt: skip
        # per replica of a model (replica="0" for a model's only worker)
        self.worker_starts = Counter(P + "worker_starts", "Worker processes started (kind: first or restart)", ["model", "replica", "kind"], registry=r)  # fmt: skip
        self.worker_exits = Counter(P + "worker_exits", "Worker processes that ended without being asked to (cause: signal name or exit code)", ["model", "replica", "cause"], registry=r)  # fmt: skip
        self._started: set[tuple[str, str]] = set()
        self.sequences = Gauge(P + "sequences", "The worker's sequences by state (busy: a request runs on it; free)", ["model", "replica", "state"], registry=r)  # fmt: skip
        self.kv_cells_used = Gauge(P + "kv_cells_used", "KV cache cells in use (running requests' tokens and idle sequences' retained ones)", ["model", "replica"], registry=r)  # fmt: skip
        self.worker_load_seconds = Gauge(P + "worker_load_seconds", "How long the running worker took from spawn to ready (load and warm-up)", ["model", "replica"], registry=r)  # fmt: skip
        self.replica_in_flight = Gauge(P + "replica_in_flight", "Requests on the replica's worker (running or queued there)", ["model", "replica"], registry=r)  # fmt: skip
        self.replica_waiting = Gauge(P + "replica_waiting", "Requests queued in the replica's worker beyond its sequences (queue depth)", ["model", "replica"], registry=r)  # fmt: skip
        self.routed = Counter(P + "routed_requests", "Requests routed to a replica of a model with several, by reason: session, affinity (its cache holds the prompt's prefix), least_loaded, round_robin", ["model", "replica", "reason"], registry=r)  # fmt: skip
        self.embedded_inputs = Counter(P + "embedding_inputs", "Texts embedded", ["model"], registry=r)
        self.build_info = Gauge(P + "build_info", "The daemon's build: its version, llama.cpp's and the engine profile setting",
                                ["version", "llama_cpp_version", "engine_profile"], registry=r)  # fmt: skip
        self.build_info.labels(version, llama_cpp_version or "unknown", engine_profile or "unknown").set(1)

    def worker_started(self, model: str, replica: str = "0") -> None:
        key = (model, replica)
        self.worker_starts.labels(model, replica, "restart" if key in self._started else "first").inc()
        self._started.add(key)

    def worker_exited(self, model: str, returncode: int | None, replica: str = "0") -> None:
        if returncode is not None and returncode < 0:
            try:
                cause = signal.Signals(-returncode).name
            except ValueError:
                cause = f"signal {-returncode}"
        else:
            cause = f"exit {returncode}"
        self.worker_exits.labels(model, replica, cause).inc()

    def forget_model(self, model: str) -> None:
        """Remove every series of `model` (it was deleted: its figures would be reported for ever)."""
        from prometheus_client.metrics import MetricWrapperBase

        for metric in vars(self).values():
            if not isinstance(metric, MetricWrapperBase) or "model" not in metric._labelnames:
                continue
            names = metric._labelnames
            seen = set()
            for family in metric.collect():
                for sample in family.samples:
                    if sample.labels.get("model") == model:
                        key = tuple(sample.labels[n] for n in names)
                        if key not in seen:
                            seen.add(key)
                            metric.remove(*key)

    def worker_figures(self, model: str, stats: dict, replica: str = "0") -> None:
        """Gauges from one worker's GetStats answer (read when /metrics is scraped)."""
        total, busy = int(stats.get("n_seq_max", 0)), int(stats.get("seqs_busy", 0))
        self.sequences.labels(model, replica, "busy").set(busy)
        self.sequences.labels(model, replica, "free").set(max(0, total - busy))
        if "kv_cells_used" in stats:
            self.kv_cells_used.labels(model, replica).set(stats["kv_cells_used"])

    def replica_load(self, model: str, replica: str, in_flight: int, waiting: int, load_seconds: float | None) -> None:
        """A replica's requests in flight, its worker-side queue and its load time (set when scraped)."""
        self.replica_in_flight.labels(model, replica).set(in_flight)
        self.replica_waiting.labels(model, replica).set(waiting)
        if load_seconds is not None:
            self.worker_load_seconds.labels(model, replica).set(load_seconds)

    def refresh(self, loads: Iterable[tuple[str, int]]) -> None:
        """Set the waiting gauge from (model, queue depth) pairs."""
        for model, waiting in loads:
            self.waiting.labels(model).set(waiting)

    def record_cache(self, model: str, cache) -> None:
        """Figures of one finished request's CacheInfo (protocol), worker tiers included."""
        self.cache_hits.labels(model, cache.kind).inc()
        self.evaluated_tokens.labels(model).inc(cache.evaluated_tokens)
        if cache.miss:
            self.cache_misses.labels(model, cache.miss.split("=", 1)[0]).inc()
        for tier, size, n in (("ram", cache.ram_bytes, cache.ram_entries), ("disk", cache.disk_bytes, cache.disk_entries)):
            self.kv_tier_bytes.labels(model, tier).set(size)
            self.kv_tier_entries.labels(model, tier).set(n)
        seen = self._evictions_seen.get(model, 0)
        grown = cache.evictions - seen if cache.evictions >= seen else cache.evictions  # a new worker counts from 0
        if grown > 0:
            self.kv_evictions.labels(model).inc(grown)
        self._evictions_seen[model] = cache.evictions

    def render(self) -> bytes:
        return generate_latest(self.registry)
