"""Real Ollama model templates (Go text/template) rendered as Ollama renders them.

The templates are Ollama's own (its template/ directory and library models): chatml, llama3-instruct and
mistral-instruct with the conversations and expected prompts of Ollama's template tests, an older
mistral-instruct that uses $index / slice / len / and, the Qwen 2.5 library template with tools and tool
calls, and the legacy style of Ollama's Modelfile docs (.System / .Prompt / .Response, run turn by turn).
"""

from __future__ import annotations

import pytest

from barrel_inference.gotemplate import OllamaTemplate

CHATML = "{{- range .Messages }}<|im_start|>{{ .Role }}\n{{ .Content }}<|im_end|>\n{{ end }}<|im_start|>assistant\n"
LLAMA3 = (
    "{{- range .Messages }}<|start_header_id|>{{ .Role }}<|end_header_id|>\n\n{{ .Content }}<|eot_id|>\n{{- end }}"
    "<|start_header_id|>assistant<|end_header_id|>\n\n"
)
MISTRAL = (
    '[INST] {{ range $index, $_ := .Messages }}\n{{- if eq .Role "system" }}{{ .Content }}\n\n'
    '{{ else if eq .Role "user" }}{{ .Content }}[/INST]\n{{- else if eq .Role "assistant" }} {{ .Content }}</s>[INST] {{ end }}\n'
    "{{- end }}"
)
MISTRAL_SLICE = (
    "{{- if .Messages }}\n{{- range $index, $_ := .Messages }}\n"
    '{{- if eq .Role "user" }}[INST] {{ if and $.System (eq (len (slice $.Messages $index)) 1) }}{{ $.System }}\n'
    "{{ end }}{{ .Content }}\n"
    '{{- else if eq .Role "assistant" }}[/INST] {{ .Content }}</s>\n'
    "{{- end }}\n{{- end }}[/INST]\n{{- else -}}\n"
    "[INST] {{ if .System }}{{ .System }} {{ end }}{{ .Prompt }}[/INST] {{ .Response }}</s>\n{{- end -}}"
)
QWEN25 = """{{- if .Messages }}
{{- if or .System .Tools }}<|im_start|>system
{{- if .System }}
{{ .System }}
{{- end }}
{{- if .Tools }}

# Tools

You may call one or more functions to assist with the user query.

You are provided with function signatures within <tools></tools> XML tags:
<tools>
{{- range .Tools }}
{"type": "function", "function": {{ .Function }}}
{{- end }}
</tools>

For each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:
<tool_call>
{"name": <function-name>, "arguments": <args-json-object>}
</tool_call>
{{- end }}<|im_end|>
{{ end }}
{{- range $i, $_ := .Messages }}
{{- $last := eq (len (slice $.Messages $i)) 1 -}}
{{- if eq .Role "user" }}<|im_start|>user
{{ .Content }}<|im_end|>
{{ else if eq .Role "assistant" }}<|im_start|>assistant
{{ if .Content }}{{ .Content }}
{{- else if .ToolCalls }}<tool_call>
{{ range .ToolCalls }}{"name": "{{ .Function.Name }}", "arguments": {{ .Function.Arguments }}}
{{ end }}</tool_call>
{{- end }}{{ if not $last }}<|im_end|>
{{ end }}
{{- else if eq .Role "tool" }}<|im_start|>user
<tool_response>
{{ .Content }}
</tool_response><|im_end|>
{{ end }}
{{- if and (ne .Role "assistant") $last }}<|im_start|>assistant
{{ end }}
{{- end }}
{{- else }}
{{- if .System }}<|im_start|>system
{{ .System }}<|im_end|>
{{ end }}{{ if .Prompt }}<|im_start|>user
{{ .Prompt }}<|im_end|>
{{ end }}<|im_start|>assistant
{{ end }}{{ .Response }}{{ if .Response }}<|im_end|>{{ end }}"""
DOCS_LEGACY = """{{ if .System }}<|im_start|>system
{{ .System }}<|im_end|>
{{ end }}{{ if .Prompt }}<|im_start|>user
{{ .Prompt }}<|im_end|>
{{ end }}<|im_start|>assistant
"""

SYSTEM = {"role": "system", "content": "You are a helpful assistant."}
HELLO = {"role": "user", "content": "Hello, how are you?"}
GREAT = {"role": "assistant", "content": "I'm doing great. How can I help you today?"}
SHOW = {"role": "user", "content": "I'd like to show off how chat templating works!"}
CONVERSATIONS = {"user": [HELLO], "user-assistant-user": [HELLO, GREAT, SHOW], "system-user-assistant-user": [SYSTEM, HELLO, GREAT, SHOW]}

