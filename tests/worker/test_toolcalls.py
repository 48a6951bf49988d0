"""Tool calls and thinking through the real llama.cpp path, on tiny GGUFs whose markers are CONTROL
tokens (rendered only with special text) and the real Qwen 2.5, Llama 3.1 and Mistral templates."""

from __future__ import annotations

import json

import jsonschema
import pytest

from barrel_inference.protocol import (
    ChatMessage, ErrorCode, FinishReason, Sampling, Submit, TextPart, ThinkingPart, ToolCall, ToolCallArgs,
    ToolCallEnd, ToolCallStart,
)  # fmt: skip
from barrel_inference.toolcalls.replay import ReplayMap
from barrel_inference.worker.engine import LlamaEngine
from barrel_inference.worker.engine_profile import resolve
from barrel_inference.worker.scheduler import Scheduler
from barrel_inference.worker.server import WorkerServer
from barrel_inference.worker.templates import ChatTemplate
from barrel_inference.worker.toolhook import ModelTools
from tinymodel import real_template, write_tiny_gguf

from .harness import Collector

CITY = {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"]}}, "required": ["city"]}
TZ = {"type": "object", "properties": {"tz": {"type": "string", "enum": ["UTC", "CET"]}}, "required": ["tz"]}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather of a city", "parameters": CITY}},
    {"type": "function", "function": {"name": "get_time", "description": "Time in a zone", "parameters": TZ}},
]
USER = [ChatMessage(role="user", content="What is the weather in Paris?")]
# flavour -> (format, start marker, whether the end marker is part of the span)
FLAVOURS = {
    "qwen2.5": ("qwen-xml", "<tool_call>", "</tool_call>"),
    "llama3.1": ("llama-python-tag", "<|python_tag|>", None),
    "mistral": ("mistral-tool-calls", "[TOOL_CALLS]", None),
}


class Worker:
    """A WorkerServer in-process: requests go through its _submit and preparation threads, ticks to a collector."""

    def __init__(self, path, *, template=None, thinking=None, replay=None, tool_format=None):
        extra = resolve("default", "auto").extra_buffers  # off on CPUs whose repacked layouts crash llama.cpp
        self.engine = LlamaEngine(str(path), n_ctx=4096, n_seq_max=2, n_batch=512, threads=1, extra_buffers=extra)
        bos, eos = self.engine.token_text(self.engine.bos), self.engine.token_text(self.engine.eos)
        tmpl = ChatTemplate.choose(template, self.engine.chat_template, self.engine.architecture, bos, eos)
        self.tools = ModelTools(self.engine, tmpl.source, tool_format=tool_format, thinking=thinking, replay=replay)
        self.server = WorkerServer(self.engine, tmpl, model="tiny", bind="ipc:///nowhere", n_ctx=4096, tools=self.tools)
        self.c = Collector()
        self.server.scheduler = Scheduler(self.engine, self.c.emit, n_ctx=4096)
        self.server._post_out = self.c.emit  # refusals found while preparing (off the scheduler thread)
        self.server.scheduler.start()
        self.n = 0

    def run(self, **kw):
        self.n += 1
        rid = f"r{self.n}"
        kw.setdefault("messages", USER)
        kw.setdefault("sampling", Sampling(temperature=0))
        reply = self.server._submit(b"p", Submit(id=rid, want_tokens=True, **kw))
        if reply is not None:  # refused before it ran
            return [], reply.done[0], []
        self.c.wait([rid])
        deltas = [d for _, _, t in self.c.ticks for d in t.deltas if d.id == rid]
        parts = []
        for p in (p for d in deltas for p in d.parts):  # adjacent text / thinking across deltas joined
            if parts and type(p) is type(parts[-1]) and type(p) in (TextPart, ThinkingPart):
                parts[-1] = type(p)(parts[-1].text + p.text)
            else:
                parts.append(p)
        return parts, self.c.done()[rid], [t for d in deltas for t in d.tokens]

    def close(self):
        self.server.scheduler.stop()
        self.engine.close()


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("flavours")
    return {f: write_tiny_gguf(d / f"{f}.gguf", flavour=f, context_length=8192) for f in FLAVOURS}


@pytest.fixture(scope="module")
def workers(models):
    ws = {f: Worker(p) for f, p in models.items()}
    yield ws
    for w in ws.values():
        w.close()


