"""The Go text/template subset: table-driven renders, parse errors that name the construct, and bounds."""

from __future__ import annotations

import pytest

from barrel_inference.gotemplate import GoTemplateError, OllamaTemplate
from barrel_inference.gotemplate.exec import NAMES, Run, Struct, go_json
from barrel_inference.gotemplate.parse import parse

DATA = {
    "S": "sys", "Empty": "", "N": 3, "F": 1.5, "T": True, "Nil": None, "List": ["a", "b", "c"], "Map": {"b": 2, "a": 1},
    "Obj": Struct("T", {"Name": "x", "Inner": Struct("U", {"V": 7})}, {"name": "x"}), "Quote": "<b>&'",
}  # fmt: skip


def render(src: str, data=DATA, **kw) -> str:
    run = Run(data, **kw)
    run.nodes(parse(src, NAMES), data)
    return "".join(run.out)


CASES = [
    ("text only", "plain", "plain"),
    ("field", "{{ .S }}", "sys"),
    ("trim both sides", "a  \n {{- .S -}} \n  b", "asysb"),
    ("trim needs a space", "{{-3}}", "-3"),
    ("comment", "a{{/* gone */}}b{{- /* gone */ -}} c", "abc"),
    ("nil prints no value", "{{ .Nil }}|{{ .Missing }}", "<no value>|<no value>"),
    ("numbers and bools", "{{ .N }} {{ .F }} {{ .T }} {{ 2.0 }} {{ 0x10 }} {{ 'a' }}", "3 1.5 true 2 16 97"),
    ("strings", '{{ "a\\tb\\u00e9" }}{{ `raw\\n` }}', "a\tbé" + "raw\\n"),
    ("if else if else", '{{ if .Empty }}1{{ else if eq .S "x" }}2{{ else if eq .S "sys" }}3{{ else }}4{{ end }}', "3"),
    ("truth", "{{ if .List }}L{{ end }}{{ if .Empty }}E{{ end }}{{ if .N }}N{{ end }}{{ if .Nil }}Z{{ end }}{{ if .Obj }}O{{ end }}", "LNO"),
    ("range with index", "{{ range $i, $v := .List }}{{ $i }}={{ $v }};{{ end }}", "0=a;1=b;2=c;"),
    ("range dot", "{{ range .List }}[{{ . }}]{{ end }}", "[a][b][c]"),
    ("range else", "{{ range .Empty }}x{{ else }}none{{ end }}", "none"),
    ("range map in key order", "{{ range $k, $v := .Map }}{{ $k }}{{ $v }}{{ end }}", "a1b2"),
    ("range int", "{{ range 3 }}{{ . }}{{ end }}", "012"),
    ("break and continue", '{{ range .List }}{{ if eq . "b" }}{{ continue }}{{ end }}{{ if eq . "c" }}{{ break }}{{ end }}{{ . }}{{ end }}', "a"),
    ("with", "{{ with .Obj }}{{ .Name }}{{ end }}{{ with .Empty }}x{{ else }}y{{ end }}", "xy"),
    ("chains", "{{ .Obj.Inner.V }} {{ $o := .Obj }}{{ $o.Inner.V }} {{ (index .List 1) }}", "7 7 b"),
    ("root variable", "{{ range .List }}{{ $.S }}{{ end }}", "syssyssys"),
    ("declare and assign", "{{ $x := 1 }}{{ range .List }}{{ $x = . }}{{ end }}{{ $x }}", "c"),
    ("scope ends with the block", "{{ $x := 1 }}{{ if .T }}{{ $x := 2 }}{{ $x }}{{ end }}{{ $x }}", "21"),
    ("pipes", "{{ .List | len }} {{ 3 | eq .N }} {{ .S | printf \"%s!\" }}", "3 true sys!"),
    ("len slice index", "{{ len .List }} {{ slice .List 1 }} {{ index .List 2 }} {{ slice .S 1 2 }} {{ index .Map \"b\" }}", '3 ["b","c"] c y 2'),
    ("and or not return values", '{{ and .S .N }} {{ or .Empty "fb" }} {{ not .T }} {{ and .Empty .Boom }}', "3 fb false "),
    ("eq with several", '{{ eq .S "a" "sys" }} {{ ne .N 3 }} {{ lt 1 2 }} {{ ge .F 1.5 }} {{ gt "b" "a" }}', "true false true true true"),
    ("last message idiom", "{{ range $i, $_ := .List }}{{ $last := eq (len (slice $.List $i)) 1 }}{{ if $last }}L{{ end }}{{ end }}", "L"),
    ("json", "{{ json .Map }} {{ json .Quote }} {{ .Map }} {{ .Obj }}", '{"b":2,"a":1} "\\u003cb\\u003e\\u0026\'" {"b":2,"a":1} {"name":"x"}'),
    ("print and println", '{{ print 1 2 "a" 3 }}|{{ println "x" 1 }}', "1 2a3|x 1\n"),
]


