"""Every error in the envelope of the family that owns the path, with the status from one table:
golden bodies per family, 404 / 405 / 413 / 500, overload with retry-after."""

from __future__ import annotations

import pytest

from barrel_inference.gateway.app import load_families
from barrel_inference.gateway.family import STATUS
from barrel_inference.protocol import ErrorCode, ErrorInfo

from .conftest import MODEL
from .test_lifecycle import echo_family

INFO = ErrorInfo(ErrorCode.OVERLOADED, "busy, retry", retryable=True)

GOLDEN = [
    # (path, status, body)
    ("/v1/chat/completions", 503,
     {"error": {"message": "busy, retry", "type": "server_error", "param": None, "code": "overloaded"}}),
    ("/api/chat", 503, {"error": "busy, retry"}),
    ("/elsewhere", 503, {"error": "busy, retry"}),
    ("/echo/say", 529, {"oops": {"status": 529, "code": "overloaded", "why": "busy, retry", "field": None}}),
]  # fmt: skip


@pytest.mark.parametrize("path,status,body", GOLDEN)
def test_golden_envelopes_and_overload_status(path, status, body):
    families = load_families()
    families.all.append(echo_family())
    r = families.error_response(path, INFO)
    assert r.status_code == status
    assert r.headers["retry-after"] == "1"
    import json

    assert json.loads(r.body) == body


def test_one_table_has_every_code():
    assert set(STATUS) == set(ErrorCode)
    assert STATUS[ErrorCode.QUEUE_TIMEOUT] == 504 and STATUS[ErrorCode.REQUEST_TOO_LARGE] == 413


@pytest.fixture
async def small(make_gateway, fake_worker):
    return await make_gateway(fake_worker.endpoint, max_request_body_bytes=4096,
                              families=[*load_families().all, echo_family()])  # fmt: skip


@pytest.mark.parametrize("path,envelope", [
    ("/v1/chat/completions", "openai"), ("/v1/embeddings", "openai"), ("/api/pull", "ollama"), ("/echo/say", "echo"),
])  # fmt: skip
async def test_too_large_bodies_are_413_in_the_familys_envelope(small, fake_worker, path, envelope):
    big = b'{"model": "' + MODEL.encode() + b'", "pad": "' + b"x" * 5000 + b'"}'
    r = await small.client.post(path, content=big, headers={"content-type": "application/json"})
    assert r.status_code == 413, r.text
    text = {"openai": lambda b: b["error"]["message"], "ollama": lambda b: b["error"], "echo": lambda b: b["oops"]["why"]}[envelope](r.json())
    assert "max_request_body_bytes" in text and "4096" in text
    if envelope == "openai":
        assert r.json()["error"]["code"] == "request_too_large"
    assert fake_worker.submits == []


async def test_a_chunked_body_is_cut_off_while_it_is_read(small, fake_worker):
    pulled = 0

    async def endless():
        nonlocal pulled
        yield b'{"model": "fake", "messages": [{"role": "user", "content": "'
        while True:
            pulled += 1
            yield b"x" * 1024

    r = await small.client.post("/v1/chat/completions", content=endless(), headers={"content-type": "application/json"})
    assert "content-length" not in r.request.headers  # sent chunked
    assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"
    assert pulled <= 5  # stopped at the limit: never read (or buffered) the whole body
    r = await small.client.post("/api/show", content=endless(), headers={"content-type": "application/json"})
    assert r.status_code == 413 and "max_request_body_bytes" in r.json()["error"]


async def test_404_405_500_by_prefix(small):
    r = await small.client.get("/api/nothing")
    assert r.status_code == 404 and isinstance(r.json()["error"], str)
    r = await small.client.get("/v1/embeddings")
    assert r.status_code == 405 and r.json()["error"]["code"] == "method_not_allowed"
    r = await small.client.delete("/echo/say")
    assert r.status_code == 405 and r.json()["oops"]["code"] == "method_not_allowed"


async def test_a_crash_in_a_familys_route_is_500_in_its_envelope(make_gateway, fake_worker):
    from starlette.routing import Route

    fam = echo_family()

    async def broken(request):
        raise RuntimeError("disk on fire")

    fam.routes = lambda: [Route("/echo/broken", broken)]
    gw = await make_gateway(fake_worker.endpoint, families=[*load_families().all, fam])
    r = await gw.client.get("/echo/broken")
    assert r.status_code == 500
    assert r.json()["oops"]["code"] == "internal" and "disk on fire" not in r.json()["oops"]["why"]  # details only in the log
    assert r.headers["x-request-id"] in r.json()["oops"]["why"]
    assert [e["error_id"] for e in gw.logs.events("unhandled_error")] == [r.headers["x-request-id"]]
