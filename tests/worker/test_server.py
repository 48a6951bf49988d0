"""The worker as a real process, spoken to over a real ZeroMQ socket with the protocol codec."""

import signal
import subprocess
import sys
import time
import uuid

import pytest
import zmq

from barrel_inference.protocol import (
    PROTOCOL_VERSION, Abort, ChatMessage, Connect, CountTokens, Embed, GetStats, Render, Tokenize, ErrorCode, FinishReason, GatewayCodec, Hello, Ping, Pong,
    Sampling, Submit, Tick,
)  # fmt: skip


class Client:
    def __init__(self, endpoint):
        self.codec = GatewayCodec()
        self.sock = zmq.Context.instance().socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(endpoint)

    def send(self, msg):
        self.sock.send(self.codec.encode(msg))

    def recv(self, timeout=30.0):
        if not self.sock.poll(int(timeout * 1000)):
            raise TimeoutError("no message from the worker")
        return self.codec.decode(self.sock.recv())

    def until_done(self, ids, timeout=60.0):
        ids, texts, dones = set(ids), {}, {}
        deadline = time.monotonic() + timeout
        while ids - set(dones):
            msg = self.recv(max(0.1, deadline - time.monotonic()))
            if isinstance(msg, Tick):
                for d in msg.deltas:
                    texts[d.id] = texts.get(d.id, "") + d.text
                for d in msg.done:
                    dones[d.id] = d
        return texts, dones

    def close(self):
        self.sock.close(0)


