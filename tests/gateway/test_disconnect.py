"""A client that goes away aborts its request in the worker (streamed and not)."""

from __future__ import annotations

import asyncio
import json

from .conftest import MODEL


async def drive(app, path: str, body: dict, *, disconnect_after_body_chunks: int | None, disconnect_when=None):
    """Call the ASGI app directly; send http.disconnect after N response body chunks, or once
    `disconnect_when(sent)` holds (sent: the ASGI messages the app has sent so far)."""
    disconnect = asyncio.Event()
    sent: list[dict] = []
    raw = json.dumps(body).encode()
    body_sent = False

    async def receive():
        nonlocal body_sent
        if not body_sent:
            body_sent = True
            return {"type": "http.request", "body": raw, "more_body": False}
        await disconnect.wait()
        return {"type": "http.disconnect"}

    async def send(message):
        sent.append(message)
        chunks = [m for m in sent if m["type"] == "http.response.body" and m.get("body")]
        if disconnect_after_body_chunks is not None and len(chunks) >= disconnect_after_body_chunks:
            disconnect.set()

    scope = {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.1"}, "http_version": "1.1", "method": "POST",
             "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "",
             "headers": [(b"content-type", b"application/json")], "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 2)}  # fmt: skip
    task = asyncio.create_task(app(scope, receive, send))
    if disconnect_when is not None:
        await wait_for(lambda: disconnect_when(sent))
        disconnect.set()
    await asyncio.wait_for(task, 5)
    return sent


async def wait_for(predicate, timeout=5.0):
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not predicate():
        assert loop.time() < end, "condition not reached"
        await asyncio.sleep(0.01)


async def test_stream_disconnect_sends_abort(gateway, fake_worker):
    body = {"model": MODEL, "messages": [{"role": "user", "content": "a b c STALL"}], "stream": True}
    sent = await drive(gateway.app, "/v1/chat/completions", body, disconnect_after_body_chunks=2)
    assert sent[0]["status"] == 200
    rid = fake_worker.submits[-1].id
    await wait_for(lambda: fake_worker.aborts == [rid])
    await wait_for(lambda: gateway.models.handles()[0].in_flight == 0)  # Done(abort) freed the slot
    line = gateway.logs.events("request")[-1]
    assert line["status"] == "client_disconnected" and line["request_id"] == rid


async def test_non_streaming_disconnect_sends_abort(gateway, fake_worker):
    body = {"model": MODEL, "messages": [{"role": "user", "content": "a STALL"}]}
    await drive(gateway.app, "/v1/chat/completions", body, disconnect_after_body_chunks=None, disconnect_when=lambda _: fake_worker.submits)
    assert len(fake_worker.submits) == 1
    rid = fake_worker.submits[0].id
    await wait_for(lambda: fake_worker.aborts == [rid])
    m = (await gateway.client.get("/metrics")).text
    assert 'status="client_disconnected"} 1.0' in m


async def test_finished_request_sends_no_abort(gateway, fake_worker):
    body = {"model": MODEL, "messages": [{"role": "user", "content": "a b"}], "stream": True}
    finished = {"type": "http.response.body", "body": b"", "more_body": False}
    sent = await drive(gateway.app, "/v1/chat/completions", body, disconnect_after_body_chunks=None,
                       disconnect_when=lambda sent: sent and sent[-1] == finished)  # the client leaves after the end
    assert sent[-1] == finished
    # a later request on the same link is dropped: its abort arrives after any abort the first one caused
    marker = {"model": MODEL, "messages": [{"role": "user", "content": "a b c STALL"}], "stream": True}
    await drive(gateway.app, "/v1/chat/completions", marker, disconnect_after_body_chunks=2)
    marker_id = fake_worker.submits[-1].id
    await wait_for(lambda: fake_worker.aborts)
    assert fake_worker.aborts == [marker_id]
