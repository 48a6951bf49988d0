import pytest

from barrel_inference.protocol import ChatMessage, ToolCall
from barrel_inference.worker.templates import BUILTIN, ChatTemplate, TemplateError

MSGS = [ChatMessage("system", "Be brief."), ChatMessage("user", "Hi"), ChatMessage("assistant", "Hello!"), ChatMessage("user", "Bye")]


@pytest.mark.parametrize(
    "arch, name, expected",
    [
        ("gemma3", "gemma",
         "<bos><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\nHello!<end_of_turn>\n"
         "<start_of_turn>user\nBye<end_of_turn>\n<start_of_turn>model\n"),
        ("qwen2", "chatml",
         "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello!<|im_end|>\n"
         "<|im_start|>user\nBye<|im_end|>\n<|im_start|>assistant\n"),
        ("unknown-arch", "chatml", None),
    ],
)
def test_builtin_template_by_architecture(arch, name, expected):
    t = ChatTemplate.choose(None, None, arch, "<bos>", "<eos>")
    assert t.name == name
    if expected is not None:
        assert t.render(MSGS) == expected


def test_gguf_template_wins_and_override_wins_over_it():
    own = "{% for m in messages %}[{{ m.role }}]{{ m.content }}{% endfor %}"
    assert ChatTemplate.choose(None, own, "gemma3", "", "").name == "gguf"
    assert ChatTemplate.choose("llama3", own, "gemma3", "", "").name == "llama3"
    assert ChatTemplate.choose("{{ messages[0].content }}!", own, "gemma3", "", "").render(MSGS) == "Be brief.!"


def test_tools_and_tool_calls_reach_the_template():
    src = "{% for t in tools %}{{ t.function.name }};{% endfor %}{% for m in messages %}{% for c in m.tool_calls or [] %}{{ c.function.name }}({{ c.function.arguments.x }}){% endfor %}{% endfor %}"
    t = ChatTemplate(src, "custom")
    msgs = [ChatMessage("assistant", "", tool_calls=[ToolCall("add", '{"x": 3}')])]
    assert t.render(msgs, tools=[{"type": "function", "function": {"name": "add"}}]) == "add;add(3)"


def test_sandbox_blocks_attribute_escape_and_raise_exception_is_an_error():
    with pytest.raises(TemplateError):
        ChatTemplate("{{ ''.__class__.__mro__[1].__subclasses__() }}", "custom").render(MSGS)
    with pytest.raises(TemplateError, match="no system"):
        ChatTemplate("{{ raise_exception('no system') }}", "custom").render(MSGS)
    with pytest.raises(TemplateError):
        ChatTemplate("{% for %}", "custom")


def test_builtins_all_compile():
    for name, src in BUILTIN.items():
        assert ChatTemplate(src, name).render([ChatMessage("user", "x")])


def test_a_modelfile_go_template_renders_chat_messages_with_calls_tools_and_think():
    from barrel_inference.protocol import ToolCall

    src = ('{{ range .Tools }}T:{{ .Function.Name }};{{ end }}{{ range .Messages }}{{ .Role }}={{ .Content }}'
           '{{ range .ToolCalls }}({{ .Function.Name }} {{ .Function.Arguments }}){{ end }}{{ .ToolName }}|{{ end }}'
           '{{ if .Think }}<think>{{ end }}')  # fmt: skip
    t = ChatTemplate.choose("chatml", None, "llama", "<s>", "</s>", go_template=src)
    assert t.name == "modelfile" and t.source == src and t.bos_token == "<s>"
    msgs = [ChatMessage(role="user", content="hi"),
            ChatMessage(role="assistant", content="", tool_calls=[ToolCall(name="f", arguments='{"x": 1}', id="c1")]),
            ChatMessage(role="tool", content="ok", name="f", tool_call_id="c1")]  # fmt: skip
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    assert t.render(msgs, tools, True, {"enable_thinking": True}) == 'T:f;user=hi|assistant=(f {"x":1})|tool=okf|<think>'
    with pytest.raises(TemplateError, match="does not parse"):
        ChatTemplate.choose(None, None, "llama", "", "", go_template="{{ if .X }}")
