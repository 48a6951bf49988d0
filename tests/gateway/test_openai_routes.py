"""The OpenAI family through the ASGI app, against the fake worker."""

from __future__ import annotations

import asyncio
import json

import pytest

from barrel_inference.protocol import FinishReason

from .conftest import MODEL


def chat_body(text: str = "hello there world", **kw) -> dict:
    return {"model": MODEL, "messages": [{"role": "user", "content": text}], **kw}


def sse_events(raw: str) -> list:
    assert raw.endswith("data: [DONE]\n\n"), raw[-200:]
    out = []
    for block in raw.split("\n\n"):
        if not block:
            continue
        assert block.startswith("data: "), block
        data = block[len("data: ") :]
        out.append(data if data == "[DONE]" else json.loads(data))
    return out


async def test_plain_chat(gateway, fake_worker):
    r = await gateway.client.post("/v1/chat/completions", json=chat_body("hello there world"))
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "chat.completion"
    assert body["id"].startswith("chatcmpl-") and r.headers["x-request-id"] == body["id"]
    assert body["model"] == MODEL
    assert body["choices"][0]["message"] == {"role": "assistant", "content": "hello there world"}
    assert body["choices"][0]["finish_reason"] == "stop"
    assert body["usage"] == {"prompt_tokens": 3, "completion_tokens": 3, "total_tokens": 6,
                             "prompt_tokens_details": {"cached_tokens": 2}}  # fmt: skip
    sent = fake_worker.submits[-1]
    assert sent.id == body["id"] and sent.messages[0].content == "hello there world"


