"""Bounds on what a client may ask the grammar sampler to enforce.

llama.cpp expands a JSON schema's repetition counts (maxLength, maxItems, regex {m,n}) into nested
grammar rules: a count of a few thousand overflows the C stack of whoever parses or samples the
grammar (the worker dies with every stream on it), and an enum of many thousand values makes each
token's grammar check scan them all (seconds per token, on the thread every stream shares). So a
schema or GBNF text is measured before it is converted or compiled, and what exceeds a bound is
refused with an error that names the keyword and the bound.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from ..protocol import ErrorCode


@dataclass(frozen=True)
class GrammarLimits:
    max_repetition: int = 1000  # maxLength / minLength / maxItems / minItems / regex {m,n} / GBNF {m,n}
    max_enum: int = 128  # values of one enum (each is an alternative the sampler checks per token)
    max_schema_nodes: int = 4096  # objects and arrays in the schema
    max_schema_depth: int = 64
    max_grammar_bytes: int = 262_144  # the GBNF text, given or converted
    max_grammar_nesting: int = 1100  # parenthesis depth of the GBNF text (a repetition of n nests n deep)
    max_pattern_length: int = 1000


class GrammarRefused(Exception):
    """A grammar or schema beyond the bounds: code GRAMMAR, `param` the request field."""

    code = ErrorCode.GRAMMAR

    def __init__(self, message: str, keyword: str, bound: int, param: str = "response_format") -> None:
        super().__init__(message)
        self.keyword = keyword
        self.bound = bound
        self.param = param


_REPETITION_KEYWORDS = ("maxLength", "minLength", "maxItems", "minItems", "maxProperties", "minProperties",
                        "maxContains", "minContains")  # fmt: skip
_QUANTIFIER = re.compile(r"\{\s*(\d*)\s*(?:,\s*(\d*)\s*)?\}")


def _where(path: list[str]) -> str:
    return "$" + "".join(f"[{p}]" if p.isdigit() else f".{p}" for p in path)


def check_schema(schema: Any, limits: GrammarLimits = GrammarLimits(), param: str = "response_format") -> None:
    """Raise GrammarRefused when the schema exceeds a bound. Iterative: no recursion on client data."""
    nodes = 0
    stack: list[tuple[Any, list[str]]] = [(schema, [])]
    while stack:
        node, path = stack.pop()
        if isinstance(node, (dict, list)):
            nodes += 1
            if nodes > limits.max_schema_nodes:
                raise GrammarRefused(f"the JSON schema has more than {limits.max_schema_nodes} objects and arrays (bound {limits.max_schema_nodes})",
                                     "schema size", limits.max_schema_nodes, param)  # fmt: skip
            if len(path) > limits.max_schema_depth:
                raise GrammarRefused(f"the JSON schema nests deeper than {limits.max_schema_depth} levels at {_where(path)} (bound {limits.max_schema_depth})",
                                     "schema depth", limits.max_schema_depth, param)  # fmt: skip
        if isinstance(node, list):
            stack.extend((v, path + [str(i)]) for i, v in enumerate(node))
            continue
        if not isinstance(node, dict):
            continue
        for key in _REPETITION_KEYWORDS:
            value = node.get(key)
            if isinstance(value, bool) or value is None:
                continue
            if not isinstance(value, int) or value < 0:
                raise GrammarRefused(f"{key} at {_where(path)} must be a non-negative integer", key, limits.max_repetition, param)
            if value > limits.max_repetition:
                raise GrammarRefused(
                    f"{key} {value} at {_where(path)} exceeds the bound of {limits.max_repetition} that this server enforces by grammar",
                    key, limits.max_repetition, param,
                )  # fmt: skip
        enum = node.get("enum")
        if isinstance(enum, list) and len(enum) > limits.max_enum:
            raise GrammarRefused(f"enum at {_where(path)} has {len(enum)} values; the bound is {limits.max_enum}", "enum", limits.max_enum, param)
        pattern = node.get("pattern")
        if isinstance(pattern, str):
            if len(pattern) > limits.max_pattern_length:
                raise GrammarRefused(f"pattern at {_where(path)} is {len(pattern)} characters; the bound is {limits.max_pattern_length}",
                                     "pattern", limits.max_pattern_length, param)  # fmt: skip
            _check_quantifiers(pattern, limits, f"pattern at {_where(path)}", param)
        for key, value in node.items():
            if key in ("enum", "const", "examples", "default"):
                continue  # values, not schemas: counted by enum's bound and the grammar's size
            if isinstance(value, (dict, list)):
                stack.append((value, path + [str(key)]))


def _check_quantifiers(text: str, limits: GrammarLimits, what: str, param: str) -> None:
    for m in _QUANTIFIER.finditer(text):
        for group in m.groups():
            if group and (len(group) > 9 or int(group) > limits.max_repetition):
                raise GrammarRefused(f"the repetition {m.group(0)} in {what} exceeds the bound of {limits.max_repetition}",
                                     "repetition", limits.max_repetition, param)  # fmt: skip


def check_gbnf(text: str, limits: GrammarLimits = GrammarLimits(), param: str = "grammar") -> None:
    """Size, parenthesis nesting and {m,n} repetitions of a GBNF text, before llama.cpp parses it."""
    if len(text) > limits.max_grammar_bytes:
        raise GrammarRefused(f"the grammar is {len(text)} characters; the bound is {limits.max_grammar_bytes}",
                             "grammar size", limits.max_grammar_bytes, param)  # fmt: skip
    depth = deepest = 0
    quote = None
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if quote:
            if c == "\\":
                i += 2
                continue
            if c == quote:
                quote = None
        elif c == '"':
            quote = '"'
        elif c == "[":
            quote = "]"
        elif c == "#":
            nl = text.find("\n", i)
            i = n if nl < 0 else nl
            continue
        elif c == "(":
            depth += 1
            if depth > deepest:
                deepest = depth
        elif c == ")":
            depth -= 1
        elif c == "{":
            end = text.find("}", i)
            if end > 0:
                _check_quantifiers(text[i : end + 1], limits, "the grammar", param)
        i += 1
    if deepest > limits.max_grammar_nesting:
        raise GrammarRefused(f"the grammar nests {deepest} groups deep; the bound is {limits.max_grammar_nesting}",
                             "grammar nesting", limits.max_grammar_nesting, param)  # fmt: skip
