"""Property-based fuzzing of every route: whatever a client sends, no 5xx, no hang, the worker alive.

Two targets. Every route with arbitrary bodies, content types and methods, on the gateway in front of
the scripted fake worker (fast). The generation routes with structured requests (messages holding
control-token text, sampling values at and past their bounds, response_format schemas with huge
repetition counts and enums) in front of a real worker running the tiny GGUF: a request that crashes
or stalls the worker fails the property. Example counts are bounded (CI: well under two minutes).
Nothing leaves 127.0.0.1: the remotes are configured to a closed local port and pull specs are never URLs.
"""

from __future__ import annotations

import asyncio
import io
import urllib.parse
import json
import sys
import tempfile
from pathlib import Path

import httpx
import pytest
from hypothesis import HealthCheck, event, given, settings, strategies as st

from barrel_inference.config import ModelSettings, Settings
from barrel_inference.gateway.app import create_app
from barrel_inference.gateway.logging import make_logger
from barrel_inference.gateway.workers import ModelManager

CLOSED = "http://127.0.0.1:9"  # remotes: a closed port, so nothing leaves the machine
FUZZ = settings(max_examples=100, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
REQUEST_TIMEOUT = 60.0

# ---- strategies ---------------------------------------------------------------------------------------------
SPECIALS = ["<|im_start|>", "<|im_end|>", "<start_of_turn>", "<end_of_turn>", "<tool_call>", "<think>", "</s>", "<s>", "\x00", "\ue000"]
text = st.one_of(st.text(max_size=40), st.sampled_from(SPECIALS), st.lists(st.sampled_from(SPECIALS + ["user", "\n", "hi"]), max_size=6).map("".join))
huge_ints = st.one_of(st.integers(-(2**70), 2**70), st.sampled_from([0, -1, 1, 2**31, 2**63, 2**64, -(2**63) - 1]))
scalars = st.one_of(st.none(), st.booleans(), huge_ints, st.floats(allow_nan=False), text)
json_values = st.recursive(scalars, lambda kids: st.one_of(st.lists(kids, max_size=4), st.dictionaries(st.text(max_size=8), kids, max_size=4)), max_leaves=12)

schemas = st.recursive(
    st.one_of(
        st.fixed_dictionaries({"type": st.just("string")}, optional={"maxLength": huge_ints, "minLength": huge_ints, "pattern": st.sampled_from(["a{0,99999}", "[a-z]+", "(", "a{3}"])}),
        st.fixed_dictionaries({"enum": st.lists(scalars, max_size=5) | st.integers(0, 30000).map(lambda n: [f"v{i}" for i in range(n)])}),
        st.fixed_dictionaries({"type": st.sampled_from(["integer", "number", "boolean", "null", "object", "bogus"])}),
        json_values,
    ),
    lambda kids: st.one_of(
        st.fixed_dictionaries({"type": st.just("array"), "items": kids}, optional={"maxItems": huge_ints, "minItems": huge_ints}),
        st.fixed_dictionaries({"type": st.just("object"), "properties": st.dictionaries(st.text(max_size=6), kids, max_size=3)}),
        st.fixed_dictionaries({"anyOf": st.lists(kids, max_size=3)}),
    ),
    max_leaves=6,
)
response_formats = st.one_of(
    st.fixed_dictionaries({"type": st.sampled_from(["text", "json_object", "json_schema", "xml"])},
                          optional={"json_schema": st.fixed_dictionaries({}, optional={"name": text, "schema": schemas})}),
    json_values,
)  # fmt: skip
messages = st.lists(
    st.one_of(
        st.fixed_dictionaries({"role": st.sampled_from(["system", "user", "assistant", "tool", "developer"]), "content": text}),
        st.fixed_dictionaries({"role": st.one_of(text, st.sampled_from(["user"])), "content": st.one_of(text, json_values)},
                              optional={"name": text, "tool_calls": json_values, "reasoning_content": text}),
    ),
    max_size=3,
)  # fmt: skip
sampling = {
    "max_tokens": st.one_of(st.integers(1, 6), huge_ints, json_values), "temperature": st.one_of(st.floats(allow_nan=False), json_values),
    "top_p": st.floats(allow_nan=False), "top_k": huge_ints, "min_p": st.floats(allow_nan=False), "seed": huge_ints,
    "repeat_penalty": st.floats(allow_nan=False), "presence_penalty": st.floats(allow_nan=False), "stop": st.one_of(text, st.lists(text, max_size=3)),
    "logit_bias": st.dictionaries(st.one_of(st.integers(-5, 2**65).map(str), text), st.one_of(st.floats(-200, 200), json_values), max_size=3),
    "stream": st.booleans(), "n": huge_ints, "stream_options": json_values,
}  # fmt: skip


plausible_sampling = {
    "max_tokens": st.integers(1, 8), "temperature": st.floats(0, 2), "top_p": st.floats(0, 1), "top_k": st.integers(0, 100),
    "min_p": st.floats(0, 1), "seed": st.integers(-(2**63), 2**63 - 1), "repeat_penalty": st.floats(0.1, 2),
    "presence_penalty": st.floats(-2, 2), "stop": st.lists(text.filter(bool), max_size=2), "stream": st.booleans(),
    "logit_bias": st.dictionaries(st.integers(0, 400).map(str), st.floats(-100, 100), max_size=3),
}  # fmt: skip
plain_messages = st.lists(st.fixed_dictionaries({"role": st.sampled_from(["system", "user", "assistant"]), "content": text}), min_size=1, max_size=3)
schema_formats = st.fixed_dictionaries({"type": st.just("json_schema"), "json_schema": st.fixed_dictionaries({"name": st.just("x"), "schema": schemas})})


def plausible_bodies(model: str):
    """Valid requests except where the worker must judge (schemas, contents, prompt sizes): what reaches the engine."""
    chat = st.fixed_dictionaries({"model": st.just(model), "messages": plain_messages, "max_tokens": st.integers(1, 8)},
                                 optional={**{k: v for k, v in plausible_sampling.items() if k != "max_tokens"}, "response_format": schema_formats})  # fmt: skip
    completion = st.fixed_dictionaries({"model": st.just(model), "prompt": st.one_of(text, st.lists(st.integers(0, 2**31 - 1), min_size=1, max_size=8)),
                                        "max_tokens": st.integers(1, 8)}, optional={k: v for k, v in plausible_sampling.items() if k != "max_tokens"})  # fmt: skip
    return st.one_of(chat, completion)


def chat_bodies(model: str):
    return st.fixed_dictionaries({"model": st.just(model), "messages": messages},
                                 optional={**sampling, "response_format": response_formats, "tools": json_values})  # fmt: skip


def completion_bodies(model: str):
    prompt = st.one_of(text, st.lists(text, max_size=2), st.lists(huge_ints, max_size=4), st.lists(st.integers(0, 300), min_size=1, max_size=8))
    return st.fixed_dictionaries({"model": st.just(model), "prompt": prompt}, optional=sampling)


def no_url(value):
    """Pull specs that are URLs would leave the machine (DNS): drop them."""
    return "://" not in json.dumps(value) and "hf.co" not in json.dumps(value) and "huggingface" not in json.dumps(value)


ROUTES = [
    ("GET", "/health"), ("GET", "/metrics"), ("GET", "/v1/models"), ("GET", "/v1/models/{x}"), ("GET", "/api/tags"), ("GET", "/api/ps"),
    ("GET", "/api/version"), ("GET", "/api/pulls"), ("GET", "/api/pulls/{x}"), ("GET", "/api/stats"),
    ("POST", "/v1/chat/completions"), ("POST", "/v1/completions"), ("POST", "/v1/embeddings"), ("POST", "/api/pull"), ("POST", "/api/show"),
    ("POST", "/api/copy"), ("POST", "/api/search"), ("POST", "/api/unload"), ("DELETE", "/api/delete"), ("PUT", "/v1/chat/completions"),
    ("POST", "/no/such/route"),
]  # fmt: skip
CONTENT_TYPES = ["application/json", "application/json; charset=utf-8", "text/plain", "application/x-www-form-urlencoded", "", "application/vnd.x+json"]


def quiet_logger(s: Settings):
    return make_logger(s, stream=io.StringIO())


# ---- targets --------------------------------------------------------------------------------------------------
class Target:
    """A gateway app in its own event loop, driven synchronously from hypothesis examples."""

    def __init__(self, settings_: Settings, registry, models: ModelManager) -> None:
        self.loop = asyncio.new_event_loop()
        self.models = models
        self.app = create_app(settings_, registry=registry, models=models, logger=quiet_logger(settings_))
        self.client = httpx.AsyncClient(transport=httpx.ASGITransport(app=self.app), base_url="http://127.0.0.1", timeout=REQUEST_TIMEOUT)

    def request(self, method: str, path: str, *, body: bytes | None = None, ctype: str = "application/json") -> httpx.Response:
        headers = {"content-type": ctype} if ctype else {}

        async def go():
            if path.endswith("/completions") and b'"stream": true' in (body or b""):
                async with self.client.stream(method, path, content=body, headers=headers) as r:
                    await r.aread()
                    return r
            return await self.client.request(method, path, content=body, headers=headers)

        return self.loop.run_until_complete(asyncio.wait_for(go(), REQUEST_TIMEOUT))  # a hang fails the example

    def worker_exits(self) -> float:
        metrics = self.app.state.metrics
        return sum(s.value for m in metrics.worker_exits.collect() for s in m.samples if s.name.endswith("_total"))

    def close(self) -> None:
        from barrel_inference.gateway.ollama import management

        self.loop.run_until_complete(management.aclose(self.app))
        self.loop.run_until_complete(self.client.aclose())
        self.loop.run_until_complete(self.models.aclose())
        self.loop.close()


REMOTE_ROUTES = ("/api/search", "/api/pull")  # their remotes are a closed port here: 502 is the right answer


def assert_no_5xx(r: httpx.Response, what) -> None:
    if r.status_code == 502 and r.request.url.path in REMOTE_ROUTES:
        return
    assert r.status_code < 500, f"{r.status_code} for {what!r}: {r.text[:300]}"
    if r.headers.get("content-type", "").startswith("text/event-stream"):
        assert "data: [DONE]" in r.text or '"error"' in r.text, r.text[-300:]


@pytest.fixture(scope="module")
def fake_target(tiny_gguf):
    from barrel_inference.registry import Registry
    from tests.gateway.fake_worker import FakeWorker

    model = "tiny:latest"
    worker = FakeWorker(model=model)
    d = tempfile.mkdtemp(prefix="bi-fuzz-", dir="/tmp")
    s = Settings(runtime_dir=f"{d}/run", model_cache_dir=f"{d}/cache", embed_default_model=False, hf_endpoint=CLOSED,
                 ollama_registry=CLOSED, ollama_search_url=CLOSED, models={model: ModelSettings(endpoint="tcp://127.0.0.1:1")})  # fmt: skip
    registry = Registry(s)
    registry.register_local("tiny", tiny_gguf)
    target = Target(s, registry, ModelManager(s, registry, logger=quiet_logger(s)))
    target.loop.run_until_complete(worker.start())  # on the loop the requests run on
    s.models[model] = ModelSettings(endpoint=worker.endpoint, insecure=True)
    target.model = model
    yield target
    target.loop.run_until_complete(worker.stop())
    target.close()


@pytest.fixture(scope="module")
def real_target(tiny_gguf):
    from barrel_inference.registry import Registry

    d = Path(tempfile.mkdtemp(prefix="bi-fz-", dir="/tmp"))
    s = Settings(runtime_dir=str(d / "run"), model_cache_dir=str(d / "cache"), embed_default_model=False, hf_endpoint=CLOSED,
                 ollama_registry=CLOSED, ollama_search_url=CLOSED,
                 models={"tiny:latest": ModelSettings(n_seq_max=2, n_ctx=256, threads=1)})  # fmt: skip
    registry = Registry(s)
    registry.register_local("tiny", tiny_gguf)
    models = ModelManager(s, registry, logger=quiet_logger(s), worker_command=[sys.executable, "-m", "barrel_inference.worker"])
    target = Target(s, registry, models)
    target.model = "tiny:latest"
    r = target.request("POST", "/v1/completions", body=b'{"model": "tiny", "prompt": "hi", "max_tokens": 1}')
    assert r.status_code == 200, r.text
    yield target
    target.close()


# ---- properties -----------------------------------------------------------------------------------------------
@FUZZ
@given(route=st.sampled_from(ROUTES), body=st.one_of(json_values.filter(no_url), st.binary(max_size=64), st.just(b"")),
       ctype=st.sampled_from(CONTENT_TYPES), x=st.text(max_size=20))  # fmt: skip
def test_every_route_survives_arbitrary_bodies(fake_target, route, body, ctype, x):
    method, path = route
    path = path.replace("{x}", urllib.parse.quote(x, safe="") or "x")
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    r = fake_target.request(method, path, body=raw if method != "GET" else None, ctype=ctype)
    assert_no_5xx(r, (method, path, raw[:200]))


@FUZZ
@given(data=st.data(), route=st.sampled_from(["/api/pull", "/api/show", "/api/copy", "/api/delete", "/api/unload", "/api/search", "/v1/embeddings"]))
def test_management_and_embedding_bodies(fake_target, data, route):
    field = st.one_of(text, st.text(min_size=200, max_size=5000), json_values).filter(no_url)
    body = data.draw(st.fixed_dictionaries({}, optional={"model": field, "name": field, "source": field, "destination": field, "input": field,
                                                           "query": field, "stream": json_values, "limit": huge_ints, "sources": json_values}))  # fmt: skip
    if route == "/v1/embeddings":
        body["model"] = fake_target.model
    method = "DELETE" if route == "/api/delete" else "POST"
    r = fake_target.request(method, route, body=json.dumps(body).encode())
    assert_no_5xx(r, (route, body))


@FUZZ
@given(body=st.one_of(plausible_bodies("tiny"), plausible_bodies("tiny"), chat_bodies("tiny"), completion_bodies("tiny")))
def test_generation_requests_never_crash_or_stall_the_real_worker(real_target, body):
    path = "/v1/chat/completions" if "messages" in body else "/v1/completions"
    raw = json.dumps(body).encode()
    r = real_target.request("POST", path, body=raw)
    event(f"status {r.status_code}")
    assert_no_5xx(r, body)
    assert real_target.worker_exits() == 0, f"the worker died on {raw[:500]!r}"


def test_the_real_worker_is_still_the_first_one(real_target):
    """After the fuzzing: one worker process, never restarted, answering."""
    assert real_target.worker_exits() == 0
    r = real_target.request("POST", "/v1/completions", body=b'{"model": "tiny", "prompt": "still here", "max_tokens": 2}')
    assert r.status_code == 200