def calls(parts):
    out = {}
    for p in parts:
        if isinstance(p, ToolCallStart):
            out[p.index] = {"id": p.id, "name": p.name, "args": ""}
        elif isinstance(p, ToolCallArgs):
            out[p.index]["args"] += p.text
        elif isinstance(p, ToolCallEnd):
            out[p.index]["end"] = p
    return list(out.values())


@pytest.mark.parametrize("flavour", sorted(FLAVOURS))
def test_markers_are_control_tokens_seen_only_with_special_text(workers, flavour):
    w = workers[flavour]
    fmt, start, _ = FLAVOURS[flavour]
    assert w.tools.fmt.name == fmt
    tok = w.tools.marker_ids[start]
    assert w.engine.piece(tok) == b"" and w.engine.piece(tok, special=True) == start.encode()
    assert w.tools.piece(tok) == start.encode()


@pytest.mark.parametrize("flavour", sorted(FLAVOURS))
@pytest.mark.parametrize("choice, name", [("required", None), ({"type": "function", "function": {"name": "get_time"}}, "get_time")])
def test_forced_tool_choice_gives_a_valid_call(workers, flavour, choice, name):
    w = workers[flavour]
    parts, done, tokens = w.run(tools=TOOLS, tool_choice=choice, max_tokens=80, parallel_tool_calls=False)
    assert done.finish_reason is FinishReason.TOOL_CALLS, (done, parts)
    [call] = calls(parts)
    assert call["name"] == (name or call["name"]) and call["name"] in ("get_weather", "get_time")
    schema = CITY if call["name"] == "get_weather" else TZ
    jsonschema.validate(json.loads(call["args"]), schema)
    _, start, end = FLAVOURS[flavour]
    raw = call["end"].raw
    assert raw.startswith(start) and (end is None or raw.endswith(end))
    assert tokens[0] == w.tools.marker_ids[start]  # the marker came as its control token
    assert not any(isinstance(p, TextPart) and start in p.text for p in parts)


def test_tool_choice_none_removes_the_tools(workers):
    w = workers["qwen2.5"]
    parts, done, _ = w.run(tools=TOOLS, tool_choice="none", max_tokens=4)
    assert done.finish_reason is FinishReason.LENGTH and not calls(parts)
    plan = w.tools.plan(Submit(id="x", messages=USER, tools=TOOLS, tool_choice="none"))
    assert plan.tools is None and "<tools>" not in w.server.prompts.render(plan.messages, plan.tools, True, plan.template_kwargs)
    plan = w.tools.plan(Submit(id="x", messages=USER, tools=TOOLS))
    assert "<tools>" in w.server.prompts.render(plan.messages, plan.tools, True, plan.template_kwargs)


def test_max_tokens_inside_a_call_never_yields_a_call(workers):
    parts, done, _ = workers["qwen2.5"].run(tools=TOOLS, tool_choice="required", max_tokens=5)
    assert done.finish_reason is FinishReason.LENGTH
    assert not calls(parts) and not any(isinstance(p, TextPart) and "tool_call" in p.text for p in parts)


def test_an_invalid_call_is_an_error_of_the_turn(workers):
    w = workers["qwen2.5"]
    start, end = w.tools.marker_ids["<tool_call>"], w.tools.marker_ids["</tool_call>"]
    grammar = f'root ::= "ok " <[{start}]> "{{\\"name\\": \\"delete_all\\", \\"arguments\\": {{}}}}" <[{end}]>'
    parts, done, _ = w.run(tools=TOOLS, grammar=grammar, max_tokens=60)
    assert done.finish_reason is FinishReason.ERROR and done.error.code is ErrorCode.TOOL_CALL_INVALID
    assert "delete_all" in done.error.message and not calls(parts)


def test_unknown_named_tool_and_bad_schema_are_refused(workers):
    w = workers["qwen2.5"]
    _, done, _ = w.run(tools=TOOLS, tool_choice={"type": "function", "function": {"name": "nope"}})
    assert done.error.code is ErrorCode.INVALID_REQUEST and done.error.param == "tool_choice"
    bad = [{"type": "function", "function": {"name": "f", "parameters": {"type": 5}}}]
    _, done, _ = w.run(tools=bad)
    assert done.error.code is ErrorCode.INVALID_REQUEST and done.error.param == "tools[0]"


