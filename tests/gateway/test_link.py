"""WorkerLink against a fake worker over real ZeroMQ sockets on 127.0.0.1."""

from __future__ import annotations

import asyncio
import socket

import msgspec
import pytest

from barrel_inference.gateway.errors import GatewayError
from barrel_inference.gateway.link import WorkerLink
from barrel_inference.protocol import (
    PROTOCOL_VERSION, ChatMessage, Delta, Done, Embed, ErrorCode, FinishReason, GetStats, Submit, Tokenize,
)  # fmt: skip

from .fake_worker import FakeWorker


def chat(rid: str, text: str, **kw) -> Submit:
    return Submit(id=rid, messages=[ChatMessage(role="user", content=text)], **kw)


async def drain(stream) -> tuple[list[Delta], Done]:
    deltas = []
    async for ev in stream:
        if isinstance(ev, Done):
            return deltas, ev
        deltas.append(ev)
    raise AssertionError("no Done")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
async def link(fake_worker):
    link = WorkerLink(fake_worker.endpoint, name="fake")
    await link.connect(timeout=5)
    yield link
    await link.close()


async def test_connect_gets_hello(link, fake_worker):
    assert link.alive
    assert link.hello.model == "fake:latest"
    assert link.hello.n_seq_max == 4
    assert fake_worker.connects >= 1


async def test_connect_before_the_worker_binds():
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    link = WorkerLink(endpoint, name="late")
    connecting = asyncio.create_task(link.connect(timeout=10))
    await asyncio.sleep(1.3)  # more than one Connect retry passes with nobody listening
    assert not connecting.done()
    worker = FakeWorker(bind=endpoint)
    await worker.start()
    try:
        hello = await connecting
        assert hello.model == "fake:latest"
        assert link.alive
    finally:
        await link.close()
        await worker.stop()


async def test_connect_timeout_is_worker_unavailable():
    link = WorkerLink(f"tcp://127.0.0.1:{free_port()}", name="nobody")
    with pytest.raises(GatewayError) as info:
        await link.connect(timeout=0.5)
    assert info.value.code == ErrorCode.WORKER_UNAVAILABLE
    assert info.value.info.retryable


async def test_protocol_version_mismatch_is_refused():
    worker = FakeWorker()
    worker.hello = lambda: msgspec.structs.replace(FakeWorker.hello(worker), protocol_version=PROTOCOL_VERSION + 1)
    await worker.start()
    link = WorkerLink(worker.endpoint, name="future")
    try:
        with pytest.raises(GatewayError) as info:
            await link.connect(timeout=5)
        assert info.value.code == ErrorCode.WORKER_UNAVAILABLE and "protocol version" in info.value.info.message
        assert not link.alive
    finally:
        await worker.stop()


async def test_submit_streams_deltas_then_done(link):
    deltas, done = await drain(link.submit(chat("r1", "alpha beta gamma")))
    assert "".join(d.text for d in deltas) == "alpha beta gamma"
    assert done.finish_reason == FinishReason.STOP
    assert done.usage.completion_tokens == 3
    assert link.in_flight() == []


async def test_slow_reader_gets_merged_deltas(link):
    stream = link.submit(chat("r2", "one two three four five"))
    while not stream.finished:  # read nothing until the worker is done
        await asyncio.sleep(0.01)
    events = [ev async for ev in stream]
    assert len(events) == 2, events  # one merged delta, then the done
    assert events[0].text == "one two three four five"
    assert events[0].n_tokens == 5
    assert isinstance(events[1], Done)
    assert stream.n_tokens == 5 and len(stream.token_gaps) == 4


async def test_max_tokens_ends_with_length(link):
    deltas, done = await drain(link.submit(chat("r3", "a b c d e", max_tokens=2)))
    assert "".join(d.text for d in deltas) == "a b"
    assert done.finish_reason == FinishReason.LENGTH


async def test_abort_ends_with_done_abort(link, fake_worker):
    stream = link.submit(chat("r4", "x y STALL"))
    first = await stream.__anext__()
    assert first.text.startswith("x")
    stream.abort()
    stream.abort()  # idempotent
    _, done = await drain(stream)
    assert done.finish_reason == FinishReason.ABORT
    assert fake_worker.aborts == ["r4"]


async def test_error_done_carries_typed_error(link):
    _, done = await drain(link.submit(chat("r5", "this is TOOLONG")))
    assert done.finish_reason == FinishReason.ERROR
    assert done.error.code == ErrorCode.CONTEXT_LENGTH


async def test_call_returns_result(link):
    result = await link.call(GetStats(id=""))
    assert result.stats["profile"]["decode_ms"] == 1.5
    tok = await link.call(Tokenize(id="", text="a b c"))
    assert tok.tokens == [0, 1, 2]


async def test_duplicate_request_id_is_refused(link):
    link.submit(chat("dup", "a STALL"))
    with pytest.raises(GatewayError) as info:
        link.submit(chat("dup", "b"))
    assert info.value.code == ErrorCode.INVALID_REQUEST


