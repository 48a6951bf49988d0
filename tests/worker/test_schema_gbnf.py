"""JSON Schema -> GBNF: integer ranges by digit rules, strings without raw control characters, the
receipt (enforced / checked / unenforced), strict refusals naming the keyword, and a table of
real-world schemas sampled on the tiny model: every finished output valid, or refused up front."""

from __future__ import annotations

import enum
import json
import re
from typing import Literal, Optional, Union

import jsonschema
import pydantic
import pytest

from barrel_inference.worker.grammar import GrammarRefused
from barrel_inference.worker.schema_gbnf import convert, integer_range

# ---- the grammar, read back as a regular expression (the subset the converter writes) -----------


def gbnf_to_regex(expr: str) -> str:
    """GBNF literals, classes, groups, alternation and repetition -> a Python regex."""
    out, i = [], 0
    while i < len(expr):
        c = expr[i]
        if c == '"':
            j, lit = i + 1, []
            while expr[j] != '"':
                if expr[j] == "\\":
                    lit.append(expr[j + 1])
                    j += 2
                    continue
                lit.append(expr[j])
                j += 1
            out.append(re.escape("".join(lit)))
            i = j + 1
        elif c == "[":
            j = expr.index("]", i)
            out.append(expr[i : j + 1])
            i = j + 1
        elif c == " ":
            i += 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


@pytest.mark.parametrize("lo,hi", [(5, 7), (0, 0), (0, 9), (10, 99), (7, 1234), (-30, 45), (-999, -100), (-5, None),
                                   (None, 12), (123, None), (None, None), (199, 201), (1, 1000)])  # fmt: skip
def test_integer_ranges_are_exact(lo, hi):
    rx = re.compile(gbnf_to_regex(integer_range(lo, hi)))
    a = -1200 if lo is None else lo - 50
    b = 1300 if hi is None else hi + 50
    for n in range(a, b + 1):
        inside = (lo is None or n >= lo) and (hi is None or n <= hi)
        assert bool(rx.fullmatch(str(n))) == inside, (lo, hi, n)
    for bad in ("01", "-0", "007", "+1", "1.0", ""):
        assert not rx.fullmatch(bad)
    if hi is None:
        assert rx.fullmatch("9" * 16) and not rx.fullmatch("9" * 17)  # unbounded: capped at 16 digits


def rule_regex(grammar: str, name: str) -> str:
    rules = dict(line.split(" ::= ", 1) for line in grammar.strip().splitlines())
    return gbnf_to_regex(rules[name])


def test_string_characters_exclude_raw_control_characters():
    g = convert({"type": "string"}).grammar
    assert 'char ::= [^"\\\\\\x00-\\x1F\\x7F\\uD800-\\uDFFF\\U00110000-\\U003FFFFF]' in g
    char = rule_regex(g, "char").replace("\\U00110000-\\U003FFFFF", "")  # beyond what Python's re reads
    rx = re.compile(f"(?:{char})")
    assert rx.fullmatch("a") and rx.fullmatch("\\n") and rx.fullmatch("\\u00e9") and rx.fullmatch("é")
    for raw in ("\n", "\t", "\x00", "\x1f", "\x7f", '"'):
        assert not rx.fullmatch(raw), repr(raw)


