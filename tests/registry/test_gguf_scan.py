"""Pull-time GGUF header scan: tool-call format and thinking markers from the chat template, n_batch, n_ctx."""

from __future__ import annotations

import pytest

from barrel_inference.registry import RegistryError
from barrel_inference.registry.gguf_header import _fallback, read_header
from barrel_inference.registry.gguf_scan import apply_parameters, batch_for_parameters, scan
from tinymodel import CHATML, write_tiny_gguf

QWEN = CHATML + "{% if tools %}<tool_call>\n{{ tool }}\n</tool_call>{% endif %}"
QWEN_THINK = "<think>\n\n</think>\n\n" + QWEN
DEEPSEEK_V3 = "{{'<｜Assistant｜><｜tool▁calls▁begin｜><｜tool▁call▁begin｜>' + tool['type']}}"
DSML = "<｜DSML｜function_calls><｜DSML｜invoke name=\"x\">"
LLAMA31 = "{{- '<|python_tag|>' + tool_call.name }}{{ '<|eom_id|>' }}"
MISTRAL = "{{ '[TOOL_CALLS] [' + tool_calls|tojson + ']' }}"
CLAUDE_LIKE = "<thinking>{{ reasoning }}</thinking>" + CHATML


@pytest.mark.parametrize(
    "template, tool_format, start, end, think",
    [
        (CHATML, None, None, None, None),
        (QWEN, "qwen-xml", "<tool_call>", "</tool_call>", None),
        (QWEN_THINK, "qwen-xml", "<tool_call>", "</tool_call>", ("<think>", "</think>")),
        (DEEPSEEK_V3, "dsml", "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>", None),
        (DSML, "dsml-invoke", "<｜DSML｜function_calls>", "</｜DSML｜function_calls>", None),
        (LLAMA31, "llama-python-tag", "<|python_tag|>", "<|eom_id|>", None),
        (MISTRAL, "mistral-tool-calls", "[TOOL_CALLS]", None, None),
        (CLAUDE_LIKE, None, None, None, ("<thinking>", "</thinking>")),
        (None, None, None, None, None),
    ],
)
def test_template_formats(tmp_path, template, tool_format, start, end, think):
    path = write_tiny_gguf(tmp_path / "m.gguf", chat_template=template)
    details, loader = scan(path)
    assert details["has_chat_template"] is (template is not None)
    assert loader["tool_format"] == tool_format
    assert loader["tool_call_start"] == start and loader["tool_call_end"] == end
    assert (loader["thinking_start"], loader["thinking_end"]) == (think or (None, None))


@pytest.mark.parametrize("trained, cap, want", [(2048, 32768, 2048), (131072, 32768, 32768), (131072, 8192, 8192)])
def test_n_ctx_is_the_trained_context_clamped(tmp_path, trained, cap, want):
    path = write_tiny_gguf(tmp_path / "m.gguf", context_length=trained)
    details, loader = scan(path, max_context_size=cap)
    assert details["context_length"] == trained and loader["n_ctx"] == want


@pytest.mark.parametrize("n, want", [(270e6, 2048), (13e9, 2048), (14e9, 1024), (33e9, 1024), (70e9, 512), (None, 2048)])
def test_n_batch_by_parameter_size(n, want):
    assert batch_for_parameters(n) == want


def test_header_reader_agrees_with_ggufreader(tiny_gguf):
    meta, n = read_header(tiny_gguf)
    assert (meta, n) == _fallback(tiny_gguf)
    assert meta["tokenizer.ggml.tokens"] == {"array_length": 256 + 8 + 7}
    assert n > 100_000


def test_truncated_file_is_a_typed_error(tmp_path, tiny_gguf):
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(tiny_gguf.read_bytes()[:300])
    with pytest.raises(RegistryError) as e:
        scan(cut)
    assert e.value.code == "bad_gguf"


def test_apply_parameters_maps_ollama_names():
    loader = {"n_ctx": 4096, "n_batch": 2048, "n_seq_max": 4}
    out = apply_parameters(loader, {"num_ctx": 1024, "num_batch": 256, "num_gpu": 99, "main_gpu": 1, "use_mmap": False, "temperature": 0.1})
    assert out == {"n_ctx": 1024, "n_batch": 256, "n_seq_max": 4, "n_gpu_layers": 99, "main_gpu": 1, "use_mmap": False}
