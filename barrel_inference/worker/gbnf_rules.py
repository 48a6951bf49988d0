"""GBNF building blocks for the JSON-Schema converter: literals, JSON primitives, integer ranges.

Pure Python. `integer_range` writes the decimal numerals of lo..hi as digit-range alternatives, so
that integer bounds are enforced by the grammar itself.
"""

from __future__ import annotations

import json
from typing import Any

MAX_INT_DIGITS = 16  # an integer with no upper bound gets at most this many digits


class Never(Exception):
    """No value satisfies this (sub)schema under the grammar's bounds."""


PRIMITIVES = {
    "ws": '| " " | "\\n" [ \\t]{0,20}',
    "char": '[^"\\\\\\x00-\\x1F\\x7F\\uD800-\\uDFFF\\U00110000-\\U003FFFFF] | "\\\\" (["\\\\/bfnrt] | "u" [0-9a-fA-F]{4})',
    "string": '"\\"" char* "\\""',
    "int": '"-"? ("0" | [1-9] [0-9]{0,15})',
    "number": 'int ("." [0-9]{1,16})? ([eE] [-+]? [0-9]{1,3})?',
    "boolean": '"true" | "false"',
    "null": '"null"',
    "value": "object | array | string | number | boolean | null",
    "object": '"{" ws ( string ws ":" ws value ws ( "," ws string ws ":" ws value ws )* )? "}"',
    "array": '"[" ws ( value ws ( "," ws value ws )* )? "]"',
    "digit": "[0-9]",
    "d2": "[0-9] [0-9]",
    "date": '"\\"" [0-9]{4} "-" ( "0" [1-9] | "1" [0-2] ) "-" ( "0" [1-9] | [12] [0-9] | "3" [01] ) "\\""',
    "time-body": '( [01] [0-9] | "2" [0-3] ) ":" [0-5] [0-9] ":" [0-5] [0-9] ( "." [0-9]{1,6} )? ( "Z" | [+-] ( [01] [0-9] | "2" [0-3] ) ":" [0-5] [0-9] )',
    "time": '"\\"" time-body "\\""',
    "date-time": '"\\"" [0-9]{4} "-" ( "0" [1-9] | "1" [0-2] ) "-" ( "0" [1-9] | [12] [0-9] | "3" [01] ) "T" time-body "\\""',
    "uuid": '"\\"" [0-9a-f]{8} "-" [0-9a-f]{4} "-" [0-9a-f]{4} "-" [0-9a-f]{4} "-" [0-9a-f]{12} "\\""',
}
_PRIMITIVE_DEPS = {
    "string": ["char"], "number": ["int"], "value": ["object", "array", "string", "number", "boolean", "null"],
    "object": ["ws", "string", "value"], "array": ["ws", "value"], "time": ["time-body"], "date-time": ["time-body"],
}  # fmt: skip


def literal(text: str) -> str:
    """A GBNF string literal for `text` (control characters as \\x escapes)."""
    out = []
    for c in text:
        if c == '"':
            out.append('\\"')
        elif c == "\\":
            out.append("\\\\")
        elif ord(c) < 0x20 or ord(c) == 0x7F:
            out.append(f"\\x{ord(c):02X}")
        else:
            out.append(c)
    return '"' + "".join(out) + '"'


def json_literal(value: Any) -> str:
    return literal(json.dumps(value, ensure_ascii=False, separators=(",", ":")))


# ---- integer ranges as digit rules ----------------------------------------------------------


def _same_length(lo: str, hi: str) -> str:
    """Digits of equal length from lo to hi (lo <= hi), as a GBNF expression."""
    if lo == hi:
        return literal(lo)
    if len(lo) == 1:
        return f"[{lo}-{hi}]"
    rest = len(lo) - 1
    if lo[0] == hi[0]:
        return f"{literal(lo[0])} ({_same_length(lo[1:], hi[1:])})"
    if lo[1:] == "0" * rest and hi[1:] == "9" * rest:
        return f"[{lo[0]}-{hi[0]}] [0-9]{{{rest}}}"
    alts = [f"{literal(lo[0])} ({_same_length(lo[1:], '9' * rest)})"]
    a, b = int(lo[0]) + 1, int(hi[0]) - 1
    if a <= b:
        alts.append(f"[{a}-{b}] [0-9]{{{rest}}}")
    alts.append(f"{literal(hi[0])} ({_same_length('0' * rest, hi[1:])})")
    return " | ".join(f"({x})" for x in alts)


def _nonneg_range(lo: int, hi: int | None) -> list[str]:
    """Alternatives for the decimal numerals of lo..hi (hi None: up to MAX_INT_DIGITS digits)."""
    alts = []
    top = MAX_INT_DIGITS if hi is None else len(str(hi))
    for n in range(len(str(lo)), top + 1):
        a = max(lo, 10 ** (n - 1) if n > 1 else 0)
        b = 10**n - 1 if hi is None else min(hi, 10**n - 1)
        if a > b:
            continue
        if hi is None and a == 10 ** (n - 1) and n > 1:  # all longer numerals at once
            alts.append(f"[1-9] [0-9]{{{n - 1},{MAX_INT_DIGITS - 1}}}")
            break
        alts.append(_same_length(str(a), str(b)))
    return alts


def integer_range(lo: int | None, hi: int | None) -> str:
    """A GBNF expression for the integers lo..hi (either end may be open)."""
    if lo is not None and hi is not None and lo > hi:
        raise Never()
    alts = []
    if hi is None or hi >= 0:
        alts += _nonneg_range(max(lo, 0) if lo is not None else 0, hi)
    if lo is None or lo < 0:
        nlo = 1 if hi is None or hi >= 0 else -hi
        nhi = None if lo is None else -lo
        alts += [f'"-" ({x})' for x in _nonneg_range(nlo, nhi)]
    return " | ".join(f"({a})" for a in alts)


# ---- the converter ----------------------------------------------------------------------------
