"""Structured output on the real daemon (tiny GGUF): the careless client's schemas each end valid or
refused, strict refusals name the keyword, every structured answer carries the receipt header, a cut
output says "length", a finished output that fails validation is an error; the openai SDK's `parse`
with pydantic models (chat and beta) and the Responses API's text.format take the same path."""

from __future__ import annotations

import json
from typing import Literal

import httpx
import jsonschema
import openai
import pydantic
import pytest

from tinymodel import write_tiny_gguf

from .daemon import Daemon

CARELESS = [
    {"type": "integer", "minimum": 5, "maximum": 7},
    {"type": "integer", "multipleOf": 7},
    {"type": "integer", "minimum": 0, "maximum": 50, "multipleOf": 7},
    {"type": "number", "exclusiveMinimum": 3},
    {"type": "integer", "exclusiveMinimum": 3, "maximum": 9},
    {"type": "object", "patternProperties": {"^x": {"type": "string"}}, "minProperties": 1},
    {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9}, "contains": {"const": 3}, "maxItems": 4},
    {"allOf": [{"type": "string"}, {"type": "integer"}]},
    {"type": "object", "properties": {"a": {"type": "string", "maxLength": 5}, "b": {"type": "boolean"}},
     "required": ["a", "b"], "additionalProperties": False},
    {"type": "object", "properties": {"text": {"type": "string", "maxLength": 40}}, "required": ["text"]},
]  # fmt: skip


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    root = tmp_path_factory.mktemp("structured")
    tiny = write_tiny_gguf(root / "tiny.gguf")
    with Daemon(root, {"tiny": tiny}, n_seq_max=2, n_ctx=2048, threads=1) as d:
        yield d