@pytest.fixture
def worker(tiny_gguf, tmp_path):
    endpoint = f"ipc://{tmp_path}/w-{uuid.uuid4().hex[:6]}.sock"
    proc = subprocess.Popen(
        [sys.executable, "-m", "barrel_inference.worker", "--bind", endpoint, "--model-path", str(tiny_gguf),
         "--model-name", "tiny:latest", "--n-ctx", "256", "--n-seq-max", "2", "--threads", "1"],
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    client = Client(endpoint)
    yield proc, client
    client.close()
    if proc.poll() is None:
        proc.kill()
    proc.wait()


def hello(client) -> Hello:
    client.send(Connect())
    msg = client.recv()
    assert isinstance(msg, Hello)
    return msg


def test_hello_describes_the_model(worker):
    _, client = worker
    h = hello(client)
    assert h.protocol_version == PROTOCOL_VERSION
    assert (h.model, h.architecture, h.n_ctx, h.n_seq_max, h.chat_template) == ("tiny:latest", "llama", 256, 2, "gguf")
    assert "<|im_start|>" in h.chat_template_source and h.pid > 0


def test_chat_generation_and_calls(worker):
    _, client = worker
    hello(client)
    client.send(Render("c1", [ChatMessage("user", "hi")]))
    r = client.recv()
    assert r.text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    client.send(Tokenize("c2", "<|im_start|>", add_special=False))
    assert len(client.recv().tokens) == 1  # a special token is one id
    client.send(CountTokens("c3", messages=[ChatMessage("user", "hi")]))
    assert client.recv().count > 5
    client.send(Submit("g1", messages=[ChatMessage("user", "hi")], sampling=Sampling(temperature=0), max_tokens=8, ignore_eos=True))
    texts, dones = client.until_done(["g1"])
    d = dones["g1"]
    assert d.finish_reason is FinishReason.LENGTH and d.usage.completion_tokens == 8 and d.usage.prompt_tokens > 5
    client.send(GetStats("c4"))
    st = client.recv().stats
    assert st["requests_total"] == 1 and st["profile"]["ticks"] >= 8
    client.send(Ping(9))
    assert client.recv() == Pong(9, 0, 0)


def test_over_long_prompt_is_a_typed_error_before_any_decode(worker):
    _, client = worker
    hello(client)
    client.send(Submit("long", prompt="word " * 400, max_tokens=4))
    _, dones = client.until_done(["long"])
    err = dones["long"].error
    assert dones["long"].finish_reason is FinishReason.ERROR and err.code is ErrorCode.CONTEXT_LENGTH
    assert "256" in err.message
    client.send(GetStats("s"))
    assert client.recv().stats["profile"]["ticks"] == 0  # nothing was decoded


def test_bad_grammar_and_bad_tokens_are_typed_errors(worker):
    _, client = worker
    hello(client)
    client.send(Submit("g", prompt="x", grammar="this is not gbnf", max_tokens=2))
    client.send(Submit("t", prompt_tokens=[10**6], max_tokens=2))
    client.send(Submit("m", prompt="x", max_tokens=0))
    _, dones = client.until_done(["g", "t", "m"])
    assert dones["g"].error.code is ErrorCode.GRAMMAR
    assert dones["t"].error.code is ErrorCode.INVALID_REQUEST and dones["t"].error.param == "prompt"
    assert dones["m"].error.param == "max_tokens"


def test_abort_ends_with_done_abort_and_sigterm_exits_cleanly(worker):
    proc, client = worker
    hello(client)
    client.send(Submit("a", prompt="hello", max_tokens=100000, ignore_eos=True))
    msg = client.recv()
    assert isinstance(msg, Tick)
    client.send(Abort(["a"]))
    _, dones = client.until_done(["a"])
    assert dones["a"].finish_reason is FinishReason.ABORT
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(10) == 0


def test_json_schema_forces_valid_json(worker):
    import json

    _, client = worker
    hello(client)
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
    client.send(Submit("j", prompt="answer:", json_schema=schema, max_tokens=64, sampling=Sampling(temperature=0)))
    texts, dones = client.until_done(["j"])
    assert dones["j"].finish_reason is FinishReason.STOP
    assert isinstance(json.loads(texts["j"])["ok"], bool)


def test_embed_call(worker):
    _, client = worker
    hello(client)
    client.send(Embed("e", ["abc", "abc", "xyz"]))
    r = client.recv()
    assert r.error is None and len(r.embeddings) == 3 and len(r.embeddings[0]) == 64
    assert r.embeddings[0] == r.embeddings[1] != r.embeddings[2]
    client.send(Embed("e2", ["ok", "word " * 400]))
    err = client.recv().error
    assert err.code is ErrorCode.CONTEXT_LENGTH and "input[1]" in err.message
    client.send(Tokenize("t", "abc", add_special=True, parse_special=False))
    tokens = client.recv().tokens
    client.send(Embed("e3", [tokens, "abc"]))  # token ids embed like the text they spell
    r = client.recv()
    assert r.error is None and r.embeddings[0] == r.embeddings[1]
    client.send(Embed("e4", [[10**6]]))
    err = client.recv().error
    assert err.code is ErrorCode.INVALID_REQUEST and err.param == "input[0]"


def test_generation_streams_while_embedding_runs_on_its_own_thread(worker):
    """The scheduler thread hands Embed to the embedding thread: ticks of a running stream go on."""
    _, client = worker
    hello(client)
    client.send(Submit("g", prompt="hello", max_tokens=40, ignore_eos=True, sampling=Sampling(temperature=0)))
    client.send(Embed("e", ["word " * 48] * 40))
    seen, order = set(), []
    deadline = time.monotonic() + 60
    while not {"g", "e"} <= seen and time.monotonic() < deadline:
        msg = client.recv()
        if isinstance(msg, Tick):
            order += ["tick-g" for d in msg.deltas if d.id == "g"]
            seen.update(d.id for d in msg.done)
        elif getattr(msg, "id", None) == "e":
            assert msg.error is None and len(msg.embeddings) == 40
            order.append("embed")
            seen.add("e")
    assert {"g", "e"} <= seen
    # tokens kept streaming while the embeddings were computed (on the scheduler thread at most one
    # tick could have slipped in before the embedding call held it)
    assert order[: order.index("embed")].count("tick-g") >= 3, order


def test_an_aborted_embedding_stops_between_inputs(worker):
    _, client = worker
    hello(client)
    client.send(Embed("e", ["word " * 48] * 400))
    client.send(Abort(["e"]))
    r = client.recv()
    assert r.id == "e" and r.error is not None and "aborted" in r.error.message and r.embeddings == []
