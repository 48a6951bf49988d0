"""Every message survives a round trip through the codec of each direction."""

import msgspec
import pytest

from barrel_inference.protocol import (
    PROTOCOL_VERSION, Abort, Call, CallResult, ChatMessage, Connect, Delta, Done, EndSession, ErrorCode, ErrorInfo,
    FinishReason, GatewayCodec, Hello, Ping, Pong, Sampling, Submit, Tick, Timings, ToolCall, Usage, WorkerCodec,
)  # fmt: skip

TO_WORKER = [
    Connect(client="gw-1"),
    Submit(
        "r1",
        messages=[ChatMessage("system", "be brief"), ChatMessage("assistant", "", tool_calls=[ToolCall("f", '{"a": 1}', "c1")])],
        sampling=Sampling(temperature=0.0, seed=7, logit_bias={1: -100.0}),
        stop=["\n\n", "END"],
        max_tokens=16,
        json_schema={"type": "object"},
        session="s1",
    ),
    Submit("r2", prompt_tokens=[1, 2, 3], grammar='root ::= "a"', ignore_eos=True, want_tokens=True),
    Abort(["r1", "r2"]),
    EndSession("s1"),
    Call("c1", "tokenize", text="hello", add_special=False),
    Call("c2", "render", messages=[ChatMessage("user", "hi")], tools=[{"type": "function"}]),
    Ping(3),
]

FROM_WORKER = [
    Hello(PROTOCOL_VERSION, "m:latest", "llama", 2048, 4096, 4, 271, "gguf", pid=12),
    Tick(
        deltas=[Delta("r1", "hé", [1, 2], 2)],
        done=[
            Done("r1", FinishReason.STOP, "END", Usage(5, 2, 1), Timings(1.0, 2.0, 3.0)),
            Done("r2", FinishReason.ERROR, error=ErrorInfo(ErrorCode.CONTEXT_LENGTH, "too long", param="messages")),
        ],
    ),
    CallResult("c1", tokens=[1, 2]),
    CallResult("c2", error=ErrorInfo(ErrorCode.TEMPLATE, "bad")),
    Pong(3, running=1, waiting=2),
]


@pytest.mark.parametrize("msg", TO_WORKER, ids=lambda m: type(m).__name__)
def test_gateway_to_worker_round_trip(msg):
    assert WorkerCodec().decode(GatewayCodec().encode(msg)) == msg


@pytest.mark.parametrize("msg", FROM_WORKER, ids=lambda m: type(m).__name__)
def test_worker_to_gateway_round_trip(msg):
    assert GatewayCodec().decode(WorkerCodec().encode(msg)) == msg


def test_tag_field_is_kind_and_defaults_are_omitted():
    raw = msgspec.msgpack.decode(GatewayCodec().encode(Submit("r", prompt="x")))
    assert raw["kind"] == "submit"
    assert "grammar" not in raw and "stop" not in raw


def test_unknown_fields_from_a_newer_peer_are_ignored():
    raw = {"kind": "ping", "nonce": 1, "added_in_v9": True}
    assert WorkerCodec().decode(msgspec.msgpack.encode(raw)) == Ping(1)


def test_a_direction_rejects_the_other_directions_messages():
    with pytest.raises(msgspec.ValidationError):
        WorkerCodec().decode(WorkerCodec().encode(Tick()))