RECEIPTS = [
    ({"type": "integer", "minimum": 5, "maximum": 7}, {"type", "minimum", "maximum"}, set(), set()),
    ({"type": "integer", "exclusiveMinimum": 0, "exclusiveMaximum": 10, "multipleOf": 3},
     {"type", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"}, set(), set()),
    ({"type": "integer", "multipleOf": 7}, {"type"}, {"multipleOf"}, set()),
    ({"type": "object", "patternProperties": {"^x": {"type": "string"}}, "minProperties": 1},
     {"type"}, {"patternProperties", "minProperties"}, set()),
    ({"type": "array", "items": {"type": "integer"}, "contains": {"const": 3}}, {"type", "items"}, {"contains"}, set()),
    ({"type": "string", "format": "date"}, {"type", "format"}, set(), set()),
    ({"type": "string", "format": "email"}, {"type"}, {"format"}, set()),
    ({"type": "string", "format": "x-custom", "contentEncoding": "base64"}, {"type"}, set(), {"format:x-custom", "contentEncoding"}),
    ({"type": "number", "minimum": 0, "maximum": 1}, {"type", "minimum", "maximum"}, set(), set()),
    ({"type": "number", "minimum": -1.5}, {"type"}, {"minimum"}, set()),
    ({"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"], "additionalProperties": False},
     {"type", "properties", "required", "additionalProperties"}, set(), set()),
    ({"oneOf": [{"type": "string"}, {"type": "integer"}]}, {"oneOf", "type"}, set(), set()),
    ({"oneOf": [{"type": "integer"}, {"type": "number"}]}, {"type"}, {"oneOf"}, set()),
]  # fmt: skip


@pytest.mark.parametrize("schema,enforced,checked,unenforced", RECEIPTS)
def test_receipts(schema, enforced, checked, unenforced):
    c = convert(schema)
    assert (c.enforced, c.checked, c.unenforced) == (enforced, checked, unenforced)
    if checked or unenforced:
        with pytest.raises(GrammarRefused) as exc:
            convert(schema, strict=True)
        assert exc.value.keyword in checked | unenforced and exc.value.keyword in str(exc.value)
    else:
        assert convert(schema, strict=True).grammar == c.grammar


@pytest.mark.parametrize("schema,keyword", [
    ({"allOf": [{"type": "string"}, {"type": "integer"}]}, "allOf"),
    ({"allOf": [{"type": "integer", "minimum": 10}, {"maximum": 3}]}, "allOf"),
    ({"type": "object", "properties": {"a": {"type": "string"}}, "required": ["b"], "additionalProperties": False}, "schema"),
    ({"$defs": {"n": {"type": "object", "properties": {"next": {"$ref": "#/$defs/n"}}, "required": ["next"]}}, "$ref": "#/$defs/n"}, "$ref"),
    ({"$ref": "#/$defs/missing"}, "$ref"),
    ({"$ref": "https://example.com/schema.json"}, "$ref"),
])  # fmt: skip
def test_schemas_no_output_can_satisfy_are_refused(schema, keyword):
    with pytest.raises(GrammarRefused) as exc:
        convert(schema)
    assert exc.value.keyword == keyword


def test_optional_recursion_is_unrolled_to_the_depth_bound():
    schema = {"$defs": {"node": {"type": "object", "properties": {"v": {"type": "integer"},
              "children": {"type": "array", "items": {"$ref": "#/$defs/node"}}}, "required": ["v"]}}, "$ref": "#/$defs/node"}  # fmt: skip
    g = convert(schema, max_ref_depth=3).grammar
    assert "node-3 " in g and "node-4 " not in g


# ---- real-world schemas -------------------------------------------------------------------------


class Colour(str, enum.Enum):
    red = "red"
    green = "green"


class Address(pydantic.BaseModel):
    street: str
    city: str
    zip: Optional[str] = None


class Person(pydantic.BaseModel):
    name: str = pydantic.Field(max_length=20)
    age: int = pydantic.Field(ge=0, le=130)
    email: Optional[str] = None
    address: Address
    tags: list[str] = pydantic.Field(default_factory=list, max_length=3)
    colour: Colour = Colour.red


class Step(pydantic.BaseModel):
    explanation: str
    output: str


class MathReasoning(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid")
    steps: list[Step] = pydantic.Field(max_length=3)
    final_answer: str


class Cat(pydantic.BaseModel):
    kind: Literal["cat"]
    lives: int = pydantic.Field(ge=1, le=9)


class Dog(pydantic.BaseModel):
    kind: Literal["dog"]
    good: bool


class Pet(pydantic.BaseModel):
    pet: Union[Cat, Dog] = pydantic.Field(discriminator="kind")


class TreeNode(pydantic.BaseModel):
    value: int
    children: list["TreeNode"] = pydantic.Field(default_factory=list, max_length=2)


class Event(pydantic.BaseModel):
    title: str
    day: str = pydantic.Field(json_schema_extra={"format": "date"})
    priority: Literal[1, 2, 3]
    score: float = pydantic.Field(ge=0, le=1)


TABLE = [
    {"type": "integer", "minimum": 5, "maximum": 7},
    {"type": "integer", "multipleOf": 5, "minimum": 0, "maximum": 100},
    {"type": "integer", "exclusiveMinimum": 10, "exclusiveMaximum": 20},
    {"type": "number", "minimum": 0, "maximum": 10},
    {"type": "boolean"},
    {"enum": ["low", "medium", "high"]},
    {"type": "string", "minLength": 2, "maxLength": 8},
    {"type": "string", "format": "date-time"},
    {"type": "string", "format": "uuid"},
    {"type": "array", "items": {"type": "integer", "minimum": -3, "maximum": 3}, "minItems": 2, "maxItems": 4},
    {"type": "array", "prefixItems": [{"type": "string", "maxLength": 4}, {"type": "boolean"}], "items": False},
    {"type": "object", "properties": {"name": {"type": "string", "maxLength": 10}, "ok": {"type": "boolean"}},
     "required": ["name", "ok"], "additionalProperties": False},
    {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "null"}, "c": {"const": "x"}}},
    {"type": "object", "additionalProperties": {"type": "integer", "minimum": 0, "maximum": 9}, "maxProperties": 3},
    {"anyOf": [{"type": "integer", "minimum": 0, "maximum": 3}, {"type": "null"}]},
    {"oneOf": [{"type": "string", "maxLength": 3}, {"type": "boolean"}]},
    {"type": "object", "properties": {"point": {"$ref": "#/$defs/pt"}, "alt": {"$ref": "#/$defs/pt"}},
     "required": ["point"], "$defs": {"pt": {"type": "object", "properties": {"x": {"type": "integer"}, "y": {"type": "integer"}},
                                              "required": ["x", "y"], "additionalProperties": False}}},
    {"allOf": [{"type": "object", "properties": {"a": {"type": "integer", "maximum": 5}}, "required": ["a"]},
               {"properties": {"a": {"minimum": 2}}, "additionalProperties": False}]},
    {"type": ["string", "integer"], "maxLength": 3, "minimum": 0, "maximum": 9},
    {"type": "object", "properties": {"s": {"type": "string", "maxLength": 6}}, "required": ["s"], "additionalProperties": False},
    Person.model_json_schema(),
    MathReasoning.model_json_schema(),
    Pet.model_json_schema(),
    TreeNode.model_json_schema(),
    Event.model_json_schema(),
]  # fmt: skip
SEEDS = [1, 2, 3, 4, 5]
MAX_TOKENS = 1500