async def test_chat_parameters_reach_the_worker(gateway, fake_worker):
    r = await gateway.client.post("/v1/chat/completions", json=chat_body(
        '{"a": 1}', max_completion_tokens=7, max_tokens=99, temperature=0.0, top_p=0.5, top_k=7, min_p=0.1, seed=42,
        presence_penalty=0.5, frequency_penalty=-0.5, repeat_penalty=1.1, stop="END", logit_bias={"13": -100},
        response_format={"type": "json_object"},
        tools=[{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
    ))  # fmt: skip
    assert r.status_code == 200, r.text
    s = fake_worker.submits[-1]
    assert s.max_tokens == 7
    assert (s.sampling.temperature, s.sampling.top_p, s.sampling.top_k, s.sampling.min_p, s.sampling.seed) == (0.0, 0.5, 7, 0.1, 42)
    assert (s.sampling.presence_penalty, s.sampling.frequency_penalty, s.sampling.repeat_penalty) == (0.5, -0.5, 1.1)
    assert s.sampling.logit_bias == {13: -100.0}
    assert s.stop == ["END"]
    assert s.json_schema == {} and not s.json_schema_strict
    assert s.tools[0]["function"]["name"] == "f"


async def test_max_tokens_gives_length(gateway):
    r = await gateway.client.post("/v1/chat/completions", json=chat_body("a b c d", max_tokens=2))
    assert r.json()["choices"][0] == {"index": 0, "message": {"role": "assistant", "content": "a b"},
                                      "logprobs": None, "finish_reason": "length"}  # fmt: skip


async def test_streamed_chat_with_usage(gateway):
    r = await gateway.client.post("/v1/chat/completions", json=chat_body("one two three", stream=True, stream_options={"include_usage": True}))
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/event-stream")
    events = sse_events(r.text)
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert all(c["object"] == "chat.completion.chunk" and c["id"] == chunks[0]["id"] for c in chunks)
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    assert text == "one two three"
    finish = [c for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
    assert len(finish) == 1 and finish[0]["choices"][0]["finish_reason"] == "stop" and finish[0] is chunks[-2]
    usage_chunk = chunks[-1]
    assert usage_chunk["choices"] == []
    assert usage_chunk["usage"]["completion_tokens"] == 3
    assert usage_chunk["usage"]["prompt_tokens_details"] == {"cached_tokens": 2}
    assert all(c["usage"] is None for c in chunks[:-1])


async def test_streamed_chat_without_usage_has_no_usage_chunk(gateway):
    r = await gateway.client.post("/v1/chat/completions", json=chat_body("x y", stream=True))
    chunks = sse_events(r.text)[:-1]
    assert all(c["choices"] for c in chunks)
    assert all("usage" not in c for c in chunks)


async def test_completions_plain_and_streamed(gateway, fake_worker):
    r = await gateway.client.post("/v1/completions", json={"model": MODEL, "prompt": "the quick brown fox", "max_tokens": 3})
    body = r.json()
    assert r.status_code == 200, body
    assert body["object"] == "text_completion" and body["id"].startswith("cmpl-")
    assert body["choices"][0]["text"] == "the quick brown" and body["choices"][0]["finish_reason"] == "length"
    assert fake_worker.submits[-1].prompt == "the quick brown fox"
    r = await gateway.client.post("/v1/completions", json={"model": MODEL, "prompt": [5, 6], "stream": True,
                                                            "stream_options": {"include_usage": True}})  # fmt: skip
    events = sse_events(r.text)
    assert fake_worker.submits[-1].prompt_tokens == [5, 6]
    assert fake_worker.submits[-1].max_tokens == 16  # OpenAI's default for completions
    text = "".join(c["choices"][0]["text"] for c in events[:-1] if c["choices"])
    assert text == "t5 t6"
    assert events[-2]["choices"] == [] and events[-2]["usage"]["completion_tokens"] == 2


async def test_models_list_and_get(gateway):
    r = await gateway.client.get("/v1/models")
    assert r.json() == {"object": "list", "data": [{"id": MODEL, "object": "model", "created": 1735776000, "owned_by": "barrel-inference"}]}
    r = await gateway.client.get("/v1/models/fake")
    assert r.status_code == 200 and r.json()["id"] == "fake"
    r = await gateway.client.get("/v1/models/nope:1b")
    assert r.status_code == 404
    assert r.json()["error"]["code"] == "model_not_found"


async def test_alias_resolves(gateway, fake_worker):
    r = await gateway.client.post("/v1/chat/completions", json={**chat_body("hi"), "model": "gpt-4o"})
    assert r.status_code == 200 and r.json()["model"] == "gpt-4o"


BAD_REQUESTS = [
    # (body, param, code)
    (b"{not json", None, "invalid_request"),
    (b"", None, "invalid_request"),
    (b"[]", None, "invalid_request"),
    ({"model": MODEL}, "messages", "invalid_request"),
    ({"messages": [{"role": "user", "content": "x"}]}, "model", "invalid_request"),
    (chat_body(n=2), "n", "invalid_request"),
    (chat_body(temperature="hot"), "temperature", "invalid_request"),
    (chat_body(temperature=3.5), "temperature", "invalid_request"),
    (chat_body(max_tokens=0), "max_tokens", "invalid_request"),
    (chat_body(top_p=2), "top_p", "invalid_request"),
    (chat_body(stop=[""]), "stop", "invalid_request"),
    (chat_body(logit_bias={"abc": 1}), "logit_bias", "invalid_request"),
    (chat_body(logprobs=True, top_logprobs=21), "top_logprobs", "invalid_request"),
    ({"model": MODEL, "messages": []}, "messages", "invalid_request"),
    ({"model": MODEL, "messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role", "invalid_request"),
    ({"model": MODEL, "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:"}}]}]},
     "messages[0].content[0]", "unsupported"),
    ({"model": MODEL, "messages": [{"role": "user", "content": 5}]}, "messages[0].content", "invalid_request"),
    (chat_body(response_format={"type": "json_schema", "json_schema": {"name": "x"}}), "response_format.json_schema.schema", "invalid_request"),
    (chat_body(tools=[{"type": "function", "function": {}}]), "tools[0]", "invalid_request"),
]


@pytest.mark.parametrize("body,param,code", BAD_REQUESTS)
async def test_bad_chat_requests_are_400_naming_the_field(gateway, fake_worker, body, param, code):
    kw = {"content": body} if isinstance(body, bytes) else {"json": body}
    r = await gateway.client.post("/v1/chat/completions", headers={"content-type": "application/json"}, **kw)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param
    assert err["code"] == code and err["type"] == "invalid_request_error"
    assert err["message"]
    assert fake_worker.submits == []


BAD_COMPLETIONS = [
    ({"model": MODEL, "prompt": [1, 2], "echo": True}, "echo"),
    ({"model": MODEL, "prompt": "x", "best_of": 3}, "best_of"),
    ({"model": MODEL, "prompt": ["a", "b"]}, "prompt"),
    ({"model": MODEL, "prompt": []}, "prompt"),
    ({"model": MODEL, "prompt": [1, "a"]}, "prompt"),
    ({"model": MODEL}, "prompt"),
]


