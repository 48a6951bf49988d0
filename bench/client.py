"""One async load client for any OpenAI-compatible endpoint (aiohttp, SSE streaming).

Every system is driven by this same code: the same prompts, the same request body, the same
clock. Times are `time.perf_counter()` seconds taken when a chunk's bytes arrive.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field

import aiohttp

# Gemma 3: <eos> = 1, <end_of_turn> = 106. Biased to -100 so every stream runs to max_tokens.
DEFAULT_SUPPRESS = (1, 106)


@dataclass
class StreamResult:
    ok: bool = False
    error: str | None = None
    t_start: float = 0.0
    t_first: float | None = None  # first chunk carrying generated output
    t_end: float = 0.0
    chunk_times: list[float] = field(default_factory=list)
    n_chunks: int = 0
    usage_tokens: int | None = None  # completion_tokens from a usage object, when the server sends one
    prompt_tokens: int | None = None
    cached_tokens: int | None = None  # usage.prompt_tokens_details.cached_tokens, where the server reports it
    finish_reason: str | None = None
    text: str = ""

    @property
    def n_tokens(self) -> int:
        return self.usage_tokens if self.usage_tokens is not None else self.n_chunks

    @property
    def ttft(self) -> float | None:
        return None if self.t_first is None else self.t_first - self.t_start

    def gaps(self) -> list[float]:
        """Seconds between consecutive output chunks (inter-token latency when one token per chunk)."""
        t = self.chunk_times
        return [b - a for a, b in zip(t, t[1:])]


@dataclass
class RequestSpec:
    prompt: str | None = None  # /v1/completions
    messages: list[dict] | None = None  # /v1/chat/completions
    max_tokens: int = 128
    temperature: float = 0.0
    seed: int = 1234
    suppress: tuple[int, ...] = DEFAULT_SUPPRESS
    headers: dict | None = None  # e.g. x-session-id

    def body(self, model: str) -> dict:
        b: dict = {
            "model": model,
            "max_tokens": self.max_tokens,
            "stream": True,
            "stream_options": {"include_usage": True},
            "temperature": self.temperature,
            "seed": self.seed,
            # OpenAI form: token id as a string key. llama-server, llama-cpp-python's server
            # (logit_bias_type "input_ids") and ours all read it so.
            "logit_bias": {str(t): -100 for t in self.suppress},
        }
        if self.messages is not None:
            b["messages"] = self.messages
        else:
            b["prompt"] = self.prompt
        return b

    @property
    def path(self) -> str:
        return "/v1/chat/completions" if self.messages is not None else "/v1/completions"


class LoadClient:
    """Holds one aiohttp session (no connection limit) for a base URL and a model name."""

    def __init__(self, base_url: str, model: str, *, timeout: float = 900.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.model = model
        self._timeout = aiohttp.ClientTimeout(total=timeout)
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> "LoadClient":
        # a fresh connection per request for every system: llama-server closes a connection after a
        # streamed response, and reusing it from the pool fails with ServerDisconnectedError
        conn = aiohttp.TCPConnector(limit=0, force_close=True)
        self._session = aiohttp.ClientSession(connector=conn, timeout=self._timeout)
        return self

    async def __aexit__(self, *exc) -> None:
        if self._session is not None:
            await self._session.close()

    @property
    def session(self) -> aiohttp.ClientSession:
        assert self._session is not None, "use LoadClient as an async context manager"
        return self._session

    async def stream(self, spec: RequestSpec, *, on_chunk=None) -> StreamResult:
        """One streaming request; `on_chunk(result, t)` is called on each output chunk."""
        res = StreamResult(t_start=time.perf_counter())
        chat = spec.messages is not None
        parts: list[str] = []
        try:
            async with self.session.post(self.base_url + spec.path, json=spec.body(self.model), headers=spec.headers) as resp:
                if resp.status != 200:
                    res.error = f"HTTP {resp.status}: {(await resp.text())[:300]}"
                    res.t_end = time.perf_counter()
                    return res
                buf = b""
                async for data in resp.content.iter_any():
                    now = time.perf_counter()
                    buf += data
                    while b"\n" in buf:
                        line, buf = buf.split(b"\n", 1)
                        line = line.strip()
                        if not line.startswith(b"data:"):
                            continue
                        payload = line[5:].strip()
                        if payload == b"[DONE]":
                            continue
                        try:
                            obj = json.loads(payload)
                        except ValueError:
                            continue
                        if "error" in obj and not obj.get("choices"):
                            res.error = json.dumps(obj["error"])[:300]
                            continue
                        usage = obj.get("usage")
                        if usage:
                            if usage.get("completion_tokens") is not None:
                                res.usage_tokens = int(usage["completion_tokens"])
                            if usage.get("prompt_tokens") is not None:
                                res.prompt_tokens = int(usage["prompt_tokens"])
                            details = usage.get("prompt_tokens_details") or {}
                            if details.get("cached_tokens") is not None:
                                res.cached_tokens = int(details["cached_tokens"])
                        for ch in obj.get("choices") or []:
                            piece = (ch.get("delta") or {}).get("content") if chat else ch.get("text")
                            if ch.get("finish_reason"):
                                res.finish_reason = ch["finish_reason"]
                            if piece:
                                parts.append(piece)
                                res.n_chunks += 1
                                res.chunk_times.append(now)
                                if res.t_first is None:
                                    res.t_first = now
                                if on_chunk is not None:
                                    on_chunk(res, now)
            res.ok = res.error is None and res.t_first is not None
            if res.t_first is None and res.error is None:
                res.error = "stream ended without output"
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
            res.error = f"{type(exc).__name__}: {exc}"
        res.t_end = time.perf_counter()
        res.text = "".join(parts)
        return res

    async def get_json(self, path: str) -> dict | list | None:
        try:
            async with self.session.get(self.base_url + path) as resp:
                if resp.status != 200:
                    return None
                return await resp.json(content_type=None)
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError):
            return None


def percentile(values: list[float], q: float) -> float | None:
    """Linear-interpolated percentile, q in [0, 100]; None for no values."""
    if not values:
        return None
    v = sorted(values)
    if len(v) == 1:
        return v[0]
    k = (len(v) - 1) * q / 100.0
    lo = int(k)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (k - lo)


def summarize(results: list[StreamResult], wall: float) -> dict:
    """Aggregate figures of one wave of concurrent streams (times in ms, throughput in tokens/s)."""
    ok = [r for r in results if r.ok]
    tokens = sum(r.n_tokens for r in ok)
    ttfts = [r.ttft * 1000.0 for r in ok if r.ttft is not None]
    gaps = [g * 1000.0 for r in ok for g in r.gaps()]
    # tokens per chunk > 1 means the server merged tokens into one chunk (then gaps are per chunk)
    chunks = sum(r.n_chunks for r in ok)
    return {
        "streams": len(results),
        "ok": len(ok),
        "errors": sorted({r.error for r in results if r.error})[:3],
        "tokens": tokens,
        "tokens_from_usage": all(r.usage_tokens is not None for r in ok) if ok else False,
        "tokens_per_chunk": (tokens / chunks) if chunks else None,
        "wall_s": wall,
        "tok_s": tokens / wall if wall > 0 else 0.0,
        "ttft_ms_p50": percentile(ttfts, 50),
        "ttft_ms_p95": percentile(ttfts, 95),
        "itl_ms_p50": percentile(gaps, 50),
        "itl_ms_p95": percentile(gaps, 95),
        "itl_ms_max": max(gaps) if gaps else None,
    }
