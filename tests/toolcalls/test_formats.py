"""Every tool-call format: the same call written in it parses to name + arguments and renders back
to the same bytes; other spellings a model writes parse too; malformed spans are errors."""

from __future__ import annotations

import pytest

from barrel_inference.config import load_settings
from barrel_inference.protocol import ToolCall
from barrel_inference.toolcalls import FormatTable, ToolCallParseError, UnknownFormat, detect

PARIS = ToolCall(name="get_weather", arguments='{"city":"Paris"}')
ROME = ToolCall(name="get_time", arguments='{"tz":"Europe/Rome","h24":true}')

# format -> the canonical bytes of get_weather(city="Paris"), written out by hand
CANONICAL = {
    "qwen-xml": '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
    "llama-python-tag": '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}',
    "mistral-tool-calls": '[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris"}}]',
    "mistral-tool-calls-args": '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}',
    "dsml": '<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{"city": "Paris"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>',
    "dsml-invoke": '<｜DSML｜function_calls>\n<｜DSML｜invoke name="get_weather">\n<｜DSML｜parameter name="city" string="true">Paris</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜function_calls>',
    "bare-json": '{"name": "get_weather", "arguments": {"city": "Paris"}}',
    "generic": '{"tool_call": {"name": "get_weather", "arguments": {"city": "Paris"}}}',
}

# other spellings of the same call that models write
VARIANTS = [
    ("qwen-xml", '<tool_call>{"name":"get_weather","arguments":{"city":"Paris"}}</tool_call>'),
    ("qwen-xml", '<tool_call>\n{"name": "get_weather", "arguments": "{\\"city\\": \\"Paris\\"}"}\n</tool_call>'),
    ("llama-python-tag", '<|python_tag|>{"name": "get_weather", "arguments": {"city": "Paris"}}'),
    ("mistral-tool-calls", '[TOOL_CALLS][{"name":"get_weather","arguments":{"city":"Paris"}}]'),
    ("mistral-tool-calls", '[TOOL_CALLS]get_weather[ARGS]{"city":"Paris"}'),
    ("mistral-tool-calls-args", '[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris"}}]'),
    ("dsml", '<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{"city":"Paris"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>'),
    ("bare-json", '  {"name": "get_weather", "parameters": {"city": "Paris"}}\n'),
]

MALFORMED = [
    ("qwen-xml", '<tool_call>\n{"name": "get_weather", "arguments": {"city": }\n</tool_call>'),
    ("qwen-xml", '<tool_call>\n{"arguments": {}}\n</tool_call>'),
    ("qwen-xml", '<tool_call>\n{"name": "get_weather", "arguments": [1]}\n</tool_call>'),
    ("llama-python-tag", "<|python_tag|>brave_search.call(query='x')"),
    ("mistral-tool-calls", "[TOOL_CALLS] []"),
    ("mistral-tool-calls-args", "[TOOL_CALLS]get_weather{}"),
    ("dsml", "<｜tool▁calls▁begin｜>junk<｜tool▁calls▁end｜>"),
    ("dsml-invoke", "<｜DSML｜function_calls>\n</｜DSML｜function_calls>"),
    ("bare-json", '{"city": "Paris"}'),
    ("generic", '{"response": "hi"}'),
    ("qwen-xml", b"<tool_call>\xff</tool_call>"),
]


@pytest.fixture(scope="module")
def table():
    return FormatTable()


def test_every_builtin_format_has_a_canonical_case(table):
    assert set(table.names()) == set(CANONICAL)


@pytest.mark.parametrize("name", sorted(CANONICAL))
def test_canonical_round_trip(table, name):
    fmt = table.get(name)
    raw = CANONICAL[name].encode()
    assert fmt.parse(raw) == [PARIS]
    assert fmt.render([PARIS]) == raw
    assert fmt.render(fmt.parse(raw)) == raw