EXPECTED = {
    ("chatml", "user"): "<|im_start|>user\nHello, how are you?<|im_end|>\n<|im_start|>assistant\n",
    ("chatml", "user-assistant-user"): (
        "<|im_start|>user\nHello, how are you?<|im_end|>\n<|im_start|>assistant\nI'm doing great. How can I help you today?<|im_end|>\n"
        "<|im_start|>user\nI'd like to show off how chat templating works!<|im_end|>\n<|im_start|>assistant\n"
    ),
    ("chatml", "system-user-assistant-user"): (
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nHello, how are you?<|im_end|>\n"
        "<|im_start|>assistant\nI'm doing great. How can I help you today?<|im_end|>\n"
        "<|im_start|>user\nI'd like to show off how chat templating works!<|im_end|>\n<|im_start|>assistant\n"
    ),
    ("llama3", "user"): "<|start_header_id|>user<|end_header_id|>\n\nHello, how are you?<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n",
    ("llama3", "user-assistant-user"): (
        "<|start_header_id|>user<|end_header_id|>\n\nHello, how are you?<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"
        "I'm doing great. How can I help you today?<|eot_id|><|start_header_id|>user<|end_header_id|>\n\n"
        "I'd like to show off how chat templating works!<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"
    ),
    ("llama3", "system-user-assistant-user"): (
        "<|start_header_id|>system<|end_header_id|>\n\nYou are a helpful assistant.<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nHello, how are you?<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"
        "I'm doing great. How can I help you today?<|eot_id|><|start_header_id|>user<|end_header_id|>\n\n"
        "I'd like to show off how chat templating works!<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"
    ),
    ("mistral", "user"): "[INST] Hello, how are you?[/INST]",
    ("mistral", "user-assistant-user"): (
        "[INST] Hello, how are you?[/INST] I'm doing great. How can I help you today?</s>[INST] "
        "I'd like to show off how chat templating works![/INST]"
    ),
    ("mistral", "system-user-assistant-user"): (
        "[INST] You are a helpful assistant.\n\nHello, how are you?[/INST] I'm doing great. How can I help you today?</s>"
        "[INST] I'd like to show off how chat templating works![/INST]"
    ),
    ("mistral-slice", "user"): "[INST] Hello, how are you?[/INST]",
    # the system prompt goes with the last user turn: `eq (len (slice $.Messages $index)) 1`
    ("mistral-slice", "system-user-assistant-user"): (
        "[INST] Hello, how are you?[/INST] I'm doing great. How can I help you today?</s>"
        "[INST] You are a helpful assistant.\nI'd like to show off how chat templating works![/INST]"
    ),
    ("qwen2.5", "user"): "<|im_start|>user\nHello, how are you?<|im_end|>\n<|im_start|>assistant\n",
    ("qwen2.5", "system-user-assistant-user"): (
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nHello, how are you?<|im_end|>\n"
        "<|im_start|>assistant\nI'm doing great. How can I help you today?<|im_end|>\n"
        "<|im_start|>user\nI'd like to show off how chat templating works!<|im_end|>\n<|im_start|>assistant\n"
    ),
    # the legacy style: one run per user turn with its reply ({{ .Response }} appended, as Ollama appends it),
    # the last run cut after {{ .Response }} so the prompt ends where the reply starts
    ("docs-legacy", "user"): "<|im_start|>user\nHello, how are you?<|im_end|>\n<|im_start|>assistant\n",
    ("docs-legacy", "system-user-assistant-user"): (
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nHello, how are you?<|im_end|>\n"
        "<|im_start|>assistant\nI'm doing great. How can I help you today?"
        "<|im_start|>user\nI'd like to show off how chat templating works!<|im_end|>\n<|im_start|>assistant\n"
    ),
}
TEMPLATES = {"chatml": CHATML, "llama3": LLAMA3, "mistral": MISTRAL, "mistral-slice": MISTRAL_SLICE, "qwen2.5": QWEN25,
             "docs-legacy": DOCS_LEGACY}  # fmt: skip


@pytest.mark.parametrize("template,conversation", sorted(EXPECTED), ids=lambda x: x)
def test_real_templates_render_as_ollama_renders_them(template, conversation):
    assert OllamaTemplate(TEMPLATES[template]).render(CONVERSATIONS[conversation]) == EXPECTED[(template, conversation)]


WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather of a city", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}  # fmt: skip


def test_qwen_library_template_with_tools_calls_and_results():
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Paris & Rome?"},
        {"role": "assistant", "content": "", "tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}},
                                                            {"name": "get_weather", "arguments": {"city": "Rome"}}]},
        {"role": "tool", "content": "sunny", "tool_name": "get_weather"},
        {"role": "tool", "content": "rainy", "tool_name": "get_weather"},
    ]  # fmt: skip
    assert OllamaTemplate(QWEN25).render(messages, [WEATHER]) == (
        "<|im_start|>system\nBe brief.\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
        "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
        '{"type": "function", "function": {"name":"get_weather","description":"Weather of a city","parameters":'
        '{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}}\n</tools>\n\n'
        "For each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n"
        '<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\nWeather in Paris & Rome?<|im_end|>\n"
        '<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": {"city":"Paris"}}\n'
        '{"name": "get_weather", "arguments": {"city":"Rome"}}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\n<tool_response>\nsunny\n</tool_response><|im_end|>\n"
        "<|im_start|>user\n<tool_response>\nrainy\n</tool_response><|im_end|>\n"  # tool messages are never merged
        "<|im_start|>assistant\n"
    )


def test_collation_merges_consecutive_turns_and_joins_system_messages():
    t = OllamaTemplate("{{ .System }}|{{ range .Messages }}[{{ .Role }}:{{ .Content }}]{{ end }}")
    msgs = [{"role": "system", "content": "a"}, {"role": "system", "content": "b"}, {"role": "user", "content": "x"},
            {"role": "user", "content": "y"}]  # fmt: skip
    assert t.render(msgs) == "a\n\nb|[system:a\n\nb][user:x\n\ny]"


def test_think_switches_reach_the_template():
    t = OllamaTemplate("{{ range .Messages }}{{ .Content }}{{ end }}{{ if .IsThinkSet }}{{ if .Think }}<think>{{ else }}/no_think{{ end }}{{ end }}{{ .ThinkLevel }}")
    msgs = [{"role": "user", "content": "q"}]
    assert (t.render(msgs), t.render(msgs, think=True, think_level="high"), t.render(msgs, think=False)) == ("q", "q<think>high", "q/no_think")