def test_generic_format_for_a_model_without_one(models, tmp_path):
    path = write_tiny_gguf(tmp_path / "plain.gguf", chat_template=None, context_length=8192)  # ChatML fallback, no tool format
    w = Worker(path)
    try:
        assert w.tools.fmt is None
        plan = w.tools.plan(Submit(id="x", messages=USER, tools=TOOLS, tool_choice="required"))
        assert plan.messages[0].role == "system" and '"tool_call"' in plan.messages[0].content and plan.tools is None
        parts, done, _ = w.run(tools=TOOLS, tool_choice="required", max_tokens=200, parallel_tool_calls=False)
        assert done.finish_reason is FinishReason.TOOL_CALLS, (done, parts)
        [call] = calls(parts)
        assert json.loads(call["end"].raw)["tool_call"]["name"] == call["name"]
    finally:
        w.close()


def test_thinking_parts_and_budget(models):
    think = real_template("qwen2.5") + "{% if add_generation_prompt %}<think>\n{% endif %}"
    w = Worker(models["qwen2.5"], template=think, thinking=("<think>", "</think>"))
    try:
        end = w.tools.marker_ids["</think>"]
        parts, done, tokens = w.run(thinking_budget=3, max_tokens=8)
        assert tokens[3] == end  # the end marker was forced after three thinking tokens
        assert isinstance(parts[0], ThinkingPart) and parts[0].text
        assert all(not isinstance(p, ThinkingPart) for p in parts[1:])
        assert done.finish_reason is FinishReason.LENGTH
    finally:
        w.close()


def test_template_switches_reach_the_template(workers):
    w = workers["qwen2.5"]
    src = "{% if enable_thinking is defined and not enable_thinking %}NO-THINK{% endif %}{{ reasoning_effort }}{{ tool_choice }}"
    tmpl = ChatTemplate(src, "custom")
    plan = w.tools.plan(Submit(id="x", messages=USER, tools=TOOLS, tool_choice="required",
                               template_kwargs={"enable_thinking": False, "reasoning_effort": "low", "messages": []}))  # fmt: skip
    assert tmpl.render(plan.messages, plan.tools, True, plan.template_kwargs) == "NO-THINKlowrequired"


def test_replay_renders_the_captured_bytes_across_restarts(models, tmp_path):
    db = tmp_path / "replay.sqlite"
    w = Worker(models["qwen2.5"], replay=ReplayMap(db))
    try:
        parts, done, _ = w.run(tools=TOOLS, tool_choice="required", max_tokens=80, parallel_tool_calls=False)
        [call] = calls(parts)
    finally:
        w.close()
        w.tools.replay.close()
    history = USER + [
        ChatMessage(role="assistant", content="", tool_calls=[ToolCall(name=call["name"], arguments='{"city": "Rome"}', id="call_" + call["id"])]),
        ChatMessage(role="tool", content="sunny", tool_call_id="call_" + call["id"]),
    ]
    w2 = Worker(models["qwen2.5"], replay=ReplayMap(db))  # a new worker process would open the same file
    try:
        plan = w2.tools.plan(Submit(id="y", messages=history, tools=TOOLS))
        text = w2.server.prompts.render(plan.messages, plan.tools, True, plan.template_kwargs)
        assert "<|im_start|>assistant\n" + call["end"].raw + "<|im_end|>" in text
        assert w2.tools.replay.counts["hit"] == 1 and list(plan.replayed) == [1]
        raw, toks = plan.replayed[1]
        assert raw == call["end"].raw and toks and toks[0] == w2.tools.marker_ids["<tool_call>"]
        assert b"".join(w2.tools.piece(t) for t in toks) == raw.encode()  # the model's own tokens of the span
        prompt = w2.server.prompts.tokens(Submit(id="y", messages=history, tools=TOOLS), plan)
        at = next(i for i in range(len(prompt)) if prompt[i : i + len(toks)] == toks)  # spliced in whole
        assert w2.engine.detokenize(prompt, special=True) == text and at > 0
        unknown = [*history[:1], ChatMessage(role="assistant", tool_calls=[ToolCall("get_weather", "{}", "call_zzz")])]
        w2.tools.plan(Submit(id="z", messages=unknown, tools=TOOLS))
        assert w2.tools.replay.counts["miss"] == 1
    finally:
        w2.close()


