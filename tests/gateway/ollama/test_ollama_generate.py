"""/api/generate, /api/chat, /api/embed, /api/embeddings against the scripted fake worker, through the
official `ollama` client and raw HTTP (exact NDJSON field sets, as Ollama's API docs show them)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import httpx
import pytest

from barrel_inference.protocol import FinishReason

ollama = pytest.importorskip("ollama")

RFC3339_NANO = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d{1,9})?Z$")
FIGURES = {"total_duration", "load_duration", "prompt_eval_count", "prompt_eval_duration", "eval_count", "eval_duration"}
# field sets of Ollama's documented responses (docs/api.md): stream chunks, final chunks, load / unload answers
GENERATE_CHUNK = {"model", "created_at", "response", "done"}
GENERATE_FINAL = GENERATE_CHUNK | {"done_reason", "context"} | FIGURES
GENERATE_LOAD = GENERATE_CHUNK | {"done_reason"}
CHAT_CHUNK = {"model", "created_at", "message", "done"}
CHAT_FINAL = CHAT_CHUNK | {"done_reason"} | FIGURES


@pytest.fixture
def client(gateway):
    return ollama.AsyncClient(host="http://gateway.test", transport=httpx.ASGITransport(app=gateway.app))


def lines(resp: httpx.Response) -> list[dict]:
    return [json.loads(x) for x in resp.text.splitlines() if x.strip()]


async def test_generate_stream_ndjson_fields(gateway):
    r = await gateway.client.post("/api/generate", json={"model": "fake", "prompt": "one two three"})
    assert r.status_code == 200 and r.headers["content-type"].startswith("application/x-ndjson")
    chunks = lines(r)
    assert "".join(c["response"] for c in chunks[:-1]) == "one two three"  # a slow reader gets merged chunks
    for c in chunks[:-1]:
        assert set(c) == GENERATE_CHUNK and c["done"] is False and c["model"] == "fake"
        assert RFC3339_NANO.match(c["created_at"])
    final = chunks[-1]
    assert set(final) == GENERATE_FINAL and final["done"] is True and final["done_reason"] == "stop"
    assert final["response"] == "" and final["eval_count"] == 3
    assert final["prompt_eval_duration"] == 2_000_000 and final["eval_duration"] == 3_000_000  # ns from the worker's ms
    assert final["prompt_eval_count"] == 1  # 3 prompt tokens, 2 reused by the (fake) cache: evaluated only
    assert final["total_duration"] >= final["eval_duration"] and isinstance(final["load_duration"], int)


async def test_generate_plain_and_context_continuation(client, fake_worker):
    first = await client.generate(model="fake", prompt="hello there")
    assert first.done and first.response == "hello there" and first.done_reason == "stop"
    assert len(first.context) == 4  # the prompt's two ids and the reply's two
    second = await client.generate(model="fake", prompt="again", context=first.context)
    submit = fake_worker.submits[-1]
    assert submit.prompt_tokens[: len(first.context)] == list(first.context)  # the earlier ids come first
    assert second.response == "hello there hello there again"  # the fake echoes its whole prompt
    assert second.context[: len(first.context)] == list(first.context)


async def test_generate_format_and_options_reach_the_worker(client, fake_worker):
    await client.generate(model="fake", prompt="a b c", format="json",
                          options={"temperature": 0, "top_k": 3, "stop": ["x"], "num_predict": 2, "seed": 7})  # fmt: skip
    s = fake_worker.submits[-1]
    assert s.json_schema == {} and s.max_tokens == 2 and s.stop == ["x"]
    assert (s.sampling.temperature, s.sampling.top_k, s.sampling.seed) == (0.0, 3, 7)
    schema = {"type": "object", "properties": {"age": {"type": "integer"}}, "required": ["age"]}
    r = await client.generate(model="fake", prompt="a b c", format=schema, options={"num_predict": 1})
    assert fake_worker.submits[-1].json_schema == schema and r.done_reason == "length"


async def test_generate_raw_has_no_context(gateway):
    r = await gateway.client.post("/api/generate", json={"model": "fake", "prompt": "x y", "raw": True, "stream": False})
    body = r.json()
    assert body["response"] == "x y" and "context" not in body and set(body) == GENERATE_FINAL - {"context"}


async def test_load_and_unload_with_an_empty_prompt(gateway):
    r = await gateway.client.post("/api/generate", json={"model": "fake"})
    assert r.status_code == 200 and set(r.json()) == GENERATE_LOAD and r.json()["done_reason"] == "load"
    assert [m.name for m in gateway.models.running()] == ["fake:latest"]
    r = await gateway.client.post("/api/generate", json={"model": "fake", "keep_alive": 0})
    # the answer is Ollama's; a worker elsewhere (this in-process fake) is only connected to, so it stays
    # (tests/gateway/test_residency.py and the live daemon test show a local worker stopping)
    assert r.json()["done_reason"] == "unload" and [m.name for m in gateway.models.running()] == ["fake:latest"]
    r = await gateway.client.post("/api/chat", json={"model": "fake", "messages": []})
    assert r.json()["done_reason"] == "load" and r.json()["message"] == {"role": "assistant", "content": ""}


async def test_chat_stream_and_plain(client, gateway, fake_worker):
    chunks = [c async for c in await client.chat(model="fake", messages=[{"role": "user", "content": "hi you"}], stream=True)]
    assert "".join(c.message.content for c in chunks) == "hi you" and chunks[-1].done and chunks[-1].done_reason == "stop"
    r = await gateway.client.post("/api/chat", json={"model": "fake", "messages": [{"role": "user", "content": "a b"}]})
    raw = lines(r)
    assert all(set(c) == CHAT_CHUNK for c in raw[:-1]) and set(raw[-1]) == CHAT_FINAL
    assert raw[0]["message"]["role"] == "assistant" and "".join(c["message"]["content"] for c in raw) == "a b"
    plain = await client.chat(model="fake", messages=[
        {"role": "system", "content": "be brief"}, {"role": "user", "content": "q"},
        {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "f", "arguments": {"x": 1}}}]},
        {"role": "tool", "content": "42", "tool_name": "f"}, {"role": "user", "content": "so"},
    ])  # fmt: skip
    assert plain.message.content == "so"
    sent = fake_worker.submits[-1].messages
    assert [m.role for m in sent] == ["system", "user", "assistant", "tool", "user"]
    assert sent[2].tool_calls[0].name == "f" and json.loads(sent[2].tool_calls[0].arguments) == {"x": 1}
    assert sent[3].name == "f"


@pytest.mark.parametrize(
    "path, body, status, words",
    [
        ("/api/generate", {"model": "fake", "prompt": "x", "options": {"temperature": "hot"}}, 400, "option 'temperature' must be a number"),
        ("/api/generate", {"model": "fake", "prompt": "x", "options": {"temprature": 1}}, 400, "did you mean 'temperature'"),
        ("/api/chat", {"model": "fake", "messages": [{"role": "user", "content": "x"}], "options": {"num_ctx": "big"}}, 400, "'num_ctx' must be an integer"),
        ("/api/generate", {"model": "absent", "prompt": "x"}, 404, "model 'absent' not found, try pulling it first"),
        ("/api/chat", {"model": "absent", "messages": [{"role": "user", "content": "x"}]}, 404, "try pulling it first"),
        ("/api/embed", {"model": "absent", "input": "x"}, 404, "try pulling it first"),
        ("/api/generate", {"model": "fake", "prompt": "x", "images": ["aGk="]}, 400, "images are not supported"),
        ("/api/chat", {"model": "fake", "messages": [{"role": "user", "content": "x", "images": ["aGk="]}]}, 400, "images in messages are not supported"),
        ("/api/generate", {"model": "fake", "prompt": "x", "keep_alive": "5 minutes"}, 400, "invalid keep_alive"),
        ("/api/generate", {"model": "fake", "prompt": "x", "format": "yaml"}, 400, "format must be"),
        ("/api/generate", {"model": "fake", "prompt": "x", "think": True}, 400, "does not support thinking"),
        ("/api/chat", {"model": "fake", "messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function", "function": {"name": "f"}}]}, 400, "does not support tools"),
        ("/api/generate", {"prompt": "x"}, 400, "'model' is required"),
        ("/api/generate", {"model": "fake", "prompt": 3}, 400, "invalid request body"),
        ("/api/chat", {"model": "fake", "messages": [{"role": "robot", "content": "x"}]}, 400, "role must be"),
        ("/api/generate", {"model": "fake", "prompt": "TOOLONG"}, 400, "longer than the context"),
        ("/api/embed", {"model": "fake", "input": ["a"], "dimensions": 0}, 400, "dimensions must be positive"),
    ],
)  # fmt: skip
async def test_errors_in_ollamas_envelope(gateway, path, body, status, words):
    r = await gateway.client.post(path, json=body)
    assert r.status_code == status, r.text
    assert set(r.json()) == {"error"} and words in r.json()["error"]


async def test_mistyped_option_through_the_client(client):
    with pytest.raises(ollama.ResponseError) as e:
        await client.generate(model="fake", prompt="x", options={"top_k": "many"})
    assert e.value.status_code == 400 and "top_k" in e.value.error


async def test_failure_mid_stream_ends_with_an_error_line(gateway):
    r = await gateway.client.post("/api/generate", json={"model": "fake", "prompt": "a b CRASH"})
    chunks = lines(r)
    assert "".join(c.get("response", "") for c in chunks[:-1]) == "a b"
    assert set(chunks[-1]) == {"error"} and chunks[-1]["error"]


async def test_embed_and_embeddings(client, fake_worker):
    # the fake's vectors: [words, vowels, 1, 0], normalised
    r = await client.embed(model="fake", input=["a b", "c"])
    assert r.embeddings[0] == pytest.approx([2 / 6**0.5, 1 / 6**0.5, 1 / 6**0.5, 0.0])
    assert r.embeddings[1] == pytest.approx([1 / 2**0.5, 0.0, 1 / 2**0.5, 0.0])
    assert r.prompt_eval_count == 3 and r.total_duration > 0 and r.model == "fake"
    one = await client.embed(model="fake", input="a b", dimensions=2)
    assert one.embeddings[0] == pytest.approx([2 / 5**0.5, 1 / 5**0.5])  # first 2 dimensions, renormalised
    old = await client.embeddings(model="fake", prompt="a b")
    assert old.embedding == pytest.approx(r.embeddings[0])
    empty = await client.embed(model="fake", input=[])
    assert empty.embeddings == []


async def test_embed_truncates_by_default_and_refuses_when_asked_not_to(gateway, fake_worker):
    fake_worker_words = "w " * 600
    r = await gateway.client.post("/api/embed", json={"model": "fake", "input": fake_worker_words + "TOOLONG", "truncate": False})
    assert r.status_code == 400 and "longer than the context" in r.json()["error"]
    r = await gateway.client.post("/api/embed", json={"model": "fake", "input": fake_worker_words + "TOOLONG"})
    assert r.status_code == 200 and r.json()["prompt_eval_count"] == 510  # cut to n_ctx - 2 tokens
    assert any(type(c).__name__ == "Detokenize" for c in fake_worker.calls)


async def test_generate_stop_reason_length(client):
    r = await client.generate(model="fake", prompt="a b c d", options={"num_predict": 2})
    assert r.done_reason == "length" and r.response == "a b" and r.eval_count == 2


def test_finish_reason_values():
    from barrel_inference.gateway.ollama.stream import done_reason
    from barrel_inference.protocol import Done

    assert done_reason(Done(id="x", finish_reason=FinishReason.LENGTH)) == "length"
    assert done_reason(Done(id="x", finish_reason=FinishReason.STOP)) == "stop"


# ---- golden: the field sets and key order of Ollama's documented responses (docs/api.md examples) -----------
GOLDEN = {
    json.loads(x)["case"]: json.loads(x)["body"]
    for x in (Path(__file__).parent / "golden" / "ollama_api_docs.ndjson").read_text().splitlines()
    if x.strip()
}


def same_shape(ours: dict, theirs: dict) -> None:
    assert list(ours) == list(theirs), (ours, list(theirs))  # the same fields, in the same order
    for key, value in theirs.items():
        assert type(ours[key]) is type(value) or (isinstance(value, (int, float)) and isinstance(ours[key], (int, float))), key
        if isinstance(value, dict) and key == "message":
            assert list(ours[key])[:2] == ["role", "content"]


async def test_golden_generate_stream_and_raw(gateway):
    chunks = lines(await gateway.client.post("/api/generate", json={"model": "fake", "prompt": "one two"}))
    same_shape(chunks[0], GOLDEN["generate_chunk"])
    same_shape(chunks[-1], GOLDEN["generate_final"])
    raw = (await gateway.client.post("/api/generate", json={"model": "fake", "prompt": "x", "raw": True, "stream": False})).json()
    same_shape(raw, GOLDEN["generate_raw_final"])
    same_shape((await gateway.client.post("/api/generate", json={"model": "fake"})).json(), GOLDEN["generate_load"])
    same_shape((await gateway.client.post("/api/generate", json={"model": "fake", "keep_alive": 0})).json(), GOLDEN["generate_unload"])


async def test_golden_chat(gateway):
    chunks = lines(await gateway.client.post("/api/chat", json={"model": "fake", "messages": [{"role": "user", "content": "a b"}]}))
    same_shape(chunks[0], GOLDEN["chat_chunk"])
    same_shape(chunks[-1], GOLDEN["chat_final"])
    same_shape((await gateway.client.post("/api/chat", json={"model": "fake", "messages": []})).json(), GOLDEN["chat_load"])
    unload = await gateway.client.post("/api/chat", json={"model": "fake", "messages": [], "keep_alive": 0})
    same_shape(unload.json(), GOLDEN["chat_unload"])


async def test_golden_embed(gateway):
    same_shape((await gateway.client.post("/api/embed", json={"model": "fake", "input": "a"})).json(), GOLDEN["embed"])
    same_shape((await gateway.client.post("/api/embeddings", json={"model": "fake", "prompt": "a"})).json(), GOLDEN["embeddings"])


# ---- thinking and tool calls: typed parts from the worker as Ollama's message fields --------------------------
@pytest.fixture
async def tools_gateway(make_gateway, fake_worker):
    from ..conftest import MODEL, StubRecord, StubRegistry

    record = StubRecord(MODEL, loader={"tool_format": "qwen-xml", "thinking_start": "<think>"})
    return await make_gateway(fake_worker.endpoint, registry=StubRegistry(record))


TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]
SCRIPT = 'THINK:hmm so CALL:get_weather:{"city":"Paris"} CALL:f:{}'


async def test_chat_stream_maps_thinking_and_tool_calls(tools_gateway, fake_worker):
    r = await tools_gateway.client.post("/api/chat", json={
        "model": "fake", "messages": [{"role": "user", "content": SCRIPT}], "tools": TOOLS, "think": True,
    })  # fmt: skip
    chunks = lines(r)
    msgs = [c["message"] for c in chunks[:-1]]
    assert "".join(m.get("thinking", "") for m in msgs) == "hmm"
    assert "".join(m["content"] for m in msgs) == " so"
    calls = [tc for m in msgs for tc in m.get("tool_calls", [])]
    assert calls == [
        {"id": "call_fc0", "function": {"index": 0, "name": "get_weather", "arguments": {"city": "Paris"}}},
        {"id": "call_fc1", "function": {"index": 1, "name": "f", "arguments": {}}},
    ]  # whole calls, arguments as objects, in order
    assert chunks[-1]["done"] and chunks[-1]["done_reason"] == "stop"  # the turn ended as tool_calls: Ollama says stop
    s = fake_worker.submits[-1]
    assert s.tools == TOOLS


async def test_chat_plain_and_client_see_tool_calls_and_thinking(tools_gateway):
    c = ollama.AsyncClient(host="http://gateway.test", transport=httpx.ASGITransport(app=tools_gateway.app))
    r = await c.chat(model="fake", messages=[{"role": "user", "content": SCRIPT}], tools=TOOLS, think=True)
    assert r.message.thinking == "hmm" and r.message.content == " so"
    assert [(t.function.name, dict(t.function.arguments)) for t in r.message.tool_calls] == [("get_weather", {"city": "Paris"}), ("f", {})]
    g = await c.generate(model="fake", prompt="THINK:mull a b", think=True)
    assert g.thinking == "mull" and g.response == " a b"
    chunks = [x async for x in await c.generate(model="fake", prompt="THINK:mull a", think=True, stream=True)]
    assert "".join(x.thinking or "" for x in chunks) == "mull" and "".join(x.response for x in chunks) == " a"


async def test_tool_choice_extension_is_checked(gateway):
    r = await gateway.client.post("/api/chat", json={"model": "fake", "messages": [{"role": "user", "content": "x"}], "tool_choice": "always"})
    assert r.status_code == 400 and "tool_choice" in r.json()["error"]


@pytest.mark.parametrize("path, body", [
    ("/api/chat", {"model": "fake", "messages": [{"role": "user", "content": "a b c STALL"}]}),
    ("/api/generate", {"model": "fake", "prompt": "a b c STALL"}),
    ("/api/chat", {"model": "fake", "messages": [{"role": "user", "content": "a STALL"}], "stream": False}),
])  # fmt: skip
async def test_a_client_that_leaves_aborts_its_request(gateway, fake_worker, path, body):
    from ..test_disconnect import drive, wait_for

    streamed = body.get("stream", True)
    sent = await drive(gateway.app, path, body, disconnect_after_body_chunks=2 if streamed else None,
                       disconnect_when=None if streamed else (lambda _: fake_worker.submits))  # fmt: skip
    if streamed:
        assert sent[0]["status"] == 200
    rid = fake_worker.submits[-1].id
    await wait_for(lambda: fake_worker.aborts == [rid])
    await wait_for(lambda: gateway.models.handles()[0].in_flight == 0)


# ---- think follows the operator's settings, as the worker does (show: test_ollama_management) ---------------------------------------------
THINK_TEMPLATE = "{% for m in messages %}{{ m['content'] }}{% endfor %}{% if enable_thinking %}<think>{% endif %}"


@pytest.mark.parametrize("defaults,caps", [
    ({}, ["completion"]),
    ({"thinking_start": "<think>", "thinking_end": "</think>"}, ["completion", "thinking"]),  # markers by hand
    ({"chat_template": THINK_TEMPLATE}, ["completion", "thinking"]),  # detected in the operator's template
    ({"tool_format": "qwen-xml"}, ["completion", "tools"]),
])  # fmt: skip
async def test_think_is_checked_against_the_workers_effective_markers(make_gateway, fake_worker, defaults, caps):
    from barrel_inference.config import ModelSettings

    gw = await make_gateway(fake_worker.endpoint, defaults=ModelSettings(**defaults))  # the manifest's scan found none
    r = await gw.client.post("/api/generate", json={"model": "fake", "prompt": "THINK:mull a", "think": True, "stream": False})
    if "thinking" in caps:
        assert r.status_code == 200 and r.json()["thinking"] == "mull", r.text
    else:
        assert r.status_code == 400 and "does not support thinking" in r.json()["error"]


async def test_generate_renders_think_as_the_templates_switches(make_gateway, fake_worker):
    from barrel_inference.config import ModelSettings

    gw = await make_gateway(fake_worker.endpoint, defaults=ModelSettings(thinking_start="<think>", thinking_end="</think>"))
    for think, switches in ((True, {"enable_thinking": True}), ("low", {"enable_thinking": True, "reasoning_effort": "low"}),
                            (False, {"enable_thinking": False}), (None, {})):  # fmt: skip
        body = {"model": "fake", "prompt": "hello", "stream": False, **({} if think is None else {"think": think})}
        assert (await gw.client.post("/api/generate", json=body)).status_code == 200
        [render] = [c for c in fake_worker.calls if type(c).__name__ == "Render"][-1:]
        assert render.template_kwargs == switches


@pytest.mark.parametrize("extra,parallel", [
    ({"tool_choice": "required"}, False),  # a forced call is one call: the turn ends once it is complete
    ({"tool_choice": {"type": "function", "function": {"name": "get_weather"}}}, False),
    ({"tool_choice": "required", "parallel_tool_calls": True}, True),  # ours: several forced calls
    ({"tool_choice": "auto"}, True),
    ({}, True),
])  # fmt: skip
async def test_a_forced_call_on_chat_is_one_call(tools_gateway, fake_worker, extra, parallel):
    body = {"model": "fake", "messages": [{"role": "user", "content": "hi"}], "tools": TOOLS, "stream": False, **extra}
    r = await tools_gateway.client.post("/api/chat", json=body)
    assert r.status_code == 200, r.text
    assert fake_worker.submits[-1].parallel_tool_calls is parallel