@pytest.fixture(scope="module")
def engine(tiny_gguf):
    from barrel_inference.worker.engine import LlamaEngine

    e = LlamaEngine(str(tiny_gguf), n_ctx=2048, n_seq_max=1, threads=1)
    yield e
    e.close()


def generate(e, grammar: str, seed: int) -> tuple[str, bool]:
    """(text, finished): sampled under the grammar until end of generation or MAX_TOKENS."""
    from barrel_inference.protocol import Sampling

    sampler = e.make_sampler(Sampling(temperature=1.0, top_k=0, seed=seed), grammar)
    e.seq_clear(0)
    prompt = e.tokenize("Answer in JSON: ", True, True)
    assert e.decode(prompt, list(range(len(prompt))), [0] * len(prompt), [False] * (len(prompt) - 1) + [True]) == 0
    out, pos, idx = b"", len(prompt), len(prompt) - 1
    try:
        for _ in range(MAX_TOKENS):
            tok = e.sample(sampler, idx)
            if e.is_eog(tok):
                return out.decode("utf-8", "replace"), True  # as the worker decodes: invalid UTF-8 as U+FFFD
            out += e.piece(tok)
            assert e.decode([tok], [pos], [0], [True]) == 0
            pos, idx = pos + 1, 0
    finally:
        sampler.free()
    return out.decode("utf-8", "replace"), False


@pytest.mark.parametrize("n", range(len(TABLE)))
def test_table_of_real_world_schemas_every_output_valid(engine, n):
    schema = TABLE[n]
    conv = convert(schema)
    validator = jsonschema.Draft202012Validator(schema, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)
    finished = 0
    for seed in SEEDS:
        text, done = generate(engine, conv.grammar, seed)
        if not done:
            continue  # cut by the token limit: reported as "length", never as a success
        finished += 1
        value = json.loads(text)  # raises on invalid JSON (raw control characters included)
        errors = list(validator.iter_errors(value))
        assert not errors or conv.checked, (seed, text, errors[0].message)
        if not conv.checked:
            assert not errors
    # a random model may write a long unbounded string past the limit: that output ends as "length"
    assert finished >= len(SEEDS) - 1, f"{len(SEEDS) - finished} seeds did not finish within {MAX_TOKENS} tokens"