def chat(d: Daemon, schema: dict, *, strict: bool = False, temperature: float = 0.0, seed: int | None = None, max_tokens: int = 400):
    body = {"model": "tiny", "messages": [{"role": "user", "content": "Answer in JSON."}], "max_tokens": max_tokens,
            "temperature": temperature, "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema, "strict": strict}}}  # fmt: skip
    if seed is not None:
        body["seed"] = seed
    return httpx.post(d.url + "/v1/chat/completions", json=body, timeout=120)


def receipt(r: httpx.Response) -> dict[str, set[str]]:
    out = {}
    for part in r.headers["x-structured-output"].split("; "):
        k, v = part.split("=", 1)
        out[k] = set() if v == "-" else set(v.split(","))
    return out


@pytest.mark.parametrize("schema", CARELESS)
def test_careless_schemas_end_valid_or_refused(daemon, schema):
    for temperature, seed in ((0.0, None), (1.0, 1), (1.0, 2)):
        r = chat(daemon, schema, temperature=temperature, seed=seed)
        if r.status_code == 200:
            choice = r.json()["choices"][0]
            got = receipt(r)
            assert got["enforced"], r.headers
            if choice["finish_reason"] == "stop":
                jsonschema.validate(json.loads(choice["message"]["content"]), schema)
            else:
                assert choice["finish_reason"] == "length"
        else:
            err = r.json()["error"]
            assert r.status_code in (400, 500), r.text
            assert err["code"] in ("grammar_error", "output_invalid"), r.text


def test_integer_bounds_are_enforced_at_temperature_zero(daemon):
    r = chat(daemon, {"type": "integer", "minimum": 5, "maximum": 7})
    assert r.status_code == 200, r.text
    assert json.loads(r.json()["choices"][0]["message"]["content"]) in (5, 6, 7)
    assert receipt(r) == {"enforced": {"type", "minimum", "maximum"}, "checked": set(), "unenforced": set()}


@pytest.mark.parametrize("schema,keyword", [
    ({"type": "integer", "multipleOf": 7}, "multipleOf"),
    ({"type": "object", "patternProperties": {"^x": {"type": "string"}}}, "patternProperties"),
    ({"type": "array", "items": {"type": "integer"}, "contains": {"const": 3}}, "contains"),
    ({"type": "string", "format": "x-made-up"}, "format:x-made-up"),
])  # fmt: skip
def test_strict_refuses_what_the_grammar_cannot_enforce(daemon, schema, keyword):
    r = chat(daemon, schema, strict=True)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["code"] == "grammar_error" and keyword in err["message"] and err["param"] == "response_format"


def test_not_strict_lists_the_keyword_and_a_failed_check_is_an_error(daemon):
    # maxLength is enforced, the pattern only checked: no output can pass the check
    r = chat(daemon, {"type": "string", "maxLength": 3, "pattern": "^z{10}$"})
    assert r.headers["x-structured-output"] == "enforced=maxLength,type; checked=pattern; unenforced=-"
    assert r.status_code == 500 and r.json()["error"]["code"] == "output_invalid", r.text
    s = httpx.post(daemon.url + "/v1/chat/completions", timeout=120, json={
        "model": "tiny", "messages": [{"role": "user", "content": "x"}], "stream": True, "max_tokens": 50, "temperature": 0,
        "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "string", "maxLength": 3, "pattern": "^z{10}$"}}}})  # fmt: skip
    assert s.status_code == 200 and "output_invalid" in s.text and '"finish_reason":"stop"' not in s.text.replace(" ", "")


def test_cut_by_max_tokens_is_length_never_success(daemon):
    r = chat(daemon, {"type": "object", "properties": {"t": {"type": "string"}}, "required": ["t"]}, max_tokens=3)
    assert r.status_code == 200
    assert r.json()["choices"][0]["finish_reason"] == "length"


class City(pydantic.BaseModel):
    city: Literal["Paris", "Rome"]
    rating: int = pydantic.Field(ge=1, le=5)
    sunny: bool


def test_openai_sdk_parse_with_pydantic(daemon):
    c = openai.OpenAI(base_url=daemon.url + "/v1", api_key="unused", max_retries=0, timeout=120)
    msgs = [{"role": "user", "content": "Pick a city."}]
    for parse in (c.chat.completions.parse, c.beta.chat.completions.parse):
        done = parse(model="tiny", messages=msgs, response_format=City, temperature=0, max_tokens=200)
        parsed = done.choices[0].message.parsed
        assert isinstance(parsed, City) and parsed.city in ("Paris", "Rome") and 1 <= parsed.rating <= 5
    with pytest.raises(openai.LengthFinishReasonError):
        c.chat.completions.parse(model="tiny", messages=msgs, response_format=City, temperature=0, max_tokens=2)


def test_responses_text_format_takes_the_same_path(daemon):
    c = openai.OpenAI(base_url=daemon.url + "/v1", api_key="unused", max_retries=0, timeout=120)
    fmt = {"type": "json_schema", "name": "n", "schema": {"type": "integer", "minimum": 5, "maximum": 7}, "strict": True}
    raw = c.responses.with_raw_response.create(model="tiny", input="A number", text={"format": fmt}, temperature=0, max_output_tokens=20)
    assert raw.headers["x-structured-output"].startswith("enforced=maximum,minimum,type")
    assert json.loads(raw.parse().output_text) in (5, 6, 7)
    with pytest.raises(openai.BadRequestError) as exc:
        c.responses.create(model="tiny", input="A number", temperature=0, max_output_tokens=20,
                           text={"format": {**fmt, "schema": {"type": "integer", "multipleOf": 3}}})  # fmt: skip
    assert "multipleOf" in str(exc.value)


@pytest.mark.gemma
def test_gemma_parse_with_pydantic(gemma_gguf, tmp_path):
    class Answer(pydantic.BaseModel):
        country: str = pydantic.Field(max_length=20)
        capital: str = pydantic.Field(max_length=20)
        population_millions: int = pydantic.Field(ge=0, le=2000)

    with Daemon(tmp_path, {"gemma": gemma_gguf}, n_seq_max=1, n_ctx=1024, threads=2) as d:
        c = openai.OpenAI(base_url=d.url + "/v1", api_key="unused", max_retries=0, timeout=300)
        raw = c.chat.completions.with_raw_response.parse(
            model="gemma", messages=[{"role": "user", "content": "France: its capital and population, as JSON."}],
            response_format=Answer, temperature=0, max_tokens=80)  # fmt: skip
        done = raw.parse()
        parsed = done.choices[0].message.parsed
        assert isinstance(parsed, Answer) and 0 <= parsed.population_millions <= 2000
        assert "minimum" in raw.headers["x-structured-output"] and "unenforced=-" in raw.headers["x-structured-output"]
