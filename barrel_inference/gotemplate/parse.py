"""Go text/template, the subset Ollama's model templates use: lexing and parsing into a small tree.

Text and actions `{{ … }}` with trim markers (`{{- ` trims the whitespace before, ` -}}` after),
comments `{{/* … */}}`, pipelines (`a | f b`), variables (`$`, `$x`, `$x := …`, `$x = …`), fields
and chains (`.A.B`, `$x.A`, `(pipe).A`), literals (strings, raw strings, numbers, chars, true,
false, nil), and the control structures `if` / `else if` / `else` / `end`, `range` (one or two
variables, `break`, `continue`) and `with`. `define`, `template` and `block` are refused with an
error naming them, and so is a function this renderer does not provide (as Go refuses an undefined
function at parse time). Parsing is linear in the text; nesting is bounded.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

SPACE = " \t\r\n"
MAX_DEPTH = 100  # nested control structures and parentheses
KEYWORDS = {"if", "else", "end", "range", "with", "define", "template", "block", "break", "continue", "nil", "true", "false"}
UNSUPPORTED = {"define", "template", "block"}


class GoTemplateError(Exception):
    """A template that does not parse, or fails while it runs; the message names the construct and line."""


# ---- the tree ------------------------------------------------------------------------------------------


@dataclass
class Text:
    text: str


@dataclass
class Dot:
    pass


@dataclass
class Field:
    names: list[str]  # .A.B -> ["A", "B"]


@dataclass
class Variable:
    name: str  # "$" or "$x"
    names: list[str] = field(default_factory=list)  # fields after it: $x.A.B


@dataclass
class Literal:
    value: Any


@dataclass
class Function:
    name: str


@dataclass
class Chain:
    node: Any  # a parenthesised pipeline
    names: list[str]


@dataclass
class Command:
    args: list


@dataclass
class Pipe:
    cmds: list[Command]
    decl: list[str] = field(default_factory=list)  # variables declared (:=) or assigned (=)
    assign: bool = False
    line: int = 0


@dataclass
class Action:
    pipe: Pipe


@dataclass
class Branch:
    kind: str  # "if" | "with" | "range"
    pipe: Pipe
    body: list
    orelse: list | None = None


@dataclass
class Break:
    pass


@dataclass
class Continue:
    pass


# ---- lexing ----------------------------------------------------------------------------------------------


@dataclass
class Tok:
    kind: str  # field var ident str num char bool nil dot pipe lparen rparen declare assign comma
    value: Any
    spaced: bool  # whitespace before it (a field right after an operand chains onto it only without)
    line: int


_NUMBER = re.compile(r"[+-]?(0[xX][0-9a-fA-F_]+|0[bB][01_]+|0[oO][0-7_]+|(\d[\d_]*(\.\d*)?|\.\d+)([eE][+-]?\d+)?)")
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_ESCAPES = {"a": "\a", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v", "\\": "\\", '"': '"', "'": "'"}


def _unquote(body: str, line: int) -> str:
    out, i = [], 0
    while i < len(body):
        c = body[i]
        if c != "\\":
            out.append(c)
            i += 1
            continue
        e = body[i + 1 : i + 2]
        if e in _ESCAPES:
            out.append(_ESCAPES[e])
            i += 2
        elif e in ("x", "u", "U"):
            width = {"x": 2, "u": 4, "U": 8}[e]
            digits = body[i + 2 : i + 2 + width]
            if len(digits) != width or not all(d in "0123456789abcdefABCDEF" for d in digits):
                raise GoTemplateError(f"line {line}: bad escape \\{e}{digits} in a string")
            out.append(chr(int(digits, 16)))
            i += 2 + width
        elif e and e in "01234567":
            digits = body[i + 1 : i + 4]
            if len(digits) != 3 or not all(d in "01234567" for d in digits):
                raise GoTemplateError(f"line {line}: bad octal escape in a string")
            out.append(chr(int(digits, 8)))
            i += 4
        else:
            raise GoTemplateError(f"line {line}: unknown escape \\{e} in a string")
    return "".join(out)


def _number(text: str, line: int):
    t = text.replace("_", "")
    try:
        if t.lstrip("+-")[:2].lower() in ("0x", "0b", "0o"):
            return int(t, 0)
        if any(c in t for c in ".eE"):
            return float(t)
        return int(t, 10)
    except ValueError:
        raise GoTemplateError(f"line {line}: bad number syntax: {text!r}") from None


def lex(src: str) -> list:
    """The template as segments: ("text", str) and ("action", [Tok], line); trim markers applied."""
    out: list = []
    pos, n = 0, len(src)
    trim_next = False
    while pos < n or trim_next:
        i = src.find("{{", pos)
        text = src[pos:] if i < 0 else src[pos:i]
        if trim_next:
            text = text.lstrip(SPACE)
            trim_next = False
        if i < 0:
            if text:
                out.append(("text", text))
            break
        line = src.count("\n", 0, i) + 1
        j = i + 2
        if src.startswith("-", j) and src[j + 1 : j + 2] and src[j + 1] in SPACE:
            text = text.rstrip(SPACE)
            j += 2
        if text:
            out.append(("text", text))
        if src.startswith("/*", j):  # a comment: nothing but the comment in this action
            end = src.find("*/", j + 2)
            if end < 0:
                raise GoTemplateError(f"line {line}: unclosed comment")
            k = end + 2
            if src[k : k + 1] and src[k] in SPACE and src.startswith("-}}", k + 1):
                trim_next, pos = True, k + 4
            elif src.startswith("}}", k):
                pos = k + 2
            else:
                raise GoTemplateError(f"line {line}: comment ends before the closing delimiter")
            continue
        toks, pos, trim_next = _lex_action(src, j, line)
        out.append(("action", toks, line))
    return out


def _lex_action(src: str, p: int, line: int) -> tuple[list[Tok], int, bool]:
    toks: list[Tok] = []
    n = len(src)
    spaced = True
    depth = 0
    while True:
        if p >= n:
            raise GoTemplateError(f"line {line}: unclosed action (no closing }}}})")
        c = src[p]
        if c in SPACE:
            if src.startswith("-}}", p + 1):
                return toks, p + 4, True
            line += c == "\n"
            p += 1
            spaced = True
            continue
        if src.startswith("}}", p):
            if depth:
                raise GoTemplateError(f"line {line}: unclosed left parenthesis")
            return toks, p + 2, False
        start = p
        if c == "|":
            kind, value, p = "pipe", "|", p + 1
        elif c == "(":
            depth += 1
            kind, value, p = "lparen", "(", p + 1
        elif c == ")":
            depth -= 1
            if depth < 0:
                raise GoTemplateError(f"line {line}: unexpected right parenthesis")
            kind, value, p = "rparen", ")", p + 1
        elif c == ",":
            kind, value, p = "comma", ",", p + 1
        elif src.startswith(":=", p):
            kind, value, p = "declare", ":=", p + 2
        elif c == "=":
            kind, value, p = "assign", "=", p + 1
        elif c == '"':
            q = p + 1
            while q < n and src[q] != '"':
                if src[q] == "\n":
                    raise GoTemplateError(f"line {line}: unterminated quoted string")
                q += 2 if src[q] == "\\" else 1
            if q >= n:
                raise GoTemplateError(f"line {line}: unterminated quoted string")
            kind, value, p = "str", _unquote(src[p + 1 : q], line), q + 1
        elif c == "`":
            q = src.find("`", p + 1)
            if q < 0:
                raise GoTemplateError(f"line {line}: unterminated raw string")
            kind, value = "str", src[p + 1 : q]
            line += value.count("\n")
            p = q + 1
        elif c == "'":
            q = p + 1
            while q < n and src[q] != "'":
                q += 2 if src[q] == "\\" else 1
            body = _unquote(src[p + 1 : q], line) if q < n else ""
            if len(body) != 1:
                raise GoTemplateError(f"line {line}: bad character constant")
            kind, value, p = "num", ord(body), q + 1
        elif c == "$":
            m = _IDENT.match(src, p + 1)
            name = "$" + (m.group(0) if m else "")
            kind, value, p = "var", name, p + len(name)
        elif c == "." and _IDENT.match(src, p + 1):
            m = _IDENT.match(src, p + 1)
            kind, value, p = "field", m.group(0), m.end()
        elif (m := _NUMBER.match(src, p)) and m.group(0) not in ("+", "-", ".") and (c.isdigit() or c in "+-."):
            kind, value, p = "num", _number(m.group(0), line), m.end()
        elif c == ".":
            kind, value, p = "dot", ".", p + 1
        elif (m := _IDENT.match(src, p)) is not None:
            word = m.group(0)
            p = m.end()
            if word in ("true", "false"):
                kind, value = "bool", word == "true"
            elif word == "nil":
                kind, value = "nil", None
            else:
                kind, value = "ident", word
        else:
            raise GoTemplateError(f"line {line}: unexpected {c!r} in an action")
        toks.append(Tok(kind, value, spaced, line))
        spaced = False
        if p == start:  # never loop without progress
            raise GoTemplateError(f"line {line}: unexpected {c!r} in an action")


# ---- parsing ---------------------------------------------------------------------------------------------


class _Parser:
    def __init__(self, segments: list, functions: set[str]) -> None:
        self.segments = segments
        self.i = 0
        self.functions = functions
        self.depth = 0
        self.in_range = 0

    def parse(self) -> list:
        nodes, end = self.list_until()
        if end is not None:
            raise GoTemplateError(f"line {end[2]}: unexpected {{{{ {end[0]} }}}}")
        return nodes

    def list_until(self) -> tuple[list, tuple | None]:
        """Nodes up to an `else` or `end` action: (nodes, (keyword, rest tokens, line) or None at the end)."""
        nodes: list = []
        while self.i < len(self.segments):
            seg = self.segments[self.i]
            self.i += 1
            if seg[0] == "text":
                nodes.append(Text(seg[1]))
                continue
            toks, line = seg[1], seg[2]
            if not toks:
                raise GoTemplateError(f"line {line}: missing value for command")
            head = toks[0]
            word = head.value if head.kind == "ident" else None
            if word in ("else", "end"):
                return nodes, (word, toks[1:], line)
            if word in UNSUPPORTED:
                raise GoTemplateError(f"line {line}: {{{{ {word} }}}} is not supported by this server's template renderer")
            if word in ("if", "range", "with"):
                nodes.append(self.branch(word, toks[1:], line))
            elif word in ("break", "continue"):
                if len(toks) > 1:
                    raise GoTemplateError(f"line {line}: unexpected {toks[1].value!r} after {word}")
                if not self.in_range:
                    raise GoTemplateError(f"line {line}: {{{{ {word} }}}} outside {{{{ range }}}}")
                nodes.append(Break() if word == "break" else Continue())
            else:
                nodes.append(Action(self.pipeline(toks, line, decl_ok=True)))
        return nodes, None

    def branch(self, kind: str, toks: list[Tok], line: int) -> Branch:
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise GoTemplateError(f"line {line}: control structures nested deeper than {MAX_DEPTH}")
        pipe = self.pipeline(toks, line, decl_ok=True, range_decl=kind == "range")
        self.in_range += kind == "range"
        body, end = self.list_until()
        self.in_range -= kind == "range"
        orelse = None
        if end is None:
            raise GoTemplateError(f"line {line}: unexpected end of template: {{{{ {kind} }}}} has no {{{{ end }}}}")
        word, rest, eline = end
        if word == "else":
            if rest and rest[0].kind == "ident" and rest[0].value in ("if", "with"):
                # `else if` / `else with`: a nested branch that shares this one's {{ end }}
                orelse = [self.branch(rest[0].value, rest[1:], eline)]
                self.depth -= 1
                return Branch(kind, pipe, body, orelse)
            if rest:
                raise GoTemplateError(f"line {eline}: unexpected {rest[0].value!r} after else")
            orelse, end = self.list_until()
            if end is None or end[0] != "end":
                raise GoTemplateError(f"line {eline}: {{{{ else }}}} of {{{{ {kind} }}}} has no {{{{ end }}}}")
            word, rest, eline = end
        if rest:
            raise GoTemplateError(f"line {eline}: unexpected {rest[0].value!r} after end")
        self.depth -= 1
        return Branch(kind, pipe, body, orelse)

    # ---- pipelines ------------------------------------------------------------------------------------
    def pipeline(self, toks: list[Tok], line: int, *, decl_ok: bool = False, range_decl: bool = False) -> Pipe:
        k = 0
        decl: list[str] = []
        assign = False
        if decl_ok and toks and toks[0].kind == "var":
            if len(toks) > 1 and toks[1].kind in ("declare", "assign"):
                decl, assign, k = [toks[0].value], toks[1].kind == "assign", 2
            elif range_decl and len(toks) > 3 and toks[1].kind == "comma" and toks[2].kind == "var" and toks[3].kind in ("declare", "assign"):
                decl, assign, k = [toks[0].value, toks[2].value], toks[3].kind == "assign", 4
        cmds, k = self.commands(toks, k, line, top=True)
        if not cmds:
            raise GoTemplateError(f"line {line}: missing value for command")
        return Pipe(cmds, decl, assign, line)

    def commands(self, toks: list[Tok], k: int, line: int, *, top: bool) -> tuple[list[Command], int]:
        cmds: list[Command] = []
        args: list = []
        while k < len(toks):
            t = toks[k]
            if t.kind == "pipe":
                if not args:
                    raise GoTemplateError(f"line {line}: missing command before |")
                cmds.append(self.command(args, line))
                args = []
                k += 1
                continue
            if t.kind == "rparen":
                if top:
                    raise GoTemplateError(f"line {line}: unexpected right parenthesis")
                break
            node, k = self.operand(toks, k, line)
            args.append(node)
        if args:
            cmds.append(self.command(args, line))
        elif cmds:
            raise GoTemplateError(f"line {line}: missing command after |")
        return cmds, k

    def command(self, args: list, line: int) -> Command:
        first = args[0]
        if isinstance(first, Literal) and first.value is None and len(args) == 1:
            raise GoTemplateError(f"line {line}: nil is not a command")
        return Command(args)

    def operand(self, toks: list[Tok], k: int, line: int) -> tuple[Any, int]:
        t = toks[k]
        k += 1
        if t.kind == "dot":
            node: Any = Dot()
        elif t.kind == "field":
            node = Field([t.value])
        elif t.kind == "var":
            node = Variable(t.value)
        elif t.kind in ("str", "num", "bool", "nil"):
            node = Literal(t.value)
        elif t.kind == "ident":
            if t.value in KEYWORDS:
                raise GoTemplateError(f"line {line}: unexpected {t.value!r} in an operand")
            if t.value not in self.functions:
                raise GoTemplateError(f"line {line}: function {t.value!r} is not defined (this server's template renderer "
                                      f"provides {', '.join(sorted(self.functions))})")  # fmt: skip
            node = Function(t.value)
        elif t.kind == "lparen":
            self.depth += 1
            if self.depth > MAX_DEPTH:
                raise GoTemplateError(f"line {line}: parentheses nested deeper than {MAX_DEPTH}")
            cmds, k = self.commands(toks, k, line, top=False)
            if k >= len(toks) or toks[k].kind != "rparen":
                raise GoTemplateError(f"line {line}: unclosed left parenthesis")
            if not cmds:
                raise GoTemplateError(f"line {line}: missing value in parentheses")
            k += 1
            self.depth -= 1
            node = Pipe(cmds, line=line)
        else:
            raise GoTemplateError(f"line {line}: unexpected {t.value!r} in an operand")
        names: list[str] = []
        while k < len(toks) and toks[k].kind == "field" and not toks[k].spaced:  # a chain: $x.A, (pipe).A, .A.B
            names.append(toks[k].value)
            k += 1
        if names:
            if isinstance(node, Field):
                node.names += names
            elif isinstance(node, Variable):
                node.names += names
            elif isinstance(node, (Pipe, Dot)):
                node = Field(names) if isinstance(node, Dot) else Chain(node, names)
            else:
                raise GoTemplateError(f"line {line}: unexpected field after {t.value!r}")
        return node, k


def parse(src: str, functions: set[str]) -> list:
    """The template's tree; GoTemplateError naming the construct and line for anything unsupported."""
    return _Parser(lex(src), functions).parse()


def identifiers(nodes: list) -> set[str]:
    """Every field and variable name the template mentions, lowercased (what Ollama's Vars() reports)."""
    out: set[str] = set()

    def walk(n) -> None:
        if isinstance(n, list):
            for x in n:
                walk(x)
        elif isinstance(n, Field):
            out.update(x.lower() for x in n.names)
        elif isinstance(n, Variable):
            out.add(n.name.lower())
            out.update(x.lower() for x in n.names)
        elif isinstance(n, Chain):
            walk(n.node)
            out.update(x.lower() for x in n.names)
        elif isinstance(n, Pipe):
            for c in n.cmds:
                walk(c.args)
        elif isinstance(n, Action):
            walk(n.pipe)
        elif isinstance(n, Branch):
            walk(n.pipe)
            walk(n.body)
            walk(n.orelse or [])

    walk(nodes)
    return out
