"""No web page can drive the daemon: Host and Origin allowlists, JSON-only bodies (CSRF, DNS rebinding)."""

from __future__ import annotations

import httpx
import pytest

from .conftest import MODEL

CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}


async def test_a_page_cannot_pull_with_a_text_plain_body(gateway):
    """The probe: POST /api/pull, Content-Type text/plain, Origin http://evil.example registered a model."""
    r = await gateway.client.post("/api/pull", content=b'{"model": "file:///tmp/x.gguf"}',
                                  headers={"content-type": "text/plain", "origin": "http://evil.example"})  # fmt: skip
    assert r.status_code == 403 and "origin" in r.json()["error"]
    r = await gateway.client.post("/api/pull", content=b'{"model": "file:///tmp/x.gguf"}', headers={"content-type": "text/plain"})
    assert r.status_code == 415 and "application/json" in r.json()["error"]


async def test_a_form_encoded_copy_is_refused(gateway):
    r = await gateway.client.post("/api/copy", data={"source": MODEL, "destination": "stolen"})
    assert r.status_code == 415
    r = await gateway.client.post("/v1/chat/completions", content=b"x", headers={"content-type": "multipart/form-data; boundary=x"})
    assert r.status_code == 415 and r.json()["error"]["code"] == "unsupported_media_type"


@pytest.mark.parametrize("host", ["evil.example", "evil.example:8080", "attacker.rebind.network"])
async def test_a_rebound_host_name_is_refused(gateway, host):
    r = await gateway.client.post("/v1/chat/completions", json=CHAT, headers={"host": host})
    assert r.status_code == 403 and r.json()["error"]["code"] == "forbidden" and "Host" in r.json()["error"]["message"]
    r = await gateway.client.get("/api/tags", headers={"host": host})
    assert r.status_code == 403


@pytest.mark.parametrize("host", ["localhost:8080", "127.0.0.1:8080", "[::1]:8080", "10.1.2.3", "app.localhost", "gateway.test"])
async def test_local_and_configured_hosts_are_answered(gateway, host):
    r = await gateway.client.post("/v1/chat/completions", json=CHAT, headers={"host": host})
    assert r.status_code == 200


@pytest.mark.parametrize("origin, allowed", [
    ("http://localhost:3000", True), ("http://127.0.0.1:5173", True), ("https://[::1]", True),
    ("http://evil.example", False), ("null", False), ("http://localhost.evil.example", False), ("file://", False),
])  # fmt: skip
async def test_origins(gateway, origin, allowed):
    r = await gateway.client.post("/v1/chat/completions", json=CHAT, headers={"origin": origin})
    if allowed:
        assert r.status_code == 200 and r.headers["access-control-allow-origin"] == origin
    else:
        assert r.status_code == 403 and "access-control-allow-origin" not in r.headers


async def test_preflight_of_an_allowed_origin_and_a_configured_one(make_gateway, fake_worker):
    gw = await make_gateway(fake_worker.endpoint, allowed_origins=["https://ui.example"])
    r = await gw.client.options("/v1/chat/completions", headers={"origin": "https://ui.example", "access-control-request-method": "POST"})
    assert r.status_code == 204 and r.headers["access-control-allow-origin"] == "https://ui.example"
    assert "content-type" in r.headers["access-control-allow-headers"]
    r = await gw.client.post("/v1/chat/completions", json=CHAT, headers={"origin": "https://ui.example"})
    assert r.status_code == 200
    r = await gw.client.post("/v1/chat/completions", json=CHAT, headers={"origin": "https://other.example"})
    assert r.status_code == 403


async def test_refusals_are_counted(gateway):
    await gateway.client.post("/api/pull", content=b"{}", headers={"content-type": "text/plain"})
    metrics = (await gateway.client.get("/metrics")).text
    assert 'barrel_inference_http_responses_total{method="POST",route="/api/pull",status="415"} 1.0' in metrics
