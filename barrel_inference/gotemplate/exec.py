"""Running a parsed Go template: values, truth, printing, the builtin functions, and bounds.

Values are Python ones: str, int, float, bool, None (Go's nil), list, dict (a Go map: `.key` looks a
key up, a missing one is nil) and `Struct` (a Go struct: `.Field` must exist; printed as its JSON
where it has one, as Ollama's API types print through their String methods). Printing follows
fmt.Print: nil prints `<no value>`, maps and lists print as JSON (Ollama's argument and schema types
do). `json` marshals as Go's encoding/json does (compact, `<`, `>`, `&` escaped).

Bounded: every node run and every range iteration is a step, and a render stops with an error past
`max_steps`, or once its output passes `max_output` characters; nothing loops but over the data.
"""

from __future__ import annotations

import json
import math
from typing import Any

from .parse import (
    Action, Branch, Break, Chain, Command, Continue, Dot, Field, Function, GoTemplateError, Literal, Pipe, Text, Variable,
)  # fmt: skip

MAX_STEPS = 1_000_000
MAX_OUTPUT = 16 * 1024 * 1024


class Struct:
    """A Go struct value: named fields, and the JSON its String method would print (None: none)."""

    __slots__ = ("type", "fields", "json")

    def __init__(self, type_: str, fields: dict, json_form: Any = None) -> None:
        self.type = type_
        self.fields = fields
        self.json = json_form


class _Break(Exception):
    pass


class _Continue(Exception):
    pass


# ---- values ---------------------------------------------------------------------------------------------


def truth(v: Any) -> bool:
    if v is None:
        return False
    if isinstance(v, Struct):
        return True
    if isinstance(v, (bool, int, float)):
        return bool(v)
    return len(v) > 0


def go_json(v: Any) -> str:
    """encoding/json's Marshal: compact, HTML-safe escapes, maps in their order, floats as Go writes them."""
    if isinstance(v, Struct):
        return go_json(v.json if v.json is not None else v.fields)
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return _float(v) if math.isfinite(v) else "null"
    if isinstance(v, str):
        s = json.dumps(v, ensure_ascii=False)
        return s.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026").replace("\u2028", "\\u2028").replace("\u2029", "\\u2029")
    if isinstance(v, dict):
        return "{" + ",".join(go_json(str(k)) + ":" + go_json(x) for k, x in v.items()) + "}"
    if isinstance(v, (list, tuple)):
        return "[" + ",".join(go_json(x) for x in v) + "]"
    return go_json(str(v))


def _float(f: float) -> str:
    if f == int(f) and abs(f) < 1e21:
        return str(int(f))
    text = repr(f)
    if "e" in text:
        mant, exp = text.split("e")
        sign = "-" if exp.startswith("-") else "+"
        text = f"{mant}e{sign}{exp.lstrip('+-').zfill(2)}"
    return text


def to_text(v: Any) -> str:
    """fmt.Print of one value, as a template action prints it."""
    if v is None:
        return "<no value>"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return v
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return _float(v)
    return go_json(v)


def _kind(v: Any) -> str:
    if isinstance(v, bool):
        return "bool"
    if isinstance(v, (int, float)):
        return "number"
    if isinstance(v, str):
        return "string"
    return type(v).__name__


def _compare(op: str, a: Any, b: Any) -> bool:
    if op in ("eq", "ne"):
        if a is not None and b is not None and not isinstance(a, (list, dict, Struct)) and _kind(a) != _kind(b):
            raise GoTemplateError(f"{op}: incompatible types for comparison ({_kind(a)} and {_kind(b)})")
        return (a == b) if op == "eq" else (a != b)
    if _kind(a) != _kind(b) or _kind(a) not in ("number", "string"):
        raise GoTemplateError(f"{op}: incomparable types ({_kind(a)} and {_kind(b)})")
    return {"lt": a < b, "le": a <= b, "gt": a > b, "ge": a >= b}[op]


