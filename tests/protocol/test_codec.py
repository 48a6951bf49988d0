"""Every message survives a round trip through the codec of each direction."""

import msgspec
import pytest

from barrel_inference.protocol import (
    PROTOCOL_VERSION, REPLY_OF, Abort, Accepted, ChatMessage, Connect, CountResult, CountTokens, Delta, Detokenize,
    DetokenizeResult, Done, Embed, EmbedResult, EndSession, ErrorCode, ErrorInfo, FinishReason, GatewayCodec, GetStats,
    Hello, HelperCall, HelperReply, Ping, Pong, Render, RenderResult, Sampling, StatsResult, Submit, TextPart,
    SchemaReceipt, ThinkingPart, Tick, Timings, TokenLogprob, Tokenize, TokenizeResult, ToolCall, ToolCallArgs, ToolCallEnd,
    ToolCallStart, TopLogprob, Usage, WorkerCodec, merge_parts,
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
    Submit("r3", messages=[ChatMessage("user", "hi")], tools=[{"type": "function", "function": {"name": "f"}}],
           tool_choice={"type": "function", "function": {"name": "f"}}, parallel_tool_calls=False,
           template_kwargs={"enable_thinking": False, "reasoning_effort": "low"}, thinking_budget=64),  # fmt: skip
    Submit("r3b", prompt="def f(", suffix="return 1", logprobs=5, json_schema={"type": "integer"}, json_schema_strict=True),
    Abort(["r1", "r2"]),
    EndSession("s1"),
    Tokenize("c1", "hello", add_special=False),
    Detokenize("c2", [1, 2]),
    Render("c3", [ChatMessage("user", "hi")], tools=[{"type": "function"}]),
    CountTokens("c4", messages=[ChatMessage("user", "hi")]),
    GetStats("c5"),
    Embed("c6", ["a text", [1, 2, 3]]),
    Ping(3),
]

FROM_WORKER = [
    Hello(PROTOCOL_VERSION, "m:latest", "llama", 2048, 4096, 4, 271, "gguf", pid=12),
    Tick(
        accepted=[Accepted("r1", prompt_tokens=5, cached_tokens=1, n_ctx=2048)],
        deltas=[Delta("r1", [ThinkingPart("hm"), TextPart("hé"), ToolCallStart(0, "c0", "f"), ToolCallArgs(0, '{"a"'),
                             ToolCallEnd(0, '{"a": 1}', '{"a":1}')], [1, 2], 2)],
        done=[
            Done("r1", FinishReason.STOP, "END", Usage(5, 2, 1), Timings(1.0, 2.0, 3.0)),
            Done("r2", FinishReason.ERROR, error=ErrorInfo(ErrorCode.CONTEXT_LENGTH, "too long", param="messages")),
        ],
    ),
    TokenizeResult(id="c1", tokens=[1, 2]),
    DetokenizeResult(id="c2", text="ab"),
    RenderResult(id="c3", error=ErrorInfo(ErrorCode.TEMPLATE, "bad")),
    CountResult(id="c4", count=3),
    StatsResult(id="c5", stats={"running": 1}),
    EmbedResult(id="c6", embeddings=[[0.6, 0.8]], count=4),
    Tick(done=[Done("r3", FinishReason.TOOL_CALLS)]),
    Tick(accepted=[Accepted("r5", prompt_tokens=9, tool_replay={"hit": 1, "miss": 1})],
         done=[Done("r5", FinishReason.ERROR, error=ErrorInfo(ErrorCode.TOOL_CALL_INVALID, "not a declared tool"))]),  # fmt: skip
    Tick(accepted=[Accepted("r4", 3, schema_receipt=SchemaReceipt(["type", "minimum"], ["pattern"], ["format:x"]))],
         deltas=[Delta("r4", [TextPart("é")], n_tokens=1, logprobs=[TokenLogprob(7, -0.25, b"\xc3\xa9", [TopLogprob(7, -0.25, b"\xc3\xa9")])])],
         done=[Done("r4", FinishReason.ERROR, error=ErrorInfo(ErrorCode.OUTPUT_INVALID, "invalid"))]),
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


def test_every_helper_call_has_its_own_reply():
    assert set(REPLY_OF) == set(HelperCall.__args__)
    assert set(REPLY_OF.values()) == set(HelperReply.__args__)


def test_delta_parts_keep_their_order_and_type_tag():
    d = Delta("r", [TextPart("a"), ToolCallStart(0, "c", "f")])
    raw = msgspec.msgpack.decode(WorkerCodec().encode(Tick(deltas=[d])))
    assert [p["type"] for p in raw["deltas"][0]["parts"]] == ["text", "tool_call_start"]
    assert d.text == "a"


def test_merge_parts_joins_adjacent_parts_of_one_kind_only():
    out: list = []
    merge_parts(out, [TextPart("a"), TextPart("b"), ThinkingPart("t"), ThinkingPart("u"), TextPart("c")])
    merge_parts(out, [TextPart("d"), ToolCallStart(0, "x", "f"), ToolCallArgs(0, "{"), ToolCallArgs(0, "}"),
                      ToolCallArgs(1, "[")])  # fmt: skip
    assert out == [TextPart("ab"), ThinkingPart("tu"), TextPart("cd"), ToolCallStart(0, "x", "f"), ToolCallArgs(0, "{}"),
                   ToolCallArgs(1, "[")]  # fmt: skip


def _tick_bytes(done: dict) -> bytes:
    return msgspec.msgpack.encode({"kind": "tick", "deltas": [{"id": "ok", "parts": [{"type": "text", "text": "x"}]}],
                                   "done": [{"id": "ok", "finish_reason": "stop"}, done]})  # fmt: skip


def test_an_unknown_finish_reason_fails_only_its_request():
    tick = GatewayCodec().decode(_tick_bytes({"id": "new", "finish_reason": "paused_for_tea"}))
    ok, new = tick.done
    assert ok.finish_reason is FinishReason.STOP and ok.error is None
    assert tick.deltas[0].text == "x"
    assert new.finish_reason is FinishReason.ERROR
    assert new.error.code is ErrorCode.INTERNAL and "paused_for_tea" in new.error.message


def test_an_unknown_error_code_decodes_as_internal_naming_it():
    tick = GatewayCodec().decode(_tick_bytes({"id": "e", "finish_reason": "error", "error": {"code": "gpu_on_fire", "message": "m"}}))
    err = tick.done[1].error
    assert err.code is ErrorCode.INTERNAL and "gpu_on_fire" in err.message and err.message.startswith("m")


def test_known_enum_values_decode_to_the_enums():
    raw = GatewayCodec().decode(WorkerCodec().encode(Tick(done=[Done("a", FinishReason.LENGTH, error=ErrorInfo(ErrorCode.OVERLOADED, "x"))])))
    assert raw.done[0].finish_reason is FinishReason.LENGTH and raw.done[0].error.code is ErrorCode.OVERLOADED

