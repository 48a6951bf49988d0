"""The worker's entry point (python -m barrel_inference.worker), run in this process on the fake engine."""

import os
import signal
import threading

from barrel_inference.protocol import Connect, Hello, Submit
from barrel_inference.worker import __main__ as worker_main
from barrel_inference.worker.fake import FakeEngine

from .test_server import Client


def test_every_decode_runs_on_one_thread_other_than_the_main_one(tmp_path, monkeypatch):
    """Warm-up, KV self-test and the scheduler's decodes all run on the engine thread: with
    llama.cpp's OpenMP builds a graph computed on any thread after the first ran ~60 % slower (the
    worker once warmed up on its main thread and decoded every token after on another)."""
    threads: list[int] = []
    decode = FakeEngine.decode

    def recording(self, *args):
        threads.append(threading.get_ident())
        return decode(self, *args)

    monkeypatch.setattr(FakeEngine, "decode", recording)
    endpoint = f"ipc://{tmp_path}/w.sock"
    got: dict = {}

    def client() -> None:
        c = Client(endpoint)
        try:
            c.send(Connect())
            got["hello"] = c.recv(30)
            c.send(Submit("a", prompt="hello", max_tokens=4))
            got["texts"], got["dones"] = c.until_done(["a"], timeout=30)
        finally:
            c.close()
            os.kill(os.getpid(), signal.SIGTERM)  # the worker's handler stops it

    handlers = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    t = threading.Thread(target=client)
    t.start()
    try:
        rc = worker_main.main(["--fake", "--bind", endpoint, "--model-name", "fake:latest", "--kv-ram-bytes", "1000000"])
    finally:
        signal.signal(signal.SIGTERM, handlers[0])
        signal.signal(signal.SIGINT, handlers[1])
        t.join(30)
    assert rc == 0
    assert isinstance(got["hello"], Hello) and got["dones"]["a"].error is None
    warm_up = 1 + 4  # its prefill and four steps
    assert len(threads) > warm_up  # the request was decoded too
    assert len(set(threads)) == 1, "decodes ran on more than one thread"
    assert threads[0] != threading.main_thread().ident