def _len(v: Any) -> int:
    if isinstance(v, (str, list, tuple, dict)):
        return len(v)
    raise GoTemplateError(f"len of {_kind(v) if v is not None else 'nil'}")


def _index_of(v: Any, i: Any) -> int:
    if not isinstance(i, int) or isinstance(i, bool):
        raise GoTemplateError(f"cannot index with {_kind(i)}")
    return i


def _slice(v: Any, *idx: Any) -> Any:
    if not isinstance(v, (str, list, tuple)):
        raise GoTemplateError(f"can't slice item of type {_kind(v) if v is not None else 'nil'}")
    if len(idx) > 3:
        raise GoTemplateError("too many slice indexes")
    bounds = [_index_of(v, i) for i in idx[:2]]
    lo = bounds[0] if bounds else 0
    hi = bounds[1] if len(bounds) > 1 else len(v)
    if not 0 <= lo <= hi <= len(v):
        raise GoTemplateError(f"slice index out of range: [{lo}:{hi}] with length {len(v)}")
    return v[lo:hi]


def _index(v: Any, *keys: Any) -> Any:
    for k in keys:
        if isinstance(v, dict):
            v = v.get(k)
        elif isinstance(v, (list, tuple, str)):
            i = _index_of(v, k)
            if not 0 <= i < len(v):
                raise GoTemplateError(f"index out of range: {i}")
            v = v[i]
        else:
            raise GoTemplateError(f"can't index item of type {_kind(v) if v is not None else 'nil'}")
    return v


def _sprint(*args: Any) -> str:
    out = []
    for i, a in enumerate(args):  # fmt.Sprint: a space between operands when neither is a string
        if i and not isinstance(a, str) and not isinstance(args[i - 1], str):
            out.append(" ")
        out.append(to_text(a))
    return "".join(out)


def _sprintf(fmt: str, *args: Any) -> str:
    if not isinstance(fmt, str):
        raise GoTemplateError("printf: the format must be a string")
    out, k, i = [], 0, 0
    while i < len(fmt):
        c = fmt[i]
        if c != "%" or i + 1 >= len(fmt):
            out.append(c)
            i += 1
            continue
        verb = fmt[i + 1]
        i += 2
        if verb == "%":
            out.append("%")
            continue
        if k >= len(args):
            out.append(f"%!{verb}(MISSING)")
            continue
        a = args[k]
        k += 1
        if verb in "vs":
            out.append(to_text(a))
        elif verb == "d" and isinstance(a, int):
            out.append(str(a))
        elif verb == "q":
            out.append(json.dumps(to_text(a), ensure_ascii=False))
        elif verb == "t" and isinstance(a, bool):
            out.append(to_text(a))
        elif verb == "f" and isinstance(a, (int, float)):
            out.append(f"{a:f}")
        else:
            out.append(f"%!{verb}({_kind(a)}={to_text(a)})")
    return "".join(out)


FUNCTIONS = {
    "not": lambda a: not truth(a),
    "len": _len,
    "slice": _slice,
    "index": _index,
    "eq": lambda a, *bs: any(_compare("eq", a, b) for b in bs) if bs else _arity("eq"),
    "ne": lambda a, b: _compare("ne", a, b),
    "lt": lambda a, b: _compare("lt", a, b),
    "le": lambda a, b: _compare("le", a, b),
    "gt": lambda a, b: _compare("gt", a, b),
    "ge": lambda a, b: _compare("ge", a, b),
    "print": _sprint,
    "println": lambda *a: " ".join(to_text(x) for x in a) + "\n",
    "printf": _sprintf,
    "json": go_json,  # Ollama's: encoding/json of the value
}
LAZY = {"and", "or"}  # evaluated argument by argument (Go 1.18+: they stop at the deciding one)
NAMES = set(FUNCTIONS) | LAZY


def _arity(name: str):
    raise GoTemplateError(f"wrong number of args for {name}")


# ---- running ----------------------------------------------------------------------------------------------