async def test_heartbeat_loss_fails_in_flight_requests():
    """A worker that stops answering (hung, or the network dropped silently) is lost after the timeout."""
    worker = FakeWorker()
    await worker.start()
    lost = []
    link = WorkerLink(worker.endpoint, name="hb", heartbeat_interval=0.05, heartbeat_timeout=1.0, on_lost=lambda _link, reason: lost.append(reason))
    try:
        await link.connect(timeout=5)
        stream = link.submit(chat("h1", "a b STALL"))
        await asyncio.sleep(1.5)
        assert worker.pings > 10 and link.alive  # pongs keep it alive past the timeout
        worker.answer_pings = False  # frozen: the socket stays open, nothing comes back
        _, done = await asyncio.wait_for(drain(stream), 5)
        assert done.finish_reason == FinishReason.ERROR
        assert done.error.code == ErrorCode.WORKER_UNAVAILABLE and done.error.retryable
        assert "stopped answering" in done.error.message
        assert len(lost) == 1 and not link.alive
        with pytest.raises(GatewayError) as info:
            link.submit(chat("h2", "again"))
        assert info.value.code == ErrorCode.WORKER_UNAVAILABLE
    finally:
        await link.close()
        await worker.stop()


async def test_dropped_connection_fails_in_flight_requests_at_once():
    worker = FakeWorker()
    await worker.start()
    lost = []
    link = WorkerLink(worker.endpoint, name="drop", watch_connection=True, on_lost=lambda _link, reason: lost.append(reason))
    try:
        await link.connect(timeout=5)
        stream = link.submit(chat("d1", "a STALL"))
        await stream.__anext__()
        await worker.kill()  # no heartbeat configured: only the connection drop tells
        _, done = await asyncio.wait_for(drain(stream), 5)
        assert done.error.code == ErrorCode.WORKER_UNAVAILABLE and "connection" in done.error.message
        assert len(lost) == 1
    finally:
        await link.close()
        await worker.stop()


async def test_close_fails_pending_calls_and_streams(fake_worker):
    link = WorkerLink(fake_worker.endpoint)
    await link.connect(timeout=5)
    stream = link.submit(chat("c1", "a STALL"))
    await link.close("shutting down")
    _, done = await drain(stream)
    assert done.error.code == ErrorCode.WORKER_UNAVAILABLE
    assert done.error.message == "shutting down"


async def test_an_undecodable_message_fails_the_requests_it_names_and_nothing_else(link, fake_worker):
    """A message this side cannot decode still names its requests: they fail with a typed error
    (and are aborted on the worker) instead of waiting forever; other requests are untouched."""
    other = link.submit(chat("ok1", "x y z"))
    deltas, done = await asyncio.wait_for(drain(link.submit(chat("bad1", "a GARBLE b c"))), 5)
    assert done.finish_reason == FinishReason.ERROR and done.error.code == ErrorCode.INTERNAL
    assert "cannot decode" in done.error.message
    _, other_done = await asyncio.wait_for(drain(other), 5)
    assert other_done.finish_reason == FinishReason.STOP
    assert "bad1" in fake_worker.aborts
    assert link.alive


async def test_a_call_given_up_on_is_aborted_in_the_worker(link, fake_worker):
    """The probe's 2,000 embedding inputs: the gateway's timeout fired, the worker computed on for minutes."""
    with pytest.raises(GatewayError) as err:
        await link.call(Embed(id="emb-1", inputs=["STALL"] * 2000), timeout=0.2)
    assert err.value.code is ErrorCode.WORKER_UNAVAILABLE
    for _ in range(100):
        if "emb-1" in fake_worker.aborts:
            break
        await asyncio.sleep(0.01)
    assert "emb-1" in fake_worker.aborts
    task = asyncio.create_task(link.call(Embed(id="emb-2", inputs=["STALL"])))
    await asyncio.sleep(0.05)
    task.cancel()  # the client went away
    await asyncio.gather(task, return_exceptions=True)
    for _ in range(100):
        if "emb-2" in fake_worker.aborts:
            break
        await asyncio.sleep(0.01)
    assert "emb-2" in fake_worker.aborts
    done = await link.call(Embed(id="emb-3", inputs=["fine"]))
    assert done.error is None and len(done.embeddings) == 1


async def test_a_lost_link_left_open_does_not_block_the_context():
    """The connection monitor's events travel over a PAIR socket that the context's I/O thread writes
    with a blocking send: a monitor socket closed while the link's socket still reports (the worker came
    back and dropped again before the owner closed the link) froze that I/O thread and with it every
    link of the gateway. The link keeps reading its monitor until it closes, and stops the monitor
    before it closes the monitor's socket."""
    import zmq
    import zmq.asyncio

    ctx = zmq.asyncio.Context()
    worker = FakeWorker()
    await worker.start()
    lost = []
    link = WorkerLink(worker.endpoint, name="flap", ctx=ctx, watch_connection=True, on_lost=lambda _l, r: lost.append(r))
    other = FakeWorker()
    try:
        await link.connect(timeout=5)
        for _ in range(3):  # the socket reconnects by itself each time the worker comes back
            await worker.kill()
            await asyncio.sleep(0.3)
            await worker.restart()
            await asyncio.sleep(0.5)
        assert len(lost) == 1
        await other.start()
        second = WorkerLink(other.endpoint, name="second", ctx=ctx)
        try:
            hello = await second.connect(timeout=3)  # the shared I/O thread still serves other links
            assert hello.protocol_version == PROTOCOL_VERSION
        finally:
            await second.close()
        await link.close()
    finally:
        await link.close()
        await worker.stop()
        await other.stop()
        ctx.destroy(linger=0)
