"""Prometheus figures of one app, in a CollectorRegistry of its own (no process globals)."""

from __future__ import annotations

import signal
from typing import Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client import CONTENT_TYPE_LATEST

P = "barrel_inference_"
_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0, 320.0)
_ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.5)


class GatewayMetrics:
    content_type = CONTENT_TYPE_LATEST

    def __init__(self) -> None:
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
        self.queue_time = Histogram(P + "request_queue_time_seconds", "Time a request waited in the worker before its prefill", ["model"], buckets=_LATENCY_BUCKETS, registry=r)  # fmt: skip
        self.http_responses = Counter(P + "http_responses", "HTTP answers of every route by status (refusals and 500s included)", ["route", "method", "status"], registry=r)  # fmt: skip
        self.worker_starts = Counter(P + "worker_starts", "Worker processes started (kind: first or restart)", ["model", "kind"], registry=r)
        self.worker_exits = Counter(P + "worker_exits", "Worker processes that ended without being asked to (cause: signal name or exit code)", ["model", "cause"], registry=r)  # fmt: skip
        self._started: set[str] = set()

    def worker_started(self, model: str) -> None:
        self.worker_starts.labels(model, "restart" if model in self._started else "first").inc()
        self._started.add(model)

    def worker_exited(self, model: str, returncode: int | None) -> None:
        if returncode is not None and returncode < 0:
            try:
                cause = signal.Signals(-returncode).name
            except ValueError:
                cause = f"signal {-returncode}"
        else:
            cause = f"exit {returncode}"
        self.worker_exits.labels(model, cause).inc()

    def refresh(self, loads: Iterable[tuple[str, int]]) -> None:
        """Set the waiting gauge from (model, queue depth) pairs."""
        for model, waiting in loads:
            self.waiting.labels(model).set(waiting)

    def render(self) -> bytes:
        return generate_latest(self.registry)
