"""API keys for every family: 401 in each family's envelope, the families a key may use, admin keys
for management routes, /health open, /metrics optionally protected, revocation by config reload,
anthropic_api_keys as an Anthropic-only shorthand."""

from __future__ import annotations

import msgspec
import pytest

from barrel_inference.config import ApiKey
from barrel_inference.gateway.auth import find_key, presented_key
from barrel_inference.gateway.server import reload_config

from .conftest import MODEL

KEYS = [
    ApiKey(key="sk-all"),
    ApiKey(key="sk-openai", families=["openai"]),
    ApiKey(key="sk-ant", families=["anthropic"]),
    ApiKey(key="sk-ollama", families=["ollama"]),
    ApiKey(key="sk-admin", admin=True),
]
CHAT = ("POST", "/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]})
MESSAGES = ("POST", "/v1/messages", {"model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]})
TAGS = ("GET", "/api/tags", None)
PULL = ("POST", "/api/pull", {"model": "nothing-here:1b", "stream": False})
DELETE = ("DELETE", "/api/delete", {"model": "nothing-here:1b"})
UNLOAD = ("POST", "/api/unload", {"model": "nothing-here:1b"})


async def call(gw, route, headers=None):
    method, path, body = route
    return await gw.client.request(method, path, json=body, headers=headers or {})


def bearer(k):
    return {"authorization": f"Bearer {k}"}


@pytest.fixture
async def gw(make_gateway, fake_worker):
    return await make_gateway(fake_worker.endpoint, api_keys=KEYS)


async def test_missing_or_unknown_key_is_401_in_each_familys_envelope(gw):
    r = await call(gw, CHAT)
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key" and r.json()["error"]["type"] == "invalid_request_error"
    r = await call(gw, CHAT, bearer("sk-nope"))
    assert r.status_code == 401
    r = await call(gw, MESSAGES, {"x-api-key": "sk-nope", "anthropic-version": "2023-06-01"})
    assert r.status_code == 401 and r.json()["type"] == "error" and r.json()["error"]["type"] == "authentication_error"
    assert r.headers["request-id"]
    r = await call(gw, TAGS)
    assert r.status_code == 401 and isinstance(r.json()["error"], str)  # Ollama's {"error": "..."}
    r = await gw.client.get("/v1/models", headers={"anthropic-version": "2023-06-01"})
    assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"


@pytest.mark.parametrize("key,route,ok", [
    ("sk-all", CHAT, True), ("sk-openai", CHAT, True), ("sk-ant", CHAT, False), ("sk-ollama", CHAT, False),
    ("sk-all", MESSAGES, True), ("sk-ant", MESSAGES, True), ("sk-openai", MESSAGES, False),
    ("sk-ollama", TAGS, True), ("sk-openai", TAGS, False), ("sk-admin", TAGS, True),
])  # fmt: skip
async def test_a_key_opens_its_families_only(gw, key, route, ok):
    r = await call(gw, route, bearer(key))
    assert (r.status_code != 401) == ok, r.text
    if ok:
        assert r.status_code == 200, r.text


async def test_anthropic_takes_x_api_key_the_others_bearer_only(gw):
    assert (await call(gw, MESSAGES, {"x-api-key": "sk-ant"})).status_code == 200
    assert (await call(gw, CHAT, {"x-api-key": "sk-openai"})).status_code == 401


@pytest.mark.parametrize("route", [PULL, DELETE, UNLOAD])
async def test_management_needs_an_admin_key(gw, route):
    assert (await call(gw, route)).status_code == 401
    r = await call(gw, route, bearer("sk-ollama"))
    assert r.status_code == 403 and "admin" in r.json()["error"]
    r = await call(gw, route, bearer("sk-admin"))
    assert r.status_code not in (401, 403), r.text


async def test_health_open_metrics_optional(make_gateway, fake_worker):
    gw = await make_gateway(fake_worker.endpoint, api_keys=KEYS)
    assert (await gw.client.get("/health")).status_code == 200
    assert (await gw.client.get("/metrics")).status_code == 200
    gw2 = await make_gateway(fake_worker.endpoint, api_keys=KEYS, metrics_require_key=True)
    assert (await gw2.client.get("/health")).status_code == 200
    assert (await gw2.client.get("/metrics")).status_code == 401
    assert (await gw2.client.get("/metrics", headers=bearer("sk-ollama"))).status_code == 200


async def test_open_when_no_key_is_configured(gateway):
    assert (await call(gateway, CHAT)).status_code == 200
    assert (await call(gateway, TAGS)).status_code == 200


async def test_changing_aliases_needs_an_admin_key_listing_them_a_family_key(gw):
    set_alias = ("PUT", "/api/aliases/claude-x", {"target": MODEL})
    remove_alias = ("DELETE", "/api/aliases/claude-x", None)
    assert (await call(gw, set_alias)).status_code == 401
    assert (await call(gw, set_alias, bearer("sk-ollama"))).status_code == 403
    r = await call(gw, set_alias, bearer("sk-admin"))
    assert r.status_code == 200 and r.json()["alias"] == "claude-x", r.text
    r = await call(gw, ("GET", "/api/aliases", None), bearer("sk-ollama"))
    assert r.status_code == 200 and "claude-x" in r.json()["aliases"]
    assert (await call(gw, remove_alias, bearer("sk-ollama"))).status_code == 403
    assert (await call(gw, remove_alias, bearer("sk-admin"))).status_code == 200


async def test_anthropic_shorthand_protects_anthropic_only(make_gateway, fake_worker):
    gw = await make_gateway(fake_worker.endpoint, anthropic_api_keys=["sk-a"])
    assert (await call(gw, MESSAGES)).status_code == 401
    assert (await call(gw, MESSAGES, {"x-api-key": "sk-a"})).status_code == 200
    assert (await call(gw, CHAT)).status_code == 200  # OpenAI stays open
    assert (await call(gw, PULL)).status_code == 401  # but managing models needs an admin key now


async def test_a_key_is_revoked_by_a_config_reload(make_gateway, fake_worker):
    gw = await make_gateway(fake_worker.endpoint, api_keys=KEYS)
    settings = gw.settings
    assert (await call(gw, CHAT, bearer("sk-openai"))).status_code == 200
    fresh = msgspec.structs.replace(settings, api_keys=[k for k in KEYS if k.key != "sk-openai"])

    class Log:
        def info(self, *a, **k): ...
        def error(self, *a, **k): ...

    assert reload_config(settings, lambda: fresh, Log()) == ["api_keys"]
    assert (await call(gw, CHAT, bearer("sk-openai"))).status_code == 401
    assert (await call(gw, CHAT, bearer("sk-all"))).status_code == 200


@pytest.mark.parametrize("headers,family,key", [
    ({b"x-api-key": b"k1"}, "anthropic", "k1"), ({b"authorization": b"Bearer k2"}, "anthropic", "k2"),
    ({b"authorization": b"bearer  k3 "}, "openai", "k3"), ({b"x-api-key": b"k1"}, "openai", None),
    ({b"authorization": b"Basic abc"}, "ollama", None), ({}, "openai", None),
])  # fmt: skip
def test_presented_key(headers, family, key):
    assert presented_key(headers, family) == key


def test_find_key_compares_whole_keys():
    keys = [ApiKey(key="a"), ApiKey(key="b")]
    assert find_key("b", keys) is keys[1] and find_key("c", keys) is None and find_key(None, keys) is None
    assert find_key("ab", keys) is None and find_key("a", []) is None


# ---- per-key model permissions ----------------------------------------------------------------------------

LIMITED = [
    ApiKey(key="sk-fake", models=["fake"]),  # a tag-less name allows its :latest
    ApiKey(key="sk-alias", models=["gpt-4o"]),  # by the alias only
    ApiKey(key="sk-other", models=["qwen*", "llama3:8b"]),
]
GENERATIONS = [
    CHAT,
    ("POST", "/v1/completions", {"model": MODEL, "prompt": "hi"}),
    ("POST", "/v1/embeddings", {"model": MODEL, "input": "hi"}),
    ("POST", "/v1/responses", {"model": MODEL, "input": "hi"}),
    MESSAGES,
    ("POST", "/v1/messages/count_tokens", {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}),
    ("POST", "/api/chat", {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": False}),
    ("POST", "/api/generate", {"model": MODEL, "prompt": "hi", "stream": False}),
    ("POST", "/api/embed", {"model": MODEL, "input": "hi"}),
]


def _as(route, model):
    method, path, body = route
    return method, path, {**body, "model": model}


@pytest.mark.parametrize("route", GENERATIONS, ids=lambda r: r[1])
async def test_a_key_limited_to_other_models_gets_403_in_each_familys_envelope(make_gateway, fake_worker, route):
    gw = await make_gateway(fake_worker.endpoint, api_keys=LIMITED)
    r = await call(gw, route, bearer("sk-other"))
    assert r.status_code == 403, r.text
    body = r.json()
    if route[1].startswith("/api/"):
        assert body == {"error": f"this API key may not use model {MODEL!r}"}
    elif route[1].startswith("/v1/messages"):
        assert body["type"] == "error" and body["error"]["type"] == "permission_error" and MODEL in body["error"]["message"]
    else:
        assert body["error"]["code"] == "forbidden" and body["error"]["param"] == "model"
    assert not fake_worker.submits  # refused before the model ran
    r = await call(gw, route, bearer("sk-fake"))
    assert r.status_code == 200, r.text


async def test_model_permissions_match_names_and_aliases(make_gateway, fake_worker):
    gw = await make_gateway(fake_worker.endpoint, api_keys=LIMITED)
    assert (await call(gw, _as(CHAT, "gpt-4o"), bearer("sk-fake"))).status_code == 200  # the alias's model is allowed
    assert (await call(gw, _as(CHAT, "gpt-4o"), bearer("sk-alias"))).status_code == 200
    assert (await call(gw, _as(CHAT, MODEL), bearer("sk-alias"))).status_code == 403  # not by its registry name
    assert (await call(gw, _as(CHAT, "nothing:1b"), bearer("sk-other"))).status_code == 404  # unknown stays unknown
    assert (await call(gw, _as(CHAT, "nothing:1b"), bearer("sk-fake"))).status_code == 404


async def test_anthropic_keys_in_table_form_restrict_models(make_gateway, fake_worker):
    from barrel_inference.config import AnthropicKey

    gw = await make_gateway(fake_worker.endpoint, anthropic_api_keys=["sk-any", AnthropicKey(key="sk-limited", models=["qwen*"])])
    assert (await call(gw, MESSAGES, {"x-api-key": "sk-any"})).status_code == 200  # the string form: every model
    r = await call(gw, MESSAGES, {"x-api-key": "sk-limited"})
    assert r.status_code == 403 and r.json()["error"]["type"] == "permission_error"
    assert (await call(gw, MESSAGES, {"x-api-key": "sk-wrong"})).status_code == 401


def test_both_forms_of_anthropic_keys_load_from_toml(tmp_path):
    from barrel_inference.config import load_settings

    path = tmp_path / "c.toml"
    path.write_text('anthropic_api_keys = ["sk-a", { key = "sk-b", models = ["claude-*"] }]\n'
                    'api_keys = [{ key = "sk-c", families = ["openai"], models = ["qwen:7b"] }]\n')  # fmt: skip
    keys = load_settings(path, env={}).all_api_keys()
    assert [(k.key, k.families, k.models) for k in keys] == [
        ("sk-c", ["openai"], ["qwen:7b"]), ("sk-a", ["anthropic"], []), ("sk-b", ["anthropic"], ["claude-*"])]