@pytest.mark.gemma
def test_gemma_without_a_tool_format_calls_through_the_generic_one(gemma_gguf):
    w = Worker(gemma_gguf)
    try:
        assert w.tools.fmt is None  # no template of its own: the built-in Gemma one, which shows no tool format
        parts, done, _ = w.run(tools=TOOLS, tool_choice="required", max_tokens=120, parallel_tool_calls=False)
        assert done.finish_reason is FinishReason.TOOL_CALLS, (done, parts)
        [call] = calls(parts)
        jsonschema.validate(json.loads(call["args"]), CITY if call["name"] == "get_weather" else TZ)
        parts, done, _ = w.run(tools=TOOLS, tool_choice={"type": "function", "function": {"name": "get_time"}}, max_tokens=120)
        assert done.finish_reason is FinishReason.TOOL_CALLS and [c["name"] for c in calls(parts)] == ["get_time"]
    finally:
        w.close()


@pytest.mark.parametrize("flavour, fmt, start", [("mistral", "mistral-tool-calls-args", "[TOOL_CALLS]"), ("qwen2.5", "dsml", "<｜tool▁calls▁begin｜>")])
def test_formats_with_the_name_outside_the_json_are_constrained_too(models, flavour, fmt, start):
    w = Worker(models[flavour], tool_format=fmt)
    try:
        parts, done, _ = w.run(tools=TOOLS, tool_choice="required", max_tokens=400, parallel_tool_calls=False)  # markers spelled byte by byte here
        assert done.finish_reason is FinishReason.TOOL_CALLS, (done, parts)
        [call] = calls(parts)
        jsonschema.validate(json.loads(call["args"]), CITY if call["name"] == "get_weather" else TZ)
        assert call["end"].raw.startswith(start)
    finally:
        w.close()


def test_mistral_history_with_calls_renders_with_nine_character_ids(workers):
    w = workers["mistral"]
    history = USER + [
        ChatMessage(role="assistant", tool_calls=[ToolCall("get_weather", '{"city": "Paris"}', "call_0123456789abcdef01234567")]),
        ChatMessage(role="tool", content="sunny", tool_call_id="call_0123456789abcdef01234567"),
        ChatMessage(role="assistant", content="It is sunny."),
        ChatMessage(role="user", content="And Rome?"),
    ]
    plan = w.tools.plan(Submit(id="m", messages=history, tools=TOOLS))
    text = w.server.prompts.render(plan.messages, plan.tools, True, plan.template_kwargs)  # the template checks the ids
    short = plan.messages[1].tool_calls[0].id
    assert len(short) == 9 and short.isalnum() and plan.messages[2].tool_call_id == short
    assert f'"call_id": "{short}"' in text and "[TOOL_CALLS] [" in text
    assert w.tools.plan(Submit(id="m2", messages=history, tools=TOOLS)).messages[1].tool_calls[0].id == short  # stable
    assert not workers["qwen2.5"].tools.short_ids


def test_a_template_that_refuses_the_replayed_form_gets_the_history_as_sent(models, tmp_path):
    replay = ReplayMap(tmp_path / "r.sqlite")
    w = Worker(models["mistral"], replay=replay)
    try:
        replay.put("abc", b'[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris"}}]')
        history = USER + [
            ChatMessage(role="assistant", tool_calls=[ToolCall("get_weather", '{"city": "Paris"}', "call_abc")]),
            ChatMessage(role="tool", content="sunny", tool_call_id="call_abc"),
            ChatMessage(role="assistant", content="It is sunny."),
            ChatMessage(role="user", content="And Rome?"),
        ]
        msg = Submit(id="m", messages=history, tools=TOOLS)
        plan = w.tools.plan(msg)
        assert list(plan.replayed) == [1]  # replayed, but Mistral's template wants the roles to alternate
        toks = w.server.prompts.tokens(msg, plan)
        assert plan.replayed == {} and plan.messages[1].tool_calls  # so it rendered the turn as sent
        assert "[TOOL_CALLS] [" in w.engine.detokenize(toks, special=True)
    finally:
        w.close()
        replay.close()
