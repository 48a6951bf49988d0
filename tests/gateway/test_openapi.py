"""/openapi.json covers every route of the app with schemas from the wire structs, every $ref resolves, and
/docs is a static page that renders it; GET / answers browsers with the chat page and others as Ollama does."""

from __future__ import annotations

import re

import pytest

from barrel_inference.gateway.openapi import iter_routes, openapi_path
from barrel_inference.gateway.webui import wants_html


def refs(node, out):
    if isinstance(node, dict):
        for k, v in node.items():
            if k == "$ref":
                out.append(v)
            else:
                refs(v, out)
    elif isinstance(node, list):
        for v in node:
            refs(v, out)
    return out


def resolve(doc, ref):
    assert ref.startswith("#/"), ref
    node = doc
    for part in ref[2:].split("/"):
        node = node[part]
    return node


async def test_openapi_covers_every_route_and_every_ref_resolves(gateway):
    r = await gateway.client.get("/openapi.json")
    assert r.status_code == 200 and r.headers["content-type"] == "application/json"
    doc = r.json()
    assert doc["openapi"].startswith("3.1") and doc["info"]["title"] == "barrel-inference"
    expected = set()
    for path, route in iter_routes(gateway.app.routes):
        methods = set(route.methods or [])
        if "GET" in methods and "HEAD" in methods and path != "/":
            methods.discard("HEAD")
        expected |= {(m.lower(), openapi_path(path)) for m in methods}
    listed = {(m, p) for p, item in doc["paths"].items() for m in item}
    assert expected <= listed and len(expected) >= 20, expected - listed
    for must in [("post", "/v1/chat/completions"), ("post", "/api/pull"), ("get", "/openapi.json"), ("get", "/docs"), ("get", "/")]:
        assert must in listed
    all_refs = refs(doc, [])
    assert len(all_refs) > 10
    for ref in all_refs:
        target = resolve(doc, ref)  # raises KeyError when it does not resolve
        assert isinstance(target, dict) and target
    # the request bodies come from the wire structs
    chat = doc["paths"]["/v1/chat/completions"]["post"]
    schema = resolve(doc, chat["requestBody"]["content"]["application/json"]["schema"]["$ref"])
    assert "messages" in schema["properties"] and "model" in schema["required"] and "max_tokens" in schema["properties"]
    assert set(chat["responses"]["200"]["content"]) == {"application/json", "text/event-stream"}
    pull = doc["paths"]["/api/pull"]["post"]
    assert "application/x-ndjson" in pull["responses"]["200"]["content"]
    assert doc["paths"]["/v1/models/{model_id}"]["get"]["parameters"][0]["name"] == "model_id"
    ids = [op["operationId"] for item in doc["paths"].values() for op in item.values()]
    assert len(ids) == len(set(ids))
    jsonschema = pytest.importorskip("jsonschema", reason="jsonschema is in the test extra")
    for name, schema in doc["components"]["schemas"].items():
        jsonschema.Draft202012Validator.check_schema(schema)
    # a real request body validates against its schema (refs resolved within the document)
    validator = jsonschema.Draft202012Validator({**schema_ref(chat), "components": doc["components"]})
    validator.validate({"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5})
    assert not validator.is_valid({"model": "m", "messages": []})


def schema_ref(op):
    return op["requestBody"]["content"]["application/json"]["schema"]


async def test_docs_page_is_static_and_self_contained(gateway):
    r = await gateway.client.get("/docs")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    assert 'fetch("/openapi.json")' in r.text
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", r.text)  # nothing from elsewhere


async def test_root_by_accept(gateway):
    browser = "text/html,application/xhtml+xml,application/xml;q=0.9,image/avif,image/webp,*/*;q=0.8"
    r = await gateway.client.get("/", headers={"accept": browser})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    assert "<title>barrel-inference</title>" in r.text and "/v1/chat/completions" in r.text
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", r.text)
    for accept in (None, "*/*", "application/json", "text/plain"):
        r = await gateway.client.get("/", headers={"accept": accept} if accept else {})
        assert r.status_code == 200 and r.text == "Ollama is running" and r.headers["content-type"].startswith("text/plain"), accept
    r = await gateway.client.head("/")
    assert r.status_code == 200 and r.text == ""
    assert wants_html("text/html;q=0.5, application/json") is False
    assert wants_html("text/html") is True
