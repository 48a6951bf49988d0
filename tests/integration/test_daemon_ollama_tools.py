"""The official `ollama` client's chat with tools and thinking against the live daemon, on a tiny GGUF whose
tool-call markers are control tokens (Qwen 2.5 vocabulary and template). Needs the worker's tool-call capture
(barrel_inference.toolcalls)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tinymodel import write_tiny_gguf

from .daemon import Daemon

import barrel_inference  # noqa: E402

if not (Path(barrel_inference.__file__).parent / "toolcalls" / "__init__.py").is_file():  # this checkout's own
    pytest.skip("needs the worker's tool-call capture (barrel_inference/toolcalls)", allow_module_level=True)
ollama = pytest.importorskip("ollama")

CITY = {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"]}}, "required": ["city"]}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": CITY}}]
USER = {"role": "user", "content": "Weather in Paris?"}


@pytest.fixture(scope="module")
def qwen(tmp_path_factory):
    return write_tiny_gguf(tmp_path_factory.mktemp("qwen") / "qwen.gguf", flavour="qwen2.5", context_length=8192)


async def test_chat_tool_calls_come_back_with_arguments_as_objects(qwen, tmp_path):
    with Daemon(tmp_path, {"qwen": qwen}, n_seq_max=2, n_ctx=4096, threads=1) as d:
        c = ollama.AsyncClient(host=d.url, timeout=120)
        assert "tools" in (await c.show("qwen")).capabilities
        body = {"model": "qwen", "messages": [USER], "tools": TOOLS, "tool_choice": "required", "stream": False,
                "options": {"temperature": 0, "num_predict": 80}}  # fmt: skip
        r = await c._request(ollama.ChatResponse, "POST", "/api/chat", json=body)
        [call] = r.message.tool_calls
        assert call.function.name == "get_weather" and call.function.arguments["city"] in ("Paris", "Rome")
        # the forced call is the turn: generation stops once it is complete (not at num_predict)
        assert "<tool_call>" not in (r.message.content or "") and r.done_reason == "stop" and r.eval_count < 80
        chunks = [x async for x in await c._request(ollama.ChatResponse, "POST", "/api/chat", json={**body, "stream": True}, stream=True)]
        calls = [t for x in chunks for t in (x.message.tool_calls or [])]
        assert [t.function.name for t in calls] == ["get_weather"] and isinstance(calls[0].function.arguments, dict)
        assert chunks[-1].done_reason == "stop"
        assert not any("<tool_call>" in (x.message.content or "") for x in chunks)
        # the next turn carries the call back (arguments as an object) and the tool's answer
        nxt = await c.chat(model="qwen", tools=TOOLS, options={"temperature": 0, "num_predict": 2}, messages=[
            USER, {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "get_weather", "arguments": dict(call.function.arguments)}}]},
            {"role": "tool", "content": "sunny", "tool_name": "get_weather"},
        ])  # fmt: skip
        assert nxt.done


async def test_chat_thinking_comes_back_as_message_thinking(qwen, tmp_path):
    from tinymodel import real_template

    template = real_template("qwen2.5") + "{% if add_generation_prompt %}<think>\n{% endif %}"
    extra = (f"[models.\"qwen:latest\"]\nthinking_start = \"<think>\"\nthinking_end = \"</think>\"\n"
             f"chat_template = '''{template}'''\n")  # fmt: skip
    with Daemon(tmp_path, {"qwen": qwen}, n_seq_max=1, n_ctx=4096, threads=1, extra=extra) as d:
        c = ollama.AsyncClient(host=d.url, timeout=120)
        r = await c.chat(model="qwen", messages=[USER], options={"temperature": 0, "num_predict": 8})
        assert r.message.thinking and "<think>" not in (r.message.content or "") and "</think>" not in r.message.thinking
        chunks = [x async for x in await c.chat(model="qwen", messages=[USER], options={"temperature": 0, "num_predict": 8}, stream=True)]
        assert "".join(x.message.thinking or "" for x in chunks) == r.message.thinking


def _text_of(ids: list[int]) -> str:
    """The tiny vocabulary's text of token ids: bytes, then the merges, then the special tokens (tinymodel.py)."""
    from tinymodel import MERGES, SPECIALS

    merged = [(a + b).replace("Ġ", " ") for a, b in MERGES]
    out = b""
    for t in ids:
        out += bytes([t]) if t < 256 else (merged + SPECIALS)[t - 256].encode()
    return out.decode("utf-8", "replace")


async def test_generate_think_reaches_the_chat_templates_switches(qwen, tmp_path):
    """/api/generate renders its turn with `think` as the template's switches (enable_thinking, reasoning_effort),
    as /api/chat does, and splits the reply into thinking and response."""
    from tinymodel import real_template

    template = real_template("qwen2.5") + (
        "{% if add_generation_prompt %}{% if reasoning_effort is defined %}effort={{ reasoning_effort }}\n{% endif %}"
        "{% if enable_thinking is defined and enable_thinking %}<think>\n{% endif %}{% endif %}"
    )
    extra = (f"[models.\"qwen:latest\"]\nthinking_start = \"<think>\"\nthinking_end = \"</think>\"\n"
             f"chat_template = '''{template}'''\n")  # fmt: skip
    with Daemon(tmp_path, {"qwen": qwen}, n_seq_max=1, n_ctx=4096, threads=1, extra=extra) as d:
        c = ollama.AsyncClient(host=d.url, timeout=120)
        assert "thinking" in (await c.show("qwen")).capabilities
        opts = {"temperature": 0, "num_predict": 8}
        on = await c.generate(model="qwen", prompt="Weather in Paris?", think="low", options=opts)
        # `context` holds the prompt's tokens, then the reply's: the switches reached the template
        assert "<|im_start|>assistant\neffort=low\n<think>\n" in _text_of(on.context)
        assert on.thinking and "<think>" not in on.response and "</think>" not in on.thinking
        off = await c.generate(model="qwen", prompt="Weather in Paris?", think=False, options=opts)
        after = _text_of(off.context).split("<|im_start|>assistant\n", 1)[1]
        assert not after.startswith(("<think>", "effort=")) and not off.thinking
