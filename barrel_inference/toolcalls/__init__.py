"""Tool-call formats and reasoning markers: pure (no llama.cpp), shared by the registry's pull-time
scan and the worker's capture.

- base: the ToolCallFormat interface; one module per built-in format (qwen_xml, llama_python_tag,
  mistral_tool_calls, dsml, bare_json, generic); registry: the table of names and operator plugins.
- reasoning: thinking markers. capture: the streaming state machine (pieces in, typed parts out).
- schema: arguments checked against the declared tools. grammar: GBNF that constrains a call.
- replay: call id -> the exact bytes of the call, persisted.
"""

from .base import ToolCallFormat, ToolCallParseError
from .registry import BUILTIN, FormatTable, UnknownFormat, detect

__all__ = ["BUILTIN", "FormatTable", "ToolCallFormat", "ToolCallParseError", "UnknownFormat", "detect"]