class Run:
    def __init__(self, data: Any, *, max_steps: int = MAX_STEPS, max_output: int = MAX_OUTPUT) -> None:
        self.vars: list[tuple[str, Any]] = [("$", data)]
        self.out: list[str] = []
        self.size = 0
        self.steps = 0
        self.max_steps = max_steps
        self.max_output = max_output

    def step(self) -> None:
        self.steps += 1
        if self.steps > self.max_steps:
            raise GoTemplateError(f"the template ran past its limit of {self.max_steps} steps")

    def write(self, text: str) -> None:
        self.size += len(text)
        if self.size > self.max_output:
            raise GoTemplateError(f"the template's output passed {self.max_output} characters")
        self.out.append(text)

    # ---- variables ----------------------------------------------------------------------------------------
    def lookup(self, name: str) -> Any:
        for n, v in reversed(self.vars):
            if n == name:
                return v
        raise GoTemplateError(f"undefined variable: {name}")

    def assign(self, name: str, value: Any) -> None:
        for i in range(len(self.vars) - 1, -1, -1):
            if self.vars[i][0] == name:
                self.vars[i] = (name, value)
                return
        raise GoTemplateError(f"undefined variable: {name}")

    # ---- nodes --------------------------------------------------------------------------------------------
    def nodes(self, nodes: list, dot: Any) -> None:
        for n in nodes:
            self.step()
            if isinstance(n, Text):
                self.write(n.text)
            elif isinstance(n, Action):
                value = self.pipe(n.pipe, dot)
                if not n.pipe.decl:
                    self.write(to_text(value))
            elif isinstance(n, Branch):
                self.branch(n, dot)
            elif isinstance(n, Break):
                raise _Break()
            elif isinstance(n, Continue):
                raise _Continue()

    def branch(self, n: Branch, dot: Any) -> None:
        mark = len(self.vars)
        try:
            if n.kind == "range":
                self.range(n, dot)
                return
            value = self.pipe(n.pipe, dot)
            if truth(value):
                self.nodes(n.body, value if n.kind == "with" else dot)
            elif n.orelse is not None:
                self.nodes(n.orelse, dot)
        finally:
            del self.vars[mark:]

    def range(self, n: Branch, dot: Any) -> None:
        value = self.pipe(n.pipe, dot, declare=False)
        if isinstance(value, dict):
            items: Any = [(k, value[k]) for k in sorted(value, key=str)]  # Go ranges over a map in key order
            empty = not value
        elif isinstance(value, (list, tuple, str)):
            items, empty = enumerate(value), not value
        elif isinstance(value, int) and not isinstance(value, bool):
            items, empty = ((i, i) for i in range(value)), value <= 0  # lazily: the step limit bounds it
        elif value is None:
            items, empty = (), True
        else:
            raise GoTemplateError(f"range can't iterate over {_kind(value)}")
        if empty:
            if n.orelse is not None:
                self.nodes(n.orelse, dot)
            return
        decl = n.pipe.decl
        if n.pipe.assign:
            pass
        elif decl:
            for name in decl:
                self.vars.append((name, None))
        for key, elem in items:
            self.step()
            if decl:
                if len(decl) == 1:
                    self.assign(decl[0], elem)
                else:
                    self.assign(decl[0], key)
                    self.assign(decl[1], elem)
            mark = len(self.vars)
            try:
                self.nodes(n.body, elem)
            except _Break:
                break
            except _Continue:
                continue
            finally:
                del self.vars[mark:]

    # ---- pipelines ----------------------------------------------------------------------------------------
    def pipe(self, p: Pipe, dot: Any, *, declare: bool = True) -> Any:
        value: Any = _NONE
        for cmd in p.cmds:
            value = self.command(cmd, dot, value)
        if p.decl and declare:
            if p.assign:
                self.assign(p.decl[0], value)
            else:
                self.vars.append((p.decl[0], value))
        return value

    def command(self, cmd: Command, dot: Any, piped: Any) -> Any:
        self.step()
        first = cmd.args[0]
        if isinstance(first, Function):
            rest = cmd.args[1:]
            if first.name in LAZY:
                return self.lazy(first.name, rest, dot, piped)
            args = [self.arg(a, dot) for a in rest]
            if piped is not _NONE:
                args.append(piped)
            try:
                return FUNCTIONS[first.name](*args)
            except TypeError:
                raise GoTemplateError(f"wrong number of args for {first.name}: {len(args)}") from None
        if len(cmd.args) > 1 or piped is not _NONE:
            raise GoTemplateError(f"can't give arguments to a non-function ({_describe(first)})")
        return self.arg(first, dot)

    def lazy(self, name: str, args: list, dot: Any, piped: Any) -> Any:
        values = [lambda a=a: self.arg(a, dot) for a in args]
        if piped is not _NONE:
            values.append(lambda: piped)
        if not values:
            raise GoTemplateError(f"wrong number of args for {name}: 0")
        v: Any = None
        for get in values:
            v = get()
            if truth(v) != (name == "and"):  # and: the first false one; or: the first true one
                return v
        return v

    def arg(self, node: Any, dot: Any) -> Any:
        if isinstance(node, Literal):
            return node.value
        if isinstance(node, Dot):
            return dot
        if isinstance(node, Field):
            return self.fields(dot, node.names)
        if isinstance(node, Variable):
            return self.fields(self.lookup(node.name), node.names)
        if isinstance(node, Pipe):
            return self.pipe(node, dot)
        if isinstance(node, Chain):
            return self.fields(self.pipe(node.node, dot), node.names)
        if isinstance(node, Function):
            if node.name in LAZY:
                raise GoTemplateError(f"wrong number of args for {node.name}: 0")
            try:
                return FUNCTIONS[node.name]()
            except TypeError:
                raise GoTemplateError(f"wrong number of args for {node.name}: 0") from None
        raise GoTemplateError(f"can't evaluate {_describe(node)}")

    def fields(self, value: Any, names: list[str]) -> Any:
        for name in names:
            if isinstance(value, Struct):
                if name not in value.fields:
                    raise GoTemplateError(f"can't evaluate field {name} in type {value.type}")
                value = value.fields[name]
            elif isinstance(value, dict):
                value = value.get(name)
            elif value is None:
                return None
            else:
                raise GoTemplateError(f"can't evaluate field {name} in type {_kind(value)}")
        return value