@pytest.mark.parametrize("name", sorted(CANONICAL))
def test_several_calls_round_trip(table, name):
    fmt = table.get(name)
    if fmt.calls_per_span == "one":  # one span per call: consecutive spans
        raw = fmt.render([PARIS, ROME])
        spans = raw.split(b"\n" + fmt.start.encode())
        assert [fmt.parse(spans[0]), fmt.parse(fmt.start.encode() + spans[1])] == [[PARIS], [ROME]]
    else:
        raw = fmt.render([PARIS, ROME])
        assert fmt.parse(raw) == [PARIS, ROME]
        assert fmt.render(fmt.parse(raw)) == raw


@pytest.mark.parametrize("name, text", VARIANTS)
def test_other_spellings_parse(table, name, text):
    assert table.get(name).parse(text.encode()) == [PARIS]


@pytest.mark.parametrize("name, text", MALFORMED)
def test_malformed_spans_are_errors(table, name, text):
    with pytest.raises(ToolCallParseError):
        table.get(name).parse(text if isinstance(text, bytes) else text.encode())


def test_markers_of_each_format_start_its_canonical_span(table):
    for name, text in CANONICAL.items():
        fmt = table.get(name)
        assert text.startswith(fmt.start)
        if fmt.end_in_span and fmt.ends:
            assert text.endswith(fmt.ends[0])


def test_aliases_of_earlier_names(table):
    assert table.get("mistral") is table.get("mistral-tool-calls")
    assert "hermes" in table and table.get("hermes").name == "qwen-xml"


def test_plugin_format_from_the_operator(table):
    plugged = FormatTable({"angle": "tests.toolcalls.plugin_format"})
    fmt = plugged.get("angle")
    raw = b'<<call get_weather {"city": "Paris"}>>'
    assert fmt.parse(raw) == [PARIS] and fmt.render([PARIS]) == raw
    assert "angle" in plugged.names() and "angle" not in table.names()
    replaced = FormatTable({"qwen-xml": "tests.toolcalls.plugin_format:FORMAT"})
    assert replaced.get("qwen-xml").name == "angle"


@pytest.mark.parametrize("path", ["no.such.module", "tests.toolcalls.plugin_format:MISSING", "json:dumps"])
def test_bad_plugin_paths_are_reported(path):
    with pytest.raises(UnknownFormat):
        FormatTable({"x": path}).get("x")
    with pytest.raises(UnknownFormat):
        FormatTable().get("no-such-format")


def test_config_key_names_plugins(tmp_path):
    cfg = tmp_path / "c.toml"
    cfg.write_text('[tool_call_formats]\nangle = "tests.toolcalls.plugin_format"\n')
    settings = load_settings(cfg, env={})
    assert FormatTable(settings.tool_call_formats).get("angle").name == "angle"


@pytest.mark.parametrize(
    "template, name",
    [
        ("{{ '<tool_call>' }}", "qwen-xml"),
        ("{{ '<|python_tag|>' }}{{ '<|eom_id|>' }}", "llama-python-tag"),
        ("{{ '[TOOL_CALLS] [' }}", "mistral-tool-calls"),
        ("{{ '[TOOL_CALLS]' + name + '[ARGS]' }}", "mistral-tool-calls-args"),
        ("{{ '<｜tool▁calls▁begin｜>' }}", "dsml"),
        ("{{ '<｜DSML｜function_calls>' }}", "dsml-invoke"),
        ("{{ messages }}", None),
    ],
)
def test_detection_from_a_template(template, name):
    found = detect(template)
    assert found["tool_format"] == name
    if name:
        assert found["tool_call_start"] == FormatTable().get(name).start


def test_prefixed_renames_rules_not_literals():
    from barrel_inference.toolcalls.grammar import prefixed

    g = 'root ::= "{" space city "}"\ncity ::= "\\"city root\\"" [a-z-]+ space\nspace ::= " "?'
    assert prefixed(g, "t0-").splitlines() == [
        't0-root ::= "{" t0-space t0-city "}"',
        't0-city ::= "\\"city root\\"" [a-z-]+ t0-space',
        't0-space ::= " "?',
    ]
