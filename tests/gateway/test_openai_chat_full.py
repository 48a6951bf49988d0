"""Chat completions in full against the fake worker: the limits refused by name (n, stop, top_logprobs,
best_of), logprobs and suffix handed to the worker, echo, system_fingerprint."""

from __future__ import annotations

import json

import pytest

from barrel_inference.gateway.openai.convert import fingerprint
from barrel_inference.protocol import EngineInfo, Hello

from .conftest import MODEL


def chat_body(text: str = "hello there world", **kw) -> dict:
    return {"model": MODEL, "messages": [{"role": "user", "content": text}], **kw}


@pytest.mark.parametrize("path,extra,param", [
    ("/v1/chat/completions", {"n": 2}, "n"),
    ("/v1/chat/completions", {"stop": [f"s{i}" for i in range(17)]}, "stop"),
    ("/v1/chat/completions", {"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ("/v1/chat/completions", {"top_logprobs": 3}, "top_logprobs"),
    ("/v1/completions", {"best_of": 2}, "best_of"),
    ("/v1/completions", {"n": 3}, "n"),
    ("/v1/completions", {"logprobs": 21}, "logprobs"),
    ("/v1/completions", {"echo": True, "logprobs": 2}, "echo"),
])  # fmt: skip
async def test_limits_are_refused_naming_the_field(gateway, path, extra, param):
    body = chat_body(**extra) if "chat" in path else {"model": MODEL, "prompt": "a b", **extra}
    r = await gateway.client.post(path, json=body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param and param in r.json()["error"]["message"]


async def test_sixteen_stops_user_and_max_completion_tokens_pass(gateway, fake_worker):
    r = await gateway.client.post("/v1/chat/completions", json=chat_body(
        "a b c d", stop=[f"s{i}" for i in range(16)], user="someone", max_completion_tokens=2, logprobs=True, top_logprobs=20))  # fmt: skip
    assert r.status_code == 200, r.text
    s = fake_worker.submits[-1]
    assert len(s.stop) == 16 and s.max_tokens == 2 and s.logprobs == 20
    assert r.json()["choices"][0]["finish_reason"] == "length"
    assert r.json()["system_fingerprint"].startswith("fp_")


async def test_echo_and_suffix(gateway, fake_worker):
    r = await gateway.client.post("/v1/completions", json={"model": MODEL, "prompt": "one two", "echo": True})
    assert r.status_code == 200 and r.json()["choices"][0]["text"] == "one twoone two"
    r = await gateway.client.post("/v1/completions", json={"model": MODEL, "prompt": "one two", "echo": True, "stream": True})
    first = json.loads(r.text.split("\n\n")[0][len("data: "):])
    assert r.status_code == 200 and first["choices"][0]["text"] == "one two"
    await gateway.client.post("/v1/completions", json={"model": MODEL, "prompt": "def f(", "suffix": "return 1"})
    assert fake_worker.submits[-1].suffix == "return 1"


def test_system_fingerprint_changes_with_model_build_and_profile():
    def hello(**info):
        return Hello(protocol_version=3, model="m", architecture="llama", n_ctx=1, n_ctx_train=1, n_seq_max=1, n_vocab=10,
                     chat_template="gguf", engine_info=EngineInfo(**info))  # fmt: skip

    base = fingerprint("m", hello(llama_cpp_version="0.3.1", profile="default"))
    assert base == fingerprint("m", hello(llama_cpp_version="0.3.1", profile="default"))
    assert base != fingerprint("other", hello(llama_cpp_version="0.3.1", profile="default"))
    assert base != fingerprint("m", hello(llama_cpp_version="0.3.2", profile="default"))
    assert base != fingerprint("m", hello(llama_cpp_version="0.3.1", profile="safe"))
