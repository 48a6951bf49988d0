"""JSON Schema -> GBNF, with a receipt of what the grammar enforces.

Pure Python (no llama_cpp): the worker calls it off the scheduler thread. The grammar may be stricter
than the schema (it never writes additional properties, caps unbounded integers at 16 digits and
unrolls recursive $ref to a depth), so everything it admits is valid for the keywords it enforces.

The receipt sorts each schema keyword met into one of three sets:
- enforced: the grammar admits only output that satisfies it;
- checked: the grammar does not guarantee it, the finished text is validated against it;
- unenforced: neither (a `format` no checker knows, contentEncoding, ...).
`strict` refuses (GrammarRefused naming the keyword) anything that is not enforced.

Strings never admit raw control characters (U+0000..U+001F must be escaped in JSON).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from .gbnf_rules import PRIMITIVES, _PRIMITIVE_DEPS, integer_range, json_literal, literal
from .gbnf_rules import Never as _Never
from .grammar import GrammarLimits, GrammarRefused
from .schema_algebra import _ANNOTATIONS, _bounds, _contradicts, _disjoint, _implied_type, _int, _is_type, _merge, _whole

MAX_REF_DEPTH = 4  # a recursive $ref is unrolled this many times, then its recursion is cut
MAX_ENUMERATED_MULTIPLES = 128  # multipleOf over a bounded integer range: enumerated up to this many values

# keywords that only annotate
  # fmt: skip
# keywords the validator checks after generation when the grammar does not enforce them
_CHECKABLE = {
    "pattern", "patternProperties", "minProperties", "maxProperties", "contains", "minContains", "maxContains",
    "uniqueItems", "not", "if", "then", "else", "dependentRequired", "dependentSchemas", "dependencies",
    "propertyNames", "unevaluatedProperties", "unevaluatedItems", "multipleOf", "minimum", "maximum",
    "exclusiveMinimum", "exclusiveMaximum", "oneOf", "allOf", "format", "$ref", "additionalItems",
}  # fmt: skip
# formats the grammar writes itself, and those the validator (jsonschema's FormatChecker) checks
_GRAMMAR_FORMATS = {"date", "time", "date-time", "uuid"}
_CHECKED_FORMATS = {"email", "idn-email", "ipv4", "ipv6", "regex", "hostname"}


@dataclass
class Conversion:
    grammar: str
    enforced: set[str] = field(default_factory=set)
    checked: set[str] = field(default_factory=set)
    unenforced: set[str] = field(default_factory=set)


class _Converter:
    def __init__(self, root: dict, limits: GrammarLimits, max_ref_depth: int) -> None:
        self.root = root
        self.limits = limits
        self.max_ref_depth = max_ref_depth
        self.rules: dict[str, str] = {}
        self.used: set[str] = set()
        self.refs: dict[tuple[str, int], str | None] = {}
        self.ref_stack: list[str] = []
        self.enforced: set[str] = set()
        self.checked: set[str] = set()
        self.unenforced: set[str] = set()

    # rules
    def prim(self, name: str) -> str:
        todo = [name]
        while todo:
            n = todo.pop()
            if n not in self.used:
                self.used.add(n)
                todo += _PRIMITIVE_DEPS.get(n, [])
        return name

    def rule(self, hint: str, body: str) -> str:
        base = "".join(c if c.isascii() and c.isalnum() else "-" for c in hint).strip("-").lower() or "r"
        name, i = base, 1
        while name in self.rules or name in PRIMITIVES or name == "root":
            i += 1
            name = f"{base}-{i}"
        self.rules[name] = body
        return name

    def check(self, kw: str) -> None:
        self.checked.add(kw)

    # schemas
    def resolve(self, ref: str) -> dict:
        if not ref.startswith("#"):
            raise GrammarRefused(f"$ref {ref!r} is not local to the schema; only '#/...' references are followed", "$ref", 0)
        node: Any = self.root
        for raw in ref[1:].split("/")[1:] if ref != "#" else []:
            key = raw.replace("~1", "/").replace("~0", "~")
            if isinstance(node, list) and key.isdigit() and int(key) < len(node):
                node = node[int(key)]
            elif isinstance(node, dict) and key in node:
                node = node[key]
            else:
                raise GrammarRefused(f"$ref {ref!r} does not resolve within the schema", "$ref", 0)
        if not isinstance(node, (dict, bool)):
            raise GrammarRefused(f"$ref {ref!r} does not name a schema", "$ref", 0)
        return node if isinstance(node, dict) else ({} if node else {"not": {}})

    def visit(self, s: Any, hint: str) -> str:
        """The rule (or primitive) name for schema `s`; raises _Never when nothing can satisfy it."""
        if s is True or s == {}:
            return self.prim("value")
        if s is False:
            raise _Never()
        if not isinstance(s, dict):
            raise GrammarRefused(f"a schema must be an object or a boolean, not {type(s).__name__}", "schema", 0)
        s = dict(s)
        for kw in list(s):
            if kw in _ANNOTATIONS or kw in ("$defs", "definitions") or kw.startswith("x-"):
                s.pop(kw)
        if "$ref" in s:
            return self.visit_ref(s, hint)
        if "allOf" in s:
            return self.visit(self.merge_all_of(s), hint)
        if "const" in s:
            self.enforced.add("const")
            self.leftovers(s, {"const", "type", "enum"})
            return json_literal(s["const"])
        if "enum" in s:
            values = s["enum"]
            if not isinstance(values, list) or not values:
                raise _Never()
            types = s.get("type")
            if types is not None:
                values = [v for v in values if _is_type(v, types)]
                if not values:
                    raise _Never()
            self.enforced.add("enum")
            self.leftovers(s, {"enum", "type"})
            return self.rule(hint, " | ".join(json_literal(v) for v in values))
        for kw in ("anyOf", "oneOf"):
            if kw in s:
                return self.visit_union(s, kw, hint)
        t = s.get("type")
        if isinstance(t, list):
            alts = []
            for one in t:
                try:
                    alts.append(self.visit({**s, "type": one}, f"{hint}-{one}"))
                except _Never:
                    pass
            if not alts:
                raise _Never()
            self.enforced.add("type")
            return self.rule(hint, " | ".join(alts))
        if t is None:
            t = _implied_type(s)
            if t is None:
                self.leftovers(s, set())
                return self.prim("value")
        self.enforced.add("type")
        if t == "string":
            return self.visit_string(s, hint)
        if t == "integer":
            return self.visit_integer(s, hint)
        if t == "number":
            return self.visit_number(s, hint)
        if t == "boolean":
            self.leftovers(s, {"type"})
            return self.prim("boolean")
        if t == "null":
            self.leftovers(s, {"type"})
            return self.prim("null")
        if t == "array":
            return self.visit_array(s, hint)
        if t == "object":
            return self.visit_object(s, hint)
        raise GrammarRefused(f"unknown type {t!r}", "type", 0)

    def leftovers(self, s: dict, handled: set[str]) -> None:
        """Keywords of `s` this visit did not turn into grammar: checked after generation, or not at all."""
        for kw in s:
            if kw in handled or kw in _ANNOTATIONS:
                continue
            if kw == "format":
                self.format_receipt(s[kw])
            elif kw in _CHECKABLE:
                self.check(kw)
            elif kw in _KNOWN_ELSEWHERE:
                continue  # a keyword for another type: inert here
            else:
                self.unenforced.add(kw)

    def format_receipt(self, fmt: Any) -> None:
        if fmt in _CHECKED_FORMATS:
            self.check("format")
        else:
            self.unenforced.add(f"format:{fmt}")

    def visit_ref(self, s: dict, hint: str) -> str:
        ref = s.pop("$ref")
        target = self.resolve(ref)
        if s:  # siblings of $ref apply together with it
            return self.visit({"allOf": [target, s]}, hint)
        depth = self.ref_stack.count(ref)
        if depth >= self.max_ref_depth:
            self.enforced.add("$ref")
            raise _Never()
        key = (ref, depth)
        if key in self.refs:
            name = self.refs[key]
            if name is None:
                raise _Never()
            return name
        name = self.rule(ref.rsplit("/", 1)[-1] or "ref", "")  # reserved; filled below
        self.refs[key] = name
        self.ref_stack.append(ref)
        try:
            body = self.visit(target, name + "-v")
        except _Never:
            self.refs[key] = None
            del self.rules[name]
            raise
        finally:
            self.ref_stack.pop()
        self.rules[name] = body
        self.enforced.add("$ref")
        return name

    def merge_all_of(self, s: dict) -> dict:
        parts = s.pop("allOf")
        if not isinstance(parts, list):
            raise GrammarRefused("allOf must be a list of schemas", "allOf", 0)
        merged = dict(s)
        for p in parts:
            if isinstance(p, dict) and "$ref" in p:
                p = {**self.resolve(p["$ref"]), **{k: v for k, v in p.items() if k != "$ref"}}
            if p is True:
                continue
            if p is False:
                raise _Never()
            if not isinstance(p, dict):
                raise GrammarRefused("allOf must be a list of schemas", "allOf", 0)
            merged = _merge(merged, p)
        if _contradicts(merged):
            raise _Never()
        self.enforced.add("allOf")
        return merged

    def visit_union(self, s: dict, kw: str, hint: str) -> str:
        options = s.pop(kw)
        if not isinstance(options, list) or not options:
            raise GrammarRefused(f"{kw} must be a non-empty list of schemas", kw, 0)
        base = {k: v for k, v in s.items()}
        alts = []
        for i, o in enumerate(options):
            sub = {"allOf": [base, o]} if base else o
            try:
                alts.append(self.visit(sub, f"{hint}-{i}"))
            except _Never:
                pass
        if not alts:
            raise _Never()
        if kw == "anyOf" or _disjoint([self.resolve(o["$ref"]) if isinstance(o, dict) and "$ref" in o else o for o in options]):
            self.enforced.add(kw)
        else:
            self.check(kw)  # the alternatives overlap: exactly-one is validated after generation
        return self.rule(hint, " | ".join(alts))

    def visit_string(self, s: dict, hint: str) -> str:
        handled = {"type", "minLength", "maxLength"}
        fmt = s.get("format")
        if fmt in _GRAMMAR_FORMATS:
            self.enforced.add("format")
            for kw in ("minLength", "maxLength"):
                if kw in s:
                    self.check(kw)
            self.leftovers(s, handled | {"format"})
            return self.prim(fmt)
        lo = _int(s.get("minLength", 0), "minLength")
        hi = s.get("maxLength")
        hi = None if hi is None else _int(hi, "maxLength")
        if hi is not None and hi < lo:
            raise _Never()
        for kw in ("minLength", "maxLength"):
            if kw in s:
                self.enforced.add(kw)
        self.leftovers(s, handled)
        if lo == 0 and hi is None:
            return self.prim("string")
        self.prim("char")
        rep = f"{{{lo},}}" if hi is None else f"{{{lo},{hi}}}"
        return self.rule(hint, f'"\\"" char{rep} "\\""')

    def visit_integer(self, s: dict, hint: str) -> str:
        lo, hi = _bounds(s, integer=True)
        for kw in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
            if kw in s:
                self.enforced.add(kw)
        handled = {"type", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"}
        m = s.get("multipleOf")
        if m is not None:
            if isinstance(m, bool) or not isinstance(m, (int, float)) or m <= 0:
                raise GrammarRefused("multipleOf must be a positive number", "multipleOf", 0)
            if float(m).is_integer() and lo is not None and hi is not None:
                m = int(m)
                first = -(-lo // m) * m
                values = list(range(first, hi + 1, m)) if first <= hi else []
                if not values:
                    raise _Never()
                if len(values) <= MAX_ENUMERATED_MULTIPLES:
                    self.enforced.add("multipleOf")
                    self.leftovers(s, handled | {"multipleOf"})
                    return self.rule(hint, " | ".join(literal(str(v)) for v in values))
            self.check("multipleOf")
            handled.add("multipleOf")
        self.leftovers(s, handled)
        if lo is None and hi is None:
            return self.prim("int")
        return self.rule(hint, integer_range(lo, hi))

    def visit_number(self, s: dict, hint: str) -> str:
        handled = {"type"}
        lo_kw = [k for k in ("minimum", "exclusiveMinimum") if k in s]
        hi_kw = [k for k in ("maximum", "exclusiveMaximum") if k in s]
        if not lo_kw and not hi_kw:
            self.leftovers(s, handled)
            return self.prim("number")
        lo, hi = s.get("minimum"), s.get("maximum")
        # enforced where the bounds are inclusive whole numbers and the lower one is not negative
        simple = (not any(k.startswith("exclusive") for k in lo_kw + hi_kw) and _whole(lo) and (hi is None or _whole(hi))
                  and lo is not None and lo >= 0 and (hi is None or hi >= lo))  # fmt: skip
        if not simple:
            lo_i, hi_i = _bounds(s, integer=False)
            if lo_i is not None and hi_i is not None and lo_i > hi_i:
                raise _Never()
            self.leftovers(s, handled)  # the bounds: checked
            return self.prim("number")
        lo, hi = int(lo), None if hi is None else int(hi)
        self.enforced.update(lo_kw + hi_kw)
        self.leftovers(s, handled | {"minimum", "maximum"})
        frac = '("." [0-9]{1,16})?'
        alts = []
        if hi is None:
            alts.append(f"({integer_range(lo, None)}) {frac}")
        else:
            if hi > lo:
                alts.append(f"({integer_range(lo, hi - 1)}) {frac}")
            alts.append(f'{literal(str(hi))} ("." "0"{{1,16}})?')
        return self.rule(hint, " | ".join(f"({a})" for a in alts))

    def visit_array(self, s: dict, hint: str) -> str:
        handled = {"type", "items", "prefixItems", "minItems", "maxItems"}
        lo = _int(s.get("minItems", 0), "minItems")
        hi = s.get("maxItems")
        hi = None if hi is None else _int(hi, "maxItems")
        for kw in ("minItems", "maxItems", "items", "prefixItems"):
            if kw in s:
                self.enforced.add(kw)
        prefix = s.get("prefixItems") or []
        items = s.get("items", True)
        if isinstance(items, list):  # the draft-4 tuple form
            prefix, items = items, s.get("additionalItems", True)
            handled.add("additionalItems")
        self.prim("ws")
        elems = []
        for i, p in enumerate(prefix):
            elems.append(self.visit(p, f"{hint}-{i}"))  # _Never: a required position cannot be written
        try:
            item = self.visit(items, f"{hint}-item")
        except _Never:
            item = None
        self.leftovers(s, handled)
        if hi is not None and hi < lo:
            raise _Never()
        n_prefix = len(elems)
        if hi is not None and hi < n_prefix:
            elems = elems[:hi]
            n_prefix = hi
        if lo > n_prefix and item is None:
            raise _Never()
        # the first min(lo, n) prefix items are required, the rest optional in order
        seq = []
        need = min(lo, n_prefix)
        for i, e in enumerate(elems):
            sep = "" if i == 0 else '"," ws '
            seq.append((f"{sep}{e} ws", i < need))
        extra_min = max(0, lo - n_prefix)
        extra_max = None if hi is None else max(0, hi - n_prefix)
        tail = ""
        if item is not None and extra_max != 0:
            first_sep = '"," ws ' if n_prefix else ""
            if n_prefix == 0:
                # item ("," item){min-1, max-1}
                if extra_min == 0:
                    more = "*" if extra_max is None else f"{{0,{extra_max - 1}}}"
                    tail = f'( {item} ws ( "," ws {item} ws ){more} )?'
                else:
                    more = f"{{{extra_min - 1},}}" if extra_max is None else f"{{{extra_min - 1},{extra_max - 1}}}"
                    tail = f'{item} ws ( "," ws {item} ws ){more}'
            else:
                rep = f"{{{extra_min},}}" if extra_max is None else f"{{{extra_min},{extra_max}}}"
                tail = f'( {first_sep}{item} ws ){rep}'
        elif extra_min > 0:
            raise _Never()
        # optional prefix items nest: (a (b (c tail)?)?)?  -- a later one only after an earlier one
        body = tail
        for text, required in reversed(seq):
            body = f"{text} {body}".strip()
            if not required:
                body = f"( {body} )?"
        return self.rule(hint, f'"[" ws {body} "]"')

    def visit_object(self, s: dict, hint: str) -> str:
        handled = {"type", "properties", "required", "additionalProperties"}
        props = s.get("properties") or {}
        required = list(dict.fromkeys(s.get("required") or []))
        addl = s.get("additionalProperties", True)
        for kw in ("properties", "required", "additionalProperties"):
            if kw in s:
                self.enforced.add(kw)
        self.prim("ws")
        self.prim("string")
        kvs_req, kvs_opt = [], []
        for name in required:
            if name in props:
                schema = props[name]
            elif addl is False:
                raise _Never()  # a required property that may not appear
            else:
                schema = addl if isinstance(addl, dict) else True
            kv = f"{json_literal(name)} ws \":\" ws {self.visit(schema, f'{hint}-{name}')} ws"  # _Never propagates
            kvs_req.append(kv)
        for name, schema in props.items():
            if name in required:
                continue
            try:
                kvs_opt.append(f"{json_literal(name)} ws \":\" ws {self.visit(schema, f'{hint}-{name}')} ws")
            except _Never:
                pass  # an optional property that can take no value: never written
        n_props = len(kvs_req) + len(kvs_opt)
        min_p = s.get("minProperties")
        if min_p is not None:
            if len(kvs_req) >= _int(min_p, "minProperties"):
                self.enforced.add("minProperties")
            else:
                self.check("minProperties")
            handled.add("minProperties")
        max_p = s.get("maxProperties")
        if max_p is not None:
            if n_props <= _int(max_p, "maxProperties") or (not kvs_opt and len(kvs_req) <= max_p):
                self.enforced.add("maxProperties")
            else:
                self.check("maxProperties")
            handled.add("maxProperties")
        free_map = not props and not required and addl is not False
        self.leftovers(s, handled)
        if free_map:  # a map: string keys, values of additionalProperties
            value = self.visit(addl if isinstance(addl, dict) else True, f"{hint}-value")
            kv = f'string ws ":" ws {value} ws'
            return self.rule(hint, f'"{{" ws ( {kv} ( "," ws {kv} )* )? "}}"')
        # required ones first, in order; then the optional ones, each optional, in order
        body = ""
        if kvs_req:
            body = ' "," ws '.join(kvs_req)
            for kv in kvs_opt:
                body += f' ( "," ws {kv} )?'
        elif kvs_opt:
            # at least one optional: the first one written opens the list, each later one after a comma
            rest = {}
            names = []
            for i in range(len(kvs_opt) - 1, -1, -1):
                after = " ".join(f'( "," ws {kv} )?' for kv in kvs_opt[i + 1 :])
                rest[i] = f"{kvs_opt[i]} {after}".strip()
                names.append(i)
            body = "( " + " | ".join(f"( {self.rule(f'{hint}-from{i}', rest[i])} )" for i in sorted(rest)) + " )?"
        return self.rule(hint, f'"{{" ws {body} "}}"')

    def grammar(self, root_rule: str) -> str:
        lines = [f"root ::= {root_rule}"]
        for name, body in self.rules.items():
            lines.append(f"{name} ::= {body}")
        for name in sorted(self.used):
            lines.append(f"{name} ::= {PRIMITIVES[name]}")
        return "\n".join(lines) + "\n"


_KNOWN_ELSEWHERE = {
    "type", "properties", "required", "additionalProperties", "items", "prefixItems", "minItems", "maxItems",
    "minLength", "maxLength", "enum", "const", "anyOf",
}  # fmt: skip


def convert(schema: Any, *, strict: bool = False, limits: GrammarLimits = GrammarLimits(),
            max_ref_depth: int = MAX_REF_DEPTH, param: str = "response_format") -> Conversion:  # fmt: skip
    """The grammar for `schema` (an empty schema at the root: any JSON object) and its receipt.
    Raises GrammarRefused: a schema no output can satisfy, a malformed one, or (strict) a keyword the
    grammar does not enforce."""
    if schema == {} or schema is True:
        schema = {"type": "object"}
    c = _Converter(schema if isinstance(schema, dict) else {}, limits, max_ref_depth)
    try:
        root = c.visit(schema, "root-value")
    except _Never:
        raise GrammarRefused(
            "no JSON value satisfies this schema under the grammar's bounds (a contradiction, or a required recursion"
            f" deeper than {max_ref_depth} levels of $ref)", "allOf" if _has(schema, "allOf") else "$ref" if _has(schema, "$ref") else "schema", 0, param
        ) from None  # fmt: skip
    except RecursionError:
        raise GrammarRefused("the JSON schema is nested too deeply to enforce", "schema depth", 0, param) from None
    except GrammarRefused as exc:
        exc.param = param
        raise
    # a keyword enforced in one place and only checked in another is not guaranteed: checked
    out = Conversion(c.grammar(root), c.enforced - c.checked - c.unenforced, set(c.checked), set(c.unenforced))
    if strict and (out.checked or out.unenforced):
        kw = sorted(out.unenforced | out.checked)[0]
        raise GrammarRefused(
            f"strict structured output: the schema keyword {kw!r} cannot be enforced by the grammar "
            f"(not enforced: {', '.join(sorted(out.checked | out.unenforced))}); remove it or set strict to false",
            kw, 0, param,
        )  # fmt: skip
    return out


def _has(schema: Any, kw: str) -> bool:
    return kw in json.dumps(schema)
