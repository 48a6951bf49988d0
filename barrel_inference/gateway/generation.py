"""One generation request's life in the gateway, shared by every API family.

`await Generation.open(state, api=..., model=..., submit=...)` resolves the model, starts its worker
if needed, admits and submits the request, and waits for the first event, so a family can still
answer with an HTTP error status when the worker rejects the request (context length, template...).
Then `events()` yields merged Delta events and the final Done. `close()` never awaits: when the
request is still running (the client went away) it sends Abort; then it records the request's
figures and writes its one log line.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, AsyncIterator

from ..protocol import Accepted, Delta, Done, ErrorCode, FinishReason, Submit, TextPart, Usage, merge_parts
from .collector import RequestStream
from .errors import GatewayError
from .structured import checked_done

Event = Delta | Done


@dataclass
class Result:
    """A collected generation: ordered parts (adjacent ones of a kind merged), tokens, the final Done."""

    parts: list
    tokens: list[int]
    done: Done
    logprobs: list = field(default_factory=list)  # TokenLogprob per sampled token (when asked for)

    @property
    def text(self) -> str:
        return "".join(p.text for p in self.parts if type(p) is TextPart)

    @property
    def usage(self) -> Usage:
        return self.done.usage


class Generation:
    def __init__(
        self, state: Any, *, api: str, model: str, submit: Submit, stream_response: bool = False, request_id: str | None = None
    ) -> None:
        self.state = state
        self.api = api
        self.requested_model = model
        self.model = ""  # the registry name, once resolved
        self.submit = submit
        self.id = submit.id
        self.request_id = request_id or submit.id  # the client's X-Request-Id when it sent one
        self.stream_response = stream_response
        self.stream: RequestStream | None = None
        self.error: GatewayError | None = None
        self.accepted: Accepted = Accepted(submit.id, prompt_tokens=0)
        self.hello: Any = None  # the serving worker's Hello, once submitted
        self._t0 = time.monotonic()
        self._closed = False
        self._counted_active = False
        self.slot: Any = None  # the admission slot, released when the worker's Done arrives
        self.queue_ms: float | None = None  # time spent in the gateway's admission queue

    @classmethod
    async def open(
        cls, state: Any, *, api: str, model: str, submit: Submit, stream_response: bool = False, request_id: str | None = None
    ) -> "Generation":
        """Start the request and wait for its first event. Raises GatewayError (already recorded)."""
        gen = cls(state, api=api, model=model, submit=submit, stream_response=stream_response, request_id=request_id)
        try:
            await gen._start()
        except GatewayError as exc:
            gen.close(exc)
            raise
        except BaseException:
            gen.close()
            raise
        return gen

    async def _start(self) -> None:
        handle = await self.state.models.get(self.requested_model)
        self.model = handle.name
        admission = getattr(self.state, "admission", None)
        if admission is not None:
            t0 = time.monotonic()
            self.slot = await admission.acquire(handle.name, handle.hello.n_seq_max)
            self.queue_ms = (time.monotonic() - t0) * 1000
            if not handle.alive:  # the worker went while this request waited: its successor serves it
                handle = await self.state.models.get(self.requested_model)
        self.hello = handle.hello
        self.stream = handle.submit(self.submit)
        if self.slot is not None:
            self.stream.add_done_callback(self.slot.release)
        self.state.metrics.active_streams.labels(self.model).inc()
        self._counted_active = True
        first = await self.stream.opened()
        if isinstance(first, Done):
            if first.error is not None:
                raise GatewayError.from_info(first.error)
        else:
            self.accepted = first
            for result, n in first.tool_replay.items():
                self.state.metrics.tool_replay.labels(self.model, result).inc(n)

    async def events(self) -> AsyncIterator[Event]:
        """The worker's events; with a JSON schema, a finished text that does not validate ends as an
        output_invalid error instead of its Done."""
        assert self.stream is not None
        schema = self.submit.json_schema
        text: list[str] = []
        async for event in self.stream:
            if schema is not None:
                if isinstance(event, Delta):
                    text.append(event.text)
                else:
                    event = await checked_done(event, "".join(text), schema)
            yield event

    async def collect(self) -> Result:
        """Read to the end: the parts in order, the tokens, the Done."""
        parts: list = []
        tokens: list[int] = []
        logprobs: list = []
        async for event in self.events():
            if isinstance(event, Delta):
                merge_parts(parts, event.parts)
                tokens.extend(event.tokens)
                logprobs.extend(event.logprobs)
            else:
                return Result(parts, tokens, event, logprobs)
        raise GatewayError(ErrorCode.INTERNAL, "the request ended without a done")

    # ---- end ------------------------------------------------------------------------
    def close(self, error: GatewayError | None = None) -> None:
        """Abort if still running, record figures, write the log line. Idempotent; never awaits."""
        if self._closed:
            return
        self._closed = True
        if error is not None:
            self.error = error
        stream = self.stream
        if stream is not None and not stream.finished:
            stream.abort()
        if self.slot is not None and stream is None:  # admitted, never submitted
            self.slot.release()
        if self._counted_active:
            self.state.metrics.active_streams.labels(self.model).dec()
        self._record()

    def _outcome(self) -> str:
        if self.error is not None:
            return self.error.code.value
        stream = self.stream
        if stream is None:
            return ErrorCode.INTERNAL.value
        done = stream.done
        if done is None or stream.aborted:
            return "client_disconnected"
        if done.error is not None:
            return done.error.code.value
        return done.finish_reason.value if isinstance(done.finish_reason, FinishReason) else str(done.finish_reason)

    def _record(self) -> None:
        metrics, status = self.state.metrics, self._outcome()
        label = self.model or "unknown"
        total_s = time.monotonic() - self._t0
        metrics.requests.labels(label, self.api, status).inc()
        stream = self.stream
        done = stream.done if stream is not None else None
        usage = done.usage if done is not None else None
        timings = done.timings if done is not None else None
        fields: dict[str, Any] = {}
        if stream is not None:
            completion = usage.completion_tokens if usage and usage.completion_tokens else stream.n_tokens
            metrics.completion_tokens.labels(label).inc(completion)
            if usage is not None:
                metrics.prompt_tokens.labels(label).inc(usage.prompt_tokens)
                metrics.cached_tokens.labels(label).inc(usage.cached_tokens)
            if done is not None and done.cache is not None:
                metrics.record_cache(label, done.cache)
                fields["cache"] = done.cache.kind
                if done.cache.miss:
                    fields["cache_miss"] = done.cache.miss
            if stream.t_first_token is not None:
                metrics.ttft.labels(label).observe(stream.t_first_token - stream.t_submit)
                fields["ttft_ms"] = round((stream.t_first_token - stream.t_submit) * 1000, 1)
            itl = metrics.itl.labels(label)
            for gap, n in stream.token_gaps:
                for _ in range(min(n, 64)):
                    itl.observe(gap / n)
            if timings is not None:
                metrics.queue_time.labels(label).observe(timings.queue_ms / 1000)
            metrics.e2e.labels(label).observe(total_s)
            fields["completion_tokens"] = completion
        if usage is not None:
            fields.update(prompt_tokens=usage.prompt_tokens, cached_tokens=usage.cached_tokens)
        if timings is not None:
            fields.update(queue_ms=round(timings.queue_ms, 1), prefill_ms=round(timings.prefill_ms, 1), decode_ms=round(timings.decode_ms, 1))
        if self.submit.session:
            fields["session"] = self.submit.session
        if stream is not None and getattr(stream, "route", "only") != "only":  # a model with replicas
            fields.update(replica=stream.replica, route=stream.route)
        if self.queue_ms is not None:
            fields["gateway_queue_ms"] = round(self.queue_ms, 1)
        if self.request_id != self.id:
            fields["id"] = self.id
        if self.error is not None:
            fields["error"] = self.error.info.message
        elif done is not None and done.error is not None:
            fields["error"] = done.error.message
        log = self.state.log
        emit = log.warning if (self.error is not None or (done is not None and done.error is not None)) else log.info
        emit(
            "request", request_id=self.request_id, api=self.api, model=self.model or self.requested_model, status=status,
            stream=self.stream_response, total_ms=round(total_s * 1000, 1), **fields,
        )  # fmt: skip


def record_rejected(state: Any, *, api: str, request_id: str, error: GatewayError, model: str | None = None) -> None:
    """Count and log a request refused before it reached a model (bad input)."""
    state.metrics.requests.labels("unknown", api, error.code.value).inc()
    state.log.warning(
        "request", request_id=request_id, api=api, model=model, status=error.code.value, error=error.info.message,
        param=error.param,
    )  # fmt: skip


def record_embedding(
    state: Any, *, api: str, model: str, request_id: str, inputs: int, prompt_tokens: int | None, t0: float,
    error: GatewayError | None = None,
) -> None:
    """Count and log one embedding request as generations are: the requests counter, prompt tokens, e2e latency
    and one `request` log line."""
    metrics, total_s = state.metrics, time.monotonic() - t0
    status = error.code.value if error is not None else "ok"
    label = model or "unknown"
    metrics.requests.labels(label, api, status).inc()
    fields: dict[str, Any] = {}
    if error is None:
        metrics.prompt_tokens.labels(label).inc(prompt_tokens or 0)
        metrics.embedded_inputs.labels(label).inc(inputs)
        metrics.e2e.labels(label).observe(total_s)
        fields["prompt_tokens"] = prompt_tokens or 0
    else:
        fields["error"] = error.info.message
    emit = state.log.warning if error is not None else state.log.info
    emit("request", request_id=request_id, api=api, model=model, status=status, inputs=inputs,
         total_ms=round(total_s * 1000, 1), **fields)  # fmt: skip
