"""Checking a parsed call against the declared tools: a declared name, arguments valid for its JSON Schema.

jsonschema interprets schemas (no code generated from client text, unlike validators that compile
a schema into Python) and never fetches a remote `$ref` (an unresolvable reference is an error).
"""

from __future__ import annotations

import json
import re

from ..protocol import ToolCall
from .base import tool_name, tool_parameters


class ToolSchemaError(ValueError):
    """A declared tool's parameters are not a valid JSON Schema (the request's fault)."""

    def __init__(self, message: str, index: int):
        super().__init__(message)
        self.index = index


# a quantified group that holds a quantifier: (a+)+, (a|aa)*, (\w+\s?)* ... backtrack exponentially
_NESTED = re.compile(r"\((?:[^()\\]|\\.)*[*+?}](?:[^()\\]|\\.)*\)\s*(?:[*+]|\{\d*,)")
MAX_PATTERN = 1000


def _patterns(node):
    if isinstance(node, dict):
        for k, v in node.items():
            if k == "pattern" and isinstance(v, str):
                yield v
            elif k == "patternProperties" and isinstance(v, dict):
                yield from (p for p in v if isinstance(p, str))
                yield from _patterns(v)
            else:
                yield from _patterns(v)
    elif isinstance(node, list):
        for v in node:
            yield from _patterns(v)


def risky_pattern(pattern: str) -> str | None:
    """Why a schema pattern is refused: checking the model's text against it could take exponential
    time on the worker (Python's re has no time limit). None when it is accepted."""
    if len(pattern) > MAX_PATTERN:
        return f"is longer than {MAX_PATTERN} characters"
    if _NESTED.search(pattern):
        return "repeats a group that itself repeats (exponential backtracking)"
    return None


class ToolValidator:
    def __init__(self, tools: list[dict] | None):
        import jsonschema

        self._validators: dict[str, object] = {}
        for i, tool in enumerate(tools or []):
            name = tool_name(tool)
            if name is None:
                raise ToolSchemaError("each tool needs a function name", i)
            schema = tool_parameters(tool)
            cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
            try:
                cls.check_schema(schema)
            except jsonschema.SchemaError as exc:
                raise ToolSchemaError(f"the parameters of tool {name!r} are not a valid JSON Schema: {exc.message}", i) from exc
            for pattern in _patterns(schema):
                why = risky_pattern(pattern)
                if why is not None:
                    raise ToolSchemaError(f"a pattern in the parameters of tool {name!r} {why}: {pattern[:80]!r}", i)
            self._validators[name] = cls(schema)

    @property
    def names(self) -> list[str]:
        return list(self._validators)

    def error(self, call: ToolCall) -> str | None:
        """Why the call is invalid, or None when it is valid."""
        import jsonschema

        v = self._validators.get(call.name)
        if v is None:
            return f"the model called {call.name!r}, which is not a declared tool ({', '.join(self.names) or 'none declared'})"
        try:
            args = json.loads(call.arguments or "{}")
        except ValueError as exc:
            return f"the arguments of {call.name!r} are not JSON: {exc}"
        try:
            err = jsonschema.exceptions.best_match(v.iter_errors(args))
        except Exception as exc:  # e.g. an unresolvable $ref (never fetched)
            return f"the schema of {call.name!r} cannot be applied: {exc}"
        if err is not None:
            where = "/".join(str(p) for p in err.absolute_path) or "(root)"
            return f"the arguments of {call.name!r} do not match its schema at {where}: {err.message}"
        return None
