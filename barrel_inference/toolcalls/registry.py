"""The table of tool-call formats: built-in names, operator plugins, detection from a chat template.

A plugin is an importable module (or `module:attribute`) whose `FORMAT` is a ToolCallFormat
instance; the operator names it in config (`tool_call_formats = {name = "module"}`). A plugin
may replace a built-in name.
"""

from __future__ import annotations

import importlib

from .base import ToolCallFormat

# name -> module (attribute FORMAT unless given after a colon)
BUILTIN: dict[str, str] = {
    "qwen-xml": "barrel_inference.toolcalls.qwen_xml",
    "llama-python-tag": "barrel_inference.toolcalls.llama_python_tag",
    "mistral-tool-calls": "barrel_inference.toolcalls.mistral_tool_calls",
    "mistral-tool-calls-args": "barrel_inference.toolcalls.mistral_tool_calls:FORMAT_ARGS",
    "dsml": "barrel_inference.toolcalls.dsml",
    "dsml-invoke": "barrel_inference.toolcalls.dsml:FORMAT_INVOKE",
    "bare-json": "barrel_inference.toolcalls.bare_json",
    "generic": "barrel_inference.toolcalls.generic",
}
# names written by earlier scans
ALIASES: dict[str, str] = {"mistral": "mistral-tool-calls", "hermes": "qwen-xml"}

# (format, substrings of a chat template that identify it), first match wins
DETECT: list[tuple[str, tuple[str, ...]]] = [
    ("dsml-invoke", ("｜DSML｜",)),
    ("dsml", ("<｜tool▁calls▁begin｜>", "<｜tool▁call▁begin｜>")),
    ("mistral-tool-calls-args", ("[ARGS]",)),
    ("mistral-tool-calls", ("[TOOL_CALLS]",)),
    ("llama-python-tag", ("<|python_tag|>",)),
    ("qwen-xml", ("<tool_call>",)),
]


class UnknownFormat(LookupError):
    pass


def _load(path: str) -> ToolCallFormat:
    module, _, attr = path.partition(":")
    try:
        obj = getattr(importlib.import_module(module), attr or "FORMAT")
    except (ImportError, AttributeError) as exc:
        raise UnknownFormat(f"tool-call format module {path!r} cannot be loaded: {exc}") from exc
    if not isinstance(obj, ToolCallFormat):
        raise UnknownFormat(f"{path!r} is not a ToolCallFormat")
    return obj


class FormatTable:
    """Built-in formats plus the operator's plugins, loaded on first use."""

    def __init__(self, plugins: dict[str, str] | None = None):
        self.paths = {**BUILTIN, **(plugins or {})}
        self._loaded: dict[str, ToolCallFormat] = {}

    def names(self) -> list[str]:
        return sorted(self.paths)

    def get(self, name: str) -> ToolCallFormat:
        name = ALIASES.get(name, name) if name not in self.paths else name
        fmt = self._loaded.get(name)
        if fmt is None:
            if name not in self.paths:
                raise UnknownFormat(f"unknown tool-call format {name!r} (known: {', '.join(self.names())})")
            fmt = self._loaded[name] = _load(self.paths[name])
        return fmt

    def __contains__(self, name: str) -> bool:
        return name in self.paths or name in ALIASES


def detect(template: str | None) -> dict:
    """The manifest's loader keys {'tool_format', 'tool_call_start', 'tool_call_end'} for a chat
    template; all None when the template shows no tool calls."""
    if template:
        table = FormatTable()
        for name, needles in DETECT:
            if any(n in template for n in needles):
                fmt = table.get(name)
                return {"tool_format": name, "tool_call_start": fmt.start or None, "tool_call_end": (fmt.ends or (None,))[0]}
    return {"tool_format": None, "tool_call_start": None, "tool_call_end": None}