_NONE = object()  # no piped value


def _describe(node: Any) -> str:
    if isinstance(node, Field):
        return "." + ".".join(node.names)
    if isinstance(node, Variable):
        return node.name + "".join("." + n for n in node.names)
    if isinstance(node, Literal):
        return repr(node.value)
    return type(node).__name__.lower()


def cut_after_response(nodes: list) -> list:
    """The tree without everything after the first `{{ .Response }}` action (kept itself), as Ollama trims a
    legacy template for the turn being generated: later text, actions and whole structures go; a condition
    that mentions Response does not count."""
    cut = False

    def walk_list(items: list) -> list:
        out = []
        for n in items:
            kept = walk(n)
            if kept is not None:
                out.append(kept)
        return out

    def walk(n):
        nonlocal cut
        if cut:
            return None
        if isinstance(n, Branch):
            body = walk_list(n.body)
            orelse = walk_list(n.orelse) if n.orelse is not None else None
            return Branch(n.kind, n.pipe, body, orelse)
        if isinstance(n, Action):
            cmds = []
            for c in n.pipe.cmds:
                args = []
                for a in c.args:
                    if cut:
                        break
                    args.append(a)
                    if isinstance(a, Field) and "Response" in a.names:
                        cut = True
                if not args:  # a command left without arguments takes its whole action with it
                    return None
                cmds.append(Command(args))
            return Action(Pipe(cmds, n.pipe.decl, n.pipe.assign, n.pipe.line))
        return n

    return walk_list(nodes)