@pytest.mark.parametrize("name,src,expected", CASES, ids=[c[0] for c in CASES])
def test_language(name, src, expected):
    assert render(src) == expected


ERRORS = [
    ('{{ define "x" }}a{{ end }}', "define"),
    ('{{ template "x" }}', "template"),
    ('{{ block "x" . }}a{{ end }}', "block"),
    ("{{ upper .S }}", "function 'upper' is not defined"),
    ("{{ if .S }}never closed", "has no {{ end }}"),
    ("{{ end }}", "unexpected {{ end }}"),
    ("{{ .S ", "unclosed action"),
    ("{{ .S | }}", "missing command after |"),
    ("{{ (.S }}", "unclosed left parenthesis"),
    ('{{ "open }}', "unterminated quoted string"),
    ("{{ break }}", "outside {{ range }}"),
    ("a\nb\n{{ nil }}", "line 3"),
    ("{{/* open", "unclosed comment"),
    ("{{ .S ! }}", "unexpected '!'"),
]


@pytest.mark.parametrize("src,fragment", ERRORS, ids=[e[1] for e in ERRORS])
def test_parse_errors_name_the_construct(src, fragment):
    with pytest.raises(GoTemplateError) as info:
        OllamaTemplate(src)
    assert fragment in str(info.value)


RUNTIME_ERRORS = [
    ("{{ .Obj.Nope }}", "can't evaluate field Nope in type T"),
    ("{{ $y }}", "undefined variable"),
    ("{{ index .List 9 }}", "index out of range"),
    ("{{ slice .List 2 1 }}", "slice index out of range"),
    ('{{ eq .N "3" }}', "incompatible types"),
    ("{{ len .N }}", "len of number"),
    ("{{ .S 1 }}", "non-function"),
]


@pytest.mark.parametrize("src,fragment", RUNTIME_ERRORS, ids=[e[1] for e in RUNTIME_ERRORS])
def test_runtime_errors_are_typed(src, fragment):
    with pytest.raises(GoTemplateError) as info:
        render(src)
    assert fragment in str(info.value)


def test_steps_and_output_are_bounded():
    nested = "{{ range .Messages }}{{ range $.Messages }}{{ range $.Messages }}x{{ end }}{{ end }}{{ end }}"
    msgs = [{"role": ("user", "assistant")[i % 2], "content": str(i)} for i in range(60)]  # 216 000 iterations
    with pytest.raises(GoTemplateError, match="steps"):
        OllamaTemplate(nested, max_steps=100_000).render(msgs)
    with pytest.raises(GoTemplateError, match="output"):
        OllamaTemplate("{{ range .Messages }}{{ .Content }}{{ end }}", max_output=1000).render([{"role": "user", "content": "y" * 600}] * 2)
    with pytest.raises(GoTemplateError, match="nested deeper"):
        OllamaTemplate("{{ if .A }}" * 150 + "{{ end }}" * 150)
    with pytest.raises(GoTemplateError, match="steps"):
        OllamaTemplate("{{ range 100000000 }}{{ end }}{{ .Messages }}", max_steps=10_000).render([])


def test_go_json_matches_encoding_json():
    assert go_json({"a": [1, 2.5, 1e21, None, True], "s": "é<\u2028"}) == '{"a":[1,2.5,1e+21,null,true],"s":"é\\u003c\\u2028"}'


def test_response_is_appended_to_a_template_without_messages_or_response():
    assert OllamaTemplate("{{ .System }}:{{ .Prompt }}=").render([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]) == ":hi=yo"