@pytest.mark.parametrize("body,param", BAD_COMPLETIONS)
async def test_bad_completions_are_400(gateway, body, param):
    r = await gateway.client.post("/v1/completions", json=body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param


@pytest.mark.parametrize("stream", [False, True])
async def test_unknown_model_is_404(gateway, stream):
    r = await gateway.client.post("/v1/chat/completions", json={**chat_body(stream=stream), "model": "missing:7b"})
    assert r.status_code == 404
    err = r.json()["error"]
    assert (err["code"], err["param"], err["type"]) == ("model_not_found", "model", "invalid_request_error")


@pytest.mark.parametrize("stream", [False, True])
async def test_context_length_is_400_even_when_streaming(gateway, stream):
    r = await gateway.client.post("/v1/chat/completions", json=chat_body("way TOOLONG prompt", stream=stream))
    assert r.status_code == 400
    assert r.headers["content-type"] == "application/json"
    assert r.json()["error"]["code"] == "context_length_exceeded"


async def test_overload_is_503(make_gateway, fake_worker):
    fake_worker.n_seq_max = 1
    gw = await make_gateway(fake_worker.endpoint, max_queue=1)
    held = [asyncio.create_task(gw.client.post("/v1/chat/completions", json=chat_body(f"w{i} STALL"))) for i in range(2)]
    # one runs on the worker's only sequence, the other waits in the gateway's queue
    from .test_disconnect import wait_for

    await wait_for(lambda: len(fake_worker.submits) == 1 and gw.app.state.admission.queue(MODEL).depth == 1)
    r = await gw.client.post("/v1/chat/completions", json=chat_body("one more"))
    assert r.status_code == 503
    assert r.json()["error"]["code"] == "overloaded" and r.headers["retry-after"] == "1"
    assert len(fake_worker.submits) == 1
    m = (await gw.client.get("/metrics")).text
    assert 'barrel_inference_requests_waiting{model="fake:latest"} 1.0' in m
    assert 'barrel_inference_active_streams{model="fake:latest"} 1.0' in m
    assert 'barrel_inference_queue_rejections_total{model="fake:latest",reason="full"} 1.0' in m
    for t in held:
        t.cancel()
    await asyncio.gather(*held, return_exceptions=True)


async def test_worker_death_mid_request_is_an_error_and_next_request_works(make_gateway, fake_worker):
    gw = await make_gateway(fake_worker.endpoint)  # the dropped connection tells, no heartbeat wait
    r = await gw.client.post("/v1/chat/completions", json=chat_body("a b CRASH"))
    assert r.status_code == 503, r.text
    assert r.json()["error"]["code"] == "worker_unavailable"
    # streamed: the headers went out with the first delta, so the error arrives as an event
    await fake_worker.restart()
    r = await gw.client.post("/v1/chat/completions", json=chat_body("x CRASH", stream=True))
    assert r.status_code == 200
    events = sse_events(r.text)
    assert events[1]["choices"][0]["delta"]["content"] == "x"
    assert events[-2]["error"]["code"] == "worker_unavailable"
    await fake_worker.restart()
    r = await gw.client.post("/v1/chat/completions", json=chat_body("alive again"))
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == "alive again"
    deaths = [e for e in gw.logs.events("worker_lost")]
    assert len(deaths) == 2


async def test_health_and_metrics(gateway):
    r = await gateway.client.get("/health")
    assert r.json() == {"status": "ok"}
    await gateway.client.post("/v1/chat/completions", json=chat_body("a b c"))
    await gateway.client.post("/v1/chat/completions", json=chat_body("d e", stream=True))
    await gateway.client.post("/v1/chat/completions", json=chat_body(n=3))
    m = (await gateway.client.get("/metrics")).text
    assert 'barrel_inference_requests_total{api="openai.chat",model="fake:latest",status="stop"} 2.0' in m
    assert 'barrel_inference_requests_total{api="openai.chat",model="unknown",status="invalid_request"} 1.0' in m
    assert 'barrel_inference_completion_tokens_total{model="fake:latest"} 5.0' in m
    assert 'barrel_inference_prompt_tokens_total{model="fake:latest"} 5.0' in m
    assert 'barrel_inference_cached_tokens_total{model="fake:latest"} 4.0' in m
    assert 'barrel_inference_time_to_first_token_seconds_count{model="fake:latest"} 2.0' in m
    assert 'barrel_inference_inter_token_latency_seconds_count{model="fake:latest"} 3.0' in m
    assert 'barrel_inference_e2e_request_latency_seconds_count{model="fake:latest"} 2.0' in m
    assert 'barrel_inference_request_queue_time_seconds_count{model="fake:latest"} 2.0' in m
    assert 'barrel_inference_active_streams{model="fake:latest"} 0.0' in m


@pytest.mark.parametrize("stream", [False, True])
async def test_an_explained_miss_reaches_the_header_the_log_line_and_the_metrics(gateway, stream):
    r = await gateway.client.post("/v1/chat/completions", json=chat_body("a EVICTED c", stream=stream), headers={"x-session-id": "s1"})
    assert r.status_code == 200 and r.headers["x-cache-miss"] == "evicted"
    (line,) = gateway.logs.events("request")
    assert line["cache_miss"] == "evicted" and line["cache"] == "prefix"
    m = (await gateway.client.get("/metrics")).text
    assert 'barrel_inference_cache_misses_total{model="fake:latest",reason="evicted"} 1.0' in m
    ok = await gateway.client.post("/v1/chat/completions", json=chat_body("a b c", stream=stream), headers={"x-session-id": "s1"})
    assert "x-cache-miss" not in ok.headers and "cache_miss" not in gateway.logs.events("request")[-1]


async def test_one_log_line_per_request(gateway):
    r = await gateway.client.post("/v1/chat/completions", json=chat_body("a b c"), headers={"x-request-id": "my-req-1"})
    assert r.headers["x-request-id"] == "my-req-1"
    assert r.json()["id"].startswith("chatcmpl-")
    lines = gateway.logs.events("request")
    assert len(lines) == 1
    line = lines[0]
    assert line["request_id"] == "my-req-1" and line["id"] == r.json()["id"] and line["api"] == "openai.chat" and line["model"] == MODEL
    assert line["status"] == FinishReason.STOP.value
    assert (line["prompt_tokens"], line["completion_tokens"], line["cached_tokens"]) == (3, 3, 2)
    assert (line["queue_ms"], line["prefill_ms"], line["decode_ms"]) == (1.0, 2.0, 3.0)
    assert line["total_ms"] > 0 and line["level"] == "info"
    # the same X-Request-Id on concurrent requests is fine: link ids stay unique
    same = {"x-request-id": "shared"}
    rs = await asyncio.gather(*(gateway.client.post("/v1/chat/completions", json=chat_body(f"w{i}"), headers=same) for i in range(3)))
    assert [r.status_code for r in rs] == [200, 200, 200]
    assert sorted(r.json()["choices"][0]["message"]["content"] for r in rs) == ["w0", "w1", "w2"]


async def test_stats_call(gateway):
    r = await gateway.client.get("/api/stats", params={"model": MODEL})
    assert r.status_code == 200
    assert r.json()["stats"]["profile"] == {"decode_ms": 1.5, "sample_ms": 0.25}
    r = await gateway.client.get("/api/stats", params={"model": "nope"})
    assert r.status_code == 404


async def test_unknown_route_is_json(gateway):
    r = await gateway.client.get("/v1/nothing")
    assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"
    r = await gateway.client.get("/v1/chat/completions")
    assert r.status_code == 405


async def test_an_unexpected_exception_still_answers_json(make_gateway, fake_worker):
    class Broken:
        def list(self):
            raise RuntimeError("disk on fire")

        def resolve(self, name):
            raise RuntimeError("disk on fire")

    gw = await make_gateway(fake_worker.endpoint, registry=Broken())
    r = await gw.client.get("/v1/models")
    assert r.status_code == 500
    rid = r.headers["x-request-id"]
    assert r.json()["error"]["code"] == "internal" and r.json()["error"]["message"] == f"internal error (request id {rid})"  # details stay in the log
    r = await gw.client.get("/api/stats")
    assert r.status_code == 500 and r.json() == {"error": f"internal error (request id {r.headers['x-request-id']})"}
    assert [e["path"] for e in gw.logs.events("unhandled_error")] == ["/v1/models", "/api/stats"]


async def test_stream_with_no_output_still_finishes(gateway):
    r = await gateway.client.post("/v1/chat/completions", json=chat_body("", stream=True))
    events = sse_events(r.text)
    assert r.status_code == 200 and len(events) == 3
    assert events[0]["choices"][0]["delta"]["role"] == "assistant"
    assert events[1]["choices"][0]["finish_reason"] == "stop" and events[2] == "[DONE]"


async def test_thinking_parts_become_reasoning_content(gateway):
    r = await gateway.client.post("/v1/chat/completions", json=chat_body("THINK:hmm THINK:ok answer"))
    msg = r.json()["choices"][0]["message"]
    assert msg == {"role": "assistant", "content": " answer", "reasoning_content": "hmmok"}
    r = await gateway.client.post("/v1/chat/completions", json=chat_body("THINK:hmm answer", stream=True))
    deltas = [c["choices"][0]["delta"] for c in sse_events(r.text)[:-1] if c["choices"]]
    assert {"reasoning_content": "hmm"} in deltas and {"content": " answer"} in deltas
    assert deltas.index({"reasoning_content": "hmm"}) < deltas.index({"content": " answer"})
