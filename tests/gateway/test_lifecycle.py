"""The family-neutral lifecycle, driven by a made-up family ("echo": its own envelope, NDJSON streams)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

import msgspec
import pytest
from starlette.routing import Route

from barrel_inference.gateway.app import load_families
from barrel_inference.gateway.collector import RequestStream
from barrel_inference.gateway.errors import invalid
from barrel_inference.gateway.family import Family
from barrel_inference.gateway.lifecycle import Adapter, Context, endpoint
from barrel_inference.protocol import (
    Delta, Done, ErrorCode, FinishReason, Submit, TextPart, ThinkingPart, ToolCallArgs, ToolCallEnd, ToolCallStart,
)  # fmt: skip

from .conftest import MODEL
from .test_disconnect import wait_for


class SayRequest(msgspec.Struct):
    model: str
    say: str
    stream: bool = False


def echo_error(info, status: int) -> dict:
    return {"oops": {"status": status, "code": info.code.value, "why": info.message, "field": info.param}}


class Lines:
    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx

    @staticmethod
    def line(obj: dict) -> bytes:
        return json.dumps(obj).encode() + b"\n"

    def start(self) -> bytes:
        a = self.ctx.accepted
        return self.line({"start": self.ctx.id, "prompt_tokens": a.prompt_tokens, "cached": a.cached_tokens})

    def event(self, delta: Delta) -> bytes:
        return b"".join(self.line({type(p).__name__: p.text}) for p in delta.parts)

    def finish(self, done: Done) -> bytes:
        return self.line({"end": done.finish_reason.value, "tokens": done.usage.completion_tokens})

    def error(self, info) -> bytes:
        return self.line({"failed": info.code.value})


class SayAdapter(Adapter):
    api = "echo.say"
    id_prefix = "say-"
    media_type = "application/x-ndjson"

    def __init__(self, family: Family) -> None:
        self.family = family

    def decode(self, body: bytes) -> SayRequest:
        try:
            return msgspec.json.decode(body, type=SayRequest)
        except msgspec.ValidationError as exc:
            raise invalid(str(exc), "say" if "say" in str(exc) else None) from None
        except msgspec.DecodeError as exc:
            raise invalid(f"not JSON: {exc}") from None

    def to_submit(self, req: SayRequest, rid: str) -> Submit:
        return Submit(id=rid, prompt=req.say)

    def encoder(self, req: SayRequest, ctx: Context) -> Lines:
        return Lines(ctx)

    def response(self, req, ctx, result) -> dict:
        return {"id": ctx.id, "said": result.text, "parts": [[type(p).__name__, p.text] for p in result.parts],
                "prompt_tokens": result.usage.prompt_tokens, "accepted_prompt_tokens": ctx.accepted.prompt_tokens}  # fmt: skip


def echo_family() -> Family:
    fam = Family("echo", ("/echo",), render_error=echo_error, status_overrides={ErrorCode.OVERLOADED: 529})
    fam.routes = lambda: [Route("/echo/say", endpoint(SayAdapter(fam)), methods=["POST"])]
    return fam


@pytest.fixture
async def echo(make_gateway, fake_worker):
    return await make_gateway(fake_worker.endpoint, families=[*load_families().all, echo_family()])


async def test_plain_response_is_built_by_the_adapter(echo, fake_worker):
    r = await echo.client.post("/echo/say", json={"model": MODEL, "say": "THINK:hmm hello THINK:again there world"})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["id"].startswith("say-") and fake_worker.submits[-1].id == body["id"]
    assert body["said"] == " hello there world"
    # parts keep their order; adjacent parts of one kind are merged
    assert body["parts"] == [["ThinkingPart", "hmm"], ["TextPart", " hello"], ["ThinkingPart", "again"], ["TextPart", " there world"]]
    assert body["prompt_tokens"] == 5 and body["accepted_prompt_tokens"] == 5
    assert echo.logs.events("request")[-1]["api"] == "echo.say"


async def test_stream_uses_the_adapters_media_type_and_encoder(echo):
    r = await echo.client.post("/echo/say", json={"model": MODEL, "say": "a b", "stream": True})
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("application/x-ndjson")
    lines = [json.loads(x) for x in r.text.splitlines()]
    assert lines[0]["start"].startswith("say-") and (lines[0]["prompt_tokens"], lines[0]["cached"]) == (2, 2)
    assert lines[1:3] == [{"TextPart": "a"}, {"TextPart": " b"}]
    assert lines[3] == {"end": "stop", "tokens": 2} and len(lines) == 4


@pytest.mark.parametrize("stream", [False, True])
async def test_errors_come_in_the_familys_envelope(echo, stream):
    r = await echo.client.post("/echo/say", json={"model": MODEL, "stream": stream})
    assert r.status_code == 400 and r.json()["oops"]["code"] == "invalid_request" and r.json()["oops"]["field"] == "say"
    r = await echo.client.post("/echo/say", json={"model": "nope:1b", "say": "x", "stream": stream})
    assert r.status_code == 404 and r.json()["oops"]["code"] == "model_not_found"
    # a worker-side rejection before acceptance is still an HTTP status, streamed or not
    r = await echo.client.post("/echo/say", json={"model": MODEL, "say": "TOOLONG", "stream": stream})
    assert r.status_code == 400 and r.json()["oops"]["code"] == "context_length_exceeded"


async def test_unknown_paths_and_methods_answer_in_the_envelope_of_the_prefix_owner(echo):
    r = await echo.client.get("/echo/nothing")
    assert r.status_code == 404 and r.json()["oops"]["code"] == "not_found"
    r = await echo.client.get("/echo/say")
    assert r.status_code == 405 and r.json()["oops"]["code"] == "method_not_allowed"
    r = await echo.client.get("/v1/nothing")
    assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"
    r = await echo.client.get("/elsewhere")
    assert r.status_code == 404 and set(r.json()) == {"error"} and isinstance(r.json()["error"], str)
    r = await echo.client.get("/echoes")  # a prefix owns a path segment, not a string prefix
    assert "oops" not in r.json()


async def test_headers_and_start_go_out_at_acceptance_before_any_token(echo, fake_worker):
    """Accepted (prompt tokenised, sequence held) opens the response: no waiting for the first token."""
    sent: list[dict] = []
    disconnect = asyncio.Event()
    raw = json.dumps({"model": MODEL, "say": "STALL", "stream": True}).encode()
    first = True

    async def receive():
        nonlocal first
        if first:
            first = False
            return {"type": "http.request", "body": raw, "more_body": False}
        await disconnect.wait()
        return {"type": "http.disconnect"}

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
             "path": "/echo/say", "raw_path": b"/echo/say", "query_string": b"", "root_path": "", "headers": [],
             "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 2)}  # fmt: skip
    task = asyncio.create_task(echo.app(scope, receive, send))
    await wait_for(lambda: any(m["type"] == "http.response.body" and m.get("body") for m in sent))
    assert sent[0]["type"] == "http.response.start" and sent[0]["status"] == 200
    start = json.loads(next(m["body"] for m in sent if m.get("body")))
    assert start["prompt_tokens"] == 1
    disconnect.set()
    await asyncio.wait_for(task, 5)
    await wait_for(lambda: fake_worker.aborts == [fake_worker.submits[-1].id])


def test_collector_keeps_part_order_and_merges_neighbours():
    stream = RequestStream("r", lambda ids: None)
    stream.feed_delta(Delta("r", [ThinkingPart("a"), ThinkingPart("b"), TextPart("x")], n_tokens=2))
    stream.feed_delta(Delta("r", [TextPart("y"), ToolCallStart(0, "c1", "f"), ToolCallArgs(0, '{"k"')], n_tokens=2))
    stream.feed_delta(Delta("r", [ToolCallArgs(0, ": 1}"), ToolCallEnd(0, '{"k": 1}'), TextPart("z")], n_tokens=1))
    stream.feed_done(Done("r", FinishReason.TOOL_CALLS))

    async def read():
        return [ev async for ev in stream]

    merged, done = asyncio.run(read())
    assert merged.parts == [ThinkingPart("ab"), TextPart("xy"), ToolCallStart(0, "c1", "f"), ToolCallArgs(0, '{"k": 1}'),
                            ToolCallEnd(0, '{"k": 1}'), TextPart("z")]  # fmt: skip
    assert merged.n_tokens == 5 and done.finish_reason is FinishReason.TOOL_CALLS


def test_the_core_imports_no_family():
    code = (
        "import sys; import barrel_inference.gateway.lifecycle, barrel_inference.gateway.family, "
        "barrel_inference.gateway.generation, barrel_inference.gateway.app, barrel_inference.gateway.workers; "
        "print(sorted(m for m in sys.modules if m.startswith(('barrel_inference.gateway.openai', 'barrel_inference.gateway.ollama'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "[]"
